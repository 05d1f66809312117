"""The model itself: one grouped-GEMM call with one tile, as an :class:`Estimate` (see the
formulas in :mod:`moe_hal.perf`)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Iterable, Mapping, Sequence

from ..backend import OPS
from ..checks import ceil_div, checked_int, group_counts, is_number, is_positive_number, positive_int
from ..errors import ArgumentError
from .efficiency import FAMILIES, OVERHEAD_TILE, Rates
from .hardware import Hardware, resolve_hardware
from .operands import BYTES_PER_ELEMENT, default_out_dtype, dtype_name, operand_bytes

#: Where a call's operands are when it starts: ``hbm`` (cold: every byte streams from device
#: memory, as for MoE weights in a real model) or ``l2`` (just written, or read by the call before,
#: and not flushed: operands that fit in the L2 stream at the L2 rate, as in a benchmark that
#: rebuilds its operands before each timed call or replays back-to-back calls; operands larger
#: than the L2 stream from memory, each line evicted before it is read again).
OPERANDS = ("hbm", "l2")


@dataclass(frozen=True)
class Estimate:
    """What the model says about one grouped-GEMM call with one tile. Times in seconds.

    ``t_roofline`` (the ideal) uses ``peak_flops`` and ``mem_bandwidth``: the device's peak and
    bandwidth (measured or datasheet, as ``basis["roofline"]`` says). ``t_predicted`` (the
    expected time) uses what kernels achieve: ``achieved_flops``, ``achieved_bandwidth``,
    ``tile_overhead`` per :data:`~moe_hal.perf.efficiency.OVERHEAD_TILE` (``overhead_per_tile``: what one tile of this call
    pays, the share of its accumulator's area up to that tile's), ``stage_latency`` per K block of a
    tile (``promotion_k`` elements of K each, run one after another; 0 for dtypes the kernel does
    not promote per K block) and ``t_fixed`` per call; ``basis`` says where each came from.
    ``ridge_m`` is computed from the achieved pair (one basis). ``operands``: where the
    operands were (:data:`OPERANDS`); ``bytes_l2``: the operand bytes streamed from the L2
    (``operands="l2"``), the rest of ``bytes_kernel`` streams at ``achieved_bandwidth``.
    ``split_k``: the slices each tile's K reduction was split into (1: not split); ``tiles``
    counts every slice. ``tile_load_rate``: bytes/s one core loads a tile's operands at (None: not
    modelled); a tile with too little operand reuse for the achieved compute rate runs its MMA at
    that rate times its FLOP per operand byte, ``operand_reuse`` (``basis["tile_load_rate"]`` says
    how much slower).

    For K-grouped calls ``counts`` are the per-group K (tokens), ``m`` the output rows per
    group, and ``rows``/``padded_rows`` count output rows over the non-empty groups.
    """

    op: str
    hw: str
    dtype: str
    out_dtype: str
    n: int
    k: int | None
    m: int | None
    block_m: int
    block_n: int
    counts: tuple[int, ...]
    active_groups: int
    rows: int
    padded_rows: int
    useful_flops: float
    padded_flops: float
    occupancy_m: float
    occupancy_n: float
    tiles: int
    waves: int
    wave_efficiency: float
    bytes_min: float
    bytes_kernel: float
    t_compute: float
    t_memory: float
    t_roofline: float
    t_padded: float
    t_predicted: float
    t_serial: float
    t_fixed: float
    bound: str
    group_bounds: tuple[str, ...]
    ridge_m: float
    peak_flops: float
    mem_bandwidth: float
    num_cores: int
    impl: str | None = None
    achieved_flops: float = 0.0
    achieved_bandwidth: float = 0.0
    tile_overhead: float = 0.0
    overhead_per_tile: float = 0.0
    stage_latency: float = 0.0
    promotion_k: int = 0
    operands: str = "hbm"
    bytes_l2: float = 0.0
    split_k: int = 1
    tile_load_rate: float | None = None
    operand_reuse: float = 0.0
    basis: Mapping[str, str] = field(default_factory=dict)

    @property
    def num_groups(self) -> int:
        return len(self.counts)

    @property
    def tile(self) -> tuple[int, int]:
        return (self.block_m, self.block_n)

    @property
    def occupancy(self) -> float:
        """Fraction of the padded FLOPs that are useful: ``occ_M * occ_N``."""
        return self.occupancy_m * self.occupancy_n

    def efficiency(self, t_measured: float) -> float:
        """Fraction of the speed of light reached by a measured time: ``t_roofline / t_measured``."""
        if not is_positive_number(t_measured):
            raise ArgumentError("t_measured", "a positive time in seconds", t_measured)
        return self.t_roofline / t_measured

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict of every field plus ``tile`` and ``num_groups``."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["counts"] = list(self.counts)
        out["group_bounds"] = list(self.group_bounds)
        out["tile"] = list(self.tile)
        out["num_groups"] = self.num_groups
        out["basis"] = dict(self.basis)
        return out


def estimate(
    counts: Sequence[int],
    n: int,
    k: int | None = None,
    hw: Any = None,
    dtype: str = "bf16",
    block_m: int = 128,
    block_n: int = 128,
    *,
    out_dtype: str | None = None,
    op: str = "contiguous",
    m: int | None = None,
    max_m: int | None = None,
    streams_all_experts: bool = False,
    reads_padding_rows: bool = False,
    accumulate: bool = False,
    t_fixed: float | None = None,
    overlap_p: float | None = None,
    measured: bool = True,
    impl: str | None = None,
    swap_ab: bool = False,
    family: str | None = None,
    operands: str = "hbm",
    split_k: int = 1,
    fast_accumulation: bool = False,
) -> Estimate:
    """Model one grouped GEMM with one ``block_m x block_n`` tile.

    ``counts``: rows per group ``M_g`` (``op="contiguous"``), valid rows ``masked_m[g]``
    (``op="masked"``, each <= ``max_m`` when given) or tokens per group ``K_g``
    (``op="k_grouped"``, with ``m`` the output rows per group and ``k`` left None).
    ``n``/``k``: the weights are ``[G, N, K]``. ``hw``: hardware-DB id or alias, hwdb entry, or
    :class:`Hardware`; ``measured`` picks measured DB values over datasheet ones.
    ``dtype``: operand dtype; ``out_dtype`` defaults to :func:`default_out_dtype`.
    ``streams_all_experts``: the kernel reads every expert's weights, empty ones included.
    ``reads_padding_rows``: the kernel loads the padding rows of A. ``accumulate``: K-grouped
    output is added to ``c`` (one more read of the output). ``t_fixed``: launch + prologue
    seconds (default: the hardware's). ``overlap_p``: None combines compute and memory time
    with ``max``; a number ``p`` uses ``(T_comp^p + T_mem^p)^(1/p)`` (p=1: no overlap).
    ``impl``: the kernel implementation whose achieved efficiency applies (None: the best known
    for this device and kernel family); the plain roofline stays in ``t_roofline``.
    ``swap_ab``: the kernel puts tokens on the MMA's N side, so a tile is floored at the
    hardware's ``mma_min_n`` rows instead of its ``min_m(dtype)``.
    ``family``: the kernel family whose achieved compute fraction applies (default: the grouped
    family of ``op``); ``"dense"`` models a plain GEMM as one contiguous group run by a dense kernel.
    ``operands``: where the operands are when the call starts (:data:`OPERANDS`): ``"hbm"``
    (default: MoE weights are not L2-resident in a model) or ``"l2"`` (a benchmark that wrote them
    just before the call): then the operand bytes read stream at the implementation's
    ``l2_bandwidth`` if they fit in the L2 (the output at its streaming bandwidth), and every byte
    at the streaming bandwidth if they do not (a stream larger than the cache, read again in the
    same order, evicts each line before its reuse); without an L2 size or L2 rate the call is
    predicted cold; ``basis["operands"]`` says which.
    ``split_k``: split each tile's K reduction into this many slices, run on different cores
    (what cuBLAS and CUTLASS do when a call has too few tiles for the chip); each slice writes its
    fp32 partial tile to memory and a reduction reads them back. 1 (default) for kernels that do
    not split, K-grouped calls included.
    ``fast_accumulation``: the kernel keeps its FP8 partial sums in the MMA's own accumulator
    instead of promoting them once per K block (CUTLASS's ``FP8FastAccum`` schedules), so it pays
    no K-block latency where the hardware's ``promotion_k`` would charge one.
    """
    call = Call.build(
        counts,
        n,
        k,
        hw,
        dtype,
        out_dtype=out_dtype,
        op=op,
        m=m,
        max_m=max_m,
        streams_all_experts=streams_all_experts,
        reads_padding_rows=reads_padding_rows,
        accumulate=accumulate,
        t_fixed=t_fixed,
        overlap_p=overlap_p,
        measured=measured,
        impl=impl,
        swap_ab=swap_ab,
        family=family,
        operands=operands,
        fast_accumulation=fast_accumulation,
    )
    split_k = positive_int(split_k, "split_k")
    if op == "k_grouped" and split_k != 1:
        raise ArgumentError("split_k", "1 for op='k_grouped' (its groups already split K)", split_k)
    return call.estimate(positive_int(block_m, "block_m"), positive_int(block_n, "block_n"), split_k)


@dataclass(frozen=True)
class Call:
    """A validated call, shared by the tiles :func:`~moe_hal.perf.advise` ranks. ``hist`` maps each distinct
    count to how many groups have it (every term is the same for groups of equal count)."""

    hw: Hardware
    values: tuple[int, ...]
    hist: Mapping[int, int]
    op: str
    n: int
    k: int | None
    m: int | None
    dtype: str
    out_dtype: str
    streams_all_experts: bool
    reads_padding_rows: bool
    accumulate: bool
    t_fixed: float
    overlap_p: float | None
    swap_ab: bool
    rates: Rates
    operands: str = "hbm"
    fast_accumulation: bool = False

    @classmethod
    def build(
        cls,
        counts: Any,
        n: Any,
        k: Any,
        hw: Any,
        dtype: Any,
        *,
        out_dtype: Any = None,
        op: str = "contiguous",
        m: Any = None,
        max_m: Any = None,
        streams_all_experts: bool = False,
        reads_padding_rows: bool = False,
        accumulate: bool = False,
        t_fixed: Any = None,
        overlap_p: Any = None,
        measured: bool = True,
        impl: str | None = None,
        swap_ab: bool = False,
        family: str | None = None,
        operands: str = "hbm",
        fast_accumulation: bool = False,
    ) -> "Call":
        if op not in OPS:
            raise ArgumentError("op", f"one of {OPS}", op)
        if operands not in OPERANDS:
            raise ArgumentError("operands", f"one of {OPERANDS}", operands)
        if family is not None and family not in FAMILIES:
            raise ArgumentError("family", f"None or one of {FAMILIES}", family)
        if hw is None:
            raise ArgumentError("hw", "a hardware-DB id or alias, a hwdb entry or a perf.Hardware", None)
        h = resolve_hardware(hw, measured=measured)
        if impl is not None:
            if not isinstance(impl, str) or not impl:
                raise ArgumentError("impl", "None or a kernel implementation name", impl)
            h = h.replace(impl=impl)
        values = group_counts(counts)
        n = positive_int(n, "n")
        dt = dtype_name(dtype)
        out_dt = dtype_name(out_dtype) if out_dtype is not None else default_out_dtype(dt, op)
        h.peak(dt)
        if t_fixed is not None and (not is_number(t_fixed) or t_fixed < 0):
            raise ArgumentError("t_fixed", "None or a non-negative number of seconds", t_fixed)
        if overlap_p is not None and (not is_number(overlap_p) or overlap_p < 1):
            raise ArgumentError("overlap_p", "None or a number >= 1", overlap_p)
        if op == "k_grouped":
            if k is not None:
                raise ArgumentError("k", "None for op='k_grouped' (counts hold the per-group K)", k)
            m = positive_int(m, "m")
        else:
            k = positive_int(k, "k")
            if m is not None:
                raise ArgumentError("m", f"None for op={op!r} (counts hold the rows per group)", m)
            if max_m is not None:
                max_m = checked_int(max_m, "max_m", 0)
                if max(values) > max_m:
                    g = next(i for i, c in enumerate(values) if c > max_m)
                    raise ArgumentError(f"counts[{g}]", f"<= max_m ({max_m})", values[g])
        hist: dict[int, int] = {}
        for c in values:
            hist[c] = hist.get(c, 0) + 1
        rates = Rates.of(h, dt, op, t_fixed, family)
        return cls(
            h,
            values,
            hist,
            op,
            n,
            k,
            m,
            dt,
            out_dt,
            bool(streams_all_experts),
            bool(reads_padding_rows),
            bool(accumulate),
            rates.launch,
            overlap_p,
            bool(swap_ab),
            rates,
            operands,
            bool(fast_accumulation),
        )

    def estimate(self, block_m: int, block_n: int, split_k: int = 1) -> Estimate:
        h, hist, n, rates = self.hw, self.hist, self.n, self.rates
        S = h.num_cores
        peak, roof_bw = h.peak(self.dtype), h.mem_bandwidth  # the roofline (ideal)
        bw = rates.bandwidth  # what a kernel achieves (prediction)
        e_a, e_b = operand_bytes(self.dtype)
        e_c = BYTES_PER_ELEMENT[self.out_dtype]
        m_floor = (h.mma_min_n if self.swap_ab else h.min_m(self.dtype)) or 1
        n_blocks = ceil_div(n, block_n)
        n_pad = n_blocks * block_n
        groups = len(self.values)
        active = groups - hist.get(0, 0)
        per_core = rates.flops / S
        device_promotion_k = h.promotion_k.get(self.dtype, 0)
        promotion_k = 0 if self.fast_accumulation else device_promotion_k
        stage_latency = rates.stage_latency if promotion_k else 0.0
        # Small tiles drain a small accumulator: a wave of 64 x 64 tiles pays a quarter of a
        # 128 x 128 one's (TileOPs PR #2148 times 8 x 128^3 GEMMs of one wave at 2.7 us in all).
        # Larger tiles pay the whole, so fewer, larger tiles still win a long call, where their
        # operand reuse is what makes them faster; only a kernel with a tile load rate has it
        # modelled (docs/perf-model-history.md, "The tile overhead by accumulator area").
        accumulator = max(block_m, m_floor) * block_n
        overhead = rates.tile_overhead * min(1.0, accumulator / (OVERHEAD_TILE[0] * OVERHEAD_TILE[1]))
        # A tile's MMA runs no faster than its operands arrive: its FLOP per operand byte times
        # the rate one core loads them at (64 x 128 tiles have half the reuse of 128 x 256 ones).
        reuse = 2.0 * accumulator / (max(block_m, m_floor) * e_a + block_n * e_b)
        mma_rate = per_core if rates.tile_load_rate is None else min(per_core, rates.tile_load_rate * reuse)
        basis = dict(rates.basis)
        if rates.tile_load_rate is not None:
            basis["tile_load_rate"] += (
                f"; this tile's MMA at {mma_rate / per_core:.0%} of the achieved compute rate"
                f" ({reuse:.0f} FLOP per operand byte)"
            )
        if not promotion_k:
            basis["stage_latency"] = (
                "not applied: this kernel accumulates without promoting partial sums per K block (fast_accumulation)"
                if device_promotion_k
                else f"not applied: {self.dtype} kernels on {h.name} do not promote partial sums per K block"
                " (Hardware.promotion_k)"
            )

        def tile_time(depth: int) -> float:
            """Seconds one core spends on one tile with reduction depth ``depth``: its MMA (at the
            lower of the achieved compute rate and what its operand loads allow), the
            latency of each of its K blocks (run one after another: each waits for its MMAs to
            promote their partial sums) and its overhead (pipeline fill, accumulator drain)."""
            mma = 2.0 * accumulator * depth / mma_rate
            blocks = ceil_div(depth, promotion_k) if promotion_k else 0
            return mma + blocks * stage_latency + overhead

        # per distinct count: (compute time of its tiles on the whole chip, memory time alone)
        terms: dict[int, tuple[float, float]] = {}
        if self.op == "k_grouped":
            m = self.m
            m_blocks = ceil_div(m, block_m)
            tiles_per_group = m_blocks * n_blocks
            total_k = sum(c * r for c, r in hist.items())
            rows, padded_rows = m * active, m_blocks * block_m * active
            tiles = tiles_per_group * active
            useful = 2.0 * m * n * total_k
            padded = 2.0 * m_blocks * block_m * n_pad * total_k
            occ_m = m / (m_blocks * block_m)
            cost = {kg: tile_time(kg) for kg in hist}
            t_comp = _round_robin_makespan(((tiles_per_group, cost[kg]) for kg in self.values if kg), S)
            out_bytes = groups * m * n * e_c * (2 if self.accumulate else 1)
            written = groups * m * n * e_c
            bytes_min = total_k * (m + n) * e_a + out_bytes
            bytes_kernel = bytes_min
            for kg in hist:
                terms[kg] = (tiles_per_group * cost[kg] / S, (kg * (m + n) * e_a + m * n * e_c) / bw)
        else:
            k = self.k
            rows = padded_rows = blocks = 0
            for c, r in hist.items():
                mb = ceil_div(c, block_m)
                rows += c * r
                padded_rows += mb * block_m * r
                blocks += mb * r
            tiles = blocks * n_blocks * split_k
            useful = 2.0 * rows * n * k
            padded = 2.0 * padded_rows * n_pad * k
            occ_m = rows / padded_rows if padded_rows else 1.0
            t_tile = tile_time(ceil_div(k, split_k))
            t_comp = ceil_div(tiles, S) * t_tile
            bytes_min = active * n * k * e_b + rows * k * e_a + rows * n * e_c
            # split K: every slice's fp32 partial is written, then read back by the reduction
            partials = 2 * split_k * rows * n * 4 if split_k > 1 else 0
            written = rows * n * e_c + partials
            bytes_kernel = bytes_min + partials
            if self.streams_all_experts:
                bytes_kernel += (groups - active) * n * k * e_b
            if self.reads_padding_rows:
                bytes_kernel += (padded_rows - rows) * k * e_a
            for c in hist:
                terms[c] = (
                    ceil_div(c, block_m) * n_blocks * split_k * t_tile / S,
                    (n * k * e_b + c * k * e_a + c * n * e_c) / bw,
                )

        waves = ceil_div(tiles, S)
        wave_eff = tiles / (waves * S) if waves else 1.0
        bw_eff = bw
        if rates.bw_per_core is not None and tiles:
            bw_eff = min(bw, min(tiles, S) * rates.bw_per_core)
        bytes_l2 = 0.0
        if self.operands == "l2":
            reads = bytes_kernel - written  # the operands read, not the output written
            if h.l2_bytes and rates.l2_bandwidth:
                if reads <= h.l2_bytes:
                    bytes_l2 = float(reads)
                    basis["operands"] = (
                        f"l2: {bytes_l2 / 1e6:.1f} MB of operands stream from the L2 at "
                        f"{rates.l2_bandwidth / 1e12:.2f} TB/s, the rest from memory"
                    )
                else:
                    # Operands read in the same order call after call, more of them than the L2
                    # holds: each line is evicted before it is read again (a cyclic stream larger
                    # than an LRU-like cache never hits), so the call streams from memory.
                    basis["operands"] = (
                        f"l2 asked, but the {reads / 1e6:.1f} MB of operands exceed the "
                        f"{h.l2_bytes / 1e6:.1f} MB L2: every byte streams from device memory"
                    )
            else:
                basis["operands"] = "l2 asked, but the L2 size or L2 bandwidth is not known: predicted cold"
        else:
            basis["operands"] = "hbm: every byte streams from device memory"
        t_mem = (bytes_kernel - bytes_l2) / bw_eff + (bytes_l2 / rates.l2_bandwidth if bytes_l2 else 0.0)
        p = self.overlap_p
        t_body = max(t_comp, t_mem) if p is None else _p_norm(t_comp, t_mem, p)
        bound_of = {c: "empty" if c == 0 else ("compute" if tc > tm else "memory") for c, (tc, tm) in terms.items()}
        t_serial = sum(max(tc, tm) * hist[c] for c, (tc, tm) in terms.items() if c)
        return Estimate(
            op=self.op,
            hw=h.name,
            dtype=self.dtype,
            out_dtype=self.out_dtype,
            n=n,
            k=self.k,
            m=self.m,
            block_m=block_m,
            block_n=block_n,
            counts=self.values,
            active_groups=active,
            rows=rows,
            padded_rows=padded_rows,
            useful_flops=useful,
            padded_flops=padded,
            occupancy_m=occ_m,
            occupancy_n=n / n_pad,
            tiles=tiles,
            waves=waves,
            wave_efficiency=wave_eff,
            bytes_min=bytes_min,
            bytes_kernel=bytes_kernel,
            t_compute=t_comp,
            t_memory=t_mem,
            t_roofline=max(useful / peak, bytes_min / roof_bw),
            t_padded=max(padded / peak, bytes_min / roof_bw),
            t_predicted=t_body + self.t_fixed,
            t_serial=t_serial + self.t_fixed,
            t_fixed=self.t_fixed,
            bound="compute" if t_comp >= t_mem else "memory",
            group_bounds=tuple(bound_of[c] for c in self.values),
            ridge_m=rates.flops * e_b / (2 * bw),
            peak_flops=peak,
            mem_bandwidth=roof_bw,
            num_cores=S,
            impl=h.impl,
            achieved_flops=rates.flops,
            achieved_bandwidth=bw,
            tile_overhead=rates.tile_overhead,
            overhead_per_tile=overhead,
            stage_latency=stage_latency,
            promotion_k=promotion_k,
            operands=self.operands,
            bytes_l2=bytes_l2,
            split_k=split_k,
            tile_load_rate=rates.tile_load_rate,
            operand_reuse=reuse,
            basis=basis,
        )


def _p_norm(x: float, y: float, p: float) -> float:
    """``(x^p + y^p)^(1/p)`` for non-negative ``x``, ``y``, computed relative to the larger one so
    that a large ``p`` neither underflows (seconds to the power 1e6 are 0.0) nor overflows."""
    big = max(x, y)
    if big == 0.0:
        return 0.0
    return big * ((x / big) ** p + (y / big) ** p) ** (1.0 / p)


def _round_robin_makespan(runs: Iterable[tuple[int, float]], cores: int) -> float:
    """Finish time of a static round-robin schedule: tiles are numbered in ``runs`` order
    (``(count, seconds per tile)`` each) and core ``s`` runs tiles ``s, s + cores, ...``."""
    load = [0.0] * cores
    base = 0.0  # time every core has received from whole rounds
    start = 0
    for count, cost in runs:
        base += (count // cores) * cost
        for i in range(count % cores):
            load[(start + (count // cores) * cores + i) % cores] += cost
        start = (start + count) % cores
    return base + max(load)
