"""The hardware database: what each accelerator is, how to recognise it, and how fast it is.

One YAML file per accelerator (``hwdb/*.yaml``, validated against ``hwdb/schema.json``); every
number is a *quantity* ``{value, unit, basis, source, ...}`` that :class:`Quantity.si` converts to
SI units. See ``docs/hwdb.md``. The package is pure data: nothing is read at import time, the
database is built on first use and cached until :func:`reload`, a change of ``MOE_HAL_HWDB`` or a
new overlay, and nothing here reaches the plugin host. Recognising a real device (which asks the
plugins' probes) is :func:`moe_hal.match_device`.

Modules: :mod:`.entry` (entries, quantities, matches), :mod:`.loading` (files, schema, overlays,
cache), :mod:`.matching` (recognition rules applied to observed properties).
"""

from __future__ import annotations

from .entry import DTYPES, HardwareEntry, Match, Quantity
from .loading import ENV_VAR, add_overlay, all, get, reload, validate
from .matching import decide, match_cpu, match_cuda, match_npu

__all__ = [
    "DTYPES",
    "ENV_VAR",
    "HardwareEntry",
    "Match",
    "Quantity",
    "add_overlay",
    "all",
    "decide",
    "get",
    "match_cpu",
    "match_cuda",
    "match_npu",
    "reload",
    "validate",
]
