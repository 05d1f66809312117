"""Argument checks shared by the pure-Python modules (the performance model and the workloads):
plain numbers, integers and per-group counts, each refused with an
:class:`~moe_hal.errors.ArgumentError` naming the argument."""

from __future__ import annotations

import math
import operator
from typing import Any

from .errors import ArgumentError


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def is_positive_number(x: Any) -> bool:
    return is_number(x) and x > 0


#: Largest integer argument accepted (2**53: every smaller int is exact as a float, and products of
#: a few of them stay far below the float range, so the arithmetic can neither overflow nor round).
MAX_INT = 2**53


def checked_int(x: Any, name: str, minimum: int) -> int:
    if not isinstance(x, bool):
        try:
            value = operator.index(x)  # int, numpy and torch integer scalars
        except TypeError:
            value = None
        if value is not None and minimum <= value <= MAX_INT:
            return value
    kind = "a positive int" if minimum else "a non-negative int"
    raise ArgumentError(
        name,
        f"{kind} <= 2**53",
        x if not isinstance(x, int) or x.bit_length() < 64 else f"an int of {x.bit_length()} bits",
    )


def positive_int(x: Any, name: str) -> int:
    return checked_int(x, name, 1)


def group_counts(counts: Any) -> tuple[int, ...]:
    if isinstance(counts, (str, bytes)) or not hasattr(counts, "__iter__"):
        raise ArgumentError("counts", "a sequence of non-negative ints", type(counts).__name__)
    if hasattr(counts, "tolist"):  # numpy arrays and host tensors
        counts = counts.tolist()
    if (
        type(counts) in (list, tuple)
        and counts
        and all(type(c) is int for c in counts)
        and min(counts) >= 0
        and max(counts) <= MAX_INT
    ):
        return tuple(counts)
    out = tuple(checked_int(c, f"counts[{g}]", 0) for g, c in enumerate(counts))
    if not out:
        raise ArgumentError("counts", "at least one group", [])
    return out
