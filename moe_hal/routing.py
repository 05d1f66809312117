"""Token routing for MoE layers: dispatch tokens to expert-grouped rows, combine expert outputs back.

A router gives, per token ``t``, ``k`` expert ids ``topk_ids[t, j]`` and weights ``topk_weights[t, j]``.
A **slot** is one ``(t, j)`` pair; its flat index is ``s = t * k + j``. Ids of ``-1`` mark slots
whose expert is not local (an expert-parallel router maps non-local experts to -1, as vLLM's
``expert_map`` does); such slots are skipped: they get no row and contribute nothing to ``combine``.

* :func:`dispatch` builds the M-grouped **contiguous** operand ``a[num_rows, H]`` and its
  :class:`~moe_hal.layouts.ContiguousLayout` (segments aligned to ``alignment``; padding rows zero).
* :func:`dispatch_masked` builds the **masked** operand ``a[G, max_m, H]`` and its
  :class:`~moe_hal.layouts.MaskedLayout`, with an explicit overflow policy.
* :func:`combine` / :func:`combine_masked` compute ``y[t] = sum_j w[t, j] * out[row(t, j)]``.

Row order is deterministic: stable by expert, then token, then slot — i.e. the rows of expert ``g``
hold its slots in increasing flat slot index. Everything is vectorized torch code (a stable sort,
``bincount``, gathers and one fused gather-reduce); there is no Python loop over tokens or experts.

Host syncs: the contiguous layout needs per-expert counts on the host, so :func:`dispatch` reads
one small tensor (counts plus an invalid-id count) from the device — one sync. :func:`dispatch_masked`
also does one sync, to validate ids and capacity and to count dropped slots; ``masked_m`` itself is
computed and kept on the device. :func:`combine` and :func:`combine_masked` do not sync.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from .errors import ArgumentError, CapacityError, DeviceError, DTypeError, LayoutError, ShapeError
from .layouts import ContiguousLayout, MaskedLayout, _reshape_rows, take_rows
from .quant import QuantizedTensor

Hidden = torch.Tensor | QuantizedTensor
OVERFLOW_POLICIES = ("error", "drop")


@dataclass(frozen=True, eq=False)
class _CombinePlan:
    """Kept slots in token order, for the fused gather-reduce of ``combine``."""

    slots: torch.Tensor  # int64 [n_kept]: flat slot index t*k + j
    rows: torch.Tensor  # int64 [n_kept]: row of the (flattened) expert output holding that slot
    offsets: torch.Tensor  # int64 [T]: first entry of token t in ``slots`` / ``rows``


class _Routed:
    """What :class:`Dispatch` and :class:`MaskedDispatch` share: the slot <-> row maps' sizes and
    the combine plan, built on first use."""

    row_of_slot: torch.Tensor
    _kept: int

    @property
    def num_tokens(self) -> int:
        return self.row_of_slot.shape[0]

    @property
    def top_k(self) -> int:
        return self.row_of_slot.shape[1]

    @functools.cached_property
    def _plan(self) -> _CombinePlan:
        return _combine_plan(self.row_of_slot.reshape(-1), self.num_tokens, self.top_k, self._kept)


@dataclass(frozen=True, eq=False)
class Dispatch(_Routed):
    """Result of :func:`dispatch`.

    ``a``: ``[num_rows, H]`` packed activations, dtype of ``hidden`` (a :class:`QuantizedTensor`
    with per-row scales if ``hidden`` was one). Padding rows are zero (scale 1.0 when quantized).
    ``layout``: the :class:`ContiguousLayout` of ``a`` (``layout.counts[g]`` = slots routed to g).
    ``row_of_slot``: int64 ``[T, k]``, the row of ``a`` holding slot ``(t, j)``; -1 if skipped.
    ``slot_of_row``: int64 ``[num_rows]``, the flat slot ``t * k + j`` held by each row; -1 on
    padding rows. ``token_of_row`` is ``slot_of_row // k`` (-1 kept).
    ``topk_weights``: the weights given to :func:`dispatch`, or None.
    """

    a: Hidden
    layout: ContiguousLayout
    row_of_slot: torch.Tensor
    slot_of_row: torch.Tensor
    topk_weights: torch.Tensor | None
    _kept: int

    @property
    def token_of_row(self) -> torch.Tensor:
        """int64 ``[num_rows]``: source token of each row, -1 on padding rows."""
        return _token_of(self.slot_of_row, self.top_k)

    def row_weights(self, topk_weights: torch.Tensor | None = None) -> torch.Tensor:
        """float32 ``[num_rows]``: the routing weight of the slot each row holds, 0 on padding rows
        (for backends that fold the weight into the GEMM epilogue)."""
        return _row_weights(self, topk_weights)


@dataclass(frozen=True, eq=False)
class MaskedDispatch(_Routed):
    """Result of :func:`dispatch_masked`.

    ``a``: ``[G, max_m, H]``; rows ``m >= masked_m[g]`` of ``a[g]`` are zero (scale 1.0 when quantized).
    ``layout``: :class:`MaskedLayout` with ``masked_m`` int32 ``[G]`` on the device of ``hidden``.
    ``dropped``: number of slots dropped for capacity (always 0 with ``overflow="error"``).
    ``row_of_slot``: int64 ``[T, k]``: flat row ``g * max_m + m`` of slot ``(t, j)``; -1 if the slot
    was skipped (id -1) or dropped. ``slot_of_row``: int64 ``[G, max_m]``, -1 on empty rows.
    """

    a: Hidden
    layout: MaskedLayout
    dropped: int
    row_of_slot: torch.Tensor
    slot_of_row: torch.Tensor
    topk_weights: torch.Tensor | None
    _kept: int

    @property
    def token_of_row(self) -> torch.Tensor:
        """int64 ``[G, max_m]``: source token of each row, -1 on empty rows."""
        return _token_of(self.slot_of_row, self.top_k)

    def row_weights(self, topk_weights: torch.Tensor | None = None) -> torch.Tensor:
        """float32 ``[G, max_m]``: the routing weight of the slot each row holds, 0 on empty rows."""
        return _row_weights(self, topk_weights)


# -- validation ----------------------------------------------------------------------------------


def _check_hidden(hidden: object) -> tuple[torch.Tensor, torch.device]:
    if isinstance(hidden, QuantizedTensor):
        if hidden.data.dim() != 2:
            raise ShapeError("hidden", "a 2-D [T, H] tensor", tuple(hidden.data.shape))
        if hidden.block[0] != 1:
            raise ShapeError(
                "hidden.block", "(1, cols): per-token scales, so rows can move with their scales", hidden.block
            )
        return hidden.data, hidden.device
    if not isinstance(hidden, torch.Tensor):
        raise DTypeError("hidden", "a torch.Tensor or moe_hal.QuantizedTensor [T, H]", type(hidden).__name__)
    if hidden.dim() != 2:
        raise ShapeError("hidden", "a 2-D [T, H] tensor", tuple(hidden.shape))
    return hidden, hidden.device


def _check_routing(
    hidden: Hidden, topk_ids: object, num_experts: object, topk_weights: object
) -> tuple[torch.Tensor, int, int, int]:
    data, device = _check_hidden(hidden)
    if not isinstance(topk_ids, torch.Tensor):
        raise DTypeError("topk_ids", "an int32/int64 tensor [T, k]", type(topk_ids).__name__)
    if topk_ids.dtype not in (torch.int32, torch.int64):
        raise DTypeError("topk_ids", "torch.int32 or torch.int64", topk_ids.dtype)
    if topk_ids.dim() != 2 or topk_ids.shape[0] != data.shape[0] or topk_ids.shape[1] < 1:
        raise ShapeError(
            "topk_ids",
            f"a 2-D [T, k] tensor with T = {data.shape[0]} (rows of hidden) and k >= 1",
            tuple(topk_ids.shape),
        )
    if topk_ids.device != device:
        raise DeviceError("topk_ids", f"device {device} (that of hidden)", topk_ids.device)
    if isinstance(num_experts, bool) or not isinstance(num_experts, int) or num_experts < 0:
        raise ArgumentError("num_experts", "a non-negative int", num_experts)
    if topk_weights is not None:
        _check_weights(topk_weights, topk_ids.shape, device)
    tokens, k = topk_ids.shape
    return topk_ids.reshape(-1).to(torch.int64), tokens, k, num_experts


def _check_weights(topk_weights: object, shape: tuple[int, int] | torch.Size, device: torch.device) -> torch.Tensor:
    if not isinstance(topk_weights, torch.Tensor):
        raise DTypeError("topk_weights", "a floating-point tensor [T, k]", type(topk_weights).__name__)
    if not topk_weights.dtype.is_floating_point:
        raise DTypeError("topk_weights", "a floating-point dtype", topk_weights.dtype)
    if tuple(topk_weights.shape) != tuple(shape):
        raise ShapeError("topk_weights", f"shape {tuple(shape)} (that of topk_ids)", tuple(topk_weights.shape))
    if topk_weights.device != device:
        raise DeviceError("topk_weights", f"device {device} (that of hidden)", topk_weights.device)
    return topk_weights


def _raise_bad_id(flat: torch.Tensor, k: int, num_experts: int) -> None:
    bad = int(torch.nonzero((flat < -1) | (flat >= num_experts))[0])
    raise LayoutError(
        f"topk_ids[{bad // k}, {bad % k}]", f"an expert id in [0, {num_experts}) or -1 (not local)", int(flat[bad])
    )


# -- shared machinery ----------------------------------------------------------------------------


def _sort_slots(flat: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Stable sort of the slots by expert id, and a histogram that also validates the ids.

    Ids are clamped to ``[-2, num_experts]`` first, so one ``bincount`` counts, in order: ids below
    -1 (invalid), skipped slots (-1), each expert, ids >= num_experts (invalid). Returns
    ``(order, key_sorted, bins)``: flat slot indices sorted stably by clamped id (skipped slots
    first), their clamped ids, and the int64 ``[num_experts + 3]`` histogram on the device.
    """
    key = flat.clamp(-2, num_experts)
    bins = torch.bincount(key + 2, minlength=num_experts + 3)
    key_sorted, order = torch.sort(key, stable=True)
    return order, key_sorted, bins


