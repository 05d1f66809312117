"""Performance model of MoE grouped GEMM: an occupancy- and wave-aware roofline.

The question this module answers (DeepGEMM issue #211, seed ``000``): with very uneven tokens
per expert and one tile height ``BM`` for every group, is the plain roofline still the right
ideal? It is the right *speed of light* to report efficiency against, but not a good
*prediction*: a persistent grouped kernel pays for padded tiles and for partly idle waves. This
module computes both, plus the ridge height ``M*`` below which a group's padding is hidden
behind its weight streaming. ``docs/perf-model.md`` explains the answer with a worked example.

Everything here is pure Python (no torch). Times are seconds, rates FLOP/s and bytes/s.

Formulas (``G`` groups, ``M_g`` rows of group ``g``, tile ``BM x BN``, ``S`` cores)::

    Mpad_g   = ceil(M_g / BM) * BM                     padded rows (0 for an empty group)
    occ_M    = sum M_g / sum Mpad_g                    aggregate, row-weighted M-occupancy
    occ_N    = N / (ceil(N / BN) * BN)
    tiles    = sum_g ceil(M_g / BM) * ceil(N / BN)
    waves    = ceil(tiles / S);   wave_eff = tiles / (waves * S)
    F_useful = 2 * sum M_g * N * K;   F_padded = 2 * sum Mpad_g * ceil(N/BN)*BN * K
    t_tile   = max(2 * max(BM, mma_min_m) * BN * K / (peak / S),    one tile on one core: MMA,
                   (BM * e_a + BN * e_b) * K / (l2_bw / S))         or operand loads (optional)
    T_comp   = waves * t_tile                          static round-robin, equal-cost tiles
    B_min    = G_act*N*K*e_b + sum M_g*K*e_a + sum M_g*N*e_c   each byte once, active experts
    B_kernel = B_min [+ (G - G_act)*N*K*e_b if the kernel streams all experts]
                     [+ sum (Mpad_g - M_g)*K*e_a if it reads padding rows]
    T_mem    = B_kernel / BW_eff,  BW_eff = min(BW, min(tiles, S) * bw_per_core)  (cap optional)
    T_pred   = max(T_comp, T_mem) + t_fixed            (or (T_comp^p + T_mem^p)^(1/p))
    T_ideal  = max(F_useful / peak, B_min / BW)        the plain roofline (speed of light)
    M*       = peak * e_b / (2 * BW)                   ridge height in rows

``e_a``, ``e_b``, ``e_c`` are bytes per element of activations, weights and output; block-scaled
dtypes add their scale bytes (:data:`SCALE_BYTES`). Masked (decode) calls use the same formulas
with ``M_g = masked_m[g]``. K-grouped calls (weight gradients) group the reduction axis: every
non-empty group owns ``ceil(M/BM) * ceil(N/BN)`` output tiles of cost proportional to its ``K_g``;
the compute time is then the makespan of the static round-robin schedule (CTA ``s`` runs tiles
``s, s+S, ...``), which reduces to ``waves * t_tile`` when all tiles cost the same.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import Any, Iterable, Mapping, Sequence

from .errors import ArgumentError, DTypeError

#: Bytes per element of each dtype the model knows.
BYTES_PER_ELEMENT: Mapping[str, float] = MappingProxyType(
    {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1, "fp4": 0.5})

#: Extra bytes per element for the scales of block-scaled dtypes, as ``(activations, weights)``.
#: fp8: DeepGEMM-style fp32 scales per 1x128 activation block and per 128x128 weight block.
#: fp4: one 1-byte scale per 16 elements (NVFP4-style) on both operands.
SCALE_BYTES: Mapping[str, tuple[float, float]] = MappingProxyType(
    {"fp8": (4 / 128, 4 / (128 * 128)), "fp4": (1 / 16, 1 / 16)})

_DTYPE_ALIASES = {"fp8_e4m3": "fp8", "float8_e4m3fn": "fp8", "e4m3": "fp8", "float32": "fp32",
                  "float": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16"}

OPS = ("contiguous", "masked", "k_grouped")

#: Tiles :func:`advise` ranks when a backend declares none: BM in {64, 128, 256} with BN = 128.
DEFAULT_TILES: tuple[tuple[int, int], ...] = ((64, 128), (128, 128), (256, 128))

#: The 32-expert routing histogram of DeepGEMM issue #211 (seed ``000``): 8048 rows, 25 active.
SEED_COUNTS: tuple[int, ...] = (4, 1026, 1799, 166, 694, 753, 0, 16, 0, 240, 1119, 19, 6, 0, 46, 659,
                                10, 0, 112, 808, 181, 0, 28, 22, 90, 0, 176, 0, 37, 5, 10, 22)


def dtype_name(dtype: str) -> str:
    """Model dtype name (``fp32 tf32 bf16 fp16 fp8 int8 fp4``) for a name or alias such as
    ``fp8_e4m3`` or ``bfloat16``; raises :class:`~moe_hal.errors.DTypeError` otherwise."""
    if not isinstance(dtype, str):
        raise DTypeError("dtype", f"one of {sorted(BYTES_PER_ELEMENT)}", dtype)
    key = dtype.strip().lower().removeprefix("torch.")
    key = _DTYPE_ALIASES.get(key, key)
    if key not in BYTES_PER_ELEMENT:
        raise DTypeError("dtype", f"one of {sorted(BYTES_PER_ELEMENT)} (or an alias like fp8_e4m3)", dtype)
    return key


def operand_bytes(dtype: str) -> tuple[float, float]:
    """Bytes per element ``(e_a, e_b)`` of activations and weights, scale bytes included."""
    name = dtype_name(dtype)
    sa, sb = SCALE_BYTES.get(name, (0.0, 0.0))
    return BYTES_PER_ELEMENT[name] + sa, BYTES_PER_ELEMENT[name] + sb


def default_out_dtype(dtype: str, op: str = "contiguous") -> str:
    """Output dtype assumed when none is given: fp32 for K-grouped (weight-gradient
    accumulation), bf16 for 8- and 4-bit inputs, the input dtype otherwise."""
    name = dtype_name(dtype)
    if op == "k_grouped":
        return "fp32"
    return "bf16" if BYTES_PER_ELEMENT[name] < 2 else name


# ---------------------------------------------------------------------------------------------
# Hardware
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Hardware:
    """The few numbers the model needs from a device.

    ``num_cores``: SMs (NVIDIA) or AI cores (Ascend): tiles that run at once. ``peak_flops``:
    dense FLOP/s per model dtype. ``mem_bandwidth``: bytes/s. ``mma_min_m``: smallest M an MMA
    instruction computes (a tile with BM below it costs ``mma_min_m`` rows; None = no floor).
    ``bw_per_core``: bytes/s one core can stream (caps bandwidth when fewer tiles than cores
    run; None = no cap). ``t_fixed``: seconds of launch + prologue added to every prediction.
    ``l2_bandwidth``: aggregate bytes/s from L2 into the cores. When set, a tile takes at least
    the time to load its ``(BM * e_a + BN * e_b) * K`` operand bytes at ``l2_bandwidth / S``, which
    is what makes short tiles slower in compute-bound calls (None = not modelled).
    ``sources``: where each number came from (free text per key, for reports).
    """

    name: str
    num_cores: int
    peak_flops: Mapping[str, float]
    mem_bandwidth: float
    mma_min_m: int | None = None
    l2_bytes: int | None = None
    bw_per_core: float | None = None
    l2_bandwidth: float | None = None
    t_fixed: float = 0.0
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.num_cores, bool) or not isinstance(self.num_cores, int) or self.num_cores < 1:
            raise ArgumentError("Hardware.num_cores", "a positive int", self.num_cores)
        peaks: dict[str, float] = {}
        for key, value in dict(self.peak_flops).items():
            if not _positive_number(value):
                raise ArgumentError(f"Hardware.peak_flops[{key!r}]", "a positive FLOP/s value", value)
            peaks[dtype_name(key)] = float(value)
        if not peaks:
            raise ArgumentError("Hardware.peak_flops", "at least one dtype with a peak", self.peak_flops)
        object.__setattr__(self, "peak_flops", MappingProxyType(peaks))
        object.__setattr__(self, "sources", MappingProxyType(dict(self.sources)))
        if not _positive_number(self.mem_bandwidth):
            raise ArgumentError("Hardware.mem_bandwidth", "a positive bytes/s value", self.mem_bandwidth)
        if self.mma_min_m is not None and (isinstance(self.mma_min_m, bool)
                                           or not isinstance(self.mma_min_m, int) or self.mma_min_m < 1):
            raise ArgumentError("Hardware.mma_min_m", "None or a positive int", self.mma_min_m)
        if self.bw_per_core is not None and not _positive_number(self.bw_per_core):
            raise ArgumentError("Hardware.bw_per_core", "None or a positive bytes/s value", self.bw_per_core)
        if self.l2_bandwidth is not None and not _positive_number(self.l2_bandwidth):
            raise ArgumentError("Hardware.l2_bandwidth", "None or a positive bytes/s value", self.l2_bandwidth)
        if not _number(self.t_fixed) or self.t_fixed < 0:
            raise ArgumentError("Hardware.t_fixed", "a non-negative number of seconds", self.t_fixed)

    def peak(self, dtype: str) -> float:
        """Dense FLOP/s for ``dtype``; :class:`~moe_hal.errors.DTypeError` when the device has none."""
        name = dtype_name(dtype)
        if name not in self.peak_flops:
            raise DTypeError("dtype", f"a dtype with a known peak on {self.name}: {sorted(self.peak_flops)}", dtype)
        return self.peak_flops[name]

    def replace(self, **changes: Any) -> "Hardware":
        """A copy with some fields changed (e.g. calibrated ``peak_flops`` or ``t_fixed``)."""
        return replace(self, **changes)

    @classmethod
    def from_entry(cls, entry: Any, measured: bool = True) -> "Hardware":
        """Adapter from a :mod:`moe_hal.hwdb` entry.

        With ``measured`` (default) the entry's measured matmul rates and read bandwidth are
        used where present, spec figures otherwise. Without a measured read bandwidth, a
        measured copy bandwidth (``measured.copy_bandwidth``, read + write bytes counted) is
        preferred over the datasheet: sustained streaming reaches it, not the datasheet figure.
        An entry without a core count (``cpu-generic``) gets this machine's ``os.cpu_count()``.
        ``sources`` records which figure each number came from.
        """
        sources: dict[str, str] = {}
        peaks: dict[str, float] = {}
        for name in BYTES_PER_ELEMENT:
            value = entry.peak_flops(name, measured=measured)
            if value:
                peaks[name] = float(value)
                spec = entry.peak_flops(name, measured=False)
                sources[f"peak.{name}"] = "spec" if value == spec else "measured"
        if not peaks:
            raise ArgumentError("hw", "a hardware-DB entry with a dense peak for some dtype", entry.id,
                                "the entry gives none; measure them (bench/calibrate.py) or pass a perf.Hardware")
        bandwidth = entry.mem_bandwidth(measured=measured)
        spec_bw = entry.mem_bandwidth(measured=False)
        sources["bandwidth"] = "spec" if bandwidth == spec_bw else "measured read"
        if measured and bandwidth == spec_bw:
            copy = entry.quantity("measured.copy_bandwidth")
            if copy is not None:
                bandwidth, sources["bandwidth"] = copy.si, "measured copy (read+write)"
        if not bandwidth:
            raise ArgumentError("hw", "a hardware-DB entry with a memory bandwidth", entry.id,
                                "the entry gives none; measure it (bench/calibrate.py) or pass a perf.Hardware")
        cores = entry.num_cores
        if not cores:
            import os

            cores = os.cpu_count() or 1
            sources["num_cores"] = "os.cpu_count() (the entry gives none)"
        mma_min_m = entry.mma_min_m
        l2 = entry.l2_bytes
        return cls(name=str(entry.id), num_cores=int(cores), peak_flops=peaks, mem_bandwidth=float(bandwidth),
                   mma_min_m=int(mma_min_m) if mma_min_m else None, l2_bytes=int(l2) if l2 else None,
                   sources=sources)


def resolve_hardware(hw: Any, measured: bool = True) -> Hardware:
    """A :class:`Hardware` from an id or alias of the hardware DB, a hardware-DB entry, or a
    :class:`Hardware` (returned as is)."""
    if isinstance(hw, Hardware):
        return hw
    if isinstance(hw, str):
        from . import hwdb  # the DB loader reads YAML; only needed when a name is given

        return Hardware.from_entry(hwdb.get(hw), measured=measured)
    if all(hasattr(hw, a) for a in ("peak_flops", "mem_bandwidth", "num_cores", "quantity", "id")):
        return Hardware.from_entry(hw, measured=measured)
    raise ArgumentError("hw", "a hardware-DB id or alias, a hwdb entry or a perf.Hardware", type(hw).__name__)


def ridge_m(hw: Any, dtype: str) -> float:
    """Ridge height ``M* = peak * e_b / (2 * BW)`` in rows: a group whose padded height stays at
    or below it is bound by streaming its weights, so its tile padding costs no time."""
    h = resolve_hardware(hw)
    return h.peak(dtype) * operand_bytes(dtype)[1] / (2 * h.mem_bandwidth)


# ---------------------------------------------------------------------------------------------
# Estimate
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Estimate:
    """What the model says about one grouped-GEMM call with one tile. Times in seconds.

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
        if not _positive_number(t_measured):
            raise ArgumentError("t_measured", "a positive time in seconds", t_measured)
        return self.t_roofline / t_measured

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict of every field plus ``tile`` and ``num_groups``."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["counts"] = list(self.counts)
        out["group_bounds"] = list(self.group_bounds)
        out["tile"] = list(self.tile)
        out["num_groups"] = self.num_groups
        return out


