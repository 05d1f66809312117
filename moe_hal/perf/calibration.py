"""Fit achieved efficiency to measured grouped-GEMM timings, and validate the fit out of sample.

The measured cases are either the published set (``bench/published/cases.yaml``: timings other
people measured and published, each with its source) or a device's own benchmark results. A fit
turns them into :class:`~moe_hal.perf.efficiency.Achieved` figures:

* per architecture, the per-tile overhead, the latency of each K block of a tile (kernels that
  promote partial sums per K block: ``Hardware.promotion_k``) and the launch
  time, chosen on a small grid to minimise the mean relative error over the fitted cases — each
  only where the architecture's cases *identify* it (:data:`IDENTIFIES`): a time that is a
  negligible part of every case leaves the error flat along the grid, and the value the search
  picks would be noise. A tile overhead or launch time — costs every GPU kernel pays — is
  identified only by cases of several kernels (:data:`BORROWABLE`); unidentified, it is borrowed
  from the architectures that identify it (their case-weighted median; the record says so); an
  unidentified K-block latency is 0, since promotion in software per K block
  is a trait of one kernel generation (SM90's), not of GPUs;
* per implementation with at least twice :data:`~moe_hal.perf.efficiency.MIN_CASES` calls, its
  own fixed time per call, where its calls tell one from its rates and it differs from the
  architecture's (:func:`_fit_launches`):
  FlashInfer's masked NVFP4 kernel on the B200 and DeepGEMM's SM100 kernels on the B300 pay 10
  and 20 us per call where the other kernels there pay 3, and read at 3 us their long calls
  streamed at 0.65 and 0.75 of the datasheet bandwidth where the fit with their own times finds
  0.74 and 0.84. A kernel without one pays the architecture's;
* given those, per (device, implementation, dtype, family) the compute fraction, and per
  (device, implementation) the bandwidth fraction: each case is attributed to the term the model
  says binds it, the fraction that case needs is computed, and the median over the cases, each
  weighted by the seconds of MMA (or streaming) its fraction explains, is kept (capped at 1: no
  kernel beats the datasheet) — only cases where that term is at least half the measured time
  (:data:`BINDING_SHARE`) inform it. An error in the fixed times moves the fraction a case implies
  by that error over the time the fraction explains, so a long call pins it and a call of a few
  microseconds barely does (counted alike, vLLM's short FP8 calls on the B200 of Helion PR #2987
  and vLLM PR #18778 set its compute fraction to 0.49 of the peak, and held out, vLLM PR #19566's
  long calls were predicted up to 37% slow: ``docs/perf-model-history.md``, "An eleventh round").
  Attribution and fractions are iterated to a fixed point;
* the cache state is a measurement condition, like the device: the bandwidth fraction is fitted
  from cold cases only (operands streamed from device memory), and per implementation and
  architecture the L2 rate (``l2_bandwidth``) from memory-bound warm cases only (a source whose
  benchmark wrote the operands just before the timed call: ``operands="l2"``), and only from
  calls whose L2-resident bytes are most of their bytes (elsewhere the L2 term is too small a part
  of the time to measure its rate); it needs :data:`~moe_hal.perf.efficiency.MIN_CASES` such calls;
* a case informs the compute fraction only when the call is compute-bound at the datasheet rates
  (its MMA time at the peak at least its memory time at the datasheet bandwidth): a call the
  silicon would run memory-bound says nothing of the MMA rate, and a slow one charged to the MMA
  (vLLM PR #20578's NVFP4 GEMM of 1 to 256 rows, read with tiles it does not launch: 0.07 of the
  FP4 peak) became the figure every FP4 kernel without its own was predicted with.

:func:`leave_one_source_out` is the honest figure: for each source (a README table, an issue, a
PR) it fits on every *other* source and predicts this one's cases with :func:`predict`, which is
:func:`moe_hal.perf.estimate` over the tiles the implementation can launch (the kernel's own
heuristic is assumed to find the fastest). :func:`write_overlays` stores a fit as
``hwdb/measured/<id>.yaml`` overlays, which the hardware DB loads automatically.
"""

from __future__ import annotations

import datetime
import multiprocessing
import statistics
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..checks import positive_int
from ..errors import ArgumentError
from .efficiency import (
    FAMILY_OF_OP,
    FRACTIONS,
    MIN_CASES,
    MIN_TYPICAL_IMPLEMENTATIONS,
    PER_OVERHEAD_TILE,
    SECONDS,
    Achieved,
    EfficiencyTable,
    _median_by_weight,
    _weighted_median,
)
from .hardware import Hardware
from .model import Estimate, estimate

#: The published validation set in a source checkout (not part of the wheel).
PUBLISHED = Path(__file__).resolve().parents[2] / "bench" / "published" / "cases.yaml"

#: This project's own measured runs, in the published set's schema (each source names the
#: committed result file and the script and commit that produced it); in a source checkout.
OWN_MEASUREMENTS = PUBLISHED.parents[1] / "own_measurements"

#: The ``source`` of the figures of an implementation only this project's own runs measured.
OWN_SOURCE = "bench/own_measurements/ (this project's own runs)"

#: Block-N values a kernel is assumed to choose from unless its implementation says otherwise.
DEFAULT_BLOCK_N: tuple[int, ...] = (64, 96, 112, 128, 144, 160, 192, 224, 256)
DEFAULT_BLOCK_M: tuple[int, ...] = (64, 128, 256)

#: Grid of (tile overhead, K-block latency, launch) seconds searched per fit.
GRID: tuple[tuple[float, float, float], ...] = tuple(
    (oh * 1e-6, stage * 1e-9, launch * 1e-6)
    for oh in (0, 1, 2, 3, 4, 5)
    for stage in (0, 40, 80, 120)
    for launch in (0, 3, 6, 10)
)

#: The grid's times in its tuples' order, as recorded.
GRID_KINDS = ("tile_overhead", "stage_latency", "launch")

#: Per-core tile load rates (bytes/s) tried per implementation once the grid's times are chosen
#: (None: no cap). Only an implementation timed at tiles of several FLOP per operand byte can show
#: it. The range spans both architectures that show one: Hopper's kernels load at 80-130 GB/s per
#: SM, while cuBLAS's 64 x 64 bf16 tiles on the RTX 4090 (PyTorch issue #181718: 32 FLOP per
#: operand byte at 84-90 TFLOP/s on 128 SMs) draw about 21 GB/s per SM.
LOAD_RATES: tuple[float | None, ...] = (
    None,
    *(gbps * 1e9 for gbps in (10, 15, 20, 25, 30, 40, 50, 60, 70, 80, 100, 130)),
)

#: Fixed times per call (seconds) tried for one implementation whose cases separate a fixed time
#: from its rates (:func:`_fit_launches`). Only a value inside the range is kept.
LAUNCHES: tuple[float, ...] = tuple(us * 1e-6 for us in (0, 3, 6, 10, 15, 20, 25, 30, 40))

