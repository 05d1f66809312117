"""DeepGEMM's process settings (SM count, contiguous-layout alignment, ...), kept per thread.

DeepGEMM keeps them in one process-global C++ object; here every thread starts from the defaults
below and changes only its own copy, so a serving thread that narrows ``num_sms`` for an overlap
window cannot change another thread's calls. :func:`scoped` sets values for a ``with`` block and
restores the previous ones on exit, even on an exception.

Settings that steer DeepGEMM's kernel choice (``num_sms``, ``tc_util``, ``pdl``,
``compiled_dims``) are recorded and returned but change nothing here: moe_hal backends pick their
own tiles. ``mk_alignment`` matters: it is the alignment of every contiguous/K-grouped layout the
shim builds. ``arch_major`` chooses whose scale rules the shim applies (see ``docs/deepgemm-compat.md``).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from ...errors import LayoutError

#: DeepGEMM's ``kLegacyMKAlignmentForContiguousLayout`` (every architecture).
DEFAULT_MK_ALIGNMENT = 128
#: Values a fresh thread starts from. ``num_sms=None``: the device's count, looked up on read.
#: ``arch_major=None``: the arch of the CUDA device when it is SM90/SM100, else portable rules.
#: ``passthrough``: ``"auto"`` calls real DeepGEMM on SM90/SM100 when it is importable.
DEFAULTS = {
    "num_sms": None,
    "tc_util": 100,
    "pdl": False,
    "ignore_compile_dims": False,
    "block_size_multiple_of": 1,
    "mk_alignment": DEFAULT_MK_ALIGNMENT,
    "arch_major": None,
    "passthrough": "auto",
    "backend": None,
}
PASSTHROUGH_MODES = ("auto", "never", "always")

_local = threading.local()


def current() -> dict:
    """This thread's settings (created from :data:`DEFAULTS` on first use)."""
    values = getattr(_local, "values", None)
    if values is None:
        values = _local.values = dict(DEFAULTS)
    return values


def check(name: str, value: object) -> object:
    """``value`` if it is valid for setting ``name``; LayoutError naming it otherwise."""

    def positive_int(v):
        return isinstance(v, int) and not isinstance(v, bool) and v > 0

    if name not in DEFAULTS:
        raise LayoutError("setting", f"one of {sorted(DEFAULTS)}", name)
    ok = {
        "num_sms": lambda v: v is None or positive_int(v),
        "tc_util": lambda v: positive_int(v) and v <= 100,
        "pdl": lambda v: isinstance(v, bool),
        "ignore_compile_dims": lambda v: isinstance(v, bool),
        "block_size_multiple_of": lambda v: (
            positive_int(v) or (isinstance(v, tuple) and len(v) == 2 and all(map(positive_int, v)))
        ),
        "mk_alignment": positive_int,
        "arch_major": lambda v: v in (None, 9, 10),
        "passthrough": lambda v: v in PASSTHROUGH_MODES,
        "backend": lambda v: v is None or isinstance(v, (str, list, tuple)),
    }[name]
    if not ok(value):
        expected = {
            "num_sms": "a positive int",
            "tc_util": "an int in [1, 100]",
            "pdl": "a bool",
            "ignore_compile_dims": "a bool",
            "block_size_multiple_of": "a positive int or a pair of them",
            "mk_alignment": "a positive int",
            "arch_major": "None, 9 or 10",
            "passthrough": f"one of {PASSTHROUGH_MODES}",
            "backend": "None or backend name(s)",
        }[name]
        raise LayoutError(name, expected, value)
    return value


def put(name: str, value: object) -> None:
    current()[name] = check(name, value)


@contextlib.contextmanager
def scoped(**values) -> Iterator[dict]:
    """Set settings (``num_sms=…``, ``mk_alignment=…``, ``arch_major=…``, ``passthrough=…``,
    ``backend=…``) for this thread inside a ``with`` block; the previous values come back on exit."""
    for name, value in values.items():
        check(name, value)
    settings = current()
    saved = dict(settings)
    settings.update(values)
    try:
        yield settings
    finally:
        settings.clear()
        settings.update(saved)


def snapshot() -> dict:
    """A copy of this thread's settings, to give back to :func:`restore`."""
    return dict(current())


def restore(saved: dict) -> None:
    """Put back the settings a :func:`snapshot` took."""
    for name, value in saved.items():
        check(name, value)
    settings = current()
    settings.clear()
    settings.update(saved)