def estimate(counts: Sequence[int], n: int, k: int | None = None, hw: Any = None, dtype: str = "bf16",
             block_m: int = 128, block_n: int = 128, *, out_dtype: str | None = None,
             op: str = "contiguous", m: int | None = None, max_m: int | None = None,
             streams_all_experts: bool = False, reads_padding_rows: bool = False,
             accumulate: bool = False, t_fixed: float | None = None, overlap_p: float | None = None,
             measured: bool = True) -> Estimate:
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
    """
    call = _Call.build(counts, n, k, hw, dtype, out_dtype=out_dtype, op=op, m=m, max_m=max_m,
                       streams_all_experts=streams_all_experts, reads_padding_rows=reads_padding_rows,
                       accumulate=accumulate, t_fixed=t_fixed, overlap_p=overlap_p, measured=measured)
    return call.estimate(_positive_int(block_m, "block_m"), _positive_int(block_n, "block_n"))


@dataclass(frozen=True)
class _Call:
    """A validated call, shared by the tiles :func:`advise` ranks. ``hist`` maps each distinct
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

    @classmethod
    def build(cls, counts: Any, n: Any, k: Any, hw: Any, dtype: Any, *, out_dtype: Any = None,
              op: str = "contiguous", m: Any = None, max_m: Any = None, streams_all_experts: bool = False,
              reads_padding_rows: bool = False, accumulate: bool = False, t_fixed: Any = None,
              overlap_p: Any = None, measured: bool = True) -> "_Call":
        if op not in OPS:
            raise ArgumentError("op", f"one of {OPS}", op)
        if hw is None:
            raise ArgumentError("hw", "a hardware-DB id or alias, a hwdb entry or a perf.Hardware", None)
        h = resolve_hardware(hw, measured=measured)
        values = _counts(counts)
        n = _positive_int(n, "n")
        dt = dtype_name(dtype)
        out_dt = dtype_name(out_dtype) if out_dtype is not None else default_out_dtype(dt, op)
        h.peak(dt)
        if t_fixed is None:
            t_fixed = h.t_fixed
        elif not _number(t_fixed) or t_fixed < 0:
            raise ArgumentError("t_fixed", "None or a non-negative number of seconds", t_fixed)
        if overlap_p is not None and (not _number(overlap_p) or overlap_p < 1):
            raise ArgumentError("overlap_p", "None or a number >= 1", overlap_p)
        if op == "k_grouped":
            if k is not None:
                raise ArgumentError("k", "None for op='k_grouped' (counts hold the per-group K)", k)
            m = _positive_int(m, "m")
        else:
            k = _positive_int(k, "k")
            if m is not None:
                raise ArgumentError("m", f"None for op={op!r} (counts hold the rows per group)", m)
            if max_m is not None:
                max_m = _int(max_m, "max_m", 0)
                if max(values) > max_m:
                    g = next(i for i, c in enumerate(values) if c > max_m)
                    raise ArgumentError(f"counts[{g}]", f"<= max_m ({max_m})", values[g])
        hist: dict[int, int] = {}
        for c in values:
            hist[c] = hist.get(c, 0) + 1
        return cls(h, values, hist, op, n, k, m, dt, out_dt, bool(streams_all_experts), bool(reads_padding_rows),
                   bool(accumulate), float(t_fixed), overlap_p)

    def estimate(self, block_m: int, block_n: int) -> Estimate:
        h, hist, n = self.hw, self.hist, self.n
        S = h.num_cores
        bw = h.mem_bandwidth
        peak = h.peak(self.dtype)
        e_a, e_b = operand_bytes(self.dtype)
        e_c = BYTES_PER_ELEMENT[self.out_dtype]
        m_floor = h.mma_min_m or 1
        n_blocks = _ceil_div(n, block_n)
        n_pad = n_blocks * block_n
        groups = len(self.values)
        active = groups - hist.get(0, 0)
        per_core = peak / S
        l2_per_core = h.l2_bandwidth / S if h.l2_bandwidth else None

        def tile_time(depth: int) -> float:
            """Seconds one core spends on one tile with reduction depth ``depth``."""
            t = 2.0 * max(block_m, m_floor) * block_n * depth / per_core
            if l2_per_core is not None:
                t = max(t, (block_m * e_a + block_n * e_b) * depth / l2_per_core)
            return t

        # per distinct count: (compute time of its tiles on the whole chip, memory time alone)
        terms: dict[int, tuple[float, float]] = {}
        if self.op == "k_grouped":
            m = self.m
            m_blocks = _ceil_div(m, block_m)
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
            bytes_min = total_k * (m + n) * e_a + out_bytes
            bytes_kernel = bytes_min
            for kg in hist:
                terms[kg] = (tiles_per_group * cost[kg] / S, (kg * (m + n) * e_a + m * n * e_c) / bw)
        else:
            k = self.k
            rows = padded_rows = blocks = 0
            for c, r in hist.items():
                mb = _ceil_div(c, block_m)
                rows += c * r
                padded_rows += mb * block_m * r
                blocks += mb * r
            tiles = blocks * n_blocks
            useful = 2.0 * rows * n * k
            padded = 2.0 * padded_rows * n_pad * k
            occ_m = rows / padded_rows if padded_rows else 1.0
            t_tile = tile_time(k)
            t_comp = _ceil_div(tiles, S) * t_tile
            bytes_min = active * n * k * e_b + rows * k * e_a + rows * n * e_c
            bytes_kernel = bytes_min
            if self.streams_all_experts:
                bytes_kernel += (groups - active) * n * k * e_b
            if self.reads_padding_rows:
                bytes_kernel += (padded_rows - rows) * k * e_a
            for c in hist:
                terms[c] = (_ceil_div(c, block_m) * n_blocks * t_tile / S,
                            (n * k * e_b + c * k * e_a + c * n * e_c) / bw)

        waves = _ceil_div(tiles, S)
        wave_eff = tiles / (waves * S) if waves else 1.0
        bw_eff = bw
        if h.bw_per_core is not None and tiles:
            bw_eff = min(bw, min(tiles, S) * h.bw_per_core)
        t_mem = bytes_kernel / bw_eff
        p = self.overlap_p
        t_body = max(t_comp, t_mem) if p is None else (t_comp ** p + t_mem ** p) ** (1.0 / p)
        bound_of = {c: "empty" if c == 0 else ("compute" if tc > tm else "memory") for c, (tc, tm) in terms.items()}
        t_serial = sum(max(tc, tm) * hist[c] for c, (tc, tm) in terms.items() if c)
        return Estimate(
            op=self.op, hw=h.name, dtype=self.dtype, out_dtype=self.out_dtype, n=n, k=self.k, m=self.m,
            block_m=block_m, block_n=block_n, counts=self.values, active_groups=active,
            rows=rows, padded_rows=padded_rows, useful_flops=useful, padded_flops=padded,
            occupancy_m=occ_m, occupancy_n=n / n_pad, tiles=tiles, waves=waves, wave_efficiency=wave_eff,
            bytes_min=bytes_min, bytes_kernel=bytes_kernel, t_compute=t_comp, t_memory=t_mem,
            t_roofline=max(useful / peak, bytes_min / bw), t_padded=max(padded / peak, bytes_min / bw),
            t_predicted=t_body + self.t_fixed, t_serial=t_serial + self.t_fixed, t_fixed=self.t_fixed,
            bound="compute" if t_comp >= t_mem else "memory",
            group_bounds=tuple(bound_of[c] for c in self.values),
            ridge_m=peak * e_b / (2 * bw), peak_flops=peak, mem_bandwidth=bw, num_cores=S)


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