def _read_bins(bins: torch.Tensor, flat: torch.Tensor, k: int, num_experts: int) -> tuple[int, list[int]]:
    """The one host sync: (skipped slots, slots per expert); LayoutError on an invalid id."""
    host = bins.tolist()
    if host[0] or host[-1]:
        _raise_bad_id(flat, k, num_experts)
    return host[1], host[2:-1]


def _token_of(slot_of_row: torch.Tensor, k: int) -> torch.Tensor:
    return torch.where(slot_of_row >= 0, torch.div(slot_of_row, k, rounding_mode="floor"), -1)


def _combine_plan(row_of_slot_flat: torch.Tensor, tokens: int, k: int, kept: int) -> _CombinePlan:
    kept_mask = row_of_slot_flat >= 0
    slots = torch.nonzero_static(kept_mask, size=kept).flatten()
    per_token = kept_mask.view(tokens, k).sum(1)
    offsets = torch.cumsum(per_token, 0) - per_token
    return _CombinePlan(slots, row_of_slot_flat[slots], offsets)


def _resolve_weights(
    d: Dispatch | MaskedDispatch, topk_weights: torch.Tensor | None, device: torch.device
) -> torch.Tensor:
    if topk_weights is None:
        if d.topk_weights is None:
            raise ArgumentError(
                "topk_weights",
                "a [T, k] tensor (here or given to dispatch); pass "
                "torch.ones_like(topk_ids, dtype=...) for an unweighted sum",
                None,
            )
        return d.topk_weights
    return _check_weights(topk_weights, d.row_of_slot.shape, device)


