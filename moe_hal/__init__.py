"""moe_hal: one grouped-GEMM API for Mixture-of-Experts layers across NVIDIA SM90/SM100,
Huawei Ascend NPUs and the CPU.

>>> import torch, moe_hal
>>> lay = moe_hal.ContiguousLayout.from_counts([3, 0, 5], alignment=4)
>>> a = torch.randn(lay.num_rows, 64); b = torch.randn(3, 32, 64)
>>> moe_hal.grouped_gemm(a, b, lay).shape
torch.Size([12, 32])

The public names below load on first access (PEP 562), so ``import moe_hal`` itself imports
neither torch nor any plugin, and never a vendor stack (torch_npu, triton, cuda-python); plugins
are discovered on the first call that needs them. Submodules: ``layouts``, ``quant``,
``routing``, ``hwdb``, ``devices`` (recognising a real device), ``perf``, ``workloads``, ``timing``,
``prepared``, ``conformance``, ``testing`` (checks for plugins' test suites), ``errors``, ``plugins``,
``ops`` (the ``torch.ops.moe_hal`` custom ops), ``nn`` (MoE layers).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: public name -> submodule that defines it
_EXPORTS = {
    "grouped_gemm": "api",
    "select": "api",
    "explain": "api",
    "backends": "api",
    "get_backend": "api",
    "Backend": "backend",
    "BackendSpec": "backend",
    "DeviceInfo": "backend",
    "Reason": "backend",
    "Signature": "backend",
    "hookimpl": "hookspecs",
    "ContiguousLayout": "layouts",
    "KGroupedLayout": "layouts",
    "MaskedLayout": "layouts",
    "PsumLayout": "device_layout",
    "Problem": "problem",
    "QuantizedTensor": "quant",
    "Selection": "selection",
    "device_info": "selection",
    "match_device": "devices",
    "PerfModel": "backend",
    "GraphCapture": "backend",
    "clear_cache": "plugin_api",
}
_SUBMODULES = frozenset(
    {
        "api",
        "backend",
        "builtin",
        "checks",
        "conformance",
        "device_layout",
        "devices",
        "dtypes",
        "environment",
        "ep",
        "errors",
        "hookspecs",
        "hwdb",
        "layouts",
        "nn",
        "notices",
        "ops",
        "perf",
        "plugin_api",
        "plugins",
        "prepared",
        "problem",
        "quant",
        "routing",
        "selection",
        "sysinfo",
        "testing",
        "timing",
        "workloads",
    }
)

__all__ = sorted([*_EXPORTS, "errors", "hwdb", "perf", "quant", "routing", "__version__"])


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # later lookups are plain attribute reads: no cost on the hot path
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS) | _SUBMODULES)


if TYPE_CHECKING:  # static analysers and IDEs see ordinary imports
    from . import conformance, errors, hwdb, perf, prepared, quant, routing  # noqa: F401 - for type checkers; loaded on first access at run time
    from .api import backends, explain, get_backend, grouped_gemm, select  # noqa: F401 - for type checkers; loaded on first access at run time
    from .backend import Backend, BackendSpec, DeviceInfo, GraphCapture, PerfModel, Reason, Signature  # noqa: F401 - for type checkers; loaded on first access at run time
    from .device_layout import PsumLayout  # noqa: F401 - for type checkers; loaded on first access at run time
    from .devices import match_device  # noqa: F401 - for type checkers; loaded on first access at run time
    from .hookspecs import hookimpl  # noqa: F401 - for type checkers; loaded on first access at run time
    from .layouts import ContiguousLayout, KGroupedLayout, MaskedLayout  # noqa: F401 - for type checkers; loaded on first access at run time
    from .plugin_api import clear_cache  # noqa: F401 - for type checkers; loaded on first access at run time
    from .problem import Problem  # noqa: F401 - for type checkers; loaded on first access at run time
    from .quant import QuantizedTensor  # noqa: F401 - for type checkers; loaded on first access at run time
    from .selection import Selection, device_info  # noqa: F401 - for type checkers; loaded on first access at run time