# ---------------------------------------------------------------------------------------------
# Tile advisor
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Advice:
    """Tiles ranked best first by :func:`advise`. ``reason`` says in words why the first won."""

    ranked: tuple[Estimate, ...]
    reason: str

    @property
    def best(self) -> Estimate:
        return self.ranked[0]

    @property
    def tile(self) -> tuple[int, int]:
        """``(block_m, block_n)`` of the best tile."""
        return self.best.tile

    def as_dict(self) -> dict[str, Any]:
        return {"tile": list(self.tile), "reason": self.reason, "ranked": [e.as_dict() for e in self.ranked]}


def rank_key(est: Estimate) -> tuple:
    """Sort key of :func:`advise`, smallest first. In order: predicted time (to the picosecond);
    compute time (more headroom when memory time decides); fewer waves; fuller last wave;
    smaller ``BM + BN``; smaller ``BM * BN``; smaller ``BM``."""
    return (round(est.t_predicted, 12), round(est.t_compute, 12), est.waves, -est.wave_efficiency,
            est.block_m + est.block_n, est.block_m * est.block_n, est.block_m)


def advise(counts: Sequence[int], n: int, k: int | None = None, hw: Any = None, dtype: str = "bf16",
           tiles: Iterable[tuple[int, int]] = DEFAULT_TILES, **options: Any) -> Advice:
    """Rank the tiles ``[(block_m, block_n), ...]`` a backend can launch for this call and pick
    the best by :func:`rank_key`. ``options`` are passed to :func:`estimate` (``op``, ``m``,
    ``out_dtype``, ``streams_all_experts``, ...)."""
    tile_list = _tiles(tiles)
    call = _Call.build(counts, n, k, hw, dtype, **options)
    ranked = tuple(sorted((call.estimate(bm, bn) for bm, bn in tile_list), key=rank_key))
    return Advice(ranked, _reason(ranked))


