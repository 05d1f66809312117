"""Expert-parallel dispatch and combine over a ``torch.distributed`` process group.

Pipeline on each rank (``W`` ranks, ``E`` experts, rank ``r`` holds ``L`` of them)::

    [route] -> count slots per expert -> all-gather counts [W, E] -> all-to-all rows (by holder)
            -> arrange into the local experts' layout -> grouped GEMM -> all-to-all back -> combine

A **slot** is one ``(token t, choice j)`` of ``topk_ids [T, k]``; slot ``t * k + j``. Each routed
slot travels as one row to the rank holding its expert (``-1`` slots stay home and contribute 0).
Rows are sent grouped by (holding rank, local expert) and, within that, in slot order, so every
expert's segment on its rank holds its rows ordered by **(source rank, source token, k)** — the
order of a single process that concatenates the ranks' tokens in rank order.

* ``mode="exact"``: the all-gathered count matrix is read on the host (**one host sync**); rows move
  with one uneven all-to-all; ``d.a`` is ``[num_rows, H]`` in a
  :class:`~moe_hal.layouts.ContiguousLayout` over the local experts (segments aligned to
  ``alignment``, padding rows zero).
* ``mode="capacity"``: every (source rank, expert) pair has a fixed ``capacity`` of rows, so all
  sizes are known without reading any count on the host (**no host sync**; shapes static, as CUDA
  graphs need); ``d.a`` is ``[L, W * capacity, H]`` in a :class:`~moe_hal.layouts.MaskedLayout`
  whose ``masked_m`` stays on the device; rows past ``masked_m`` are zero.

Combine returns each token's ``sum_j w[t, j] * out(t, j)`` on its source rank, accumulated in fp32
in the fixed order ``j = 0 .. k-1`` with separate multiply and add (no fused multiply-add whose use
could depend on vector alignment), so the result does not depend on the world size or placement
beyond the GEMM's own rounding, and is bit-identical when the inputs are small integers.

Failure protocol: every rank validates its arguments *before* the first collective; a rank whose
arguments are invalid still joins the count all-gather with an error flag and then raises its own
error, and every other rank raises :class:`~moe_hal.errors.PeerRankError` naming it — nobody waits
in a collective for a rank that has given up. In capacity mode the flag (and the capacity check) is
evaluated with ``torch._assert_async``: on the CPU it raises at once and is turned into the typed
error; on an accelerator it is a device-side assertion that stops the process at its next
synchronisation (the price of no host sync; ``overflow="drop"`` never raises).

Autograd: dispatch's backward is a combine (sum of the k gradient rows, fp32, fixed order) and
combine's backward a dispatch of ``w[t, j] * grad_y[t]`` plus ``grad w[t, j] = <grad_y[t],
out(t, j)>``, in both modes. Backward runs collectives, so every rank must backpropagate through
every dispatch and combine it ran, in the same order (as for any collective in a model).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..errors import (
    ArgumentError,
    DTypeError,
    EPCapacityError,
    PeerRankError,
    ShapeError,
)
from ..layouts import ContiguousLayout, MaskedLayout, _check_alignment
from ..quant import QuantizedTensor
from ..routing import _check_routing, _raise_bad_id
from .group import EPGroup
from .transport import TransportSelection, select

Hidden = torch.Tensor | QuantizedTensor
OVERFLOW_POLICIES = ("error", "drop")

# Columns after the E per-expert counts in each rank's row of the all-gathered matrix.
_BAD_IDS, _STATUS = 0, 1  # offsets: ids outside [-1, E); 1 when the rank's arguments are invalid


@dataclass(frozen=True, eq=False)
class _Maps:
    """Where every row goes, as gathers. ``S`` send rows (grouped by destination rank), ``R``
    received rows (grouped by source rank), the local layout's rows.

    Every received buffer carries one extra zero row at its end (row ``R``, resp. ``S`` on the way
    back); a destination that must be empty (padding rows of ``a``, slots not sent) points there,
    so one plain gather fills it — no masking pass. An empty *source* row (a send row no slot fills,
    a received row no expert row uses) is never read on the other side, so its index is merely
    clamped into range and it travels as whatever row that is."""

    token_of_send_row: torch.Tensor  # int64 [S]: source token of each send row (clamped where empty)
    slot_of_send_row: torch.Tensor  # int64 [S]: flat slot t*k+j of each send row (clamped where empty)
    send_row_of_slot: torch.Tensor  # int64 [T*k]: send row of each slot; S (the zero row) if not sent
    recv_of_row: torch.Tensor  # int64 [layout rows]: received row placed there; R on padding
    row_of_recv: torch.Tensor  # int64 [R]: layout row of each received row (clamped where empty)
    kept_slots: torch.Tensor | None  # bool [T, k]: slots that were sent; None when all were
    send_splits: list[int]  # rows to each rank
    recv_splits: list[int]  # rows from each rank


@dataclass(frozen=True, eq=False)
class EPDispatch:
    """Result of :func:`dispatch`; feed ``moe_hal.grouped_gemm(d.a, w_local, d.layout)`` and pass
    its output to :func:`combine`.

    ``a``: exact mode ``[num_rows, H]``, capacity mode ``[L, W * capacity, H]``; dtype of ``x``
    (a :class:`~moe_hal.QuantizedTensor` with its per-row scales when ``x`` was one; padding rows
    have data 0 and scale 1.0). ``layout``: :class:`~moe_hal.ContiguousLayout` or
    :class:`~moe_hal.MaskedLayout` over ``group.local_experts``. ``mode``, ``group``,
    ``transport`` (name of the transport used), ``topk_weights`` (as given).
    ``send_counts`` / ``recv_counts``: int64 ``[W]`` on the device of ``x``: rows sent to / received
    from each rank (capacity mode: kept rows). ``dropped``: int64 0-dim device tensor, this rank's
    slots dropped for capacity (always 0 unless ``overflow="drop"``; read it when convenient).
    """

    a: Hidden
    layout: ContiguousLayout | MaskedLayout
    mode: str
    group: EPGroup
    transport: str
    topk_weights: torch.Tensor | None
    send_counts: torch.Tensor
    recv_counts: torch.Tensor
    dropped: torch.Tensor
    num_tokens: int
    top_k: int
    _maps: _Maps
    _selection: TransportSelection


# -- row movement --------------------------------------------------------------------------------


def _words(t: torch.Tensor) -> torch.Tensor:
    """``t``'s rows as a 2-D view of the widest integer type dividing the row's bytes: gathers then
    move whole words (several times faster than bf16 element gathers on the CPU)."""
    nbytes = math.prod(t.shape[1:]) * t.element_size()
    raw = t.contiguous().view(torch.uint8).reshape(t.shape[0], nbytes)
    for word in (torch.int64, torch.int32, torch.int16):
        if nbytes % word.itemsize == 0:
            return raw.view(word)
    return raw


def _take(src: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``src[index]`` along dim 0 (every index in range), same dtype and trailing shape."""
    if index.shape[0] == 0 or src.shape[0] == 0:  # src empty: every index is an unread row
        return src.new_zeros(index.shape[0], *src.shape[1:])
    rows = _words(src).index_select(0, index)
    return rows.view(torch.uint8).view(src.dtype).reshape(index.shape[0], *src.shape[1:])


