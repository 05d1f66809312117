"""Host side of the kernels: grids, tile schedules, strides, and the launches themselves.

Each function takes plain tensors (the fp8 *data* of quantized operands), optional
:class:`~moe_hal_cuda.scales.Physical` scales, an output tensor and an explicit
:class:`~moe_hal_cuda.configs.KernelConfig`; the backend picks the config, benchmarks may pass any.

Contiguous calls have two forms:

* ``"schedule"`` (what the backend uses): a tile list built on the host from the layout's
  counts — per tile its group, first and end row — so tiles start at each group's first row and
  ``BLOCK_M`` need not divide the layout's alignment; rows of no group are covered by zero tiles.
  Built once per (layout, BLOCK_M, device) and kept with the layout.
* ``"m_indices"``: the kernel reads DeepGEMM's per-row group ids from the device
  (``layout.m_indices(device)``, -1 on rows of no group); ``BLOCK_M`` must divide the alignment.
  This is the form for callers that hold only a device ``m_indices`` tensor.
"""

from __future__ import annotations

import weakref

import torch

from . import kernels  # first: it sets TRITON_INTERPRET before triton is imported

import triton  # noqa: E402
from .configs import KernelConfig
from .scales import SCALES_NONE, Physical

_schedules: "weakref.WeakKeyDictionary[object, dict]" = weakref.WeakKeyDictionary()


def _cached(layout, key, build):
    per_layout = _schedules.setdefault(layout, {})
    hit = per_layout.get(key)
    if hit is None:
        hit = per_layout[key] = build()
    return hit


def contiguous_schedule(layout, block_m: int, device: torch.device) -> torch.Tensor:
    """int32 ``[3, tiles]`` (group, first row, end row) covering every row of ``layout`` in row
    order: each group's rows in ``block_m`` chunks, then the rows of no group (group -1)."""

    def build() -> torch.Tensor:
        tiles: list[tuple[int, int, int]] = []
        covered = 0
        for g, start, end in layout.segments():
            if end == start:
                continue
            tiles.extend((-1, r, min(r + block_m, start)) for r in range(covered, start, block_m))
            tiles.extend((g, r, min(r + block_m, end)) for r in range(start, end, block_m))
            covered = end
        tiles.extend((-1, r, min(r + block_m, layout.num_rows)) for r in range(covered, layout.num_rows, block_m))
        table = torch.tensor(tiles, dtype=torch.int32).reshape(-1, 3).t().contiguous()
        return table.to(device)

    return _cached(layout, ("schedule", block_m, torch.device(device)), build)


def group_bounds(layout, device: torch.device) -> torch.Tensor:
    """int32 ``[2, G]``: first and end token of each group of a K-grouped layout (cached)."""
    return _cached(layout, ("bounds", torch.device(device)), lambda: torch.tensor(
        [list(layout.starts), list(layout.ends)], dtype=torch.int32).reshape(2, -1).to(device))


def _scale_args(s: Physical | None, dims: int, dummy: torch.Tensor):
    """(tensor, strides padded to ``dims``, kind, rows per scale) for a kernel launch."""
    if s is None:
        return dummy, (0,) * dims, SCALES_NONE, 1
    strides = tuple(s.tensor.stride())
    return s.tensor, (0,) * (dims - len(strides)) + strides, s.kind, s.rows_per_scale


def _check_config(config: KernelConfig, scaled: bool) -> None:
    if scaled and 128 % config.block_k:
        raise ValueError(f"BLOCK_K={config.block_k} must divide 128 (the scale block along K) for fp8")


def _launch_kwargs(config: KernelConfig) -> dict:
    return dict(BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k, GROUP_M=config.group_m,
                INTERPRET=kernels.INTERPRET, num_warps=config.num_warps, num_stages=config.num_stages)