def advise_decode(max_m: int, expected_m: int | None, num_groups: int, n: int, k: int, hw: Any = None,
                  dtype: str = "bf16", tiles: Iterable[tuple[int, int]] = DEFAULT_TILES,
                  **options: Any) -> Advice:
    """Tile advice when only the device holds the histogram (masked decode under CUDA graphs).

    Every one of ``num_groups`` groups is assumed to hold ``expected_m`` rows (``max_m`` when
    no hint is given, the worst case), which makes every term closed-form. The ranking then
    follows the shortcut of reference §4.6: when ``expected_m <= M*`` the call is bound by
    weight streaming, every tile predicts the same time and the tie-break on compute time picks
    the smallest BM the MMA does not round up (a BM below ``mma_min_m`` costs ``mma_min_m``
    rows, so it only wins when it also has no more waves); above ``M*`` the BM that wastes the
    fewest padded rows at the fewest waves wins.
    """
    max_m = _positive_int(max_m, "max_m")
    num_groups = _positive_int(num_groups, "num_groups")
    if expected_m is None:
        rows = max_m
    else:
        rows = _positive_int(expected_m, "expected_m")
        if rows > max_m:
            raise ArgumentError("expected_m", f"<= max_m ({max_m})", expected_m)
    options.setdefault("op", "masked")
    advice = advise([rows] * num_groups, n, k, hw, dtype, tiles, max_m=max_m, **options)
    regime = ("expected_m <= M*: weight streaming bounds every tile" if rows <= advice.best.ridge_m
              else "expected_m > M*: compute-bound, padding and waves decide")
    return Advice(advice.ranked, f"{regime} (M* = {advice.best.ridge_m:.0f} rows); {advice.reason}")