def _row_weights(d: Dispatch | MaskedDispatch, topk_weights: torch.Tensor | None) -> torch.Tensor:
    w = _resolve_weights(d, topk_weights, d.row_of_slot.device).reshape(-1).to(torch.float32)
    if w.numel() == 0:
        return torch.zeros(d.slot_of_row.shape, dtype=torch.float32, device=w.device)
    return torch.where(d.slot_of_row >= 0, w[d.slot_of_row.clamp(min=0)], 0.0)


def _combine(flat_out: torch.Tensor, d: Dispatch | MaskedDispatch, topk_weights: torch.Tensor | None) -> torch.Tensor:
    w = _resolve_weights(d, topk_weights, flat_out.device)
    tokens, n = d.num_tokens, flat_out.shape[1]
    if tokens == 0 or n == 0 or flat_out.shape[0] == 0:
        return flat_out.new_zeros(tokens, n)
    plan = d._plan
    # One fused gather + weighted sum per token (fp32 accumulation on CPU and CUDA); skipped and
    # dropped slots are simply absent from the bag, so garbage in unused rows can never leak in.
    return torch.nn.functional.embedding_bag(
        plan.rows, flat_out, plan.offsets, mode="sum", per_sample_weights=w.reshape(-1)[plan.slots].to(flat_out.dtype)
    )


def _check_out(expert_out: object, shape: tuple[int, ...], what: str, device: torch.device) -> torch.Tensor:
    if not isinstance(expert_out, torch.Tensor):
        raise DTypeError("expert_out", f"a floating-point tensor {what}", type(expert_out).__name__)
    if not expert_out.dtype.is_floating_point or expert_out.dtype.itemsize < 2:
        raise DTypeError(
            "expert_out", "torch.float32, torch.bfloat16, torch.float16 or torch.float64", expert_out.dtype
        )
    if expert_out.dim() != len(shape) + 1 or tuple(expert_out.shape[:-1]) != shape:
        raise ShapeError("expert_out", f"{what} with leading dims {shape}", tuple(expert_out.shape))
    if expert_out.device != device:
        raise DeviceError("expert_out", f"device {device} (that of the dispatch)", expert_out.device)
    return expert_out