def _take_hidden(x: Hidden, index: torch.Tensor) -> Hidden:
    if isinstance(x, QuantizedTensor):
        return QuantizedTensor(_take(x.data, index), _take(x.scale, index), x.block, x.scale_format)
    return _take(x, index)


def _exchange(
    sel: TransportSelection, group: EPGroup, parts: list[torch.Tensor], send_splits: list[int], recv_splits: list[int]
) -> list[torch.Tensor]:
    """All-to-all of row tensors that share their row count, as one buffer of byte rows; each
    returned tensor has one extra zero row at the end (see :class:`_Maps`)."""
    rows = parts[0].shape[0]
    views = [p.contiguous().view(torch.uint8).reshape(rows, math.prod(p.shape[1:]) * p.element_size()) for p in parts]
    send = views[0] if len(views) == 1 else torch.cat(views, dim=1)
    received = sum(recv_splits)
    recv = send.new_empty(received + 1, send.shape[1])
    recv[received].zero_()
    sel.transport.all_to_all(recv[:received], send, recv_splits, send_splits, group.process_group)
    out, col = [], 0
    for p, v in zip(parts, views):
        chunk = recv if len(views) == 1 else recv[:, col : col + v.shape[1]].contiguous()
        col += v.shape[1]
        out.append(chunk.view(p.dtype).reshape(received + 1, *p.shape[1:]))
    return out