def advise_problem(problem: Any, hw: Any, tiles: Iterable[tuple[int, int]] = DEFAULT_TILES,
                   **options: Any) -> Advice:
    """Tile advice for a validated :class:`moe_hal.Problem`, without a device sync: contiguous
    and K-grouped calls read the host-side counts of their layout; a masked call uses
    :func:`advise_decode` with the layout's ``max_m`` and ``expected_m``. Backends resolve ``hw``
    once (:func:`resolve_hardware`) and pass the :class:`Hardware`; one call costs tens of
    microseconds of Python per tile for tens of groups."""
    layout = problem.layout
    dtype, out_dtype = problem.in_dtype, problem.out_dtype_name
    if problem.op == "masked":
        return advise_decode(layout.max_m, layout.expected_m, problem.num_groups, problem.n, problem.k, hw, dtype,
                             tiles, out_dtype=out_dtype, **options)
    if problem.op == "k_grouped":
        return advise(layout.counts_list, problem.n, None, hw, dtype, tiles, op="k_grouped", m=problem.m,
                      out_dtype=out_dtype, accumulate=problem.c is not None, **options)
    return advise(layout.counts_list, problem.n, problem.k, hw, dtype, tiles, out_dtype=out_dtype, **options)


def _reason(ranked: Sequence[Estimate]) -> str:
    best = ranked[0]
    text = (f"{best.block_m}x{best.block_n}: predicted {best.t_predicted * 1e6:.1f} us "
            f"({best.bound}-bound; roofline {best.t_roofline * 1e6:.1f} us)")
    if len(ranked) == 1:
        return text + "; the only tile offered"
    second = ranked[1]
    if round(second.t_predicted, 12) > round(best.t_predicted, 12):
        return text + f"; next {second.block_m}x{second.block_n} at {second.t_predicted * 1e6:.1f} us"
    names = ("compute time", "waves", "last-wave utilisation", "BM+BN", "BM*BN", "BM")
    a, b = rank_key(best)[1:], rank_key(second)[1:]
    why = next((name for name, x, y in zip(names, a, b) if x != y), "tile order")
    return text + f"; ties with {second.block_m}x{second.block_n} on predicted time, broken by {why}"


