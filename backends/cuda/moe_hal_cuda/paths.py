"""The measured path table: where a peer library (torch ``grouped_mm``, DeepGEMM) was timed faster
than our Triton kernels, keyed by ``(arch, op, dtype, shape bucket)``.

A peer's advantage depends on the shape — torch's CUTLASS kernel picks its tile by the average
rows per group, DeepGEMM's heuristics by M, N and K — so one verdict per (op, dtype) would route
shapes that were never measured. The **shape bucket** of a call is the power-of-two range of
each of its dimensions: ``N``, the reduction length (``K``; tokens per group for K-grouped calls)
and the rows per group (contiguous: rows / G; masked: ``expected_m``, else ``max_m``; K-grouped:
the output's ``M``). An entry covers the calls whose three dimensions fall in its ranges.

``path_table.json`` is filled only from a committed GPU run (``backends/cuda/scripts/gpu_check.py``
writes a ``path_table_suggestion``); while no entry covers a call, :func:`lookup` returns None and
the backend says the peer choice is unmeasured.

File format::

    {"source": "bench/results/<run>.json", "device": "nvidia-h200-sxm",
     "entries": [{"arch": "sm90", "op": "contiguous", "dtype": "bf16",
                  "bucket": {"n": 4096, "k": 4096, "rows_per_group": 256},
                  "path": "torch", "speedup": 1.25}]}

where each bucket value is the lower end of a power-of-two range (``4096`` covers 4096-8191).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from importlib import resources

#: The dimensions of a shape bucket, in key order.
BUCKET_DIMS = ("n", "k", "rows_per_group")


def floor_pow2(x: int) -> int:
    """The largest power of two <= ``x`` (0 for ``x <= 0``): the lower end of ``x``'s range."""
    return 1 << (x.bit_length() - 1) if x > 0 else 0


def shape_bucket(p) -> tuple[int, int, int]:
    """``(n, k, rows_per_group)`` range starts of a :class:`~moe_hal.problem.Problem` (O(1): sizes
    only, nothing read from a device or from the group counts)."""
    groups = max(p.num_groups, 1)
    if p.op == "contiguous":
        return floor_pow2(p.n), floor_pow2(p.k), floor_pow2(p.m // groups)
    if p.op == "masked":
        return floor_pow2(p.n), floor_pow2(p.k), floor_pow2(p.layout.expected_m or p.m)
    return floor_pow2(p.n), floor_pow2(p.k // groups), floor_pow2(p.m)  # K-grouped: k = tokens T


def describe_bucket(bucket: tuple[int, int, int]) -> str:
    """``N in [4096, 8192), K in [...), rows per group in [...)`` for ``explain()``."""
    names = ("N", "K", "rows per group")
    return ", ".join(f"{name} in [{lo}, {2 * lo if lo else 1})" for name, lo in zip(names, bucket))


@dataclass(frozen=True)
class PathPreference:
    """A measured verdict: for ``(arch, op, dtype, bucket)`` the peer ``path`` beat our Triton
    kernel by ``speedup`` (median time ratio) on ``device`` in ``source`` (a bench/results JSON)."""

    arch: str
    op: str
    dtype: str
    bucket: tuple[int, int, int]
    path: str
    speedup: float
    source: str
    device: str


def parse(data: dict) -> dict[tuple, PathPreference]:
    """The entries of a path-table document (see the module docstring), keyed by
    ``(arch, op, dtype, bucket)``; a malformed entry raises ``ValueError`` naming it."""
    out = {}
    for i, e in enumerate(data.get("entries", [])):
        try:
            bucket = tuple(int(e["bucket"][d]) for d in BUCKET_DIMS)
            if any(v != floor_pow2(v) for v in bucket):
                raise ValueError(f"bucket values must be powers of two (range starts), got {bucket}")
            pref = PathPreference(
                str(e["arch"]),
                str(e["op"]),
                str(e["dtype"]),
                bucket,
                str(e["path"]),
                float(e["speedup"]),
                str(e.get("source", data.get("source", ""))),
                str(e.get("device", data.get("device", ""))),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"path_table entry {i}: {type(exc).__name__}: {exc}") from exc
        out[(pref.arch, pref.op, pref.dtype, pref.bucket)] = pref
    return out


@functools.cache
def table() -> dict[tuple, PathPreference]:
    """The packaged ``path_table.json`` (read once)."""
    text = resources.files("moe_hal_cuda").joinpath("path_table.json").read_text(encoding="utf-8")
    return parse(json.loads(text))


def lookup(arch: str, p, entries: dict[tuple, PathPreference] | None = None) -> PathPreference | None:
    """The measured preference covering ``p`` on ``arch`` (from ``entries``, default the packaged
    table), or None when no committed measurement covers it."""
    entries = table() if entries is None else entries
    return entries.get((arch, p.op, p.in_dtype, shape_bucket(p)))