# -- public API ----------------------------------------------------------------------------------


def dispatch(
    hidden: Hidden,
    topk_ids: torch.Tensor,
    num_experts: int,
    alignment: int = 128,
    topk_weights: torch.Tensor | None = None,
) -> Dispatch:
    """Group the routed copies of the tokens by expert into the contiguous M-grouped layout.

    ``hidden``: ``[T, H]`` tensor of any dtype, or a :class:`QuantizedTensor` with ``block = (1, c)``
    (per-token scales travel with their rows). ``topk_ids``: int32/int64 ``[T, k]``, values in
    ``[0, num_experts)`` or -1 for a skipped (non-local) slot. ``alignment``: each expert's segment
    starts at a multiple of it (any positive int; 128 is DeepGEMM's default). ``topk_weights``: optional
    ``[T, k]`` floats kept for :func:`combine` and :meth:`Dispatch.row_weights`.

    Expert ``g``'s segment holds its slots in increasing flat slot order ``t * k + j``. Rows that
    belong to no expert (alignment padding) are zero. One host sync (the layout's counts).
    Raises :class:`~moe_hal.errors.LayoutError` for ids outside ``[-1, num_experts)``,
    ShapeError / DTypeError / DeviceError for malformed arguments.
    """
    flat, tokens, k, num_experts = _check_routing(hidden, topk_ids, num_experts, topk_weights)
    device = flat.device
    order, key_sorted, bins = _sort_slots(flat, num_experts)
    skipped, counts = _read_bins(bins, flat, k, num_experts)
    layout = ContiguousLayout.from_counts(counts, alignment=alignment)
    kept = sum(counts)

    # Skipped slots sort first; the next ``kept`` sorted slots are the routed ones, expert-major,
    # and the i-th of them lands on row i + (start[g] - first routed index of g). Both maps are
    # scatters with unique indices (deterministic on every device).
    routed = order[skipped : skipped + kept]
    first_routed = torch.tensor([0] + counts, dtype=torch.int64).cumsum(0)[:num_experts]
    shift = (torch.tensor(layout.starts, dtype=torch.int64) - first_routed).to(device)
    dest = torch.arange(kept, device=device) + shift[key_sorted[skipped : skipped + kept]]
    row_of_slot = torch.full_like(flat, -1).scatter_(0, routed, dest)
    slot_of_row = torch.full((layout.num_rows,), -1, dtype=torch.int64, device=device).scatter_(0, dest, routed)

    source_token = torch.div(slot_of_row, k, rounding_mode="floor").clamp_(min=0)
    empty_rows = torch.nonzero_static(slot_of_row < 0, size=layout.num_rows - kept).flatten()
    a = take_rows(hidden, source_token, empty_rows, filled_rows=dest)
    return Dispatch(a, layout, row_of_slot.view(tokens, k), slot_of_row, topk_weights, kept)


def combine(expert_out: torch.Tensor, d: Dispatch, topk_weights: torch.Tensor | None = None) -> torch.Tensor:
    """Weighted sum of each token's expert outputs: ``y[t] = sum_j w[t, j] * expert_out[row(t, j)]``.

    ``expert_out``: ``[num_rows, N]`` (rows of ``d.a``'s layout; padding rows are never read).
    ``topk_weights``: ``[T, k]``; None uses the weights given to :func:`dispatch`. Skipped slots
    contribute 0; a token with no kept slot gets a zero row. Returns ``[T, N]`` in
    ``expert_out.dtype``. The weights are cast to that dtype (as a fused epilogue would) and the
    ``k`` products are accumulated in fp32 (``torch.nn.functional.embedding_bag``). No host sync.
    """
    if not isinstance(d, Dispatch):
        raise DTypeError("d", "a moe_hal.routing.Dispatch (from dispatch)", type(d).__name__)
    out = _check_out(expert_out, (d.layout.num_rows,), "[num_rows, N]", d.row_of_slot.device)
    return _combine(out, d, topk_weights)