def contiguous(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, layout, config: KernelConfig, *,
               sa: Physical | None = None, sb: Physical | None = None, form: str = "schedule") -> torch.Tensor:
    """``out[r] = a[r] @ b[group(r)].T`` for ``a[num_rows, K]``, ``b[G, N, K]``, ``out[num_rows, N]``;
    rows of no group are written as zeros. ``form``: ``"schedule"`` or ``"m_indices"``."""
    _check_config(config, sa is not None)
    num_rows, k = a.shape
    n = b.shape[1]
    if out.numel() == 0:
        return out
    if form == "schedule":
        sched = contiguous_schedule(layout, config.block_m, a.device)
        num_tiles = sched.shape[1]
        group_ptr, start_ptr, end_ptr, ids = sched[0], sched[1], sched[2], sched[0]
    elif form == "m_indices":
        if layout.alignment % config.block_m:
            raise ValueError(f"the m_indices form needs BLOCK_M ({config.block_m}) to divide the layout's "
                             f"alignment ({layout.alignment}); use the schedule form")
        ids = layout.m_indices(a.device)
        num_tiles = triton.cdiv(num_rows, config.block_m)
        group_ptr = start_ptr = end_ptr = ids
    else:
        raise ValueError(f"form: expected 'schedule' or 'm_indices', got {form!r}")
    sa_t, sa_strides, kind, _ = _scale_args(sa, 2, a)
    sb_t, sb_strides, _, sb_rows = _scale_args(sb, 3, a)
    grid = (num_tiles * triton.cdiv(n, config.block_n),)
    kernels.contiguous_kernel[grid](
        a, b, out, sa_t, sb_t, group_ptr, start_ptr, end_ptr, ids,
        num_tiles, num_rows, n, k,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), b.stride(2), out.stride(0), out.stride(1),
        *sa_strides, *sb_strides,
        SB_ROWS=sb_rows, SCALES=kind, USE_SCHEDULE=form == "schedule", **_launch_kwargs(config))
    return out


def masked(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, masked_m: torch.Tensor, config: KernelConfig, *,
           sa: Physical | None = None, sb: Physical | None = None) -> torch.Tensor:
    """``out[g, r] = a[g, r] @ b[g].T`` for ``r < masked_m[g]`` (read on the device); other rows of
    ``out`` are never written. ``a[G, max_m, K]``, ``b[G, N, K]``, ``out[G, max_m, N]``."""
    _check_config(config, sa is not None)
    g, max_m, k = a.shape
    n = b.shape[1]
    if out.numel() == 0:
        return out
    sa_t, sa_strides, kind, _ = _scale_args(sa, 3, a)
    sb_t, sb_strides, _, sb_rows = _scale_args(sb, 3, a)
    grid = (g * triton.cdiv(max_m, config.block_m) * triton.cdiv(n, config.block_n),)
    kernels.masked_kernel[grid](
        a, b, out, sa_t, sb_t, masked_m, max_m, n, k,
        a.stride(0), a.stride(1), a.stride(2), b.stride(0), b.stride(1), b.stride(2),
        out.stride(0), out.stride(1), out.stride(2), *sa_strides, *sb_strides,
        SB_ROWS=sb_rows, SCALES=kind, **_launch_kwargs(config))
    return out


def k_grouped(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, layout, config: KernelConfig, *,
              c: torch.Tensor | None = None, sa: Physical | None = None, sb: Physical | None = None) -> torch.Tensor:
    """``out[g] = (c[g] or 0) + a[rows_g].T @ b[rows_g]`` for ``a[T, M]``, ``b[T, N]``, ``out[G, M, N]``;
    ``out`` may be ``c`` itself."""
    _check_config(config, sa is not None)
    m, n = a.shape[1], b.shape[1]
    groups = out.shape[0]
    if out.numel() == 0:
        return out
    bounds = group_bounds(layout, a.device)
    sa_t, sa_strides, kind, _ = _scale_args(sa, 2, a)
    sb_t, sb_strides, _, _ = _scale_args(sb, 2, a)
    c_t = c if c is not None else out
    grid = (groups * triton.cdiv(m, config.block_m) * triton.cdiv(n, config.block_n),)
    kernels.k_grouped_kernel[grid](
        a, b, c_t, out, sa_t, sb_t, bounds[0], bounds[1], m, n,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1),
        c_t.stride(0), c_t.stride(1), c_t.stride(2), out.stride(0), out.stride(1), out.stride(2),
        *sa_strides, *sb_strides,
        HAS_C=c is not None, SCALES=kind, **_launch_kwargs(config))
    return out