#: A group of cases identifies one of the grid's times only if, at the largest value the grid
#: tries, that time would be at least this share of the measured time of :data:`MIN_CASES` of its
#: cases, whichever tile runs (below that the error hardly moves along the grid).
IDENTIFIES = 0.1

#: The grid's times an architecture may borrow from others when its cases do not identify them.
#: These are costs every kernel on the architecture pays, fitted jointly over its kernels, so its
#: cases identify one only when they come from at least :data:`MIN_TYPICAL_IMPLEMENTATIONS`
#: implementations: one kernel's pipeline is not every kernel's (DeepGEMM's SM100 kernels drain one
#: tile's accumulator while the next tile's MMA runs, two accumulator stages in tensor memory; the
#: B300's only kernel, they fitted a 0 us tile overhead).
BORROWABLE = ("tile_overhead", "launch")

#: A case informs the compute (or streaming) fraction of its kernel only when the MMA (or memory)
#: time that fraction explains is at least this share of its measured time. In a call of a few
#: microseconds the fixed and per-tile times are most of it, and an error of a fraction of a
#: microsecond in them moves the fraction that case implies by tens of percent (which the
#: fallback order then carries to other kernels' long calls).
BINDING_SHARE = 0.5

#: A case informs the streaming fraction of its kernel only when, at the datasheet rates, its
#: memory time is at least this multiple of its compute time (padded tiles included). Near the
#: ridge a kernel runs slower than either rate alone explains, and its time cannot tell a slow
#: stream from a slow MMA: charged to the stream, torch grouped_mm's balanced H200 calls (memory
#: and compute time within 12% of each other) made the typical H200 streaming figure, which every
#: kernel without one of its own there is predicted with, 0.58 where large streams reach 0.85.
#: At 1.5, memory binds in any kernel reaching two thirds of the compute peak. Chosen from 1.5, 2
#: and 3 by the leave-one-source-out error (the figures of each: docs/perf-model-history.md, "A
#: streaming fraction only from calls bound by their stream by far").
STREAMING_MARGIN = 1.5

#: The K-block latency (and tile overhead) at which the fit reads how many K blocks (and tile
#: overheads) a call's compute time charges.
_UNIT_TIME = 1e-6

#: Iterations of the attribute-then-refit loop at most (it settles in 3-4; a round that gives back
#: the records it started from ends it, as every later round would too).
ITERATIONS = 6

#: A warm call informs the L2 rate only when its L2-resident bytes are more than this share of
#: its bytes (otherwise its time says little about the L2).
L2_SHARE = 0.5

#: The model's ``operands`` for each ``cache_state`` of a source (unknown is predicted cold).
OPERANDS_OF_CACHE_STATE = {"cold": "hbm", "unknown": "hbm", "l2_warm": "l2"}


@dataclass(frozen=True)
class MeasuredCase:
    """One measured grouped GEMM: the call, the implementation that ran it, the measured time.

    ``counts``: rows per group (``op`` contiguous/masked) or K per group (``op`` k_grouped, with
    ``m`` rows of output per group). ``tiles``: the ``(block_m, block_n)`` the implementation can
    launch; ``split_k``: the K splits it can run them with (``(1,)``: it does not split K).
    ``swap_ab``: tokens sit on the MMA's N side (no minimum M per tile). ``fast_accumulation``:
    the kernel does not promote FP8 partial sums per K block (no K-block latency). ``kernel_family``:
    whose achieved compute fraction applies (None: the grouped family of ``op``; ``dense`` for a
    plain GEMM, modelled as one contiguous group). ``operands``: where the operands were when
    the source timed the call (``hbm``: cold or unknown; ``l2``: its benchmark had just written
    them, the source's ``cache_state`` ``l2_warm``). ``origin``: ``published`` (measured and
    published by others) or ``own`` (this project's committed run, :data:`OWN_MEASUREMENTS`).
    """

    id: str
    source: str
    device: str
    impl: str
    op: str
    dtype: str
    out_dtype: str
    counts: tuple[int, ...]
    n: int
    k: int | None
    m: int | None
    t_measured: float
    tiles: tuple[tuple[int, int], ...]
    swap_ab: bool = False
    fast_accumulation: bool = False
    streams_all_experts: bool = False
    kernel_family: str | None = None
    operands: str = "hbm"
    split_k: tuple[int, ...] = (1,)
    origin: str = "published"

    @property
    def family(self) -> str:
        return self.kernel_family or FAMILY_OF_OP[self.op]

    @property
    def configs(self) -> list[tuple[int, int, int]]:
        """Every ``(block_m, block_n, split_k)`` the implementation can run this call with."""
        return [(bm, bn, s) for bm, bn in self.tiles for s in self.split_k]


@dataclass(frozen=True)
class Outcome:
    """A prediction of one case: ``estimate`` is the model's (best tile), ``t_roofline`` the plain
    roofline on datasheet figures; errors are ``predicted / measured - 1``."""

    case: MeasuredCase
    estimate: Estimate
    t_roofline: float

    @property
    def error(self) -> float:
        return self.estimate.t_predicted / self.case.t_measured - 1

    @property
    def roofline_error(self) -> float:
        return self.t_roofline / self.case.t_measured - 1

    def as_dict(self) -> dict[str, Any]:
        e = self.estimate
        return {
            "id": self.case.id,
            "source": self.case.source,
            "origin": self.case.origin,
            "device": self.case.device,
            "impl": self.case.impl,
            "op": self.case.op,
            "family": self.case.family,
            "dtype": self.case.dtype,
            "operands": self.case.operands,
            "measured_us": self.case.t_measured * 1e6,
            "predicted_us": e.t_predicted * 1e6,
            "roofline_us": self.t_roofline * 1e6,
            "error": self.error,
            "roofline_error": self.roofline_error,
            "bound": e.bound,
            "tile": list(e.tile),
            "split_k": e.split_k,
            "basis": dict(e.basis),
        }


# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------
def load_cases(path: str | Path | None = None) -> list[MeasuredCase]:
    """Every measured case: those of ``path`` alone when given, else the published set and this
    project's own runs (every ``*.yaml`` of :data:`OWN_MEASUREMENTS` in a source checkout)."""
    if path is not None:
        return load_published(path)
    own = sorted(OWN_MEASUREMENTS.glob("*.yaml")) if OWN_MEASUREMENTS.is_dir() else []
    return [case for file in (PUBLISHED, *own) for case in load_published(file)]


def load_published(path: str | Path | None = None) -> list[MeasuredCase]:
    """The cases of one file in the published set's schema (default: the published set),
    validated against that schema."""
    import json

    import jsonschema
    import yaml

    location = Path(path) if path is not None else PUBLISHED
    if not location.is_file():
        raise ArgumentError(
            "path", "the published set bench/published/cases.yaml (in a source checkout)", str(location)
        )
    data = yaml.safe_load(location.read_text())
    schema = json.loads(PUBLISHED.with_name("schema.json").read_text())  # one schema for every file
    jsonschema.Draft202012Validator(schema).validate(data)
    impls, sources = data.get("impls", {}), data["sources"]
    return [
        _case(
            raw,
            {**impls.get(raw["impl"], {}), **sources[raw["source"]].get("kernel_tiles", {}).get(raw["impl"], {})},
            OPERANDS_OF_CACHE_STATE[sources[raw["source"]]["cache_state"]],
            "own" if "result" in sources[raw["source"]] else "published",
        )
        for raw in data["cases"]
    ]


