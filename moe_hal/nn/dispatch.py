"""Device-side token dispatch and combine for :class:`~moe_hal.nn.MoE`: no host sync, static
shapes, differentiable, traceable by ``torch.compile``.

    topk_ids [T, k] ─► dispatch ─► a (expert-grouped rows) + layout ─► experts ─► combine ─► y [T, H]

:func:`moe_hal.routing.dispatch` builds a host :class:`~moe_hal.ContiguousLayout` (one sync, exact
row count); these functions instead size the grouped operand by a bound known from shapes alone
(``T * k`` rows, plus ``alignment - 1`` per expert when segments are aligned) and carry the layout
as device tensors (:class:`~moe_hal.PsumLayout`, or a :class:`~moe_hal.MaskedLayout` with a fixed
capacity), which is what a compiled graph or a CUDA graph needs. Rows past the last group are
zero and belong to no group. An expert-parallel dispatch replaces :func:`dispatch_contiguous` /
:func:`combine` with the same inputs and outputs (the :class:`Dispatched` value).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..device_layout import PsumLayout
from ..dtypes import accumulation_dtype
from ..layouts import MaskedLayout


@dataclass(frozen=True, eq=False)
class Dispatched:
    """Expert-grouped rows and how to put them back.

    ``a``: ``[rows, H]`` (contiguous) or ``[E, capacity, H]`` (masked). ``layout``: its layout.
    ``row_of_slot``: int64 ``[T * k]``: the row (of ``a`` flattened to 2-D) holding slot ``t*k+j``.
    ``row_expert``: int64 ``[rows]`` expert of each row, -1 for rows of no group (contiguous only;
    ``None`` for masked). ``tokens_per_expert``: int64 ``[E]`` slots routed to each expert.
    """

    a: torch.Tensor
    layout: PsumLayout | MaskedLayout
    row_of_slot: torch.Tensor
    row_expert: torch.Tensor | None
    tokens_per_expert: torch.Tensor


def _sort_slots(topk_ids: torch.Tensor, num_experts: int):
    """Slots sorted by expert (stable: token order within an expert) and per-expert counts."""
    flat = topk_ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=flat.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    sorted_expert = flat[order]
    first = torch.cumsum(counts, 0) - counts  # first sorted position of each expert
    rank = torch.arange(flat.numel(), device=flat.device) - first[sorted_expert]
    return order, sorted_expert, rank, counts


def dispatch_contiguous(x: torch.Tensor, topk_ids: torch.Tensor, num_experts: int, alignment: int = 1) -> Dispatched:
    """Rows of ``x[T, H]`` for each ``(token, expert)`` slot, grouped by expert, segments starting
    at multiples of ``alignment``. ``topk_ids``: int64 ``[T, k]`` of ids in ``[0, num_experts)``."""
    tokens, k = topk_ids.shape
    order, sorted_expert, rank, counts = _sort_slots(topk_ids, num_experts)
    slots = tokens * k
    if alignment == 1:
        num_rows = slots
        starts = torch.cumsum(counts, 0) - counts
    else:
        num_rows = -(-(slots + num_experts * (alignment - 1)) // alignment) * alignment
        aligned = (counts + alignment - 1) // alignment * alignment
        starts = torch.cumsum(aligned, 0) - aligned
    row_sorted = starts[sorted_expert] + rank
    source = x.index_select(0, order // k)
    if alignment == 1:
        a = source  # rows are already in sorted order
        row_expert = sorted_expert
    else:
        a = x.new_zeros(num_rows, x.shape[1]).index_copy(0, row_sorted, source)
        row_expert = torch.full((num_rows,), -1, dtype=torch.int64, device=x.device).index_copy(
            0, row_sorted, sorted_expert
        )
    row_of_slot = torch.empty_like(row_sorted).index_copy_(0, order, row_sorted)
    psum = (starts + counts).to(torch.int32)
    return Dispatched(a, PsumLayout(psum, "contiguous", alignment), row_of_slot, row_expert, counts)


def dispatch_masked(x: torch.Tensor, topk_ids: torch.Tensor, num_experts: int, capacity: int) -> Dispatched:
    """``a[E, capacity, H]``: expert ``e``'s slots in its first ``masked_m[e]`` rows. ``capacity``
    must be at least the number of tokens (top-k ids of a token are distinct, so no expert then
    overflows); the caller checks it."""
    k = topk_ids.shape[1]
    order, sorted_expert, rank, counts = _sort_slots(topk_ids, num_experts)
    row_sorted = sorted_expert * capacity + rank
    a = x.new_zeros(num_experts * capacity, x.shape[1]).index_copy(0, row_sorted, x.index_select(0, order // k))
    row_of_slot = torch.empty_like(row_sorted).index_copy_(0, order, row_sorted)
    layout = MaskedLayout(counts.to(torch.int32), capacity, check=False)
    return Dispatched(a.view(num_experts, capacity, x.shape[1]), layout, row_of_slot, None, counts)


def combine(expert_out: torch.Tensor, d: Dispatched, topk_weights: torch.Tensor) -> torch.Tensor:
    """``y[t] = sum_j topk_weights[t, j] * expert_out[row_of_slot[t*k + j]]``, summed in fp32 (fp64
    for fp64 outputs) and returned in ``expert_out``'s dtype. ``expert_out``: the experts' output
    rows (any leading shape that flattens to the rows of ``d.a``)."""
    tokens, k = topk_weights.shape
    rows = expert_out.reshape(-1, expert_out.shape[-1]).index_select(0, d.row_of_slot)
    acc = accumulation_dtype(expert_out.dtype)
    y = (rows.view(tokens, k, expert_out.shape[-1]).to(acc) * topk_weights.to(acc).unsqueeze(-1)).sum(dim=1)
    return y.to(expert_out.dtype)
