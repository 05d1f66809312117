"""Expert-parallel dispatch and combine over a ``torch.distributed`` process group.

Pipeline on each rank (``W`` ranks, ``E`` experts, rank ``r`` holds ``L`` of them)::

    [route] -> count slots per expert -> all-gather counts [W, E] -> all-to-all rows to the experts
            -> grouped GEMM -> status all-gather -> all-to-all rows back -> weighted sum (combine)

A **slot** is one ``(token t, choice j)`` of ``topk_ids [T, k]``; slot ``t * k + j``. Each routed
slot travels as one row to the rank holding its expert (``-1`` slots stay home and contribute 0).
Every expert's segment on its rank holds its rows ordered by **(source rank, source token, k)** —
the order of a single process that concatenates the ranks' tokens in rank order.

* ``mode="exact"``: the all-gathered count matrix is read on the host (**one host sync**). The
  rows for other ranks move with **one** uneven all-to-all per direction (each collective has a
  fixed cost, which on gloo is worth several MiB of copying). Dispatch sends each token **once**
  to each other rank holding any of its experts (not once per routed slot, as DeepEP's dispatch),
  followed by its k layout rows there, which the sender computes from the count matrix (it gives
  every rank's layout); the receiver copies each token row, and each of its own tokens, into
  every layout row it fills with one gather. Rows that differ from slot to slot (combine's, and
  both backwards) travel one per slot: the send rows are ordered (destination rank, its local
  expert, slot), so what a rank receives is ordered (source rank, local expert, slot) and is put
  into (local expert, source rank, slot) order by one gather; on the way back one gather takes
  the rows out of the expert output in that order. Rows a rank routes to its own experts never
  enter the all-to-all: they join the received rows on the rank (:class:`_Maps`). Every row
  movement is one op however many experts and ranks there are — an accelerator launches about
  one kernel per op — so a dispatch + combine runs a fixed number of ops. ``d.a`` is
  ``[num_rows, H]`` in a :class:`~moe_hal.layouts.ContiguousLayout` over the local experts
  (segments aligned to ``alignment``, padding rows zero) — right for the large messages of
  training and prefill.
* ``mode="capacity"``: every (source rank, expert) pair has a fixed ``capacity`` of rows, so all
  sizes are known without reading any count on the host (**no host sync**; shapes static, as CUDA
  graphs need); the fixed blocks for other ranks move with one all-to-all (a rank's blocks for its
  own experts are gathered straight into the receive buffer, and back straight into the returned
  rows) and are packed into ``d.a`` ``[L, W * capacity, H]`` — a
  :class:`~moe_hal.layouts.MaskedLayout` whose ``masked_m`` stays on the device; rows past
  ``masked_m`` are zero — by one gather on the device (and unpacked by one on the way back).

Rows in flight between two collectives live in the group's scratch buffers
(:meth:`EPGroup.scratch`); everything returned (``d.a``, combine's output, gradients) is fresh.

Combine returns each token's ``sum_j w[t, j] * out(t, j)`` on its source rank, accumulated in fp32
(fp64 for float64 rows: :func:`moe_hal.dtypes.accumulation_dtype`) in the fixed order ``j = 0 .. k-1`` with
separate multiply and add (no fused multiply-add whose use could depend on vector alignment), so
the result does not depend on the world size or placement beyond the GEMM's own rounding, and is
bit-identical when the inputs are small integers. It gathers
the returned rows token chunk by token chunk (on the CPU), so the fp32 terms stay in cache.

Failure protocol: every rank validates its arguments *before* the first collective of dispatch and
of combine; a rank whose arguments are invalid still joins that call's first all-gather (dispatch's
counts, combine's status flags) with an error flag and then raises its own error, and every other
rank raises :class:`~moe_hal.errors.PeerRankError` naming it — nobody waits in a collective for a
rank that has given up. Where the flags (and capacity mode's capacity check) may not be read on the
host — capacity mode, and combine in both modes — they are checked with ``torch._assert_async``: on
the CPU, where the values already are on the host, it raises at once and the typed error
(:class:`~moe_hal.errors.EPCapacityError`, ``PeerRankError``) is raised in its place; on an
accelerator it is a device-side assertion that stops the process at its next synchronisation with
a message naming the check but no typed error (raising one there needs the host sync these paths
avoid). ``overflow="drop"`` never raises.

Autograd: dispatch's backward is a combine (sum of the k gradient rows, same accumulation dtype,
fixed order) and combine's backward a dispatch of ``w[t, j] * grad_y[t]`` plus ``grad w[t, j] =
<grad_y[t], out(t, j)>``, in both modes. Backward runs collectives, so every rank must
backpropagate through every dispatch and combine it ran, in the same order (as for any collective
in a model).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..dtypes import accumulation_dtype
from ..errors import (
    ArgumentError,
    DTypeError,
    EPCapacityError,
    PeerRankError,
    ShapeError,
)
from ..layouts import ContiguousLayout, MaskedLayout, _check_alignment, _segment_rows
from ..quant import QuantizedTensor
from ..routing import _check_routing, _raise_bad_id
from .group import EPGroup
from .transport import Pending, TransportSelection, select

Hidden = torch.Tensor | QuantizedTensor
OVERFLOW_POLICIES = ("error", "drop")

# Columns after the E per-expert counts in each rank's row of the all-gathered matrix.
_BAD_IDS, _STATUS = 0, 1  # offsets: ids outside [-1, E); 1 when the rank's arguments are invalid
_CALL = 2  # offset of the 4 columns stating the call (:func:`_describe_call`)
_ROW = 6  # offset of the 4 columns describing the rank's x row (:func:`_describe_row`)
_TOKENS = 10  # offset of W columns: this rank's tokens with at least one expert on each rank

#: every dtype of torch, numbered for the status exchanges (the same torch on every rank)
_DTYPES = tuple(dict.fromkeys(t for t in vars(torch).values() if isinstance(t, torch.dtype)))
#: added to a row's dtype number when x is a QuantizedTensor (more than torch has dtypes)
_QUANTIZED_KIND = 256


@dataclass(frozen=True, eq=False)
class _Maps:
    """Where every row goes. ``S`` send rows; the rows coming back from the experts land in the same
    order (row ``s`` of the returned buffer is send row ``s``), followed by one zero row (row ``S``)
    that every slot not sent points to, so one plain gather reads every slot.

    Both modes send rows ``[0, remote_sent)`` to the other ranks with one all-to-all; this rank's
    own rows, ``[remote_sent, S)``, never enter it (send rows are in :attr:`EPGroup.send_block`
    order). On the experts' side the rows received from the other ranks, then this rank's own rows
    (the send rows' tail, in the same order), then one zero row are the *arrivals*: ``recv_of_row``
    gives the arrival each layout row holds (the zero row on padding), ``row_of_recv`` the layout
    row of each arrival, so rows move between the arrivals and the layout with one gather each
    way, however many experts and ranks there are (an accelerator runs one kernel per op, where a
    copy per (rank, expert) block would launch thousands). Exact mode's dispatch of ``x`` is the
    exception: its rows for other ranks travel as token rows (``token_*``). Capacity mode moves
    fixed blocks (``capacity`` rows per (rank, expert)): an empty *source* row (a send row no slot
    fills, a received row no expert row uses) is never read on the other side, so its index is
    merely clamped into range."""

    send_token: torch.Tensor  # int64 [S]: source token of each send row (clamped where empty)
    send_slot: torch.Tensor  # int64 [S]: flat slot t*k+j of each send row (clamped where empty)
    slot_row: torch.Tensor  # int64 [T, k]: send row of each slot; S (the zero row) if not sent
    kept_slots: torch.Tensor | None  # bool [T, k]: slots that were sent; None when all were
    recv_of_row: torch.Tensor  # int64 [layout rows]: the arrival placed there; A (the zero row) on padding
    row_of_recv: torch.Tensor  # int64 [A]: layout row of each arrival (clamped where capacity leaves it empty)
    remote_sent: int = 0  # send rows [0, remote_sent) go to other ranks
    exchange: bool = False  # the all-to-all runs (decided alike on every rank)
    # exact mode, the dispatch of x: each token travels once to each other rank holding any of its
    # experts (token rows, in destination rank then token order), with its k layout rows there
    token_send: torch.Tensor | None = None  # int64 [token rows]: source token of each
    token_rows: torch.Tensor | None = None  # int64 [token rows, k]: layout row on the destination; -1 elsewhere
    token_send_counts: tuple[int, ...] = ()  # token rows to each rank (0 for this rank)
    token_recv_counts: tuple[int, ...] = ()  # token rows from each rank (0 for this rank)
    # rows to / from each rank in the all-to-all (0 for this rank)
    send_splits: tuple[int, ...] = ()
    recv_splits: tuple[int, ...] = ()


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
    ``dispatch_rows``: (sent, received) host ints ``[W]``, rows of ``x``'s byte width that dispatch's
    all-to-all moved to / from each rank (0 for this rank, whose rows bypass it): exact mode, each
    token once per rank holding any of its experts plus the rows carrying their layout rows there;
    capacity mode, the fixed blocks. Combine's all-to-all moves ``recv_counts`` / ``send_counts``
    rows of the expert output's width (one per routed slot).
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
    dispatch_rows: tuple[tuple[int, ...], tuple[int, ...]]
    num_tokens: int
    top_k: int
    _maps: _Maps
    _selection: TransportSelection


# -- row movement --------------------------------------------------------------------------------
#
# Every payload travels as byte rows (bf16, fp32, fp8 data and its fp32 scales alike). Rows in
# flight between two collectives live in the group's scratch buffers; what is returned to the
# caller (``a``, ``y``, gradients) is always freshly allocated.


def _byte_rows(t: torch.Tensor) -> torch.Tensor:
    """``t``'s rows as a 2-D uint8 view ``[rows, row bytes]`` (a copy only if ``t`` is not contiguous)."""
    if t.dim() and t.stride(-1) != 1:
        # is_contiguous() ignores the strides of size-1 dims (a [T, 1] column of a transposed
        # tensor is "contiguous"), but view(torch.uint8) needs a unit last stride.
        t = t.clone(memory_format=torch.contiguous_format)
    return t.contiguous().view(torch.uint8).reshape(t.shape[0], math.prod(t.shape[1:]) * t.element_size())


def _words(rows: torch.Tensor) -> torch.Tensor:
    """Contiguous byte rows as the widest integer words dividing the row: gathers then move whole
    words (several times faster than byte or bf16 element gathers on the CPU)."""
    for word in (torch.int64, torch.int32, torch.int16):
        if rows.shape[1] % word.itemsize == 0:
            return rows.view(word)
    return rows


def _gather_into(out: torch.Tensor, src: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``out[i] = src[index[i]]`` for byte rows (every index in range), written in place."""
    if out.shape[0] and src.shape[0]:
        torch.index_select(_words(src), 0, index, out=_words(out))
    elif out.shape[0]:  # src empty: every index is an unread row
        out.zero_()
    return out


def _pick(src: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``src[index]`` along dim 0; zeros when ``src`` has no row (then every index is an unread row)."""
    if src.shape[0] == 0:
        return src.new_zeros(index.shape[0], *src.shape[1:])
    return src.index_select(0, index)


def _rows_buffer(d: EPDispatch, role: str, rows: int, width: int, device: torch.device, keep: bool) -> torch.Tensor:
    """``[rows, width]`` uint8: the group's scratch buffer for ``role``, or a fresh one to ``keep``."""
    if keep:
        return torch.empty(rows, width, dtype=torch.uint8, device=device)
    return d.group.scratch(role, rows * width, device).view(rows, width)


def _start_all_to_all(d: EPDispatch, out, inp, out_splits, in_splits) -> Pending:
    return d._selection.transport.start_all_to_all(out, inp, list(out_splits), list(in_splits), d.group.process_group)


def _to_experts(d: EPDispatch, src: torch.Tensor, per_token: bool) -> torch.Tensor:
    """Send rows -> a fresh ``[*layout rows, B]`` (uint8) in the local layout; padding rows are zero.

    ``src`` ``[*, B]`` uint8: one row per token when ``per_token`` (send row ``s`` is
    ``src[send_token[s]]``), else one per send row. The rows for other ranks are gathered into the
    send buffer; this rank's own rows are put after the received ones while those travel; one
    gather then fills the layout (:class:`_Maps`). Exact mode sends token rows once per
    destination rank (:func:`_send_tokens`) when ``per_token``."""
    m, width, device = d._maps, src.shape[1], src.device
    if d.mode == "exact" and m.exchange and per_token:
        pending, recv, recv_splits = _send_tokens(d, src)
        return _place_tokens(d, pending, recv, recv_splits, src)
    sent = m.send_token.shape[0]
    index = m.send_token if per_token else None
    arrived, remote = m.row_of_recv.shape[0], sum(m.recv_splits)
    recv = _rows_buffer(d, "recv", arrived + 1, width, device, keep=False)
    recv[arrived].zero_()
    if m.exchange:
        send = _send_rows(d, src, index, m.remote_sent)
        pending = _start_all_to_all(d, recv[:remote], send, m.recv_splits, m.send_splits)
    own = recv[remote:arrived]  # the send rows' own-expert tail, in the same order
    if index is None:
        own.copy_(src[m.remote_sent : sent])
    else:
        _gather_into(own, src, index[m.remote_sent : sent])
    if m.exchange:
        pending.wait()
    out = torch.empty(m.recv_of_row.shape[0], width, dtype=torch.uint8, device=device)
    return _gather_into(out, recv, m.recv_of_row).view(*_layout_rows(d), width)


def _position_rows(tokens: int, k: int, width: int) -> int:
    """Rows of ``width`` bytes that carry ``tokens`` x ``k`` int64 layout rows."""
    return -(-tokens * k * 8 // width)


def _token_splits(counts: tuple[int, ...], k: int, width: int) -> list[int]:
    """All-to-all rows per rank when ``counts[r]`` token rows travel with their layout rows."""
    return [n + _position_rows(n, k, width) for n in counts]


def _send_tokens(d: EPDispatch, src: torch.Tensor) -> tuple[Pending, torch.Tensor, tuple[int, ...]]:
    """Exact mode, rows per token (``src`` ``[T, B]``): start the all-to-all of the token rows.

    Each token travels once to each other rank holding any of its experts (what DeepEP's dispatch
    does), followed in that rank's chunk by the rows carrying its k layout rows there (-1 where
    the choice is elsewhere); :func:`_place_tokens` then copies each token row to every layout
    row it fills. Fewer bytes than one row per routed slot whenever a token has several experts
    on one rank; the layout is the same byte for byte. The splits are ``d.dispatch_rows``, which
    :func:`dispatch` computed for ``x``'s byte width (``src``'s). Returns the pending all-to-all,
    the receive buffer (room left after the received rows for ``src`` and a zero row) and its
    splits."""
    m, width, device = d._maps, src.shape[1], src.device
    send_splits, recv_splits = d.dispatch_rows
    send = _rows_buffer(d, "send", sum(send_splits), width, device, keep=False)
    counts, starts = m.token_send_counts, _starts(send_splits)
    # One gather fills every send row: token rows read their token, the layout rows' rows read
    # token 0 and are overwritten next with the layout rows' bytes (one scatter of words).
    source = torch.zeros(send.shape[0], dtype=torch.int64, device=device)
    source.index_copy_(0, _segment_rows(starts, counts, device), m.token_send)
    _gather_into(send, src, source)
    words = _words(send)
    _scatter_layout_rows(words.view(-1), m.token_rows, starts, counts, words.shape[1], d.top_k)
    received = sum(recv_splits)
    recv = _rows_buffer(d, "recv", received + src.shape[0] + 1, width, device, keep=False)
    return _start_all_to_all(d, recv[:received], send, recv_splits, send_splits), recv, recv_splits


def _place_tokens(
    d: EPDispatch, pending: Pending, recv: torch.Tensor, recv_splits: tuple[int, ...], src: torch.Tensor
) -> torch.Tensor:
    """The layout ``[layout rows, B]`` (fresh) from the token rows :func:`_send_tokens` receives and
    this rank's own tokens ``src``, which are copied after them while they travel: then one gather
    fills every layout row (own choices, other ranks' choices and padding alike)."""
    m, k, device = d._maps, d.top_k, recv.device
    received, tokens = sum(recv_splits), src.shape[0]
    recv[received : received + tokens].copy_(src)
    recv[received + tokens].zero_()
    num_rows = m.recv_of_row.shape[0]
    # the arrival each layout row reads; choices held elsewhere (-1) all land on the extra last entry
    arrival = torch.full((num_rows + 1,), received + tokens, dtype=torch.int64, device=device)
    own = m.row_of_recv[sum(m.recv_splits) :]
    arrival.index_copy_(0, own, m.send_token[m.remote_sent :] + received)
    pending.wait()
    counts, starts = m.token_recv_counts, _starts(recv_splits)
    token_row = _segment_rows(starts, counts, device)  # the recv row of each received token row
    words = _words(recv)
    where = words.view(-1)[_layout_row_words(starts, counts, words.shape[1], k, words.element_size(), device)]
    where = where.view(torch.int64).view(-1, k)  # the layout row of each received token's choices
    arrival.scatter_(0, torch.where(where >= 0, where, num_rows).view(-1), token_row[:, None].expand(-1, k).reshape(-1))
    out = torch.empty(num_rows, recv.shape[1], dtype=torch.uint8, device=device)
    return _gather_into(out, recv, arrival[:num_rows])


def _send_rows(d: EPDispatch, src: torch.Tensor, index: torch.Tensor | None, rows: int) -> torch.Tensor:
    """The first ``rows`` send rows (see :func:`_to_experts`), gathered into the send scratch buffer."""
    if index is None:
        return src[:rows]
    return _gather_into(_rows_buffer(d, "send", rows, src.shape[1], src.device, keep=False), src, index[:rows])


def _from_experts(
    d: EPDispatch, flat: torch.Tensor, keep: bool, before_exchange: Callable[[], None] | None = None
) -> torch.Tensor:
    """Layout rows ``[layout rows, B]`` (uint8) -> the rows of every send row back on this rank,
    ``[S + 1, B]`` with the zero row last (a scratch buffer unless ``keep``). The rows for other
    ranks are copied into the send buffer, then ``before_exchange`` runs (it may raise), then this
    rank's own rows are copied while the others travel."""
    m, width = d._maps, flat.shape[1]
    sent = m.send_token.shape[0]
    ret = _rows_buffer(d, "ret", sent + 1, width, flat.device, keep)
    ret[sent].zero_()
    remote = sum(m.recv_splits)
    if m.exchange:
        back = _gather_into(
            _rows_buffer(d, "send", remote, width, flat.device, keep=False), flat, m.row_of_recv[:remote]
        )
    if before_exchange is not None:
        before_exchange()
    if m.exchange:
        pending = _start_all_to_all(d, ret[: m.remote_sent], back, m.send_splits, m.recv_splits)
    _gather_into(ret[m.remote_sent : sent], flat, m.row_of_recv[remote:])
    if m.exchange:
        pending.wait()
    return ret


#: One fp32 ``[chunk, C]`` block of the weighted sum on the CPU (three are live): small enough to
#: stay in a core's cache while other threads (the transport's, other ranks') share the core, large
#: enough that the per-chunk dispatch of a few ops stays small. 256 KiB was faster than 512 KiB, and
#: 2 MiB slowest, in interleaved dispatch + combine rounds on 2 gloo ranks sharing 2 cores.
_SUM_CHUNK_BYTES = 1 << 18


def _sum_slots(
    d: EPDispatch, rows: torch.Tensor, slot_row: torch.Tensor, weights: torch.Tensor | None, dtype
) -> torch.Tensor:
    """``[T, C]`` in ``dtype``: ``sum_j weights[t, j] * rows[slot_row[t, j]]`` accumulated in
    ``accumulation_dtype(rows.dtype)`` (fp32, fp64 for float64 rows) in the order j = 0 .. k-1,
    each product and each sum rounded separately (no fused multiply-add, whose use could depend on
    vector alignment), so the result does not depend on T, the chunking or the placement. ``rows``
    ``[S + 1, C]`` (any float dtype); ``weights`` ``[T, k]`` in the accumulation dtype, or None
    for a plain sum.

    Token chunk by token chunk (on the CPU), choice by choice: the chunk's ``j``-th rows are
    gathered straight from ``rows`` into a scratch buffer, widened to the accumulation dtype there,
    weighted and added to the chunk's accumulator — a working set of three ``[chunk, C]`` blocks,
    which stays in a core's cache (the k rows of a chunk gathered at once do not). No ``[T, k, C]`` copy, and no
    fresh allocation, whose page faults cost more than the arithmetic."""
    T, k = slot_row.shape
    C = rows.shape[1]
    out = torch.empty(T, C, dtype=dtype, device=rows.device)
    if T == 0 or k == 0:
        return out.zero_()
    acc_dtype = accumulation_dtype(rows.dtype)
    width = acc_dtype.itemsize
    step = min(T, max(1, _SUM_CHUNK_BYTES // (width * C))) if rows.device.type == "cpu" else T
    words = _words(rows.view(torch.uint8))
    group, device = d.group, rows.device
    # Every chunk's indices [k, chunk] and weights [k, chunk, 1] split off at once: the loop below
    # runs once per (chunk, choice), so each tensor view made inside it costs (16 chunks x 4
    # choices of 128 tokens per call in bench_ep.py).
    index = slot_row.t().contiguous().split(step, 1)  # choice j's rows, token by token
    w = None if weights is None else weights.t().unsqueeze(-1).contiguous().split(step, 1)
    term_buf = group.scratch("sum_term", step * C * width, device).view(acc_dtype).view(step, C)
    picked_buf = (  # the gathered rows, in rows.dtype
        term_buf
        if rows.dtype == acc_dtype
        else group.scratch("sum_rows", step * C * rows.element_size(), device).view(rows.dtype).view(step, C)
    )
    acc_buf = (
        None if dtype == acc_dtype else group.scratch("sum_acc", step * C * width, device).view(acc_dtype).view(step, C)
    )
    n = 0
    for chunk, lo in enumerate(range(0, T, step)):
        if n != min(T, lo + step) - lo:  # the first chunk, and a shorter last one
            n = min(T, lo + step) - lo
            term, values, acc_rows = term_buf[:n], picked_buf[:n], None if acc_buf is None else acc_buf[:n]
            picked = values.view(words.dtype)
        acc = out[lo : lo + n] if acc_rows is None else acc_rows
        for j in range(k):
            torch.index_select(words, 0, index[chunk][j], out=picked)
            dst = acc if j == 0 else term
            dst.copy_(values)  # exact widening (a no-op copy for rows already in acc_dtype)
            if w is not None:
                dst.mul_(w[chunk][j])
            if j:
                acc.add_(term)
        if acc_rows is not None:
            out[lo : lo + n].copy_(acc)
    return out


def _layout_rows(d: EPDispatch) -> tuple[int, ...]:
    if d.mode == "exact":
        return (d.layout.num_rows,)
    return (d.layout.num_groups, d.layout.max_m)


def _padding_fill(d: EPDispatch, t: torch.Tensor, value: float) -> torch.Tensor:
    """Set the padding rows of ``t`` (in the local layout) to ``value``, in place (no host sync)."""
    m = d._maps
    padding = (m.recv_of_row == m.row_of_recv.shape[0]).view(*_layout_rows(d))
    return t.masked_fill_(padding.view(*padding.shape, *([1] * (t.dim() - padding.dim()))), value)


class _DispatchRows(torch.autograd.Function):
    """x ``[T, H]`` -> ``a`` in the local layout; backward: sum of each token's k gradient rows."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, d: EPDispatch) -> torch.Tensor:
        ctx.d = d
        rows = _to_experts(d, _byte_rows(x), per_token=True)
        return rows.view(x.dtype).view(*_layout_rows(d), *x.shape[1:])

    @staticmethod
    def backward(ctx, grad_a: torch.Tensor):
        d = ctx.d
        flat = grad_a.reshape(-1, grad_a.shape[-1])  # copies an expanded zero
        ret = _from_experts(d, _byte_rows(flat), keep=False).view(grad_a.dtype)
        return _sum_slots(d, ret, d._maps.slot_row, None, grad_a.dtype), None


class _CombineRows(torch.autograd.Function):
    """(expert_out in the local layout, topk_weights ``[T, k]``) -> y ``[T, N]`` on the source rank.

    ``anchor`` is the dispatch's ``a`` when it is differentiable: combine's backward hands it a zero
    gradient, so the dispatch's backward (a collective) runs on *every* rank even where the GEMM
    between them left the graph (a rank whose experts received no row may get an output that does
    not depend on ``a``) — otherwise the other ranks would wait in it forever."""

    @staticmethod
    def forward(
        ctx,
        expert_out: torch.Tensor,
        weights: torch.Tensor,
        anchor: torch.Tensor | None,
        d: EPDispatch,
        peers_ok: Callable[[], None],
    ) -> torch.Tensor:
        keep = ctx.needs_input_grad[1]  # the weights' gradient reads the returned rows again
        flat = expert_out.reshape(-1, expert_out.shape[-1])
        rows = _from_experts(d, _byte_rows(flat), keep, peers_ok).view(expert_out.dtype)
        w = weights.to(accumulation_dtype(expert_out.dtype))
        if d._maps.kept_slots is not None:
            w = torch.where(d._maps.kept_slots, w, 0.0)
        ctx.save_for_backward(rows if keep else None, w)
        ctx.d, ctx.out_shape, ctx.out_dtype, ctx.w_dtype = d, expert_out.shape, expert_out.dtype, weights.dtype
        ctx.anchor = None if anchor is None else (anchor.shape, anchor.dtype, anchor.device)
        return _sum_slots(d, rows, d._maps.slot_row, w, expert_out.dtype)

    @staticmethod
    def backward(ctx, grad_y: torch.Tensor):
        rows, w = ctx.saved_tensors
        d, m = ctx.d, ctx.d._maps
        g = grad_y.to(w.dtype)  # the accumulation dtype of the forward's sum
        grad_out = grad_w = grad_anchor = None
        if rows is not None:
            T, k = m.slot_row.shape
            per_slot = rows.index_select(0, m.slot_row.reshape(-1)).view(T, k, rows.shape[1]).to(w.dtype)
            grad_w = (per_slot * g[:, None, :]).sum(-1).to(ctx.w_dtype)
        if ctx.needs_input_grad[0]:
            # Row of slot s = w[s] * grad_y[token(s)], sent the way dispatch sent x.
            send = (_pick(g, m.send_token) * _pick(w.reshape(-1, 1), m.send_slot)).to(ctx.out_dtype)
            grad_out = _to_experts(d, _byte_rows(send), per_token=False).view(ctx.out_dtype).view(ctx.out_shape)
        if ctx.anchor is not None:
            shape, dtype, device = ctx.anchor
            grad_anchor = torch.zeros((), dtype=dtype, device=device).expand(shape)
        return grad_out, grad_w, grad_anchor, None, None


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
    shape = tuple((x.data if isinstance(x, QuantizedTensor) else x).shape)
    if math.prod(shape[1:]) == 0:
        raise ShapeError("x", "[T, H, ...] with at least one feature per token", shape)
    return flat, tokens, k


def _describe_call(
    group: EPGroup, mode: str, alignment: int, capacity: int | None, overflow: str, k: int
) -> tuple[int, int, int, int]:
    """The call's arguments that every rank must pass alike, as the count exchange states them
    (the ranks size and place each other's rows from them): mode and overflow (exact mode has no
    use for ``overflow``), alignment or capacity, the group's placement digest, and in exact mode
    ``k`` (the token rows carry k layout rows each; capacity mode moves slots, whatever k)."""
    if mode == "exact":
        return 0, alignment, group.placement_digest, k
    return len(OVERFLOW_POLICIES) + OVERFLOW_POLICIES.index(overflow), capacity, group.placement_digest, 0


def _raise_for_call(host: list[list[int]], E: int) -> None:
    """Every rank's call must state the same placement, mode, overflow and alignment or capacity;
    raised identically on every rank."""
    calls = [row[E + _CALL : E + _ROW] for row in host]
    if all(call == calls[0] for call in calls):
        return
    if any(call[2] != calls[0][2] for call in calls):
        given = ", ".join(f"rank {s}: digest {call[2]:#016x}" for s, call in enumerate(calls))
        raise ArgumentError("group", "EPGroups with the same placement on every rank", given)
    stated = [(*divmod(code, len(OVERFLOW_POLICIES)), size, k) for code, size, _, k in calls]
    modes = [("exact", "capacity")[m] for m, _, _, _ in stated]
    if len(set(modes)) > 1:
        argument, given = "mode", [repr(m) for m in modes]
    elif len({o for _, o, _, _ in stated}) > 1:
        argument, given = "overflow", [repr(OVERFLOW_POLICIES[o]) for _, o, _, _ in stated]
    elif len({n for _, _, n, _ in stated}) > 1:
        argument, given = ("alignment" if modes[0] == "exact" else "capacity"), [str(n) for _, _, n, _ in stated]
    else:
        given = ", ".join(f"rank {s}: k = {k}" for s, (_, _, _, k) in enumerate(stated))
        raise ShapeError("topk_ids", "[T, k] with the same k on every rank in mode='exact'", given)
    ranks = ", ".join(f"rank {s}: {g}" for s, g in enumerate(given))
    raise ArgumentError(argument, "the same value on every rank of the group", ranks)


def _differentiable(t: torch.Tensor) -> int:
    """1 if autograd will run ``t``'s backward (and so its collectives), else 0."""
    return int(t.requires_grad and torch.is_grad_enabled())


def _raise_differentiable_differs(argument: str, flags: list[int]) -> None:
    given = ", ".join(f"rank {s}: {bool(flag)}" for s, flag in enumerate(flags))
    raise ArgumentError(
        argument, "requires_grad (with grad mode on) alike on every rank: the backward runs collectives", given
    )


def _describe_row(x: Hidden) -> tuple[int, int, int, int]:
    """What a row of ``x`` holds, as the count exchange states it: (QuantizedTensor or not, dtype),
    features per token, the last dimension (a QuantizedTensor's: its scales per token), and
    whether the dispatch is differentiable. Rows travel as bytes, so ranks that disagree would
    exchange rows of different sizes (gloo aborts the process) or misread each other's values when
    only the dtype differs; and the backward runs collectives, which a rank whose dispatch is not
    differentiable would never join."""
    if isinstance(x, QuantizedTensor):
        return (
            _QUANTIZED_KIND + _DTYPES.index(x.data.dtype),
            math.prod(x.data.shape[1:]),
            math.prod(x.scale.shape[1:]),
            0,
        )
    return _DTYPES.index(x.dtype), math.prod(x.shape[1:]), x.shape[-1], _differentiable(x)


def _row_text(described: list[int]) -> str:
    kind, features, last, _ = described
    quantized, dtype = divmod(kind, _QUANTIZED_KIND)
    if quantized:
        return f"QuantizedTensor, {features} features of {_DTYPES[dtype]} and {last} scales"
    return f"{features} features of {_DTYPES[dtype]}" + ("" if features == last else f" (last dim {last})")


def _raise_for_rows(host: list[list[int]], E: int) -> None:
    """Every rank's x row must be the same (:func:`_describe_row`); raised identically on every rank."""
    rows = [row[E + _ROW : E + _TOKENS] for row in host]
    if any(row[:3] != rows[0][:3] for row in rows):
        given = ", ".join(f"rank {s}: {_row_text(row)}" for s, row in enumerate(rows))
        if any(row[1:3] != rows[0][1:3] for row in rows):
            raise ShapeError("x", "the same features per token on every rank", given)
        raise DTypeError("x", "the same dtype (and kind of tensor) on every rank", given)
    if any(row[3] != rows[0][3] for row in rows):
        _raise_differentiable_differs("x", [row[3] for row in rows])


def _slot_keys(
    flat: torch.Tensor, group: EPGroup, k: int, described: tuple[int, ...]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each slot's send block (:attr:`EPGroup.send_block` of its expert; E for skipped/invalid),
    its destination rank and its token's choices per rank (:func:`_rank_hits`), and this rank's row
    of the count matrix (per-position counts, invalid ids, status 0, the call and x row
    ``described``, tokens with an expert on each rank)."""
    E = group.num_experts
    routed = (flat >= 0) & (flat < E)
    expert = flat.clamp(0, E - 1)
    key = torch.where(routed, group.on_device("expert_position", flat.device)[expert], E)
    # scatter_add instead of bincount: bincount sizes its output from the data (a host sync).
    row = torch.zeros(E + 1 + _CALL, dtype=torch.int64, device=flat.device)
    row.scatter_add_(0, key, torch.ones_like(key))
    row[E + 1 + _BAD_IDS] = ((flat < -1) | (flat >= E)).sum()
    block = torch.where(routed, group.on_device("send_block", flat.device)[expert], E)
    rank, hits = _rank_hits(block, group, k)
    # drop the skipped-slot bin
    row = torch.cat([row[:E], row[E + 1 :], group.constant(described, flat.device), hits.sum(0)])
    return block, rank, hits, row


def _send_order(block: torch.Tensor) -> torch.Tensor:
    """The stable order in which slots are sent: by block, skipped slots last."""
    return torch.sort(block, stable=True).indices


def _rank_hits(block: torch.Tensor, group: EPGroup, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """From the slots' send blocks: each slot's destination rank ``[T, k]`` (W where not sent) and
    int64 ``[T, W]``, 1 where the token has a choice on that rank."""
    W = group.world_size
    rank = group.on_device("block_rank", block.device)[block].view(-1, k)
    hits = torch.zeros(rank.shape[0], W + 1, dtype=torch.int64, device=block.device).scatter_(1, rank, 1)
    return rank, hits[:, :W]


def _failed_ranks(host: list[list[int]], E: int) -> list[int]:
    return [s for s, row in enumerate(host) if row[E + _BAD_IDS] or row[E + _STATUS]]


def _raise_for_counts(host: list[list[int]], group: EPGroup, flat: torch.Tensor, k: int, capacity: int | None) -> None:
    """The error path: invalid ids (this rank's, or a peer's), then call arguments and x rows that
    differ between ranks, then capacity (first source rank, then lowest expert id)."""
    E = group.num_experts
    failed = _failed_ranks(host, E)
    if group.rank in failed:
        _raise_bad_id(flat, k, E)
    if failed:
        raise PeerRankError("moe_hal.ep.dispatch", failed, "invalid arguments or expert ids")
    _raise_for_call(host, E)
    _raise_for_rows(host, E)
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
    host: list[list[int]],
    group: EPGroup,
    block: torch.Tensor,
    rank_hits: tuple[torch.Tensor, torch.Tensor],
    order: torch.Tensor,
    k: int,
    alignment: int,
) -> tuple[_Maps, ContiguousLayout, list[int], list[int]]:
    """Splits, row maps, slot maps and layout from the host count matrix (identical on every rank, so
    every rank agrees on whether the all-to-all runs). Also returns the rows sent to and received
    from each rank (this rank included)."""
    W, r, pos, held = group.world_size, group.rank, group.expert_position, group.experts_of_rank
    mine = held[r]
    count = [[host[s][pos[e]] for e in mine] for s in range(W)]  # [source rank][local expert]
    layout = ContiguousLayout.from_counts([sum(c[i] for c in count) for i in range(len(mine))], alignment=alignment)
    to_rank = [sum(host[r][pos[e]] for e in held[d]) for d in range(W)]
    from_rank = [sum(c) for c in count]
    remote_sent = sum(to_rank) - to_rank[r]
    # Layout row where source s's rows for local expert i go: after those of sources s' < s. The
    # arrivals are the other ranks' rows (source, local expert, slot), then this rank's own.
    fill, first = list(layout.starts), []
    for s in range(W):
        first.append(list(fill))
        fill = [f + n for f, n in zip(fill, count[s])]
    arrival_order = [s for s in range(W) if s != r] + [r]
    device = order.device
    row_of_recv = _segment_rows(
        [first[s][i] for s in arrival_order for i in range(len(mine))],
        [count[s][i] for s in arrival_order for i in range(len(mine))],
        device,
    )
    arrived = row_of_recv.shape[0]
    recv_of_row = torch.full((layout.num_rows,), arrived, dtype=torch.int64, device=device)
    recv_of_row.index_copy_(0, row_of_recv, torch.arange(arrived, device=device))
    E, placement = group.num_experts, group.placement
    exchange = any(host[s][pos[e]] for s in range(W) for e in range(E) if placement[e] != s)
    sent = sum(to_rank)
    slot_of_send_row = order[:sent]
    slot_row = torch.full_like(order, sent).scatter_(0, slot_of_send_row, torch.arange(sent, device=device))
    maps = _Maps(
        torch.div(slot_of_send_row, k, rounding_mode="floor"),
        slot_of_send_row,
        slot_row.view(-1, k),
        None if sent == order.shape[0] else (slot_row < sent).view(-1, k),
        recv_of_row,
        row_of_recv,
        remote_sent=remote_sent,
        exchange=exchange,
        send_splits=tuple(0 if d == r else n for d, n in enumerate(to_rank)),
        recv_splits=tuple(0 if s == r else n for s, n in enumerate(from_rank)),
        **(_token_maps(host, group, block, *rank_hits, slot_row, alignment) if exchange else {}),
    )
    return maps, layout, to_rank, from_rank


def _starts(rows: tuple[int, ...] | list[int]) -> list[int]:
    """The first row of each rank's chunk, for chunks of ``rows`` rows in rank order."""
    return [sum(rows[:i]) for i in range(len(rows))]


def _layout_row_words(
    starts: list[int], counts: tuple[int, ...], per_row: int, k: int, word_bytes: int, device: torch.device
) -> torch.Tensor:
    """Flat word indices of the int64 layout rows each rank's chunk carries after its ``counts``
    token rows (chunks at ``starts``, rows of ``per_row`` words of ``word_bytes`` bytes)."""
    return _segment_rows(
        [(s + n) * per_row for s, n in zip(starts, counts)], [n * k * 8 // word_bytes for n in counts], device
    )


def _scatter_layout_rows(
    flat_words: torch.Tensor,
    layout_rows: torch.Tensor,
    starts: list[int],
    counts: tuple[int, ...],
    per_row: int,
    k: int,
) -> None:
    """Write ``layout_rows`` (int64 ``[sum(counts), k]``, rank by rank) after each rank's token rows."""
    dst = _layout_row_words(starts, counts, per_row, k, flat_words.element_size(), flat_words.device)
    flat_words.index_copy_(0, dst, layout_rows.reshape(-1).view(flat_words.dtype))


def _token_maps(
    host: list[list[int]],
    group: EPGroup,
    block: torch.Tensor,
    rank: torch.Tensor,
    hits: torch.Tensor,
    slot_row: torch.Tensor,
    alignment: int,
) -> dict:
    """The token rows of exact mode's dispatch (see :func:`_send_tokens`): which tokens go to
    each other rank, and each choice's layout row on the rank holding its expert — computed here
    from the count matrix, which gives every rank's layout (the receiver only copies).

    A slot's layout row on its expert's rank: the segment start of the expert there, plus the rows
    of the sources before this rank, plus the slot's place among this rank's slots for the expert
    (slot order) — its send row minus the first send row of its block."""
    W, r, E, ps = group.world_size, group.rank, group.num_experts, group.position_start
    total = [sum(host[s][p] for s in range(W)) for p in range(E)]  # rows per expert position
    start: list[int] = []  # layout row of each position's segment on its rank: rank d's layout
    for d in range(W):
        start += ContiguousLayout.from_counts(total[ps[d] : ps[d + 1]], alignment=alignment).starts
    offset, first = [], 0  # per send block: layout row there minus the block's first send row here
    for p in group.block_position:
        offset.append(start[p] + sum(host[s][p] for s in range(r)) - first)
        first += host[r][p]
    k = rank.shape[1]
    where = (slot_row.view(-1) + torch.tensor(offset + [0], device=block.device)[block]).view(-1, k)
    # Tokens with a choice on rank d, in token order: a stable sort of "no choice there" per rank.
    tokens_by_rank = torch.sort(1 - hits.t(), dim=1, stable=True).indices  # [W, T]
    counts = [0 if d == r else host[r][E + _TOKENS + d] for d in range(W)]
    T, device = hits.shape[0], block.device
    send = tokens_by_rank.reshape(-1)[_segment_rows([d * T for d in range(W)], counts, device)]
    destination = torch.repeat_interleave(
        torch.arange(W, device=device), torch.tensor(counts, device=device), output_size=sum(counts)
    )
    rows = torch.where(rank[send] == destination[:, None], where[send], -1)
    return {
        "token_send": send,
        "token_rows": rows,
        "token_send_counts": tuple(counts),
        "token_recv_counts": tuple(0 if s == r else host[s][E + _TOKENS + r] for s in range(W)),
    }


def _capacity_maps(
    gathered: torch.Tensor,
    row: torch.Tensor,
    block: torch.Tensor,
    order: torch.Tensor,
    group: EPGroup,
    k: int,
    capacity: int,
) -> tuple[_Maps, MaskedLayout]:
    """All on the device: no count is read on the host.

    Send rows: ``capacity`` per expert, in :attr:`EPGroup.send_block` order (this rank's own experts
    last). Received rows: ``[W, L, capacity]`` in :attr:`EPGroup.rank_chunk` order of the source
    ranks (this rank's own chunk last, filled without the all-to-all) — so the own-expert tail of
    the send rows and the own chunk of the received rows are the same rows in the same order."""
    W, r, E, L = group.world_size, group.rank, group.num_experts, group.num_local_experts
    ps, cap, device = group.position_start, capacity, order.device
    n_slots = order.shape[0]
    counts = row[:E][group.on_device("block_position", device)]  # per block
    first = torch.cumsum(counts, 0) - counts  # first sorted index per block
    # Send side: row b * cap + m holds the m-th slot (slot order) routed to block b, if m < cap.
    key_sorted = block[order]
    routed_sorted = key_sorted < E
    m_sorted = torch.arange(n_slots, device=device) - first[key_sorted.clamp(max=E - 1)]
    send_sorted = torch.where(routed_sorted & (m_sorted < cap), key_sorted * cap + m_sorted, E * cap)
    send_row_of_slot = torch.empty_like(order).scatter_(0, order, send_sorted)
    m = torch.arange(cap, device=device)
    if n_slots:
        at = (first[:, None] + m[None, :]).clamp_(max=n_slots - 1)
        slot_of_send_row = order[at].reshape(-1)  # rows past a block's count: unread
    else:
        slot_of_send_row = torch.zeros(E * cap, dtype=torch.int64, device=device)
    token_of_send_row = torch.div(slot_of_send_row, k, rounding_mode="floor")
    # Receive side: source s's kept rows for local expert l go after those of s' < s.
    kept = gathered[:, ps[r] : ps[r] + L].clamp(max=cap)  # [W, L], by source rank
    before = torch.cumsum(kept, 0) - kept
    max_m = W * cap
    # Rows m >= kept[s, l] are unused; their index stays in range (an unread row of the output).
    row_of_recv = (
        torch.arange(L, device=device)[None, :, None] * max_m
        + (before[:, :, None] + m[None, None, :]).clamp(max=max(max_m - 1, 0))
    )[group.on_device("chunk_rank", device)].reshape(-1)  # [W, L, cap] in chunk order
    masked_m = kept.sum(0)
    if L and max_m:
        i = torch.arange(max_m, device=device).expand(L, max_m).contiguous()
        ends = torch.cumsum(kept, 0).t().contiguous()  # [L, W] inclusive ends
        src = torch.searchsorted(ends, i, right=True).clamp_(max=W - 1)  # source rank of row i
        within = i - before.t().gather(1, src)
        chunk = group.on_device("rank_chunk", device)[src]
        recv = (chunk * L + torch.arange(L, device=device)[:, None]) * cap + within
        recv_of_row = torch.where(i < masked_m[:, None], recv, W * L * cap).reshape(-1)
    else:
        recv_of_row = torch.full((L * max_m,), W * L * cap, dtype=torch.int64, device=device)
    maps = _Maps(
        token_of_send_row,
        slot_of_send_row,
        send_row_of_slot.view(-1, k),
        (send_row_of_slot < E * cap).view(-1, k),
        recv_of_row,
        row_of_recv,
        remote_sent=(E - L) * cap,
        exchange=W > 1,
        send_splits=tuple(0 if d == r else (ps[d + 1] - ps[d]) * cap for d in range(W)),
        recv_splits=tuple(0 if s == r else L * cap for s in range(W)),
    )
    return maps, MaskedLayout(masked_m.to(torch.int32), max_m, check=False)


def _start_gather_rows(sel: TransportSelection, group: EPGroup, row: torch.Tensor) -> tuple[torch.Tensor, Pending]:
    """Begin the all-gather of every rank's 1-D int64 ``row`` (dispatch's counts) into ``[W, n]``,
    valid once ``wait()`` of the returned collective has returned."""
    out = row.new_empty(group.world_size * row.shape[0])
    pending = sel.transport.start_all_gather(out, row, group.process_group)
    return out.view(group.world_size, row.shape[0]), pending


def _require(ok: torch.Tensor, raise_typed, message: str) -> None:
    """Stop unless the 0-dim bool ``ok`` holds, without reading it on the host.

    ``torch._assert_async`` raises at once on the CPU, where the value already is on the host:
    ``raise_typed()`` then raises the typed error (it reads the small tensors it needs). On an
    accelerator it is a device-side assertion: the process stops at its next synchronisation with
    ``message`` — a typed error there would cost the host sync this path exists to avoid."""
    try:
        torch._assert_async(ok, message)
    except RuntimeError:
        if ok.device.type != "cpu":
            raise
        raise_typed()
        raise


# -- public API ----------------------------------------------------------------------------------


# Under torch.compile both run eagerly, with a graph break on each side: they read counts on the
# host (exact mode), run collectives and keep reused buffers on the group, and AOTAutograd could
# not replay the byte views of their inputs once a second shape made the graph dynamic (it
# failed with "setStorage ... out of bounds").
@torch.compiler.disable
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

    Every rank of the group must call it with the same ``mode``/``alignment``/``capacity``/
    ``overflow``, the same ``H`` and dtype, ``x`` differentiable alike (its backward runs
    collectives) and, in exact mode, the same ``k`` — ``T`` may differ, 0 included. The count
    exchange states them, and ranks that disagree all raise the same
    :class:`~moe_hal.errors.ArgumentError` (or ``ShapeError`` / ``DTypeError`` for the row of
    ``x``, ``ShapeError`` for ``k``) naming every rank's value. See the module docstring for
    ordering, host syncs and the failure protocol.
    """
    if not isinstance(group, EPGroup):  # without a group there is nobody to tell
        raise DTypeError("group", "a moe_hal.ep.EPGroup", type(group).__name__)
    device = x.device if isinstance(x, (torch.Tensor, QuantizedTensor)) else torch.device("cpu")
    graph = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    sel = select(
        group, mode if mode in ("exact", "capacity") else "exact", graph=graph, transport=transport, device=device
    )
    local_error: Exception | None = None
    try:
        flat, tokens, k = _check_args(x, topk_ids, topk_weights, group, mode, alignment, capacity, overflow)
        described = _describe_call(group, mode, alignment, capacity, overflow, k) + _describe_row(x)
        block, rank, hits, row = _slot_keys(flat, group, k, described)
    except ArgumentError as exc:  # join the count exchange with an error flag, then raise
        local_error = exc
        row = torch.zeros(group.num_experts + _TOKENS + group.world_size, dtype=torch.int64, device=device)
        row[group.num_experts + _STATUS] = 1
    gathered, counts = _start_gather_rows(sel, group, row)
    if local_error is not None:
        counts.wait()  # this rank's part of the exchange is complete before it gives up
        raise local_error
    order = _send_order(block)  # while the counts travel
    counts.wait()
    E = group.num_experts
    if mode == "exact":
        host = gathered.tolist()  # the one host sync
        _raise_for_counts(host, group, flat, k, None)
        maps, layout, to_rank, from_rank = _exact_maps(host, group, block, (rank, hits), order, k, alignment)
        dropped = torch.zeros((), dtype=torch.int64, device=flat.device)
        send_counts = torch.tensor(to_rank, device=flat.device)
        recv_counts = torch.tensor(from_rank, device=flat.device)
    else:
        ok = (gathered[:, E : E + _CALL] == 0).all()
        ok = ok & (gathered[:, E + _CALL : E + _TOKENS] == gathered[:1, E + _CALL : E + _TOKENS]).all()
        if overflow == "error":
            ok = ok & (gathered[:, :E] <= capacity).all()
        _require(
            ok,
            lambda: _raise_for_counts(gathered.tolist(), group, flat, k, capacity if overflow == "error" else None),
            "moe_hal.ep.dispatch: a (source rank, expert) pair is over capacity, a rank's arguments are invalid, "
            "or the ranks' arguments or x rows differ",
        )
        maps, layout = _capacity_maps(gathered[:, :E], row, block, order, group, k, capacity)
        dropped = (row[:E] - row[:E].clamp(max=capacity)).sum()
        ps, r = group.position_start, group.rank
        kept = gathered[:, :E].clamp(max=capacity)  # [W, E] rows kept per (source, position)
        upto = torch.cat([kept.new_zeros(1), torch.cumsum(kept[r], 0)])  # rows kept before each position
        edges = group.on_device("position_start", kept.device)
        send_counts = upto[edges[1:]] - upto[edges[:-1]]  # per destination rank: its positions' rows
        recv_counts = kept[:, ps[r] : ps[r + 1]].sum(1)
    if isinstance(x, QuantizedTensor):  # not differentiable: fp8 bytes and fp32 scales in one row
        src = torch.cat([_byte_rows(x.data.view(torch.uint8)), _byte_rows(x.scale)], dim=1)
        width = src.shape[1]
    else:
        width = math.prod(x.shape[1:]) * x.element_size()
    if maps.token_send is not None:  # what _to_experts moves
        moved = (
            tuple(_token_splits(maps.token_send_counts, k, width)),
            tuple(_token_splits(maps.token_recv_counts, k, width)),
        )
    else:
        moved = maps.send_splits, maps.recv_splits
    d = EPDispatch(
        None,
        layout,
        mode,
        group,
        sel.name,
        topk_weights,
        send_counts,
        recv_counts,
        dropped,
        moved,
        tokens,
        k,
        maps,
        sel,
    )
    if isinstance(x, QuantizedTensor):
        rows = _to_experts(d, src, per_token=True)
        lead, H = _layout_rows(d), x.data.shape[-1]
        a = QuantizedTensor(
            rows[..., :H].contiguous().view(torch.float8_e4m3fn),
            _padding_fill(d, rows[..., H:].contiguous().view(torch.float32), 1.0).view(*lead, *x.scale.shape[1:]),
            x.block,
            x.scale_format,
        )
    else:
        a = _DispatchRows.apply(x, d)
    object.__setattr__(d, "a", a)
    return d


def _check_combine(expert_out, d: EPDispatch) -> None:
    if not isinstance(expert_out, torch.Tensor) or not expert_out.dtype.is_floating_point:
        got = expert_out.dtype if isinstance(expert_out, torch.Tensor) else type(expert_out).__name__
        raise DTypeError("expert_out", "a floating-point tensor", got)
    lead = _layout_rows(d)
    if expert_out.dim() != len(lead) + 1 or tuple(expert_out.shape[:-1]) != lead:
        raise ShapeError("expert_out", f"a tensor with leading dims {lead} (those of d.a)", tuple(expert_out.shape))
    if expert_out.shape[-1] == 0:
        raise ShapeError("expert_out", "at least one feature per row (last dimension >= 1)", tuple(expert_out.shape))


@torch.compiler.disable
def combine(expert_out: torch.Tensor, d: EPDispatch) -> torch.Tensor:
    """``y[t] = sum_j topk_weights[t, j] * expert_out[row of (t, j)]`` on the token's source rank.

    ``expert_out``: the grouped GEMM's output in ``d.layout`` — ``[num_rows, N]`` (exact) or
    ``[L, max_m, N]`` (capacity; rows past ``masked_m`` are never read). Returns ``[T, N]`` in
    ``expert_out.dtype``; skipped and dropped slots contribute 0. Differentiable in ``expert_out``
    and in the ``topk_weights`` given to :func:`dispatch`. Every rank must call it.

    Failure protocol (as dispatch's): every rank checks its arguments, then the ranks exchange one
    status flag each before any row moves (the flags travel while the rows bound for other ranks
    are copied into the send buffer); a rank whose arguments are invalid raises its own error
    and every other rank :class:`~moe_hal.errors.PeerRankError` naming it (on an accelerator: a
    device-side assertion, see the module docstring) — nobody waits in a collective for it. With
    its flag each rank states its ``expert_out`` row (last dimension, dtype) and whether it is
    differentiable; ranks that disagree all raise :class:`~moe_hal.errors.ShapeError` (the row)
    or :class:`~moe_hal.errors.ArgumentError` (``requires_grad``) naming every rank's value.
    """
    if not isinstance(d, EPDispatch):  # without a dispatch there is no group to tell
        raise DTypeError("d", "a moe_hal.ep.EPDispatch (from moe_hal.ep.dispatch)", type(d).__name__)
    local_error: Exception | None = None
    try:
        _check_combine(expert_out, d)
    except ArgumentError as exc:
        local_error = exc
    # Besides its error flag, each rank states its output row (width, dtype): the rows travel as
    # bytes, so ranks that disagree would exchange rows of different sizes, or misread each
    # other's values when only the dtype differs; and whether it is differentiable: the backward
    # exchanges rows, which a rank whose expert_out needs no gradient would never join.
    if local_error is not None:
        row = (-1, -1, -1)
    else:
        row = (expert_out.shape[-1], _DTYPES.index(expert_out.dtype), _differentiable(expert_out))
    status = torch.tensor([int(local_error is not None), *row], dtype=torch.int64, device=d.send_counts.device)
    W = d.group.world_size
    flags = status.new_empty(W * status.numel())
    # Non-blocking: the rows bound for other ranks are copied into the send buffer while the flags
    # travel (a peer that is behind costs less waiting); they are checked before any row moves.
    pending = d._selection.transport.start_all_gather(flags, status, d.group.process_group)
    if local_error is not None:
        pending.wait()  # this rank's part of the exchange is complete before it gives up
        raise local_error

    per_rank = flags.view(W, status.numel())

    def peers_failed() -> None:
        failed = [s for s, flag in enumerate(per_rank[:, 0].tolist()) if flag]
        raise PeerRankError("moe_hal.ep.combine", failed, "invalid arguments")

    def rows_disagree() -> None:
        stated = per_rank[:, 1:].tolist()
        if any(r[:2] != stated[0][:2] for r in stated):
            given = ", ".join(f"rank {s}: {n} x {_DTYPES[i]}" for s, (n, i, _) in enumerate(stated))
            raise ShapeError("expert_out", "the same last dimension and dtype on every rank", given)
        _raise_differentiable_differs("expert_out", [g for _, _, g in stated])

    def peers_ok() -> None:
        pending.wait()
        _require((per_rank[:, 0] == 0).all(), peers_failed, "moe_hal.ep.combine: a peer rank's arguments are invalid")
        _require(
            (per_rank[:, 1:] == per_rank[0, 1:]).all(),
            rows_disagree,
            "moe_hal.ep.combine: the ranks' expert_out differ in last dimension, dtype or requires_grad",
        )

    weights = d.topk_weights
    if weights is None:
        weights = torch.ones(d.num_tokens, d.top_k, dtype=torch.float32, device=expert_out.device)
    anchor = d.a if isinstance(d.a, torch.Tensor) and d.a.requires_grad else None
    return _CombineRows.apply(expert_out, weights, anchor, d, peers_ok)


__all__ = ["OVERFLOW_POLICIES", "EPDispatch", "combine", "dispatch"]