def _sum_slots(per_slot: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    """fp32 ``[T, C]``: ``sum_j weights[:, j] * per_slot[:, j]`` in the order j = 0 .. k-1, with a
    separate multiply and add per term (bit-reproducible whatever T and the placement). ``weights``
    is fp32, so each product is computed in fp32 (type promotion) without a separate cast pass."""
    T, k, C = per_slot.shape
    if k == 0:
        return per_slot.new_zeros(T, C, dtype=torch.float32)
    first = per_slot[:, 0]
    acc = first * weights[:, 0:1] if weights is not None else first.to(torch.float32, copy=True)
    for j in range(1, k):
        acc.add_(per_slot[:, j] * weights[:, j : j + 1] if weights is not None else per_slot[:, j])
    return acc


def _to_experts(d: EPDispatch, send: list[torch.Tensor]) -> list[torch.Tensor]:
    """Send rows -> rows of the local layout (the forward direction)."""
    m = d._maps
    return _exchange(d._selection, d.group, send, m.send_splits, m.recv_splits)


def _from_experts(d: EPDispatch, flat: torch.Tensor) -> torch.Tensor:
    """Rows of the local layout ``[layout rows, C]`` -> per-slot rows ``[T, k, C]`` on the source
    rank (zeros for slots not sent); the backward direction."""
    m = d._maps
    (ret,) = _exchange(d._selection, d.group, [_take(flat, m.row_of_recv)], m.recv_splits, m.send_splits)
    return _take(ret, m.send_row_of_slot).view(d.num_tokens, d.top_k, ret.shape[1])


def _layout_rows(d: EPDispatch) -> tuple[int, ...]:
    if d.mode == "exact":
        return (d.layout.num_rows,)
    return (d.layout.num_groups, d.layout.max_m)


def _arrange(d: EPDispatch, recv: torch.Tensor) -> torch.Tensor:
    """Received rows (with their trailing zero row) -> the local layout; padding rows are zero."""
    return _take(recv, d._maps.recv_of_row).view(*_layout_rows(d), *recv.shape[1:])


class _DispatchRows(torch.autograd.Function):
    """x ``[T, H]`` -> ``a`` in the local layout; backward: sum of each token's k gradient rows."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, d: EPDispatch) -> torch.Tensor:
        ctx.d = d
        send = _take(x, d._maps.token_of_send_row)
        (recv,) = _to_experts(d, [send])
        return _arrange(d, recv)

    @staticmethod
    def backward(ctx, grad_a: torch.Tensor):
        d = ctx.d
        per_slot = _from_experts(d, grad_a.reshape(-1, grad_a.shape[-1]))  # copies an expanded zero
        return _sum_slots(per_slot, None).to(grad_a.dtype), None


class _CombineRows(torch.autograd.Function):
    """(expert_out in the local layout, topk_weights ``[T, k]``) -> y ``[T, N]`` on the source rank.

    ``anchor`` is the dispatch's ``a`` when it is differentiable: combine's backward hands it a zero
    gradient, so the dispatch's backward (a collective) runs on *every* rank even where the GEMM
    between them left the graph (a rank whose experts received no row may get an output that does
    not depend on ``a``) — otherwise the other ranks would wait in it forever."""

    @staticmethod
    def forward(
        ctx, expert_out: torch.Tensor, weights: torch.Tensor, anchor: torch.Tensor | None, d: EPDispatch
    ) -> torch.Tensor:
        per_slot = _from_experts(d, expert_out.reshape(-1, expert_out.shape[-1]))
        w = weights.to(torch.float32)
        if d._maps.kept_slots is not None:
            w = torch.where(d._maps.kept_slots, w, 0.0)
        ctx.save_for_backward(per_slot, w)
        ctx.d, ctx.out_shape, ctx.out_dtype, ctx.w_dtype = d, expert_out.shape, expert_out.dtype, weights.dtype
        ctx.anchor = None if anchor is None else (anchor.shape, anchor.dtype, anchor.device)
        return _sum_slots(per_slot, w).to(expert_out.dtype)

    @staticmethod
    def backward(ctx, grad_y: torch.Tensor):
        per_slot, w = ctx.saved_tensors
        d, m = ctx.d, ctx.d._maps
        g = grad_y.to(torch.float32)
        grad_w = (per_slot.to(torch.float32) * g[:, None, :]).sum(-1).to(ctx.w_dtype)
        # Row of slot s = w[s] * grad_y[token(s)], sent the way dispatch sent x.
        send = _take(g, m.token_of_send_row) * _take(w.reshape(-1, 1), m.slot_of_send_row)
        (recv,) = _to_experts(d, [send.to(ctx.out_dtype)])
        grad_out = _arrange(d, recv).view(ctx.out_shape)
        grad_anchor = None
        if ctx.anchor is not None:
            shape, dtype, device = ctx.anchor
            grad_anchor = torch.zeros((), dtype=dtype, device=device).expand(shape)
        return grad_out, grad_w, grad_anchor, None


# -- planning ------------------------------------------------------------------------------------


def _check_args(x, topk_ids, topk_weights, group, mode, alignment, capacity, overflow):
    if mode not in ("exact", "capacity"):
        raise ArgumentError("mode", "'exact' or 'capacity'", mode)
    if overflow not in OVERFLOW_POLICIES:
        raise ArgumentError("overflow", f"one of {OVERFLOW_POLICIES}", overflow)
    if mode == "exact":
        _check_alignment(alignment)
        if capacity is not None:
            raise ArgumentError("capacity", "None in mode='exact' (rows are sized by the counts)", capacity)
    elif isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 0:
        raise ArgumentError(
            "capacity", "a non-negative int (rows per source rank and expert) in mode='capacity'", capacity
        )
    flat, tokens, k, _ = _check_routing(x, topk_ids, group.num_experts, topk_weights)
    return flat, tokens, k


def _slot_keys(flat: torch.Tensor, group: EPGroup) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each slot's expert position (E for skipped/invalid), this rank's row of the count matrix
    (per-position counts, invalid ids, status 0) and the stable sort of slots by position."""
    E = group.num_experts
    routed = (flat >= 0) & (flat < E)
    key = torch.where(routed, group.positions(flat.device)[flat.clamp(0, E - 1)], E)
    # scatter_add instead of bincount: bincount sizes its output from the data (a host sync).
    row = torch.zeros(E + 3, dtype=torch.int64, device=flat.device)
    row.scatter_add_(0, key, torch.ones_like(key))
    row[E + 1 + _BAD_IDS] = ((flat < -1) | (flat >= E)).sum()
    row = torch.cat([row[:E], row[E + 1 :]])  # drop the skipped-slot bin
    order = torch.sort(key, stable=True).indices
    return key, row, order


def _failed_ranks(host: list[list[int]], E: int) -> list[int]:
    return [s for s, row in enumerate(host) if row[E + _BAD_IDS] or row[E + _STATUS]]


def _raise_for_counts(host: list[list[int]], group: EPGroup, flat: torch.Tensor, k: int, capacity: int | None) -> None:
    """The error path: invalid ids (this rank's, or a peer's), then capacity (first source rank,
    then lowest expert id)."""
    E = group.num_experts
    failed = _failed_ranks(host, E)
    if group.rank in failed:
        _raise_bad_id(flat, k, E)
    if failed:
        raise PeerRankError("moe_hal.ep.dispatch", failed, "invalid arguments or expert ids")
    if capacity is None:
        return
    over = [(s, e) for s in range(group.world_size) for e in range(E) if host[s][group.expert_position[e]] > capacity]
    if over:
        s, e = over[0]
        raise EPCapacityError(
            e,
            s,
            group.placement[e],
            host[s][group.expert_position[e]],
            capacity,
            f"{len(over)} (source rank, expert) pair(s) over capacity; overflow='drop' keeps "
            f"the first {capacity} slots of each",
        )


def _exact_maps(
    host: list[list[int]], group: EPGroup, order: torch.Tensor, k: int, alignment: int
) -> tuple[_Maps, ContiguousLayout]:
    W, r, ps = group.world_size, group.rank, group.position_start
    device = order.device
    sent = sum(host[r][: group.num_experts])
    send_splits = [sum(host[r][ps[d] : ps[d + 1]]) for d in range(W)]
    blocks = [[host[s][ps[r] + lo] for lo in range(group.num_local_experts)] for s in range(W)]
    layout = ContiguousLayout.from_counts([sum(col) for col in zip(*blocks)] if blocks[0] else [], alignment=alignment)
    recv_splits = [sum(b) for b in blocks]
    shifts, sizes, recv_at, before = [], [], 0, [0] * group.num_local_experts
    for s in range(W):
        for lo, n in enumerate(blocks[s]):
            shifts.append(layout.starts[lo] + before[lo] - recv_at)
            sizes.append(n)
            before[lo] += n
            recv_at += n
    received = recv_at
    ar = torch.arange(received, device=device)
    row_of_recv = (
        torch.repeat_interleave(
            torch.tensor(shifts, dtype=torch.int64, device=device),
            torch.tensor(sizes, dtype=torch.int64, device=device),
            output_size=received,
        )
        + ar
        if received
        else ar
    )
    recv_of_row = torch.full((layout.num_rows,), received, dtype=torch.int64, device=device).scatter_(
        0, row_of_recv, ar
    )
    slot_of_send_row = order[:sent]
    send_row_of_slot = torch.full_like(order, sent).scatter_(0, slot_of_send_row, torch.arange(sent, device=device))
    kept = None if sent == order.shape[0] else (send_row_of_slot < sent).view(-1, k)
    maps = _Maps(
        torch.div(slot_of_send_row, k, rounding_mode="floor"),
        slot_of_send_row,
        send_row_of_slot,
        recv_of_row,
        row_of_recv,
        kept,
        send_splits,
        recv_splits,
    )
    return maps, layout


def _capacity_maps(
    gathered: torch.Tensor,
    row: torch.Tensor,
    key: torch.Tensor,
    order: torch.Tensor,
    group: EPGroup,
    k: int,
    capacity: int,
) -> tuple[_Maps, MaskedLayout]:
    """All on the device: no count is read on the host."""
    W, r, E, L = group.world_size, group.rank, group.num_experts, group.num_local_experts
    ps, cap, device = group.position_start, capacity, order.device
    n_slots = order.shape[0]
    counts = row[:E]
    first = torch.cumsum(counts, 0) - counts  # first sorted index per position
    # Send side: row p * cap + m holds the m-th slot (slot order) routed to position p, if m < cap.
    key_sorted = key[order]
    routed_sorted = key_sorted < E
    m_sorted = torch.arange(n_slots, device=device) - first[key_sorted.clamp(max=E - 1)]
    send_sorted = torch.where(routed_sorted & (m_sorted < cap), key_sorted * cap + m_sorted, E * cap)
    send_row_of_slot = torch.empty_like(order).scatter_(0, order, send_sorted)
    m = torch.arange(cap, device=device)
    if n_slots:
        at = (first[:, None] + m[None, :]).clamp_(max=n_slots - 1)
        slot_of_send_row = order[at].reshape(-1)  # rows past a position's count: unread
    else:
        slot_of_send_row = torch.zeros(E * cap, dtype=torch.int64, device=device)
    token_of_send_row = torch.div(slot_of_send_row, k, rounding_mode="floor")
    # Receive side: [W, L, cap] rows; source s's kept rows for local expert l go after those of s' < s.
    kept = gathered[:, ps[r] : ps[r] + L].clamp(max=cap)  # [W, L]
    before = torch.cumsum(kept, 0) - kept
    max_m = W * cap
    # Rows m >= kept[s, l] are unused; their index stays in range (an unread row of the output).
    row_of_recv = (
        torch.arange(L, device=device)[None, :, None] * max_m
        + (before[:, :, None] + m[None, None, :]).clamp(max=max(max_m - 1, 0))
    ).reshape(-1)
    masked_m = kept.sum(0)
    if L and max_m:
        i = torch.arange(max_m, device=device).expand(L, max_m).contiguous()
        ends = torch.cumsum(kept, 0).t().contiguous()  # [L, W] inclusive ends
        src = torch.searchsorted(ends, i, right=True).clamp_(max=W - 1)  # source rank of row i
        within = i - before.t().gather(1, src)
        recv = (src * L + torch.arange(L, device=device)[:, None]) * cap + within
        recv_of_row = torch.where(i < masked_m[:, None], recv, W * L * cap).reshape(-1)
    else:
        recv_of_row = torch.full((L * max_m,), W * L * cap, dtype=torch.int64, device=device)
    sizes = [(ps[d + 1] - ps[d]) * cap for d in range(W)]
    kept_slots = (send_row_of_slot < E * cap).view(-1, k)
    maps = _Maps(
        token_of_send_row,
        slot_of_send_row,
        send_row_of_slot,
        recv_of_row,
        row_of_recv,
        kept_slots,
        sizes,
        [L * cap] * W,
    )
    return maps, MaskedLayout(masked_m.to(torch.int32), max_m, check=False)


def _gather_counts(sel: TransportSelection, group: EPGroup, row: torch.Tensor) -> torch.Tensor:
    out = row.new_empty(group.world_size * row.shape[0])
    sel.transport.all_gather(out, row, group.process_group)
    return out.view(group.world_size, row.shape[0])


# -- public API ----------------------------------------------------------------------------------


def dispatch(
    x: Hidden,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor | None,
    group: EPGroup,
    mode: str = "exact",
    alignment: int = 128,
    capacity: int | None = None,
    *,
    overflow: str = "error",
    transport: str | None = None,
) -> EPDispatch:
    """Send each routed copy of this rank's tokens to the rank holding its expert.

    ``x``: ``[T, H]`` tensor (any float dtype; differentiable) or :class:`~moe_hal.QuantizedTensor`
    with per-token scales (``block = (1, c)``; its fp8 bytes and fp32 scales travel as byte rows).
    ``topk_ids``: int32/int64 ``[T, k]`` global expert ids, ``-1`` for no expert. ``topk_weights``:
    ``[T, k]`` floats (differentiable) used by :func:`combine`, or None for an unweighted sum.
    ``group``: the :class:`~moe_hal.ep.EPGroup`. ``mode``: ``"exact"`` (``alignment`` per expert
    segment) or ``"capacity"`` (``capacity`` rows per (source rank, expert), required).
    ``overflow`` (capacity mode): ``"error"`` raises :class:`~moe_hal.errors.EPCapacityError` on
    every rank (expert, source rank, count, capacity); ``"drop"`` keeps the first ``capacity`` slots
    of each (source rank, expert) in slot order and reports this rank's dropped slots in
    ``d.dropped``. ``transport``: force a transport by name (see :func:`moe_hal.ep.select`).

    Every rank of the group must call it with the same ``mode``/``alignment``/``capacity`` and the
    same ``H`` and dtype (``T`` may differ, 0 included). See the module docstring for ordering,
    host syncs and the failure protocol.
    """
    if not isinstance(group, EPGroup):  # without a group there is nobody to tell
        raise DTypeError("group", "a moe_hal.ep.EPGroup", type(group).__name__)
    graph = isinstance(x, torch.Tensor) and x.device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    sel = select(group, mode if mode in ("exact", "capacity") else "exact", graph=graph, transport=transport)
    local_error: Exception | None = None
    try:
        flat, tokens, k = _check_args(x, topk_ids, topk_weights, group, mode, alignment, capacity, overflow)
        key, row, order = _slot_keys(flat, group)
    except ArgumentError as exc:  # join the count exchange with an error flag, then raise
        local_error = exc
        device = x.device if isinstance(x, (torch.Tensor, QuantizedTensor)) else torch.device("cpu")
        row = torch.zeros(group.num_experts + 2, dtype=torch.int64, device=device)
        row[group.num_experts + _STATUS] = 1
    gathered = _gather_counts(sel, group, row)
    if local_error is not None:
        raise local_error
    E = group.num_experts
    if mode == "exact":
        host = gathered.tolist()  # the one host sync
        _raise_for_counts(host, group, flat, k, None)
        maps, layout = _exact_maps(host, group, order, k, alignment)
        dropped = torch.zeros((), dtype=torch.int64, device=flat.device)
    else:
        ok = (gathered[:, E:] == 0).all()
        if overflow == "error":
            ok = ok & (gathered[:, :E] <= capacity).all()
        try:
            torch._assert_async(ok)  # device-side on accelerators
        except RuntimeError:
            _raise_for_counts(gathered.tolist(), group, flat, k, capacity if overflow == "error" else None)
            raise
        maps, layout = _capacity_maps(gathered[:, :E], row, key, order, group, k, capacity)
        dropped = (row[:E] - row[:E].clamp(max=capacity)).sum()
    if mode == "exact":
        send_counts = torch.tensor(maps.send_splits, device=flat.device)
        recv_counts = torch.tensor(maps.recv_splits, device=flat.device)
    else:
        ps, r = group.position_start, group.rank
        kept = gathered[:, :E].clamp(max=capacity)  # [W, E] rows kept per (source, position)
        send_counts = torch.stack([kept[r, ps[t] : ps[t + 1]].sum() for t in range(group.world_size)])
        recv_counts = kept[:, ps[r] : ps[r + 1]].sum(1)
    d = EPDispatch(
        None, layout, mode, group, sel.name, topk_weights, send_counts, recv_counts, dropped, tokens, k, maps, sel
    )
    if isinstance(x, QuantizedTensor):
        send = _take_hidden(x, maps.token_of_send_row)
        data, scale = _to_experts(d, [send.data.view(torch.uint8), send.scale])
        padding = (maps.recv_of_row == data.shape[0] - 1).view(*_layout_rows(d), 1)
        a = QuantizedTensor(
            _arrange(d, data).view(torch.float8_e4m3fn),
            _arrange(d, scale).masked_fill_(padding, 1.0),
            x.block,
            x.scale_format,
        )
    else:
        a = _DispatchRows.apply(x, d)
    object.__setattr__(d, "a", a)
    return d


def combine(expert_out: torch.Tensor, d: EPDispatch) -> torch.Tensor:
    """``y[t] = sum_j topk_weights[t, j] * expert_out[row of (t, j)]`` on the token's source rank.

    ``expert_out``: the grouped GEMM's output in ``d.layout`` — ``[num_rows, N]`` (exact) or
    ``[L, max_m, N]`` (capacity; rows past ``masked_m`` are never read). Returns ``[T, N]`` in
    ``expert_out.dtype``; skipped and dropped slots contribute 0. Differentiable in ``expert_out``
    and in the ``topk_weights`` given to :func:`dispatch`. Every rank must call it.
    """
    if not isinstance(d, EPDispatch):
        raise DTypeError("d", "a moe_hal.ep.EPDispatch (from moe_hal.ep.dispatch)", type(d).__name__)
    if not isinstance(expert_out, torch.Tensor) or not expert_out.dtype.is_floating_point:
        got = expert_out.dtype if isinstance(expert_out, torch.Tensor) else type(expert_out).__name__
        raise DTypeError("expert_out", "a floating-point tensor", got)
    lead = _layout_rows(d)
    if expert_out.dim() != len(lead) + 1 or tuple(expert_out.shape[:-1]) != lead:
        raise ShapeError("expert_out", f"a tensor with leading dims {lead} (those of d.a)", tuple(expert_out.shape))
    weights = d.topk_weights
    if weights is None:
        weights = torch.ones(d.num_tokens, d.top_k, dtype=torch.float32, device=expert_out.device)
    anchor = d.a if isinstance(d.a, torch.Tensor) and d.a.requires_grad else None
    return _CombineRows.apply(expert_out, weights, anchor, d)


__all__ = ["OVERFLOW_POLICIES", "EPDispatch", "combine", "dispatch"]
