"""What an Ascend SoC can do, as the hardware DB says: the only source of chip facts in this package.

A real device is recognised by the core (``moe_hal.hwdb.match`` reads ``torch.npu.get_device_name``);
an emulated one by matching the emulated SoC name the same way. Either way the backends and the
emulator read *feature flags* of the matched entry, never lists of SoC names:

* ``npu_grouped_matmul``, ``cube_unit``, ``bf16``: the grouped matmul runs (both backends require them);
* ``fp8``: fp8 e4m3 operands are native (Ascend 950); without it they are dequantized or rejected;
* ``ascend_a5``: the arch35 operator rules of the 950 generation (group_list_type 2 for full
  quantization, no ``tuning_config``, a one-entry counts list allowed); without it the Atlas A2/A3
  (910B/910C) rules apply;
* ``nz_format``: weights may be cast to FRACTAL_NZ.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import emulation


@dataclass(frozen=True)
class SocProfile:
    """An SoC name and what the hardware DB knows about it (``hw_id`` None: not recognised)."""

    soc: str
    hw_id: str | None
    features: frozenset[str]
    reason: str | None = None

    @property
    def native_fp8(self) -> bool:
        return "fp8" in self.features

    @property
    def arch35(self) -> bool:
        return "ascend_a5" in self.features

    @property
    def nz_format(self) -> bool:
        return "nz_format" in self.features

    @property
    def label(self) -> str:
        return f"{self.soc} ({self.hw_id})" if self.hw_id else f"{self.soc} (not in the hardware DB)"


def profile(soc: str) -> SocProfile:
    """The hardware-DB view of the SoC named ``soc`` (a ``torch.npu.get_device_name()`` string)."""
    from moe_hal import hwdb

    match = hwdb.match_npu(soc)
    return SocProfile(soc, match.id, frozenset(match.features), match.reason)


def emulated() -> SocProfile:
    """The profile of the SoC the emulator currently pretends to be."""
    return profile(emulation.config().soc)
