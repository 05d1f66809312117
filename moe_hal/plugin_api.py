"""Everything a backend plugin imports from moe_hal, in one place: ``from moe_hal.plugin_api import ...``.

Names here keep their meaning for as long as :data:`API_VERSION` keeps its major number; the rest of
the package may be reorganised. The declarative names (specs, signatures, reasons, the hook marker)
load with this module and import neither torch nor any vendor stack, so a plugin's entry-point
module stays cheap; the others (:class:`Problem`, :class:`QuantizedTensor`, :func:`device_info`,
:data:`prepared_cache`, the ``hwdb`` and ``perf`` packages, ...) load on first access (PEP 562).

The hooks themselves are documented in :mod:`moe_hal.hookspecs` and ``docs/plugins.md``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from . import environment, errors
from .backend import (
    API_VERSION,
    OPS,
    TIERS,
    Backend,
    BackendSpec,
    DeviceInfo,
    GraphCapture,
    PerfModel,
    Reason,
    Signature,
)
from .hookspecs import ENTRY_POINT_GROUP, hookimpl
from .identity_table import IdentityTable

#: names that import torch: public name -> (module, attribute)
_LAZY = {
    "Problem": ("problem", "Problem"),
    "QuantizedTensor": ("quant", "QuantizedTensor"),
    "device_info": ("selection", "device_info"),
    "prepared_cache": ("prepared", "prepared_cache"),
    "warn_once": ("notices", "warn_once"),
    "dtypes": ("dtypes", None),
    "ep": ("ep", None),
    "hwdb": ("hwdb", None),
    "perf": ("perf", None),
}

__all__ = [
    "API_VERSION",
    "ENTRY_POINT_GROUP",
    "OPS",
    "TIERS",
    "Backend",
    "BackendSpec",
    "DeviceInfo",
    "GraphCapture",
    "IdentityTable",
    "PerfModel",
    "Problem",
    "QuantizedTensor",
    "Reason",
    "Signature",
    "clear_cache",
    "device_info",
    "dtypes",
    "environment",
    "ep",
    "errors",
    "hookimpl",
    "hwdb",
    "perf",
    "prepared_cache",
    "warn_once",
]


def clear_cache() -> None:
    """Forget every cached backend selection and device look-up, e.g. after a plugin changed
    something a selection depends on that moe_hal cannot see (an emulated device, a mode switch).
    Cheap, and imports nothing that is not loaded yet."""
    import sys

    selection = sys.modules.get(f"{__package__}.selection")
    if selection is not None:
        selection.clear_cache()


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attribute = _LAZY[name]
    value = importlib.import_module(f"{__package__}.{module}")
    if attribute is not None:
        value = getattr(value, attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return list(__all__)


if TYPE_CHECKING:  # static analysers see ordinary imports
    from . import dtypes, ep, hwdb, perf  # noqa: F401 - re-exported through __getattr__
    from .notices import warn_once  # noqa: F401 - for type checkers; loaded on first access at run time
    from .prepared import prepared_cache  # noqa: F401 - for type checkers; loaded on first access at run time
    from .problem import Problem  # noqa: F401 - for type checkers; loaded on first access at run time
    from .quant import QuantizedTensor  # noqa: F401 - for type checkers; loaded on first access at run time
    from .selection import device_info  # noqa: F401 - for type checkers; loaded on first access at run time