# ---------------------------------------------------------------------------------------------
# Routing histograms
# ---------------------------------------------------------------------------------------------
DISTRIBUTIONS = ("uniform", "balanced", "zipf:A", "seed")


def synthetic_counts(dist: str, tokens: int | None, experts: int, topk: int = 1, seed: int = 0) -> list[int]:
    """Rows per expert for ``tokens`` tokens each routed to ``topk`` distinct of ``experts``.

    ``uniform``: each token picks its experts uniformly at random. ``balanced``: exactly
    ``tokens * topk / experts`` each (the remainder to the first experts). ``zipf:A``: expert
    popularity proportional to ``rank^-A`` over a random ranking, ``topk`` drawn without
    replacement. ``seed``: :data:`SEED_COUNTS` (32 experts), scaled to ``tokens * topk`` rows
    when ``tokens`` is given. The sum is always ``tokens * topk``. Deterministic in ``seed``.
    """
    experts = _positive_int(experts, "experts")
    topk = _positive_int(topk, "topk")
    if not isinstance(dist, str):
        raise ArgumentError("dist", f"one of {DISTRIBUTIONS}", dist)
    if dist == "seed":
        if experts != len(SEED_COUNTS):
            raise ArgumentError("experts", f"{len(SEED_COUNTS)} for dist='seed'", experts)
        if tokens is None:
            return list(SEED_COUNTS)
        return scale_counts(SEED_COUNTS, _positive_int(tokens, "tokens") * topk)
    tokens = _positive_int(tokens, "tokens")
    if topk > experts:
        raise ArgumentError("topk", f"<= experts ({experts})", topk)
    if dist == "balanced":
        q, r = divmod(tokens * topk, experts)
        return [q + (1 if e < r else 0) for e in range(experts)]
    import numpy as np  # sampling 10^5..10^6 picks is only practical vectorised

    rng = np.random.default_rng(seed)
    if dist == "uniform":
        log_w = np.zeros(experts)
    elif dist.startswith("zipf:"):
        try:
            alpha = float(dist.split(":", 1)[1])
        except ValueError:
            raise ArgumentError("dist", "zipf:A with a number A >= 0, e.g. zipf:1.2", dist) from None
        if not alpha >= 0 or math.isinf(alpha):
            raise ArgumentError("dist", "zipf:A with a number A >= 0, e.g. zipf:1.2", dist)
        ranks = rng.permutation(experts) + 1
        log_w = -alpha * np.log(ranks)
    else:
        raise ArgumentError("dist", f"one of {DISTRIBUTIONS}", dist)
    # Gumbel top-k draws topk distinct experts per token with probabilities proportional to w.
    keys = log_w[None, :] + rng.gumbel(size=(tokens, experts))
    picks = np.argpartition(-keys, topk - 1, axis=1)[:, :topk]
    return [int(c) for c in np.bincount(picks.ravel(), minlength=experts)]