def dispatch_masked(
    hidden: Hidden,
    topk_ids: torch.Tensor,
    num_experts: int,
    max_m: int,
    overflow: str = "error",
    topk_weights: torch.Tensor | None = None,
) -> MaskedDispatch:
    """Group the routed copies of the tokens by expert into the masked layout ``a[G, max_m, H]``.

    Arguments as in :func:`dispatch`; ``max_m`` is the per-expert capacity. Row ``m`` of ``a[g]``
    holds expert ``g``'s ``m``-th slot in flat slot order; rows ``m >= masked_m[g]`` are zero.
    ``overflow``: ``"error"`` (default) raises :class:`~moe_hal.errors.CapacityError` naming the
    first expert with more than ``max_m`` slots and its count; ``"drop"`` keeps each expert's
    first ``max_m`` slots (in the stable order) and reports the number dropped in ``dropped``;
    dropped slots contribute nothing to :func:`combine_masked`. One host sync (validation and
    the dropped count); ``masked_m`` is computed on the device.
    """
    if overflow not in OVERFLOW_POLICIES:
        raise ArgumentError("overflow", f"one of {OVERFLOW_POLICIES}", overflow)
    if isinstance(max_m, bool) or not isinstance(max_m, int) or max_m < 0:
        raise ArgumentError("max_m", "a non-negative int", max_m)
    flat, tokens, k, num_experts = _check_routing(hidden, topk_ids, num_experts, topk_weights)
    device = flat.device
    order, key_sorted, bins = _sort_slots(flat, num_experts)
    skipped, counts_host = _read_bins(bins, flat, k, num_experts)
    over = [g for g, c in enumerate(counts_host) if c > max_m]
    if over and overflow == "error":
        g = over[0]
        raise CapacityError(
            f"expert {g}",
            f"at most max_m = {max_m} routed slots",
            counts_host[g],
            f"{len(over)} expert(s) over capacity; pass overflow='drop' to keep the first {max_m} of each",
        )
    routed_total = sum(counts_host)
    kept = sum(min(c, max_m) for c in counts_host)

    # As in dispatch, the routed slots follow the skipped ones in expert-major order; the m-th slot
    # of expert g goes to row g * max_m + m if m < max_m, else it is dropped.
    routed = order[skipped : skipped + routed_total]
    expert = key_sorted[skipped : skipped + routed_total]
    counts = bins[2:-1]
    first_routed = torch.cumsum(counts, 0) - counts
    rank = torch.arange(routed_total, device=device) - first_routed[expert]
    dest = torch.where(rank < max_m, expert * max_m + rank, -1)
    row_of_slot = torch.full_like(flat, -1).scatter_(0, routed, dest)

    masked_m = counts.clamp(max=max_m).to(torch.int32)
    m = torch.arange(max_m, device=device)
    filled = m[None, :] < masked_m[:, None]  # [G, max_m]
    if routed_total:
        position = (first_routed[:, None] + m[None, :]).clamp_(max=routed_total - 1)
        slot_of_row = torch.where(filled, routed[position], -1)
    else:
        slot_of_row = torch.full(filled.shape, -1, dtype=torch.int64, device=device)

    source_token = torch.div(slot_of_row, k, rounding_mode="floor").clamp_(min=0).reshape(-1)
    filled = filled.reshape(-1)
    empty_rows = torch.nonzero_static(~filled, size=num_experts * max_m - kept).flatten()
    filled_rows = torch.nonzero_static(filled, size=kept).flatten()
    a = _reshape_rows(take_rows(hidden, source_token, empty_rows, filled_rows), (num_experts, max_m))
    layout = MaskedLayout(masked_m, max_m, check=False)  # in range by construction
    return MaskedDispatch(a, layout, routed_total - kept, row_of_slot.view(tokens, k), slot_of_row, topk_weights, kept)


def combine_masked(
    expert_out: torch.Tensor, md: MaskedDispatch, topk_weights: torch.Tensor | None = None
) -> torch.Tensor:
    """:func:`combine` for the masked layout: ``expert_out`` is ``[G, max_m, N]``; rows past
    ``masked_m`` (never written by a masked GEMM) are never read. Returns ``[T, N]``. No host sync."""
    if not isinstance(md, MaskedDispatch):
        raise DTypeError("md", "a moe_hal.routing.MaskedDispatch (from dispatch_masked)", type(md).__name__)
    shape = (md.layout.num_groups, md.layout.max_m)
    out = _check_out(expert_out, shape, "[G, max_m, N]", md.row_of_slot.device)
    return _combine(out.reshape(shape[0] * shape[1], out.shape[-1]), md, topk_weights)


__all__ = [
    "Dispatch",
    "MaskedDispatch",
    "OVERFLOW_POLICIES",
    "combine",
    "combine_masked",
    "dispatch",
    "dispatch_masked",
]
