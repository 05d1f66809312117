"""What an Ascend SoC can do, as the hardware DB says: the only source of chip facts in this package.

A real device is recognised by the core (``moe_hal.match_device`` reads ``torch.npu.get_device_name``);
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

import re
from dataclasses import dataclass

from . import emulation

#: ``torch_npu.npu.get_soc_version()`` per SoC name, from the ``c10_npu::SocVersion`` enum of the
#: torch_npu 2.13.0 wheel (include/torch_npu/csrc/core/npu/NpuVariables.h). The enum spells
#: ``Ascend910B4_1``; the name string compiled into libtorch_npu.so is ``Ascend910B4-1``. Every 950
#: SKU is 260. The emulator passes the version with the name, as a real device would.
SOC_VERSIONS: dict[str, int] = {
    "Ascend910B1": 220,
    "Ascend910B2": 221,
    "Ascend910B2C": 222,
    "Ascend910B3": 223,
    "Ascend910B4": 224,
    "Ascend910B4-1": 225,
    "Ascend910B4_1": 225,
    "Ascend910_9391": 250,
    "Ascend910_9392": 251,
    "Ascend910_9381": 252,
    "Ascend910_9382": 253,
    "Ascend910_9372": 254,
    "Ascend910_9362": 255,
    "Ascend910_9363": 256,
}
_ARCH35 = re.compile(r"Ascend950(PR|DT)_\w+")


def soc_version(soc: str) -> int | None:
    """The soc_version torch_npu reports for the SoC named ``soc`` (None if the enum lacks it)."""
    if _ARCH35.fullmatch(soc):
        return 260
    return SOC_VERSIONS.get(soc)


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


def profile(soc: str, version: int | None = None) -> SocProfile:
    """The hardware-DB view of the SoC named ``soc`` (a ``torch.npu.get_device_name()`` string)
    reporting ``version`` (default: torch_npu's number for that name, :func:`soc_version`)."""
    from moe_hal import hwdb

    match = hwdb.match_npu(soc, soc_version(soc) if version is None else version)
    return SocProfile(soc, match.id, frozenset(match.features), match.reason)


def emulated() -> SocProfile:
    """The profile of the SoC the emulator currently pretends to be."""
    return profile(emulation.config().soc)