def scale_counts(counts: Sequence[int], total: int) -> list[int]:
    """``counts`` rescaled to sum to ``total`` by largest remainders; zeros stay zero."""
    values = _counts(counts)
    total = int(total)
    if total < 0:
        raise ArgumentError("total", "a non-negative int", total)
    s = sum(values)
    if s == 0:
        raise ArgumentError("counts", "at least one non-zero count to scale", list(values))
    exact = [c * total / s for c in values]
    out = [int(math.floor(x)) for x in exact]
    order = sorted(range(len(values)), key=lambda i: (-(exact[i] - out[i]), i))
    for i in order[: total - sum(out)]:
        out[i] += 1
    return out


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------
def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _positive_number(x: Any) -> bool:
    return _number(x) and x > 0


def _int(x: Any, name: str, minimum: int) -> int:
    if not isinstance(x, bool):
        try:
            value = operator.index(x)  # int, numpy and torch integer scalars
        except TypeError:
            value = None
        if value is not None and value >= minimum:
            return value
    raise ArgumentError(name, "a positive int" if minimum else "a non-negative int", x)


def _positive_int(x: Any, name: str) -> int:
    return _int(x, name, 1)


def _counts(counts: Any) -> tuple[int, ...]:
    if isinstance(counts, (str, bytes)) or not hasattr(counts, "__iter__"):
        raise ArgumentError("counts", "a sequence of non-negative ints", type(counts).__name__)
    if hasattr(counts, "tolist"):  # numpy arrays and host tensors
        counts = counts.tolist()
    if type(counts) in (list, tuple) and counts and all(type(c) is int for c in counts) and min(counts) >= 0:
        return tuple(counts)
    out = tuple(_int(c, f"counts[{g}]", 0) for g, c in enumerate(counts))
    if not out:
        raise ArgumentError("counts", "at least one group", [])
    return out


def _tiles(tiles: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    try:
        out = [tuple(t) for t in tiles]
    except TypeError:
        raise ArgumentError("tiles", "an iterable of (block_m, block_n) pairs", tiles) from None
    if not out:
        raise ArgumentError("tiles", "at least one (block_m, block_n) pair", [])
    for t in out:
        if len(t) != 2:
            raise ArgumentError("tiles", "(block_m, block_n) pairs", t)
        _positive_int(t[0], "block_m")
        _positive_int(t[1], "block_n")
    return list(dict.fromkeys(out))  # duplicates would only repeat a row


__all__ = ["Advice", "BYTES_PER_ELEMENT", "DEFAULT_TILES", "DISTRIBUTIONS", "Estimate", "Hardware", "OPS",
           "SCALE_BYTES", "SEED_COUNTS", "advise", "advise_decode", "advise_problem", "default_out_dtype", "dtype_name",
           "estimate", "operand_bytes", "rank_key", "resolve_hardware", "ridge_m", "scale_counts",
           "synthetic_counts"]