def _case(raw: Mapping[str, Any], impl: Mapping[str, Any], operands: str, origin: str) -> MeasuredCase:
    """One case of the published set; ``impl``: what its kernel can launch (``impls.<impl>`` of
    the set, overridden by the source's ``kernel_tiles.<impl>``: the kernel version it ran);
    ``operands``: where its source's benchmark left the operands; ``origin``: see
    :class:`MeasuredCase`."""
    layout = raw["layout"]
    # a dense GEMM is one contiguous group run by a dense kernel (its own compute fraction)
    op, family = ("contiguous", "dense") if layout == "dense" else (layout, None)
    measured = raw["measured"]
    if op == "k_grouped":
        counts = (raw["k_per_group"],) * raw["groups"]
        useful = 2.0 * raw["m"] * raw["n"] * sum(counts)
    else:
        if "counts" in raw:
            counts = tuple(raw["counts"])
        elif raw["counts_basis"] == "expected" and {"time_us", "tflops"} <= set(measured):
            # rows were drawn at random around m_per_group; the printed TFLOPS and time give their sum
            rows = round(measured["tflops"] * measured["time_us"] * 1e6 / (2 * raw["n"] * raw["k"]))
            base, extra = divmod(max(rows, raw["groups"]), raw["groups"])
            counts = tuple(base + (1 if g < extra else 0) for g in range(raw["groups"]))
        else:
            counts = (raw["m_per_group"],) * raw["groups"]
        useful = 2.0 * sum(counts) * raw["n"] * raw["k"]
    t = measured["time_us"] * 1e-6 if "time_us" in measured else useful / (measured["tflops"] * 1e12)
    if "tile" in raw:
        tiles = (tuple(raw["tile"]),)
    else:
        block_m = impl.get("block_m", {}).get(layout, DEFAULT_BLOCK_M)
        if impl.get("block_m_choice") == "smallest_covering":
            # the kernel's rule, not a search: the smallest BM that holds a group's rows
            rows = raw["m"] if op == "k_grouped" else raw.get("m_per_group", max(counts))
            block_m = [min((bm for bm in block_m if bm >= rows), default=max(block_m))]
        block_n = impl.get("block_n", DEFAULT_BLOCK_N)
        tiles = tuple((bm, bn) for bm in block_m for bn in block_n if not (bm > 128 and bn > 128))
    # K-grouped calls already split K by group: no kernel splits them further
    split_k = (1,) if op == "k_grouped" else tuple(impl.get("split_k", (1,)))
    return MeasuredCase(
        id=raw["id"],
        source=raw["source"],
        device=raw["device"],
        impl=raw["impl"],
        op=op,
        dtype=raw["dtype"],
        out_dtype=raw["out_dtype"],
        counts=counts,
        n=raw["n"],
        k=raw.get("k"),
        m=raw.get("m"),
        t_measured=t,
        tiles=tiles,
        swap_ab=bool(impl.get("swap_ab", False)),
        fast_accumulation=bool(impl.get("fast_accumulation", False)),
        streams_all_experts=bool(raw.get("streams_all_experts", False)),
        kernel_family=family,
        operands=operands,
        split_k=split_k,
        origin=origin,
    )


# ---------------------------------------------------------------------------------------------
# Prediction
# ---------------------------------------------------------------------------------------------
def datasheet_hardware(device: str) -> Hardware:
    """The device on datasheet figures only (no measured or achieved values): the common basis
    every achieved fraction is a fraction of."""
    from .. import hwdb

    return Hardware.from_entry(hwdb.get(device), measured=False, achieved=False)


def predict(case: MeasuredCase, table: EfficiencyTable | None = None) -> Estimate:
    """The model's estimate of ``case``: :func:`estimate` with the achieved figures of ``table``
    (datasheet figures when None) for every tile the implementation can launch; the fastest wins."""
    hw = datasheet_hardware(case.device)
    hw = hw.replace(efficiency=table if table is not None else EfficiencyTable(), impl=case.impl)
    best = None
    for bm, bn, s in case.configs:
        est = estimate(case.counts, case.n, case.k, hw, case.dtype, bm, bn, split_k=s, **_call_options(case))
        if best is None or est.t_predicted < best.t_predicted:
            best = est
    assert best is not None
    return best


def _call_options(case: MeasuredCase) -> dict[str, Any]:
    options: dict[str, Any] = {
        "op": case.op,
        "out_dtype": case.out_dtype,
        "swap_ab": case.swap_ab,
        "fast_accumulation": case.fast_accumulation,
        "streams_all_experts": case.streams_all_experts,
        "family": case.kernel_family,
        "operands": case.operands,
    }
    if case.op == "k_grouped":
        options["m"] = case.m
    return options


# ---------------------------------------------------------------------------------------------
# Fitting
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Candidate:
    tile: tuple[int, int]
    split_k: int
    t_compute_unit: float  # compute time at the full datasheet peak, no tile overhead
    overhead_tiles: float  # tile overheads the busiest core pays (compute seconds per second of tile overhead)
    stages: float  # K blocks the busiest core runs one after another (compute seconds per second of their latency)
    t_memory_unit: float  # memory time at the full datasheet bandwidth
    share_l2: float  # the share of its bytes a warm call streams from the L2 (0 when cold)
    bytes_l2: float  # those bytes
    reuse: float  # the tile's FLOP per operand byte loaded
    core_peak: float  # datasheet FLOP/s of one core in the case's dtype


@dataclass
class _Prepared:
    case: MeasuredCase
    architecture: str
    candidates: list[_Candidate] = field(default_factory=list)


def _numbered(keys: list) -> tuple[list, np.ndarray]:
    """The distinct ``keys`` in the order of their first appearance, and each key's number in it."""
    distinct = list(dict.fromkeys(keys))
    number = {key: i for i, key in enumerate(distinct)}
    return distinct, np.array([number[key] for key in keys], dtype=int)


