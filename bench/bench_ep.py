"""Benchmark expert-parallel dispatch + combine against a bare ``all_to_all_single`` of the same bytes.

W local processes join one gloo group on 127.0.0.1 (:func:`moe_hal.ep.spawn_local`). Each rank
routes ``--tokens`` tokens of ``--hidden`` bf16 features to ``--topk`` of ``--experts`` experts
(uniform, distinct per token), then times, interleaved round by round so all see the same load:

* **ep** — :func:`moe_hal.ep.dispatch` then :func:`moe_hal.ep.combine` with an identity expert
  (``expert_out = d.a``), so only the movement is timed: routing and planning, the count
  all-gather, the row gathers, the all-to-alls both ways, combine's status all-gather and its
  fixed-order fp32 weighted sum;
* **bare** — two ``torch.distributed.all_to_all_single`` calls into preallocated buffers moving the
  rows the user needs moved — each routed (token, expert) row to its expert's rank and back, with
  the same per-rank split sizes — in two variants: every row through the collective, and a rank's
  rows for itself moved by a plain copy with its own split 0 (what dispatch does; gloo's own-rank
  path can be slower than a copy). The faster of the two (slowest rank's median each) is the
  peer: the strongest honest one on the same group; both are in the JSON;
* **handwritten** — exact-mode dispatch + combine as a user writes it today with plain torch ops
  (:class:`_HandWritten`: slots stable-sorted by expert, ``index_select`` into a send buffer, an
  ``all_to_all_single`` of the per-expert counts, one uneven ``all_to_all_single`` per direction,
  block copies into and out of local-expert-major order, a chunked fp32 weighted sum in fixed
  ``j`` order). Before any timing each rank checks that it returns exactly ``moe_hal.ep``'s exact
  ``d.a``, layout and combined output (identity expert and a random expert output) and fails
  otherwise. Unlike the bare peer it does the rearranging any correct implementation must do, so
  ``ratio_vs_handwritten`` (hand-written time / ep time) separates ``moe_hal.ep``'s own overhead
  from that work. Capacity mode is compared against the same exact-mode peer (a hand-written
  capacity exchange is not implemented): what a user pays for static shapes, not a like-for-like.

The bytes ``moe_hal.ep`` actually moves differ from those, so each mode has a second ratio,
``ratio_vs_moved``, against the same bare peer moving exactly the rows its all-to-alls move
(``d.dispatch_rows`` there, one row per routed slot back; padded fixed blocks both ways in
capacity mode): exact mode's dispatch sends each token **once** per rank holding any of its
experts plus a few rows carrying their layout rows there (fewer bytes than one row per routed
slot, so ``ratio_vs_moved`` is expected below ``ratio``); capacity mode moves fixed blocks of
``capacity`` rows per (source rank, expert), padding included (more bytes: expected above).
``ratio`` says what a call costs the user against a hand-written exchange of the routed rows,
``ratio_vs_moved`` how fast ``moe_hal.ep`` moves its own traffic.

Bytes per call count the payload rows each rank sends and receives in both directions (bf16 rows).
bytes/s uses the slowest rank's median time; ``ratio`` = ep bytes/s / bare bytes/s (the same bytes,
so bare time / ep time). **host s/call** is the time a dispatch + combine spends outside the
transport's collectives (measured by timing the transport's methods, a non-blocking collective's
``wait()`` included; waiting for a peer inside a collective counts as collective time), median
over the calls, slowest rank. **CPU time per call** is each process's CPU time (all its threads,
gloo's included) in the same timed calls, added up over the ranks call by call (median): the
ranks share the host's cores, so a call takes at least that CPU time over the cores whatever
overlaps what, and ``ratio_ceiling_at_full_cpu`` is the ratio ep would reach with its CPU work
unchanged and every core busy throughout (:func:`_cpu_use`).
``--trials`` repeats the whole measurement in fresh processes and reports the median ratio. The
1-minute load average before and after each trial is stored: on a shared host absolute figures
move with it. After the timed rounds, each rank times
``--repeat`` more calls split into **phases** (:data:`PHASES`: planning, the small all-gathers,
the payload all-to-alls, the row gathers and block copies, combine's fp32 sum, the rest), stored
per trial and as medians. ``--profile`` prints each rank's top operators (torch.profiler) for a
few dispatch + combine calls. A measurement script, not a test.

Usage::

    python bench/bench_ep.py                                        # W=2, T=2048, H=1024, top-4 of 16
    python bench/bench_ep.py --trials 3 --json bench/results/ep_gloo_cpu_w2.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

from moe_hal import ep, timing, workloads

MODES = ("exact", "capacity")

#: The ratio to the bare exchange that dispatch + combine is to reach on gloo / CPU (docs/expert-parallel.md).
TARGET_RATIO = 0.7


def _rank(rank: int, world: int, cfg: dict) -> dict:
    torch.manual_seed(rank)
    g = ep.EPGroup(None, cfg["experts"])
    ids, weights = workloads.route_tokens(cfg["tokens"], cfg["experts"], cfg["topk"], "uniform", seed=rank)
    x = torch.randn(cfg["tokens"], cfg["hidden"]).to(torch.bfloat16)
    hw = _HandWritten(g, x, ids, weights)
    _check_handwritten(hw, g, x, ids, weights)  # before any timing: an honest peer or none
    out = {mode: _measure(mode, g, x, ids, weights, cfg, hw) for mode in MODES}
    for mode in MODES:
        out[mode]["phases_ms"] = _phases(mode, g, x, ids, weights, cfg)
    out["handwritten_phases_ms"] = _handwritten_phases(hw, g, cfg)
    if cfg["profile"]:
        out["profile"] = {mode: _profile(mode, g, x, ids, weights, cfg) for mode in MODES}
    return out


def _call(mode: str, g: ep.EPGroup, x, ids, weights, cfg: dict):
    kw = {"capacity": cfg["capacity"]} if mode == "capacity" else {}

    def run():
        d = ep.dispatch(x, ids, weights, g, mode=mode, alignment=1, overflow="drop", **kw)
        ep.combine(d.a, d)
        return d

    return run


Splits = tuple[list[int], list[int]]  # rows (sent to, received from) each rank


def _bare(x: torch.Tensor, there: Splits, back: Splits, own: int, own_copy: bool):
    """Rows to the experts (``there``) and back (``back``) with ``all_to_all_single`` into
    preallocated buffers; the splits' own-rank entries are 0 and ``own`` rows go to the rank itself
    each way.

    ``own_copy``: the own rows are moved by a plain ``copy_`` instead of through the collective
    (with the rank's own split 0) — what dispatch does; on gloo the collective's own-rank path can
    cost more than a copy, so both variants run and the faster is the peer."""
    rank = dist.get_rank()

    def buffers(n: int) -> torch.Tensor:
        return torch.empty(n, x.shape[1], dtype=x.dtype)

    def with_own(splits: list[int]) -> list[int]:
        return [n + own * (r == rank) for r, n in enumerate(splits)]

    t_send, t_recv, b_send, b_recv = (*there, *back) if own_copy else map(with_own, (*there, *back))
    t_s, t_r, b_s, b_r = buffers(sum(t_send)), buffers(sum(t_recv)), buffers(sum(b_send)), buffers(sum(b_recv))
    own_s, own_r = buffers(own), buffers(own)

    def run():
        dist.all_to_all_single(t_r, t_s, t_recv, t_send)
        if own_copy:
            own_r.copy_(own_s)
        dist.all_to_all_single(b_r, b_s, b_recv, b_send)
        if own_copy:
            own_s.copy_(own_r)

    return run


class _HandWritten:
    """The hand-written peer: exact-mode dispatch + combine as a user writes it today with plain
    torch ops and ``torch.distributed``, same semantics as ``moe_hal.ep`` with ``alignment=1`` on a
    placement of contiguous expert blocks (the default), for routings without ``-1`` slots (the
    benchmark's). Per call, on each rank:

    dispatch: the ``[T*k]`` routed slots stable-sorted by expert (so by destination rank, then
    local expert, then (source token, k)); per-expert counts by ``bincount``; one
    ``all_to_all_single`` of the ``[W, E_local]`` counts (split sizes and per-expert counts from
    every source) read on the host; the token rows gathered (``index_select``) into a reused send
    buffer; one uneven ``all_to_all_single`` into a reused receive buffer (a rank's own rows go
    through it too); the received (source rank, local expert) blocks copied into a fresh ``a`` in
    (local expert, source rank) order — one contiguous copy per block, no per-row loop.

    combine: the blocks of the expert output copied back into (source rank, local expert) order in
    a reused buffer; one ``all_to_all_single`` back (the splits reversed) into a reused buffer,
    whose rows are then in the sorted slot order; per choice ``j = 0 .. k-1`` the rows of slots
    ``(t, j)`` gathered into a reused ``[T, N]`` buffer and ``w[:, j] * rows`` accumulated in an fp32
    buffer (rows widened exactly by a copy, then an in-place fp32 multiply and a separate add — the
    contract's order and rounding), token chunk by token chunk so the three ``[chunk, N]`` blocks
    stay in cache (:data:`_HANDWRITTEN_CHUNK_BYTES`); a fresh output in the expert output's dtype.
    (In a single-process timing on this host, a /tmp script, the chunked form and the widening copy
    were each faster than one ``[T, N]`` pass and than a mixed bf16 x fp32 ``mul``: the peer takes
    the fastest form tried.)

    Like ``moe_hal.ep``, the returned ``a`` and ``y`` are fresh tensors (they outlive the call) and
    everything in flight lives in buffers reused across calls. :attr:`spent` accumulates seconds per
    phase (:data:`HANDWRITTEN_PHASES`)."""

    def __init__(self, g: ep.EPGroup, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor):
        W, E = g.world_size, g.num_experts
        if list(g.placement) != sorted(g.placement) or any(len(e) != E // W for e in g.experts_of_rank):
            raise ValueError(f"the hand-written peer assumes E/W contiguous experts per rank, got {g.placement}")
        if bool((ids < 0).any()):
            raise ValueError("the hand-written peer assumes routings without -1 slots")
        self.group, self.W, self.E, self.L = g.process_group, W, E, E // W
        self.x, self.ids, self.weights = x, ids, weights
        self.spent: dict[str, float] = dict.fromkeys(HANDWRITTEN_PHASES, 0.0)
        self._buffers: dict[str, torch.Tensor] = {}

    def _buffer(self, name: str, rows: int, width: int, dtype: torch.dtype) -> torch.Tensor:
        """``[rows, width]`` view of a reused buffer, grown when too small."""
        b = self._buffers.get(name)
        if b is None or b.numel() < rows * width or b.dtype != dtype:
            b = self._buffers[name] = torch.empty(rows * width, dtype=dtype)
        return b[: rows * width].view(rows, width)

    def _tick(self, phase: str, t0: float) -> float:
        t = time.perf_counter()
        self.spent[phase] += t - t0
        return t

    def _blocks(self, recv_counts: list[list[int]]):
        """(offset in the exchanged order, offset in the local-expert-major order, rows) per
        (source rank, local expert) block."""
        at = [[0] * self.L for _ in range(self.W)]
        n = 0
        for s in range(self.W):
            for e in range(self.L):
                at[s][e], n = n, n + recv_counts[s][e]
        n, blocks = 0, []
        for e in range(self.L):
            for s in range(self.W):
                blocks.append((at[s][e], n, recv_counts[s][e]))
                n += recv_counts[s][e]
        return blocks

    def dispatch(self) -> tuple[torch.Tensor, tuple]:
        """``a`` ``[R, H]`` (rows per local expert, in source rank, token, k order) and the state
        combine needs."""
        x, ids = self.x, self.ids
        T, k = ids.shape
        t0 = time.perf_counter()
        flat = ids.reshape(-1)
        order = torch.sort(flat, stable=True).indices  # slots by expert, then (token, k)
        counts = torch.bincount(flat, minlength=self.E).view(self.W, self.L)
        t0 = self._tick("plan (sort slots, counts, block offsets)", t0)
        recv_counts = torch.empty_like(counts)
        dist.all_to_all_single(recv_counts, counts, group=self.group)
        send_splits = counts.sum(1).tolist()
        rc = recv_counts.tolist()
        t0 = self._tick("count exchange (incl. waiting for the peer)", t0)
        recv_splits = [sum(r) for r in rc]
        blocks = self._blocks(rc)
        t0 = self._tick("plan (sort slots, counts, block offsets)", t0)
        send = self._buffer("send", T * k, x.shape[1], x.dtype)
        torch.index_select(x, 0, order // k, out=send)
        t0 = self._tick("row gathers and block copies", t0)
        recv = self._buffer("recv", sum(recv_splits), x.shape[1], x.dtype)
        dist.all_to_all_single(recv, send, recv_splits, send_splits, group=self.group)
        t0 = self._tick("payload all-to-alls (incl. waiting for the peer)", t0)
        a = torch.empty_like(recv)
        for src, dst, n in blocks:
            a[dst : dst + n].copy_(recv[src : src + n])
        self._tick("row gathers and block copies", t0)
        return a, (order, send_splits, recv_splits, blocks)

    def combine(self, out: torch.Tensor, state: tuple) -> torch.Tensor:
        """``[T, N]`` in ``out``'s dtype: ``sum_j w[t, j] * out(t, j)`` in fp32, j = 0 .. k-1."""
        order, send_splits, recv_splits, blocks = state
        T, k = self.ids.shape
        N = out.shape[1]
        t0 = time.perf_counter()
        back = self._buffer("back_send", out.shape[0], N, out.dtype)
        for src, dst, n in blocks:
            back[src : src + n].copy_(out[dst : dst + n])
        t0 = self._tick("row gathers and block copies", t0)
        rows = self._buffer("back_recv", T * k, N, out.dtype)
        dist.all_to_all_single(rows, back, send_splits, recv_splits, group=self.group)
        t0 = self._tick("payload all-to-alls (incl. waiting for the peer)", t0)
        row_of_slot = torch.empty_like(order)
        row_of_slot[order] = torch.arange(T * k)
        row_of_slot = row_of_slot.view(T, k).t().contiguous()  # [k, T]: row of slot (t, j)
        w = self.weights.t().unsqueeze(-1).contiguous()  # [k, T, 1]
        step = min(T, max(1, _HANDWRITTEN_CHUNK_BYTES // (4 * N)))
        picked = self._buffer("picked", step, N, out.dtype)
        acc = self._buffer("acc", step, N, torch.float32)
        term = self._buffer("term", step, N, torch.float32)
        y = torch.empty(T, N, dtype=out.dtype)
        for lo in range(0, T, step):
            n = min(step, T - lo)
            for j in range(k):
                torch.index_select(rows, 0, row_of_slot[j, lo : lo + n], out=picked[:n])
                dst = acc[:n] if j == 0 else term[:n]
                dst.copy_(picked[:n])  # exact widening, then the fp32 product
                dst.mul_(w[j, lo : lo + n])
                if j:
                    acc[:n].add_(term[:n])
            y[lo : lo + n].copy_(acc[:n])
        self._tick("fp32 weighted sum, its gathers included (combine)", t0)
        return y

    def run(self) -> torch.Tensor:
        a, state = self.dispatch()
        return self.combine(a, state)


#: fp32 bytes of one token chunk of the hand-written weighted sum (``moe_hal.ep``'s value).
_HANDWRITTEN_CHUNK_BYTES = 256 << 10

#: Phases of the hand-written peer (:class:`_HandWritten`), in call order.
HANDWRITTEN_PHASES = (
    "plan (sort slots, counts, block offsets)",
    "count exchange (incl. waiting for the peer)",
    "payload all-to-alls (incl. waiting for the peer)",
    "row gathers and block copies",
    "fp32 weighted sum, its gathers included (combine)",
)


def _check_handwritten(hw: _HandWritten, g: ep.EPGroup, x, ids, weights) -> None:
    """Raise unless the hand-written peer gives exactly ``moe_hal.ep``'s exact-mode ``d.a``, layout
    and combined output — for the identity expert and for a random expert output."""
    d = ep.dispatch(x, ids, weights, g, mode="exact", alignment=1)
    a, state = hw.dispatch()
    counts = [n for _, _, n in state[3]]  # blocks in (local expert, source rank) order
    per_expert = [sum(counts[e * hw.W : (e + 1) * hw.W]) for e in range(hw.L)]
    problems = []
    if list(d.layout.counts_list) != per_expert or d.layout.num_rows != a.shape[0]:
        problems.append(f"layout counts {d.layout.counts_list} vs hand-written {per_expert}")
    elif not torch.equal(d.a, a):
        problems.append("d.a differs")
    out = torch.randn(a.shape, generator=torch.Generator().manual_seed(g.rank)).to(x.dtype)
    for name, expert_out in (("identity expert", d.a), ("random expert output", out)):
        if not torch.equal(ep.combine(expert_out, d), hw.combine(expert_out, state)):
            problems.append(f"combine differs ({name})")
    if problems:
        raise RuntimeError(f"rank {g.rank}: the hand-written peer is not moe_hal.ep's exact mode: {problems}")


class _Started:
    def __init__(self, wait):
        self.wait = wait


def _started(start, wrap, name: str):
    """``start`` whose returned collective's ``wait()`` is wrapped as ``name`` too."""
    return lambda *args: _Started(wrap(name, start(*args).wait))


def _wrap_transport(transport, wrap):
    """Replace the transport's collectives by ``wrap(f"transport.{name}", method)``: the blocking
    ones, and for the non-blocking ones both the start and its ``wait()``. Returns the undo."""
    for name in ("all_to_all", "all_gather"):
        setattr(transport, name, wrap(f"transport.{name}", getattr(transport, name)))
        start = wrap(f"transport.{name}", getattr(transport, f"start_{name}"))
        setattr(transport, f"start_{name}", _started(start, wrap, f"transport.{name}"))

    def restore():  # the class's methods again
        for name in ("all_to_all", "all_gather", "start_all_to_all", "start_all_gather"):
            delattr(transport, name)

    return restore


def _measure(mode: str, g: ep.EPGroup, x: torch.Tensor, ids, weights, cfg: dict, hw: _HandWritten) -> dict:
    run_ep = _call(mode, g, x, ids, weights, cfg)
    d = run_ep()
    row_bytes, r = x.shape[1] * x.element_size(), g.rank
    send, recv = d.send_counts.tolist(), d.recv_counts.tolist()  # rows routed (capacity mode: kept)
    own = send[r]
    send[r] = recv[r] = 0
    needed = (send, recv), (recv, send), own  # each routed (token, expert) row there and back
    if mode == "capacity":  # padded blocks both ways
        moved = d.dispatch_rows, d.dispatch_rows[::-1], g.num_local_experts * cfg["capacity"]
    else:  # token rows (+ their layout rows) there, one row per routed slot back
        moved = d.dispatch_rows, (recv, send), own
    fns = {"ep": run_ep, "handwritten": hw.run}  # the hand-written peer is exact mode's in both modes
    for name, (there, back, own_rows) in (("bare", needed), ("bare_moved", moved)):
        fns[name] = _bare(x, [list(s) for s in there], [list(s) for s in back], own_rows, False)
        fns[f"{name}_own_copy"] = _bare(x, [list(s) for s in there], [list(s) for s in back], own_rows, True)

    def nbytes(there, back, own_rows) -> int:  # rows sent + received, both directions
        return (sum(map(sum, there)) + sum(map(sum, back)) + 4 * own_rows) * row_bytes

    inside = [0.0]  # seconds spent inside the transport's collectives so far
    # per timed call of each function: this process's CPU seconds (every thread: gloo's transfer
    # threads too) and the seconds inside the collectives (ep's only: the others do not use it)
    cpu: dict[str, list[float]] = {name: [] for name in fns}
    collectives: dict[str, list[float]] = {name: [] for name in fns}

    def per_call(name, fn):
        def run():
            start, inside_before = time.process_time(), inside[0]
            try:
                return fn()
            finally:
                cpu[name].append(time.process_time() - start)
                collectives[name].append(inside[0] - inside_before)

        return run

    fns = {name: per_call(name, fn) for name, fn in fns.items()}

    def wrap(name, fn):
        def timed(*args):
            t0 = time.perf_counter()
            try:
                return fn(*args)
            finally:
                inside[0] += time.perf_counter() - t0

        return timed

    restore = _wrap_transport(ep.select(g, mode).transport, wrap)
    try:
        for fn in fns.values():
            for _ in range(cfg["warmup"]):
                fn()
        for calls in (*cpu.values(), *collectives.values()):
            calls.clear()
        times = timing.interleaved_wall_seconds(fns, "cpu", warmup=0, repeat=cfg["repeat"])
    finally:
        restore()
    return {
        **{f"{name}_s": statistics.median(t) for name, t in times.items()},
        # per round, for the summary to add up the ranks' CPU time call by call
        "ep_wall_s_per_round": times["ep"],
        **{f"{name}_cpu_s_per_round": cpu[name] for name in fns},
        "bytes_needed": nbytes(*needed),
        "bytes_moved": nbytes(*moved),
        "dropped": int(d.dropped),
        # outside the transport's collectives (routing, planning, gathers, the fp32 combine): the
        # median over the calls, as for the wall times (a mean would carry a slow call's whole time)
        "host_s_per_call": statistics.median(
            wall - inside_call for wall, inside_call in zip(times["ep"], collectives["ep"], strict=True)
        ),
    }


#: Where a dispatch + combine spends its time: the functions of ``moe_hal.ep.exchange`` (and the
#: transport's methods) in each phase. Each phase counts its functions' own time (nested calls
#: excluded); "other" is the rest of the call (Python, autograd, allocation of d.a and y).
PHASES = {
    "plan (argument checks, slot keys and sort, row maps)": (
        "_check_args",
        "_slot_keys",
        "_send_order",
        "_exact_maps",
        "_capacity_maps",
        "_raise_for_counts",
        "_require",
        "_check_combine",
    ),
    "count and status all-gathers (incl. waiting for the peer)": ("transport.all_gather",),
    "payload all-to-alls (incl. waiting for the peer)": ("transport.all_to_all",),
    "row gathers and block copies": (
        "_gather_into",
        "_send_rows",
        "_send_tokens",
        "_place_tokens",
        "_to_experts",
        "_from_experts",
    ),
    "fp32 weighted sum (combine)": ("_sum_slots",),
}


def _phases(mode: str, g: ep.EPGroup, x, ids, weights, cfg: dict) -> dict:
    """Milliseconds per dispatch + combine in each of :data:`PHASES`, over ``--repeat`` calls run
    after the timed rounds (the wrappers cost about a microsecond per wrapped call)."""
    from moe_hal.ep import exchange

    run = _call(mode, g, x, ids, weights, cfg)
    transport = ep.select(g, mode).transport
    spent: dict[str, float] = {}
    stack: list[float] = []

    def wrap(name, fn):
        def timed(*args, **kw):
            stack.append(0.0)
            t0 = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                dt = time.perf_counter() - t0
                nested = stack.pop()
                spent[name] = spent.get(name, 0.0) + dt - nested
                if stack:
                    stack[-1] += dt

        return timed

    names = [n for fns in PHASES.values() for n in fns if not n.startswith("transport.")]
    saved = {n: getattr(exchange, n) for n in names}
    for n in names:
        setattr(exchange, n, wrap(n, saved[n]))
    restore = _wrap_transport(transport, wrap)
    try:
        run()
        dist.barrier(g.process_group)
        spent.clear()
        t0 = time.perf_counter()
        for _ in range(cfg["repeat"]):
            run()
        total = (time.perf_counter() - t0) / cfg["repeat"] * 1e3
    finally:
        for n in names:
            setattr(exchange, n, saved[n])
        restore()
    out = {phase: sum(spent.get(n, 0.0) for n in fns) / cfg["repeat"] * 1e3 for phase, fns in PHASES.items()}
    out["other (Python, autograd, allocation of d.a and y)"] = total - sum(out.values())
    out["total"] = total
    return out


def _handwritten_phases(hw: _HandWritten, g: ep.EPGroup, cfg: dict) -> dict:
    """Milliseconds per hand-written dispatch + combine in each of :data:`HANDWRITTEN_PHASES`, over
    ``--repeat`` calls run after the timed rounds."""
    hw.run()
    dist.barrier(g.process_group)
    hw.spent = dict.fromkeys(HANDWRITTEN_PHASES, 0.0)
    t0 = time.perf_counter()
    for _ in range(cfg["repeat"]):
        hw.run()
    total = (time.perf_counter() - t0) / cfg["repeat"] * 1e3
    out = {phase: s / cfg["repeat"] * 1e3 for phase, s in hw.spent.items()}
    out["other (Python, allocation of a and y)"] = total - sum(out.values())
    out["total"] = total
    return out


def _profile(mode: str, g: ep.EPGroup, x, ids, weights, cfg: dict) -> str:
    from torch.profiler import ProfilerActivity, profile

    run = _call(mode, g, x, ids, weights, cfg)
    run()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            run()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15)


def _peer(per_rank: list[dict], mode: str, name: str) -> tuple[float, float, float, str]:
    """The slowest rank's median of both variants of a bare peer: the faster of the two, each
    variant's, and the name of the faster one's timed function."""
    plain = max(r[mode][f"{name}_s"] for r in per_rank)
    own = max(r[mode][f"{name}_own_copy_s"] for r in per_rank)
    return (plain, plain, own, name) if plain <= own else (own, plain, own, f"{name}_own_copy")


def _cores() -> int:
    """CPU cores this process (and the ranks it spawns) may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _cpu_use(per_rank: list[dict], mode: str, bare_s: float, peers: dict[str, str]) -> dict:
    """What the CPU time of a call says about the ratio, whatever the scheduling.

    All ranks share the host's cores, so a call's wall time is at least the CPU time it uses on all
    ranks (every thread, gloo's transfers included) divided by the cores. Per round, the ranks'
    CPU times of the same collective call are added up; the median over the rounds (the statistic
    of the wall times) gives ``ratio_ceiling_at_full_cpu``, the ratio ep would reach with the CPU
    work it does now and every core busy throughout (overlap cannot do better), and
    ``cpu_ms_per_rank_for_target``, the CPU time per rank at which :data:`TARGET_RATIO` would just
    be possible so. ``peers``: name in the record -> timed function (the faster variant of each
    bare peer)."""
    cores, world = _cores(), len(per_rank)

    def per_round(key: str) -> list[float]:  # all ranks' CPU seconds, round by round
        return [sum(calls) for calls in zip(*(r[mode][f"{key}_cpu_s_per_round"] for r in per_rank), strict=True)]

    cpu = {name: per_round(key) for name, key in {"ep": "ep", **peers}.items()}
    walls = [max(w) for w in zip(*(r[mode]["ep_wall_s_per_round"] for r in per_rank), strict=True)]
    return {
        "cores": cores,
        "cpu_ms_per_call_all_ranks": {name: statistics.median(t) * 1e3 for name, t in cpu.items()},
        "ep_cores_busy": statistics.median(c / w for c, w in zip(cpu["ep"], walls, strict=True)),
        "ratio_ceiling_at_full_cpu": bare_s / (statistics.median(cpu["ep"]) / cores),
        "cpu_ms_per_rank_for_target": bare_s / TARGET_RATIO * cores / world * 1e3,
    }


def _summary(per_rank: list[dict]) -> dict:
    """Per mode: the slowest rank's medians, the ratios, the phases (mean over ranks)."""
    modes = {}
    for mode in MODES:
        ep_s = max(r[mode]["ep_s"] for r in per_rank)
        bare_s, bare_plain_s, bare_own_s, bare_fn = _peer(per_rank, mode, "bare")
        needed = sum(r[mode]["bytes_needed"] for r in per_rank)
        m = {
            "bytes_needed_per_call_all_ranks": needed,
            "bytes_moved_per_call_all_ranks": sum(r[mode]["bytes_moved"] for r in per_rank),
            "ep_s_per_call": ep_s,
            "bare_s_per_call": bare_s,
            "bare_all_rows_through_collective_s_per_call": bare_plain_s,
            "bare_own_rows_by_copy_s_per_call": bare_own_s,
            "ep_gb_per_s": needed / ep_s / 1e9,
            "bare_gb_per_s": needed / bare_s / 1e9,
            "ratio": bare_s / ep_s,
            "host_s_per_call": max(r[mode]["host_s_per_call"] for r in per_rank),
            "dropped_slots": sum(r[mode]["dropped"] for r in per_rank),
        }
        m["phases_ms_mean_over_ranks"] = {
            phase: statistics.fmean(r[mode]["phases_ms"][phase] for r in per_rank)
            for phase in per_rank[0][mode]["phases_ms"]
        }
        moved_s, moved_plain_s, moved_own_s, moved_fn = _peer(per_rank, mode, "bare_moved")
        m["bare_moved_s_per_call"] = moved_s
        m["bare_moved_all_rows_through_collective_s_per_call"] = moved_plain_s
        m["bare_moved_own_rows_by_copy_s_per_call"] = moved_own_s
        m["ratio_vs_moved"] = moved_s / ep_s
        m["handwritten_exact_s_per_call"] = max(r[mode]["handwritten_s"] for r in per_rank)
        m["ratio_vs_handwritten"] = m["handwritten_exact_s_per_call"] / ep_s
        peers = {"bare": bare_fn, "bare_moved": moved_fn, "handwritten_exact": "handwritten"}
        m.update(_cpu_use(per_rank, mode, bare_s, peers))
        modes[mode] = m
    return modes


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--tokens", type=int, default=2048, help="tokens per rank")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--experts", type=int, default=16)
    p.add_argument("--topk", type=int, default=4)
    p.add_argument(
        "--capacity-factor",
        type=float,
        default=1.25,
        help="capacity = factor * tokens * topk / experts rows per (source rank, expert)",
    )
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeat", type=int, default=10, help="timed rounds per trial (median per rank)")
    p.add_argument("--trials", type=int, default=1, help="independent runs (fresh processes); median ratio")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--profile", action="store_true", help="print each rank's top operators")
    p.add_argument("--json", metavar="FILE", help="write the results here")
    args = p.parse_args(argv)
    capacity = math.ceil(args.capacity_factor * args.tokens * args.topk / args.experts)
    cfg = {
        "tokens": args.tokens,
        "hidden": args.hidden,
        "experts": args.experts,
        "topk": args.topk,
        "warmup": args.warmup,
        "repeat": args.repeat,
        "capacity": capacity,
        "profile": args.profile,
    }
    trials = []
    for trial in range(args.trials):
        load_before = os.getloadavg()[0]
        per_rank = ep.spawn_local(_rank, args.world, (cfg,), timeout_s=900, threads=args.threads)
        load_after = os.getloadavg()[0]
        modes = _summary(per_rank)
        hw_phases = {
            phase: statistics.fmean(r["handwritten_phases_ms"][phase] for r in per_rank)
            for phase in per_rank[0]["handwritten_phases_ms"]
        }
        trials.append(
            {
                "load_avg_1min": [load_before, load_after],
                "modes": modes,
                "handwritten_exact_phases_ms_mean_over_ranks": hw_phases,
            }
        )
        for mode, m in modes.items():
            extra = (
                f", vs bare of the bytes moved {m['ratio_vs_moved']:.2f}"
                f", vs hand-written exact {m['ratio_vs_handwritten']:.2f}"
                f" ({m['handwritten_exact_s_per_call'] * 1e3:.1f} ms)"
            )
            print(
                f"trial {trial} {mode:9s} ep {m['ep_gb_per_s']:.3f} GB/s vs bare all_to_all_single "
                f"{m['bare_gb_per_s']:.3f} GB/s: ratio {m['ratio']:.2f}{extra}; ep {m['ep_s_per_call'] * 1e3:.1f} "
                f"ms/call, host (outside collectives) {m['host_s_per_call'] * 1e3:.1f} ms/call"
            )
            cpu = m["cpu_ms_per_call_all_ranks"]
            print(
                f"trial {trial} {mode:9s} CPU ms/call, all ranks: ep {cpu['ep']:.1f}, bare {cpu['bare']:.1f}, "
                f"bare of the bytes moved {cpu['bare_moved']:.1f}, "
                f"hand-written exact {cpu['handwritten_exact']:.1f}; ep keeps {m['ep_cores_busy']:.2f} of "
                f"{m['cores']} cores busy; ratio with every core busy at most {m['ratio_ceiling_at_full_cpu']:.2f} "
                f"({TARGET_RATIO} needs <= {m['cpu_ms_per_rank_for_target']:.1f} CPU ms per rank)"
            )
        for mode, m in modes.items():
            phases = m["phases_ms_mean_over_ranks"]
            print(f"trial {trial} {mode:9s} ms per call (mean over ranks):")
            print("\n".join(f"    {v:7.2f}  {phase}" for phase, v in phases.items()))
        print(f"trial {trial} hand-written exact ms per call (mean over ranks):")
        print("\n".join(f"    {v:7.2f}  {phase}" for phase, v in hw_phases.items()))
        print(f"trial {trial} load average (1 min) before/after: {load_before:.1f} / {load_after:.1f}")
        if args.profile:
            for rank, r in enumerate(per_rank):
                for mode, table in r["profile"].items():
                    print(f"--- rank {rank}, {mode}: top operators over 3 dispatch + combine calls\n{table}")
    medians = {
        mode: {
            key: statistics.median(t["modes"][mode][key] for t in trials)
            for key in (
                "ratio",
                "ratio_vs_moved",
                "ratio_vs_handwritten",
                "ep_s_per_call",
                "bare_s_per_call",
                "handwritten_exact_s_per_call",
                "host_s_per_call",
                "ep_cores_busy",
                "ratio_ceiling_at_full_cpu",
                "cpu_ms_per_rank_for_target",
            )
        }
        for mode in MODES
    }
    for mode in MODES:
        medians[mode]["cpu_ms_per_call_all_ranks"] = {
            name: statistics.median(t["modes"][mode]["cpu_ms_per_call_all_ranks"][name] for t in trials)
            for name in trials[0]["modes"][mode]["cpu_ms_per_call_all_ranks"]
        }
        medians[mode]["phases_ms"] = {
            phase: statistics.median(t["modes"][mode]["phases_ms_mean_over_ranks"][phase] for t in trials)
            for phase in trials[0]["modes"][mode]["phases_ms_mean_over_ranks"]
        }
    hw_phases = {
        phase: statistics.median(t["handwritten_exact_phases_ms_mean_over_ranks"][phase] for t in trials)
        for phase in trials[0]["handwritten_exact_phases_ms_mean_over_ranks"]
    }
    for mode, m in medians.items():
        extra = (
            f", vs bare of the bytes moved {m['ratio_vs_moved']:.2f}"
            f", vs hand-written exact {m['ratio_vs_handwritten']:.2f}"
        )
        print(
            f"median of {args.trials} trial(s) {mode:9s} ratio {m['ratio']:.2f}{extra}; "
            f"host {m['host_s_per_call'] * 1e3:.1f} ms/call; at most {m['ratio_ceiling_at_full_cpu']:.2f} "
            f"with every core busy"
        )
    if args.json:
        result = {
            "benchmark": "bench/bench_ep.py",
            "command": " ".join(["python", "bench/bench_ep.py", *sys.argv[1:]]),
            "world": args.world,
            "backend": "gloo (127.0.0.1, one process per rank)",
            "dtype": "bf16",
            "config": cfg,
            "threads_per_rank": args.threads,
            # how the ranks' OpenMP threads wait decides what extra threads cost on a shared host
            "environment": {k: os.environ[k] for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT") if k in os.environ},
            "cpu_count": os.cpu_count(),
            "machine": timing.machine_record(),
            "timing": "wall time per call, rounds interleaved (ep, the hand-written exact peer and each bare "
            "variant); median per rank; slowest rank; the faster bare variant is the peer; bytes/s and ratio "
            "over the bytes needed (routed rows, both directions); ratio_vs_moved against the bare peer of the "
            "rows ep's all-to-alls move; ratio_vs_handwritten = hand-written exact-mode dispatch + combine "
            "time / ep time (capacity mode too: against the same exact-mode peer), checked equal to "
            "moe_hal.ep's exact d.a, layout and combine output before timing; host_s_per_call: median over "
            "the calls of the time outside the transport's collectives, slowest rank; cpu_ms_per_call_all_ranks: "
            "process CPU time (all threads) of the same calls added up over the ranks call by call, median; "
            "ep_cores_busy: that over the call's wall time; ratio_ceiling_at_full_cpu = bare time / (ep CPU "
            "time / cores): the ratio with ep's CPU work unchanged and every core busy throughout",
            "caveat": "shared development host: other jobs run during the measurement (see load_avg_1min)",
            "median_over_trials": medians,
            "handwritten_exact_phases_ms_median_over_trials": hw_phases,
            "trials": trials,
        }
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
