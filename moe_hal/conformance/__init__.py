"""The conformance suite: the same cases, golden outputs and layouts for every backend.

Cases and golden data live in the data package ``moe_hal.data.conformance`` (``conformance/`` in
the repository): a versioned YAML manifest and safetensors files produced by the suite's own
float64 oracle. Each case runs directly on a backend and through the public dispatcher with the
backend forced; values are checked with suite-owned tolerance classes, layouts and indices byte
for byte, and untouched or zero rows with sentinel-filled outputs. A run produces a JSON report
(and JUnit XML) that :func:`compare_reports` can diff between machines or backends.

>>> report = moe_hal.conformance.run("torch", tiers=["smoke"])     # doctest: +SKIP
>>> print(moe_hal.conformance.summary(report))                     # doctest: +SKIP

Modules: ``suite`` (manifest), ``generate`` and ``oracle`` (pinned inputs, float64 goldens),
``build`` (case tensors and calls), ``tolerances`` and ``checks``, ``runner`` (one case on one
backend), ``waivers`` (expected failures), ``session`` (a whole run), ``report`` (JSON, JUnit,
verify), ``compare``, ``regen``, ``sweep`` (generated tiers) and ``plugin`` (pytest).
Importing this package imports neither torch nor the plugins; they load on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["compare_reports", "load_suite", "run", "summary", "verify"]

_EXPORTS = {
    "run": ("session", "run"),
    "summary": ("session", "summary"),
    "load_suite": ("suite", "load"),
    "verify": ("report", "verify"),
    "compare_reports": ("compare", "compare"),
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        module, attr = _EXPORTS[name]
        return getattr(importlib.import_module(f"{__name__}.{module}"), attr)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