class _Batch:
    """Prepared cases with every candidate of each as one row of flat arrays: a fit predicts each
    case hundreds of times (grid points x iterations), so :func:`_fast_predict` runs on all of them
    at once. Iterates over the cases."""

    def __init__(self, cases: Iterable[_Prepared]):
        self.cases = list(cases)
        self.candidates = [cand for p in self.cases for cand in p.candidates]
        #: the case (index into ``cases``) each candidate row belongs to, and each case's first row
        self.owner = np.repeat(np.arange(len(self.cases)), [len(p.candidates) for p in self.cases])
        self.starts = np.searchsorted(self.owner, np.arange(len(self.cases)))
        columns = np.array(
            [
                (
                    c.t_compute_unit,
                    c.overhead_tiles,
                    c.stages,
                    c.t_memory_unit,
                    c.share_l2,
                    c.bytes_l2,
                    c.reuse,
                    c.core_peak,
                )
                for c in self.candidates
            ],
            dtype=float,
        ).reshape(len(self.candidates), 8)
        (
            self.t_unit,
            self.tiles,
            self.stages,
            self.t_memory,
            self.share_l2,
            self.bytes_l2,
            self.reuse,
            self.core_peak,
        ) = columns.T
        self.t_measured = np.array([p.case.t_measured for p in self.cases], dtype=float)
        # the questions a prediction asks the efficiency table, once per distinct kernel: a fit
        # asks them of thousands of tables
        questions = [
            (p.case.device, p.architecture, p.case.impl, p.case.dtype, p.case.family, p.case.operands == "l2")
            for p in self.cases
        ]
        self.questions, self.question = _numbered(questions)
        self.devices = sorted({p.case.device for p in self.cases})

    def load_caps(self, loads: np.ndarray, rows: np.ndarray | slice = slice(None)) -> np.ndarray:
        """The highest fraction of the datasheet peak the operand loads of the candidates ``rows``
        allow at per-core tile load rates ``loads`` (bytes/s, one per row; NaN: no cap, inf)."""
        return np.where(np.isnan(loads), np.inf, loads * self.reuse[rows] / self.core_peak[rows])

    def __iter__(self) -> Iterator[_Prepared]:
        return iter(self.cases)

    def __len__(self) -> int:
        return len(self.cases)


def _prepare(cases: Sequence[MeasuredCase]) -> list[_Prepared]:
    from .. import hwdb

    out = []
    for case in cases:
        hw = datasheet_hardware(case.device)
        prepared = _Prepared(case, hwdb.get(case.device).architecture)
        # the bytes the L2 holds do not depend on its rate: any rate makes the model split them
        l2_split = hw.replace(l2_bandwidth=hw.mem_bandwidth) if case.operands == "l2" else None
        staged = hw.replace(stage_latency=_UNIT_TIME)
        overheads = hw.replace(tile_overhead=_UNIT_TIME)
        for bm, bn, s in case.configs:
            est = estimate(case.counts, case.n, case.k, hw, case.dtype, bm, bn, split_k=s, **_call_options(case))
            t_staged = estimate(
                case.counts, case.n, case.k, staged, case.dtype, bm, bn, split_k=s, **_call_options(case)
            ).t_compute
            t_overheads = estimate(
                case.counts, case.n, case.k, overheads, case.dtype, bm, bn, split_k=s, **_call_options(case)
            ).t_compute
            resident = 0.0  # a cold call streams every byte from memory
            if l2_split is not None:
                resident = estimate(
                    case.counts, case.n, case.k, l2_split, case.dtype, bm, bn, split_k=s, **_call_options(case)
                ).bytes_l2
            prepared.candidates.append(
                _Candidate(
                    (bm, bn),
                    s,
                    est.t_compute,
                    (t_overheads - est.t_compute) / _UNIT_TIME,
                    (t_staged - est.t_compute) / _UNIT_TIME,
                    est.t_memory,
                    resident / est.bytes_kernel,
                    resident,
                    est.operand_reuse,
                    hw.peak(case.dtype) / hw.num_cores,
                )
            )
        out.append(prepared)
    return out


