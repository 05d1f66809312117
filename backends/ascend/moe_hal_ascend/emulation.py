"""Emulation mode: the Ascend backends accept CPU tensors and run them on the CPU emulator.

There is no NPU in CI, so every Ascend code path is exercised through
:mod:`moe_hal_ascend.emulator`, a CPU implementation of the torch_npu operators the backends
call. Emulation is off unless switched on, and even then the Ascend backends are never picked
automatically for CPU tensors: they run only when named (``backend="ascend"``,
``MOE_HAL_BACKEND=ascend``), and ``explain()`` reports them as EMULATED.

Switches (environment, read on every query):

* ``MOE_HAL_ASCEND_EMULATE``: unset, empty or ``0`` = off; ``1`` (or ``true``/``yes``/``on``)
  = on, emulating :data:`DEFAULT_SOC`; a SoC name such as ``Ascend950PR_9579`` = on, emulating
  that SoC.
* ``MOE_HAL_ASCEND_SOC``: the SoC to emulate (overrides the one given by ``MOE_HAL_ASCEND_EMULATE``).

or in code: :func:`enable` / :func:`disable` (which override the environment until :func:`reset`).

The emulated SoC name is matched in the hardware DB exactly as a real device's
``torch.npu.get_device_name()`` would be, and the backends read the *features* of the matched
entry (``npu_grouped_matmul``, ``fp8``, ``ascend_a5``, ...), so emulating a 950 SoC enables the
950 backend and its native fp8 path, and emulating a 910B does not. This module imports only ``os``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

ENV_EMULATE = "MOE_HAL_ASCEND_EMULATE"
ENV_SOC = "MOE_HAL_ASCEND_SOC"
#: SoC emulated when none is named: an Atlas A2 training part (910B2), the common 910B SKU.
DEFAULT_SOC = "Ascend910B2"

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


@dataclass(frozen=True)
class EmulationConfig:
    """Whether emulation is on, which SoC it pretends to be, and what switched it on."""

    enabled: bool
    soc: str
    source: str  # "environment", "moe_hal_ascend.enable()", "moe_hal_ascend.disable()" or "default"

    def describe(self) -> str:
        if not self.enabled:
            return "emulation off"
        return f"EMULATED: CPU emulator of torch_npu, SoC {self.soc} (switched on by {self.source})"


_override: EmulationConfig | None = None


def config() -> EmulationConfig:
    """The current emulation setting (an :func:`enable`/:func:`disable` override, else the environment)."""
    if _override is not None:
        return _override
    raw = os.environ.get(ENV_EMULATE, "").strip()
    soc_env = os.environ.get(ENV_SOC, "").strip()
    if raw.lower() in _FALSE:
        return EmulationConfig(False, soc_env or DEFAULT_SOC, "default")
    soc = soc_env or (DEFAULT_SOC if raw.lower() in _TRUE else raw)
    return EmulationConfig(True, soc, "environment")


def enable(soc: str | None = None) -> EmulationConfig:
    """Switch emulation on in this process, emulating ``soc`` (default: ``MOE_HAL_ASCEND_SOC`` or
    :data:`DEFAULT_SOC`). Cached backend selections are dropped so the change takes effect."""
    global _override
    chosen = (soc or os.environ.get(ENV_SOC, "").strip() or DEFAULT_SOC).strip()
    _override = EmulationConfig(True, chosen, "moe_hal_ascend.enable()")
    _forget_selections()
    return _override


def disable() -> EmulationConfig:
    """Switch emulation off in this process, whatever the environment says."""
    global _override
    _override = EmulationConfig(False, DEFAULT_SOC, "moe_hal_ascend.disable()")
    _forget_selections()
    return _override


def reset() -> EmulationConfig:
    """Forget :func:`enable`/:func:`disable`: the environment decides again."""
    global _override
    _override = None
    _forget_selections()
    return config()


def _forget_selections() -> None:
    # Selections are cached per problem signature; a different emulated SoC changes the answer.
    from moe_hal.plugin_api import clear_cache

    clear_cache()