def _fast_predict(
    batch: _Batch,
    table: EfficiencyTable,
    overhead: float,
    stage: float,
    launch: float | Sequence[float],
    load: float | None | Sequence[float | None] = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The same arithmetic as :func:`estimate` with achieved figures, from the unit terms, for every
    case of ``batch``: per case the predicted time, the candidate (tile and split) that gives it, as
    its row in ``batch.candidates``, and whether it is compute-bound. ``launch`` and ``load`` (the per-core tile load rate, None for no
    cap) are one value for every case or one per case."""
    n = len(batch)
    eta_c, eta_b, l2 = _achieved(batch, table)
    row = batch.owner
    loads, launches = _per_case(load, n)[row], _per_case(launch, n)[row]
    # min(eta_c, the load cap) and estimate's terms, operation for operation
    rate = np.minimum(eta_c[row], batch.load_caps(loads))
    t_comp = batch.t_unit / rate + batch.tiles * overhead
    t_comp = t_comp + batch.stages * stage
    warm = ~np.isnan(l2[row])
    t_mem = np.where(
        warm,
        batch.t_memory * (1 - batch.share_l2) / eta_b[row] + batch.bytes_l2 / np.where(warm, l2[row], 1.0),
        batch.t_memory / eta_b[row],
    )
    t = np.maximum(t_comp, t_mem) + launches
    best = np.minimum.reduceat(t, batch.starts)
    # each case's first candidate at its minimum (ties go to the earlier candidate)
    at_min = np.flatnonzero(t == best[row])
    chosen = at_min[np.unique(row[at_min], return_index=True)[1]]
    return best, chosen, t_comp[chosen] >= t_mem[chosen]


def _achieved(batch: _Batch, table: EfficiencyTable) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per case of ``batch``, what ``table`` gives its kernel: the fraction of the compute peak and
    of the memory bandwidth (1 where it has none), and the L2 rate of a warm call (NaN for a cold
    call or none known: a warm call with no L2 rate streams at the cold rate)."""
    asked = len(batch.questions)
    eta_c, eta_b, l2 = np.empty(asked), np.empty(asked), np.full(asked, np.nan)
    for i, (device, architecture, impl, dtype, family, warm) in enumerate(batch.questions):
        comp = table.compute(device, architecture, impl, dtype, family)
        band = table.bandwidth(device, architecture, impl)
        eta_c[i] = comp.value if comp else 1.0
        eta_b[i] = band.value if band else 1.0
        if warm and (rate := table.figure("l2_bandwidth", device, architecture, impl)):
            l2[i] = rate.value
    return eta_c[batch.question], eta_b[batch.question], l2[batch.question]


def _per_case(value: float | None | Sequence[float | None], n: int) -> np.ndarray:
    """``value`` (one for every case, or one per case; None: none) as ``n`` floats, NaN for none."""
    values = list(value) if isinstance(value, (list, tuple)) else [value] * n
    return np.array([np.nan if v is None else v for v in values], dtype=float)


def fit(
    cases: Sequence[MeasuredCase],
    *,
    basis: str = "fitted",
    source: str = "bench/published/cases.yaml",
    grid: Sequence[tuple[float, float, float]] = GRID,
    prepared: Mapping[str, _Prepared] | None = None,
    fitted: dict[tuple, list[Achieved]] | None = None,
) -> EfficiencyTable:
    """Achieved figures that make the model reproduce ``cases`` (see the module docstring).
    ``prepared``: the cases' unit terms by case id, when the caller has them already.
    ``fitted``: the records of the architectures fitted by earlier calls on the same ``prepared``
    cases, by their inputs (:func:`_fit_architecture`), to take and to add to: the folds of a
    validation refit only the architecture of the cases they hold out, and those that borrow
    from it."""
    prepared = [prepared[c.id] for c in cases] if prepared is not None else _prepare(cases)
    by_arch: dict[str, list[_Prepared]] = {}
    for p in prepared:
        by_arch.setdefault(p.architecture, []).append(p)
    # The grid's times are fitted on published cases where an architecture has them: those are
    # kernel times from profilers, while this project's own runs time whole calls with CUDA
    # events, host launch gaps included; own runs then fit their kernels' fractions at those times.
    timed = {arch: [p for p in group if p.case.origin == "published"] or group for arch, group in by_arch.items()}
    # this project's own kernels (measured by its own runs alone) answer only for themselves
    published_impls = {p.case.impl for p in prepared if p.case.origin == "published"}
    own_kernels = frozenset(p.case.impl for p in prepared if p.case.impl not in published_impls)
    identified = {arch: _identified(timed[arch], grid) for arch in by_arch}
    # First the architectures whose cases identify every borrowable time, then the others with
    # those times fixed to what the first ones found.
    lenders = {arch for arch, known in identified.items() if all(known[kind] for kind in BORROWABLE)}
    records: list[Achieved] = []
    for arch in sorted(by_arch, key=lambda a: a not in lenders):
        known = identified[arch]
        fixed: dict[str, tuple[float, str]] = {}
        if not known["stage_latency"]:
            fixed["stage_latency"] = (0.0, f"not identified by this architecture's {len(timed[arch])} cases: 0")
        for kind in BORROWABLE:
            if not known[kind] and (lent := _borrow(kind, records, identified)) is not None:
                fixed[kind] = lent
        own_here = own_kernels & {p.case.impl for p in by_arch[arch]}
        inputs = (
            arch,
            tuple(p.case.id for p in by_arch[arch]),
            tuple(fixed.items()),
            own_here,
            basis,
            source,
            tuple(grid),
        )
        if fitted is not None and inputs in fitted:
            found = fitted[inputs]
        else:
            found = _fit_architecture(by_arch[arch], timed[arch], fixed, basis, source, own_here, grid)
            if fitted is not None:
                fitted[inputs] = found
        records.extend(found)
    return EfficiencyTable(records)


def _fit_architecture(
    cases: list[_Prepared],
    timed: list[_Prepared],
    fixed: Mapping[str, tuple[float, str]],
    basis: str,
    source: str,
    own_kernels: frozenset[str],
    grid: Sequence[tuple[float, float, float]],
) -> list[Achieved]:
    """The records of one architecture's ``cases``: its grid times fitted on ``timed`` (the
    ``fixed`` ones set: value, and in words why), each implementation's load rate and launch time,
    and the fractions at those."""
    arch = cases[0].architecture
    group, scored = _Batch(cases), _Batch(timed)
    points = _restrict(grid, {kind: value for kind, (value, _) in fixed.items()})
    # the grid without load caps, then each implementation's load rate at the chosen times,
    # then the grid again with those rates (they trade off little: one round settles them)
    table, point = _search(group, scored, points, {}, basis, source, own_kernels)
    loads, load_notes = _fit_loads(group, point, basis, source, own_kernels)
    if loads:
        table, point = _search(group, scored, points, loads, basis, source, own_kernels)
    launches, launch_notes = _fit_launches(group, point, loads, basis, source, own_kernels)
    if launches:
        table, point = _search(group, scored, points, loads, basis, source, own_kernels, launches)
    records = list(table)
    for device in group.devices:
        n = sum(1 for p in group if p.case.device == device)
        for kind, value in zip(GRID_KINDS, point):
            how = fixed[kind][1] if kind in fixed else f"one value per architecture, {len(timed)} cases"
            if kind == "tile_overhead":
                how = f"{PER_OVERHEAD_TILE}; {how}"
            records.append(Achieved(device, arch, "*", kind, value, n, basis, f"{source} ({how})"))
        # each implementation's own launch time and tile load rate, where it has one
        for kind, own, notes in (("launch", launches, launch_notes), ("tile_load_rate", loads, load_notes)):
            for impl, value in sorted(own.items()):
                mine = sum(1 for p in group if p.case.device == device and p.case.impl == impl)
                if mine:
                    records.append(
                        Achieved(
                            device,
                            arch,
                            impl,
                            kind,
                            value,
                            mine,
                            basis,
                            f"{_source_of(impl, own_kernels, source)} ({impl}'s own; {notes[impl]})",
                            typical=impl not in own_kernels,
                        )
                    )
    return records


def _score(
    group: _Batch,
    table: EfficiencyTable,
    point: tuple[float, ...],
    loads: Mapping[str, float],
    launches: Mapping[str, float] | None = None,
) -> float:
    """Mean relative error of the fast prediction over ``group``."""
    overhead, stage, launch = point
    times, _, _ = _fast_predict(
        group, table, overhead, stage, _by_impl(group, launches, launch), _by_impl(group, loads, None)
    )
    return statistics.fmean(abs(float(t) / p.case.t_measured - 1) for t, p in zip(times, group))


def _by_impl(group: _Batch, values: Mapping[str, float] | None, default: float | None) -> list[float | None]:
    """Per case of ``group``: its implementation's value in ``values`` (its own launch time or load
    rate), else ``default``."""
    return [(values or {}).get(p.case.impl, default) for p in group]


def _search(
    group: _Batch,
    scored: _Batch,
    points: Sequence[tuple[float, ...]],
    loads: Mapping[str, float],
    basis: str,
    source: str,
    own_kernels: frozenset[str],
    launches: Mapping[str, float] | None = None,
) -> tuple[EfficiencyTable, tuple[float, ...]]:
    """The fractions fitted on ``group`` and the grid point of the best of ``points`` with
    ``loads`` and the implementations' own ``launches``, judged by the error over ``scored``."""
    best = None
    for point in points:
        table = _fit_fractions(group, *point, basis, source, loads, own_kernels, launches)
        score = _score(scored, table, point, loads, launches)
        if best is None or score < best[0]:
            best = (score, table, point)
    assert best is not None
    return best[1], best[2]


def _fit_loads(
    group: _Batch, point: tuple[float, ...], basis: str, source: str, own_kernels: frozenset[str]
) -> tuple[dict[str, float], dict[str, str]]:
    """Per implementation timed at tiles of several FLOP per operand byte (a tile sweep), the
    load rate of :data:`LOAD_RATES` that best predicts its cases, kept only where it moves at
    least :data:`MIN_CASES` of their predictions by :data:`IDENTIFIES` of their measured time (a
    cap that binds nowhere the cases can see is noise); and in words how each was chosen."""
    reuse: dict[str, set[float]] = {}
    for p in group:
        for cand in p.candidates if len(p.case.tiles) == 1 else ():
            reuse.setdefault(p.case.impl, set()).add(round(cand.reuse, 3))
    loads: dict[str, float] = {}
    notes: dict[str, str] = {}
    for impl in sorted(i for i, values in reuse.items() if len(values) > 1):
        mine = _Batch(p for p in group if p.case.impl == impl)
        best = None
        for rate in LOAD_RATES:
            trial = {**loads, impl: rate} if rate is not None else dict(loads)
            table = _fit_fractions(group, *point, basis, source, trial, own_kernels)
            score = _score(mine, table, point, trial)
            if best is None or score < best[0]:
                best = (score, rate, table)
        _, rate, table = best
        if rate is None:
            continue
        moved = _moved(mine, table, (*point, rate), (*point, None))
        if moved >= MIN_CASES:
            loads[impl] = rate
            notes[impl] = f"fitted on its {len(mine)} cases at fixed tiles, binds {moved} of them"
    return loads, notes


def _fit_launches(
    group: _Batch,
    point: tuple[float, ...],
    loads: Mapping[str, float],
    basis: str,
    source: str,
    own_kernels: frozenset[str],
) -> tuple[dict[str, float], dict[str, str]]:
    """Per implementation with at least twice :data:`MIN_CASES` cases (some to pin a fixed time,
    some a rate), the fixed time of :data:`LAUNCHES` that best predicts its cases, the fractions
    refitted; kept where it differs from the architecture's, lies inside the range tried and moves
    at least :data:`MIN_CASES` of its predictions by :data:`IDENTIFIES` of their measured time; and
    in words how each was chosen.

    Whether calls tell a fixed time from a rate depends on how much of each the rates explain,
    not on how far apart the measured times are: Helion PR #3209's GB200 calls of
    ``torch._scaled_mm`` with rowwise scales take 7.5 to 11.8 us, but those of N 256 move a
    megabyte and are mostly fixed time while those of N 4096 and 6144 stream 16 to 25 MB. A
    rule that also asked the times to span a factor of 4 refused that kernel a time of its own, so
    held out, PR #2987's B200 calls of it paid the joint 3 us (docs/perf-model-history.md, "A
    thirteenth round"); the three rules above judge a time by what it does to the predictions."""
    launches: dict[str, float] = {}
    notes: dict[str, str] = {}
    for impl in sorted({p.case.impl for p in group}):
        cases = [p for p in group if p.case.impl == impl]
        if len(cases) < 2 * MIN_CASES:
            continue
        mine = _Batch(cases)
        best = None
        for launch in LAUNCHES:
            trial = {**launches, impl: launch}
            table = _fit_fractions(group, *point, basis, source, loads, own_kernels, trial)
            score = _score(mine, table, point, loads, trial)
            if best is None or score < best[0]:
                best = (score, launch, table)
        _, launch, table = best
        moved = _moved(mine, table, (*point[:2], launch, loads.get(impl)), (*point, loads.get(impl)))
        # at either end of the grid the search ran out of range: the time is making up for
        # something else (cuBLAS's warm calls on the B200 traded a 0 us fixed time for a slower L2)
        if launch not in (point[2], LAUNCHES[0], LAUNCHES[-1]) and moved >= MIN_CASES:
            launches[impl] = launch
            shortest, longest = mine.t_measured.min(), mine.t_measured.max()
            notes[impl] = f"fitted on its {len(mine)} cases of {shortest * 1e6:.0f} to {longest * 1e6:.0f} us"
    return launches, notes


def _moved(cases: _Batch, table: EfficiencyTable, changed: tuple, base: tuple) -> int:
    """How many of ``cases`` the fast prediction with the times and load rate ``changed`` moves
    from the one with ``base`` (each ``(tile overhead, K-block latency, launch, load rate)``) by at
    least :data:`IDENTIFIES` of their measured time."""
    moved = np.abs(_fast_predict(cases, table, *changed)[0] - _fast_predict(cases, table, *base)[0])
    return int(np.count_nonzero(moved >= IDENTIFIES * cases.t_measured))


def _identified(group: list[_Prepared], grid: Sequence[tuple[float, float, float]]) -> dict[str, bool]:
    """Which of the grid's times ``group`` identifies (:data:`IDENTIFIES`; a time every kernel
    pays only from several kernels' cases, :data:`BORROWABLE`)."""
    top = dict(zip(GRID_KINDS, (max(point[i] for point in grid) for i in range(len(GRID_KINDS)))))
    size = {
        "tile_overhead": lambda c: c.overhead_tiles * top["tile_overhead"],
        "stage_latency": lambda c: c.stages * top["stage_latency"],
        "launch": lambda c: top["launch"],
    }
    known = {}
    for kind in GRID_KINDS:
        showing = [p for p in group if min(size[kind](c) for c in p.candidates) >= IDENTIFIES * p.case.t_measured]
        kernels = len({p.case.impl for p in showing})
        known[kind] = len(showing) >= MIN_CASES and (kind not in BORROWABLE or kernels >= MIN_TYPICAL_IMPLEMENTATIONS)
    return known


def _borrow(
    kind: str, records: Sequence[Achieved], identified: Mapping[str, Mapping[str, bool]]
) -> tuple[float, str] | None:
    """The case-weighted median of ``kind`` over the ``records`` of the architectures fitted so
    far that identify it, and the words the borrower's records say it with; None when there is none."""
    # the times every kernel pays, not one kernel's own (_fit_launches)
    lent = [r for r in records if r.kind == kind and r.impl == "*" and identified[r.architecture][kind]]
    if not lent:
        return None
    cases: dict[str, int] = {}
    for r in lent:
        cases[r.architecture] = cases.get(r.architecture, 0) + r.cases
    names = ", ".join(f"{arch} ({n} cases)" for arch, n in sorted(cases.items()))
    return _weighted_median(lent), f"not identified by this architecture's cases; borrowed from {names}"


def _restrict(grid: Sequence[tuple[float, float, float]], fixed: Mapping[str, float]) -> list[tuple[float, ...]]:
    """The grid's points with the ``fixed`` times set to their values (duplicates dropped, order kept)."""
    index = {kind: i for i, kind in enumerate(GRID_KINDS)}
    points = []
    for point in grid:
        values = list(point)
        for kind, value in fixed.items():
            values[index[kind]] = value
        if tuple(values) not in points:
            points.append(tuple(values))
    return points


def _source_of(impl: str, own_kernels: frozenset[str], source: str) -> str:
    """The ``source`` a fitted figure of ``impl`` records: this project's runs for its own kernels."""
    return OWN_SOURCE if impl in own_kernels else source


def _fit_fractions(
    group: _Batch,
    overhead: float,
    stage: float,
    launch: float,
    basis: str,
    source: str,
    loads: Mapping[str, float] | None = None,
    own_kernels: frozenset[str] = frozenset(),
    launches: Mapping[str, float] | None = None,
) -> EfficiencyTable:
    table = EfficiencyTable()
    load_of, launch_of = _by_impl(group, loads, None), _by_impl(group, launches, launch)
    measured = group.t_measured
    left = measured - _per_case(launch_of, len(group))
    load = _per_case(load_of, len(group))
    cold = np.array([p.case.operands == "hbm" for p in group])
    # which fraction each case informs: its kernel's compute share, its device's streaming rate
    # and its kernel's L2 rate, each numbered in the order the cases first name it
    compute_of = _numbered([(p.case.device, p.case.impl, p.case.dtype, p.case.family) for p in group])
    bandwidth_of = _numbered([(p.case.device, p.case.impl) for p in group])
    l2_of = _numbered([p.case.impl for p in group])
    for _ in range(ITERATIONS):
        _, chosen, compute_bound = _fast_predict(group, table, overhead, stage, launch_of, load_of)
        t_unit, t_memory, share_l2 = group.t_unit[chosen], group.t_memory[chosen], group.share_l2[chosen]
        mma = left - group.tiles[chosen] * overhead - group.stages[chosen] * stage
        with np.errstate(divide="ignore", invalid="ignore"):
            implied = t_unit / mma
            # a tile its operand loads hold below the fraction it would imply says nothing of it
            informs_compute = (
                compute_bound
                & (mma > BINDING_SHARE * measured)
                & (implied < group.load_caps(load, chosen))
                & (t_unit >= t_memory)
            )
            streams = (
                ~compute_bound & (left > BINDING_SHARE * measured) & cold & (t_memory >= STREAMING_MARGIN * t_unit)
            )
            # the time left once the bytes outside the L2 have streamed at the cold rate
            rest = left - t_memory * (1 - share_l2) / _achieved(group, table)[1]
            informs_l2 = ~compute_bound & ~streams & (left > 0) & (share_l2 > L2_SHARE) & (rest > 0)
            streamed, l2_rate = t_memory / left, group.bytes_l2[chosen] / rest
        # (fraction a case implies, the seconds that fraction explains in it): weights (below)
        compute = _grouped(compute_of, informs_compute, np.minimum(1.0, implied), mma)
        bandwidth = _grouped(bandwidth_of, streams, np.minimum(1.0, streamed), left)
        l2 = {impl: [rate for rate, _ in pairs] for impl, pairs in _grouped(l2_of, informs_l2, l2_rate, rest).items()}
        arch = group.cases[0].architecture
        records = [
            Achieved(
                d,
                arch,
                i,
                "compute",
                _median_by_weight(v),
                len(v),
                basis,
                _source_of(i, own_kernels, source),
                dt,
                f,
                i not in own_kernels,
            )
            for (d, i, dt, f), v in compute.items()
        ]
        records += [
            Achieved(
                d,
                arch,
                i,
                "bandwidth",
                _median_by_weight(v),
                len(v),
                basis,
                _source_of(i, own_kernels, source),
                typical=i not in own_kernels,
            )
            for (d, i), v in bandwidth.items()
        ]
        for i, rates in l2.items():
            if len(rates) >= MIN_CASES:
                note = f"{source} (per implementation and architecture, from {len(rates)} warm-cache cases)"
                records += [
                    Achieved(
                        d,
                        arch,
                        i,
                        "l2_bandwidth",
                        statistics.median(rates),
                        len(rates),
                        basis,
                        note,
                        typical=i not in own_kernels,
                    )
                    for d in group.devices
                ]
        if tuple(records) == table.records:
            break  # a fixed point: each round is a function of the last one's records alone
        table = EfficiencyTable(records)
    return table


def _grouped(
    numbered: tuple[list, np.ndarray], selected: np.ndarray, values: np.ndarray, weights: np.ndarray
) -> dict[Any, list[tuple[float, float]]]:
    """The ``(value, weight)`` pairs of the ``selected`` cases by their key (``numbered``, from
    :func:`_numbered`), keys in the order the selected cases first name them, pairs in case order."""
    keys, number = numbered
    rows = np.flatnonzero(selected)
    first = np.unique(number[rows], return_index=True)
    out = {}
    for key in first[0][np.argsort(first[1])]:
        mine = rows[number[rows] == key]
        out[keys[key]] = list(zip(values[mine].tolist(), weights[mine].tolist()))
    return out


# ---------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------
#: Called as each held-out fold is predicted: the group held out, the folds done, the folds in all.
FoldProgress = Callable[[str, int, int], None]


def _leave_one_group_out(
    cases: Sequence[MeasuredCase],
    group_of: Callable[[_Prepared], str],
    jobs: int = 1,
    progress: FoldProgress | None = None,
) -> list[Outcome]:
    """For each group (``group_of`` a prepared case): fit on the other groups' cases, predict this
    group's. ``jobs``: processes the folds run in (they are independent, and the outcomes are the
    same in any number of them); 1 runs them here. ``progress``: told of each fold as it ends (in
    the order they end); the outcomes are in the order of the groups' names either way."""
    prepared = {p.case.id: p for p in _prepare(cases)}
    group = {c.id: group_of(prepared[c.id]) for c in cases}
    folds = sorted(set(group.values()))
    jobs = min(positive_int(jobs, "jobs"), len(folds))
    by_fold: dict[str, list[Outcome]] = {}

    def done(held_out: str, outcomes: list[Outcome]) -> None:
        by_fold[held_out] = outcomes
        if progress is not None:
            progress(held_out, len(by_fold), len(folds))

    if jobs == 1:
        fitted: dict[tuple, list[Achieved]] = {}
        for held_out in folds:
            done(held_out, _fold(held_out, cases, prepared, group, fitted))
    else:
        # spawn, not fork: the caller may hold threads (torch's) that a forked child would inherit stuck
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(jobs, context, _hold_folds, (cases, prepared, group)) as pool:
            running = {pool.submit(_held_fold, held_out): held_out for held_out in folds}
            for future in as_completed(running):
                done(running[future], future.result())
    return [o for held_out in folds for o in by_fold[held_out]]


def _fold(
    held_out: str,
    cases: Sequence[MeasuredCase],
    prepared: Mapping[str, _Prepared],
    group: Mapping[str, str],
    fitted: dict[tuple, list[Achieved]],
) -> list[Outcome]:
    """Fit on the cases outside ``held_out`` and predict the cases in it; ``fitted``: the
    architectures the folds before fitted (:func:`fit`)."""
    table = fit([c for c in cases if group[c.id] != held_out], prepared=prepared, fitted=fitted)
    return [Outcome(c, predict(c, table), _roofline(c)) for c in cases if group[c.id] == held_out]


#: A worker process's cases, their unit terms, their groups and the architectures its folds have
#: fitted (:func:`_hold_folds`).
_FOLD_INPUTS: tuple = ()


def _hold_folds(*inputs: Any) -> None:
    global _FOLD_INPUTS
    _FOLD_INPUTS = (*inputs, {})


def _held_fold(held_out: str) -> list[Outcome]:
    return _fold(held_out, *_FOLD_INPUTS)


def leave_one_source_out(
    cases: Sequence[MeasuredCase], jobs: int = 1, progress: FoldProgress | None = None
) -> list[Outcome]:
    """For each source: fit on the other sources, predict this one. Out-of-sample by source.
    ``jobs``: processes to run the folds in; ``progress``: told of each source as its fold ends."""
    return _leave_one_group_out(cases, lambda p: p.case.source, jobs, progress)


def leave_one_architecture_out(
    cases: Sequence[MeasuredCase], jobs: int = 1, progress: FoldProgress | None = None
) -> list[Outcome]:
    """For each GPU architecture: fit on the cases of the others, predict this one's. What a device
    of an architecture no case measured is predicted with (``moe_hal.perf.efficiency``, step 5).
    ``jobs``: processes to run the folds in; ``progress``: told of each architecture as its fold
    ends."""
    return _leave_one_group_out(cases, lambda p: p.architecture, jobs, progress)


def in_sample(cases: Sequence[MeasuredCase]) -> list[Outcome]:
    """Fit on every case and predict every case (the optimistic, in-sample figure)."""
    table = fit(cases)
    return [Outcome(case, predict(case, table), _roofline(case)) for case in cases]


def same_call_spread(cases: Sequence[MeasuredCase]) -> list[dict[str, Any]]:
    """Calls timed by more than one source on silicon with the same datasheet figures (same
    architecture, core count, peak of the dtype and memory bandwidth: an H100 SXM and an H800 SXM
    count as one): per call, each source's time, the ratio ``r`` of the slowest to the fastest and
    the cache states (``operands``) the sources timed it in. A model that predicts from the call
    and the device alone is off by at least ``(r - 1) / (r + 1)`` at one end of such a spread: in
    sample, and held out too if it predicts a held-out call within the times the other sources
    measured for it. This model also takes the cache state, so only the times of one cache state
    bound it: ``least_worst_error`` is the bound of the widest spread within one state (None where
    no state has two times). Sorted by ratio, largest first."""
    from .. import hwdb

    groups: dict[tuple, list[MeasuredCase]] = {}
    for c in cases:
        hw = datasheet_hardware(c.device)
        silicon = (
            hwdb.get(c.device).architecture,
            hw.num_cores,
            hw.peak(c.dtype),
            hw.mem_bandwidth,
        )
        # a tile the source fixed (a sweep of tiles, PyTorch's rule) makes a different call
        fixed = c.tiles[0] if len(c.tiles) == 1 else None
        call = (c.impl, c.op, c.family, c.dtype, c.out_dtype, c.counts, c.n, c.k, c.m, fixed)
        groups.setdefault(silicon + call, []).append(c)
    out = []
    for key, members in groups.items():
        if len({c.source for c in members}) < 2:
            continue
        times = {f"{c.source} ({c.device})": c.t_measured * 1e6 for c in members}
        first, fixed = members[0], key[-1]
        ratio = max(c.t_measured for c in members) / min(c.t_measured for c in members)
        operands = sorted({c.operands for c in members})
        in_one_state = [
            max(ts) / min(ts)
            for ts in ([c.t_measured for c in members if c.operands == state] for state in operands)
            if len(ts) > 1
        ]
        out.append(
            {
                "call": f"{first.impl} {first.family} {first.dtype} rows={list(first.counts)} n={first.n} k={first.k}"
                + (f" m={first.m}" if first.m else "")
                + (f" tile={fixed[0]}x{fixed[1]}" if fixed else ""),
                "times_us": times,
                "ratio": ratio,
                "operands": operands,
                "least_worst_error": (max(in_one_state) - 1) / (max(in_one_state) + 1) if in_one_state else None,
            }
        )
    return sorted(out, key=lambda r: -r["ratio"])


def least_worst_error(spread: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The lowest worst-case |error| any model of the call, the device and the cache state can
    reach on these cases (in sample, and held out with the condition :func:`same_call_spread`
    states): set by the widest spread of ``spread`` within one cache state, returned as
    ``{"error", "call"}`` (None: no such spread)."""
    bounded = [row for row in spread if row["least_worst_error"] is not None]
    if not bounded:
        return None
    row = max(bounded, key=lambda r: r["least_worst_error"])
    return {"error": row["least_worst_error"], "call": row["call"]}


def _roofline(case: MeasuredCase) -> float:
    hw = datasheet_hardware(case.device)
    return estimate(case.counts, case.n, case.k, hw, case.dtype, *case.tiles[0], **_call_options(case)).t_roofline


def summarize(outcomes: Iterable[Outcome]) -> dict[str, Any]:
    """Median and worst absolute error of the model and of the plain roofline, over all cases and
    split by the bound the model predicts (compute / memory)."""
    outcomes = list(outcomes)

    def stats(items: list[Outcome]) -> dict[str, Any]:
        if not items:
            return {"cases": 0}
        model = [abs(o.error) for o in items]
        roof = [abs(o.roofline_error) for o in items]
        return {
            "cases": len(items),
            "model_median": statistics.median(model),
            "model_worst": max(model),
            "roofline_median": statistics.median(roof),
            "roofline_worst": max(roof),
        }

    return {
        "all": stats(outcomes),
        "compute_bound": stats([o for o in outcomes if o.estimate.bound == "compute"]),
        "memory_bound": stats([o for o in outcomes if o.estimate.bound == "memory"]),
    }


# ---------------------------------------------------------------------------------------------
# Storing a fit
# ---------------------------------------------------------------------------------------------
def overlays(table: EfficiencyTable, *, method: str, tool: str, date: str | None = None) -> dict[str, dict[str, Any]]:
    """One ``overlay_of`` document per device holding ``achieved.<impl>`` (schema of hwdb/schema.json)."""
    day = date or datetime.date.today().isoformat()
    docs: dict[str, dict[str, Any]] = {}
    for r in table:
        doc = docs.setdefault(r.device, {"schema_version": 1, "overlay_of": r.device, "achieved": {}})
        impl = doc["achieved"].setdefault(r.impl, {})
        value, unit = (
            (round(r.value, 4), "fraction")
            if r.kind in FRACTIONS
            else (round(r.value * 1e6, 3), "us")
            if r.kind in SECONDS
            else (round(r.value / 1e9, 3), "GB/s")
        )
        q: dict[str, Any] = {
            "value": value,
            "unit": unit,
            "basis": r.basis,
            "cases": r.cases,
            "source": r.source,
            "method": method,
            "date": day,
            "tool": tool,
        }
        if not r.typical:
            impl["typical"] = False
        if r.kind == "compute":
            impl.setdefault("compute", {}).setdefault(r.dtype, {})[r.family] = q
        else:
            impl[r.kind] = q
    return docs


def write_overlays(table: EfficiencyTable, directory: str | Path, *, suffix: str = "", **kwargs: Any) -> list[Path]:
    """Write :func:`overlays` to ``directory/<id><suffix>.yaml``; each file is validated by the
    hardware DB before it replaces an older one."""
    import yaml

    from .. import hwdb

    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for device, doc in sorted(overlays(table, **kwargs).items()):
        target = folder / f"{device}{suffix}.yaml"
        staging = folder / f".{device}{suffix}.yaml.new"
        staging.write_text(
            "# Written by `moe-hal model calibrate`; do not edit by hand.\n" + yaml.safe_dump(doc, sort_keys=False)
        )
        try:
            hwdb.validate(staging)
        except Exception:
            staging.unlink()
            raise
        staging.replace(target)
        written.append(target)
    return written
