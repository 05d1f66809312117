"""``moe-hal bench``: time grouped GEMM on this device against peers, and validate the model.

For each case of a sweep (uniform, Zipf and the DeepGEMM issue #211 histogram for contiguous
calls; masked decode shapes; K-grouped weight gradients; N/K of DeepSeek-V3 and Qwen3-MoE) it
times ``moe_hal.grouped_gemm`` on the selected backend, ``torch.nn.functional.grouped_mm`` called
directly, and a per-expert ``torch.mm`` loop. With ``--model`` it adds the plain roofline and the
model's prediction (:mod:`moe_hal.perf`) for the backend's best tile, the error of each against
the measured time, and the median and worst absolute error. It reports; it never asserts.

Timing (:class:`moe_hal.timing.Timer`): on an accelerator, device events around each call after an
L2 flush (a 512 MiB memset that also lets the host queue the call before the device reaches it),
median over the repetitions after warm-up; on the CPU ``time.perf_counter`` around call +
synchronize, median.

Calibration measurements keep the fastest repetition (what the device can do); case timings the
median. Hardware figures: the device's hardware-DB entry, measured values first (``perf.Hardware.
from_entry``); figures the entry lacks (``cpu-generic`` has none) are measured in process
(dense ``torch.mm`` peak, copy bandwidth) and the report says so. ``--calibrate`` adds a second
model, fitted on three calls of the backend outside the sweep: a fixed time (one row), the
streaming bandwidth (one memory-bound call) and the peak (one large single-group call).

Backends tell the model about their kernels through ``BackendSpec.perf_model``
(:class:`moe_hal.backend.PerfModel`: the tiles they launch and what their kernels read).
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..timing import Timer
from . import types

# Expert GEMM shapes of the sweep (weights [G, N, K]):
# DeepSeek-V3: hidden 7168, moe_intermediate 2048, 256 routed experts, top-8
#   (huggingface.co/deepseek-ai/DeepSeek-V3 config.json); gate+up fused N = 2*2048, K = 7168, down
#   N = 7168, K = 2048 (DeepGEMM's test shapes); 32 local experts = expert parallelism 8.
# Qwen3-30B-A3B: hidden 2048, moe_intermediate 768, 128 experts, top-8
#   (huggingface.co/Qwen/Qwen3-30B-A3B config.json; also THUDM/slime scripts/models/qwen3-30B-A3B.sh).
# Qwen3-235B-A22B: hidden 4096, moe_intermediate 1536, 128 experts, top-8
#   (huggingface.co/Qwen/Qwen3-235B-A22B config.json; also slime scripts/models/qwen3-235B-A22B.sh).
SHAPES = {
    "dsv3-gateup": ("DeepSeek-V3 gate+up", 4096, 7168, 32),
    "dsv3-down": ("DeepSeek-V3 down", 7168, 2048, 32),
    "q30b-gateup": ("Qwen3-30B-A3B gate+up", 1536, 2048, 128),
    "q30b-down": ("Qwen3-30B-A3B down", 2048, 768, 128),
    "q235b-gateup": ("Qwen3-235B-A22B gate+up", 3072, 4096, 128),
    "q235b-down": ("Qwen3-235B-A22B down", 4096, 1536, 128),
}


@dataclass
class Case:
    """One call of the sweep. ``counts``: rows per group (contiguous), ``masked_m`` (masked) or
    tokens per group (k_grouped, with ``m`` output rows per group and ``k`` None)."""

    name: str
    source: str
    op: str
    dtype: str
    n: int
    k: int | None
    counts: list[int]
    m: int | None = None
    max_m: int | None = None
    dist: str = ""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "bench",
        help="time grouped GEMM against peers; --model validates the performance model",
        description="Time moe_hal.grouped_gemm on the selected backend against torch grouped_mm and a "
        "per-expert torch.mm loop over a sweep of MoE shapes; with --model, compare with the "
        "roofline and the model's prediction. Reports, never asserts.",
    )
    p.add_argument("--backend", help="force this backend (default: what moe_hal selects)")
    p.add_argument("--device", type=types.device, help="torch device (default: cuda when available, else cpu)")
    p.add_argument("--model", action="store_true", help="add the model's ideal and prediction and the error summary")
    p.add_argument(
        "--calibrate",
        action="store_true",
        help="also fit a calibrated model (fixed time, bandwidth, peak) on three calls outside the sweep",
    )
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="CPU-sized sweep (the default on CPU)")
    size.add_argument("--full", action="store_true", help="GPU-sized sweep (the default on GPU)")
    p.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), help="operand dtype (default bf16 on GPU, fp32 on CPU)")
    p.add_argument("--fp8", action="store_true", help="add fp8 (1x128 / 128x128 block-scaled) cases")
    p.add_argument("--only", help="run only the cases whose name contains this text")
    p.add_argument("--warmup", type=int, default=3, help="warm-up calls per timing (default 3)")
    p.add_argument("--reps", type=int, default=15, help="timed calls per timing (default 15)")
    p.add_argument("--no-peers", action="store_true", help="time only the moe_hal backend")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic histograms and data")
    p.add_argument("--json", action="store_true", help="print the JSON report instead of a table")
    p.add_argument("--out", metavar="FILE.json", help="also write the JSON report to this file")
    p.set_defaults(func=run)


# ---------------------------------------------------------------------------------------------
# sweep
# ---------------------------------------------------------------------------------------------
def sweep(full: bool, dtype: str, fp8: bool, seed: int = 0) -> list[Case]:
    """The cases of the quick (CPU-sized) or full (GPU-sized) sweep."""
    from .. import workloads

    def counts(dist: str, tokens: int, experts: int, topk: int = 8) -> list[int]:
        return workloads.synthetic_counts(dist, tokens, experts, topk, seed)

    cases: list[Case] = []
    if not full:
        for dist in ("uniform", "zipf:1.2"):
            cases.append(
                Case(f"small-{dist}", "synthetic", "contiguous", dtype, 256, 512, counts(dist, 128, 8, 2), dist=dist)
            )
        cases.append(
            Case(
                "small-seed",
                "issue #211 histogram",
                "contiguous",
                dtype,
                128,
                256,
                list(workloads.SEED_COUNTS),
                dist="seed",
            )
        )
        for m in (4, 16):
            cases.append(
                Case(
                    f"small-decode-m{m}",
                    "synthetic",
                    "masked",
                    dtype,
                    256,
                    512,
                    workloads.masked_decode_counts(m, 8, 32, seed),
                    max_m=32,
                    dist=f"uniform mean {m}",
                )
            )
        cases.append(
            Case(
                "small-wgrad",
                "synthetic",
                "k_grouped",
                dtype,
                256,
                None,
                counts("zipf:1.2", 256, 8, 2),
                m=128,
                dist="zipf:1.2",
            )
        )
        if fp8:
            cases.append(
                Case(
                    "small-fp8-uniform",
                    "synthetic",
                    "contiguous",
                    "fp8",
                    256,
                    512,
                    counts("uniform", 128, 8, 2),
                    dist="uniform",
                )
            )
        return cases

    def add(shape: str, dist: str, tokens: int, topk: int = 8, dt: str = dtype) -> None:
        source, n, k, experts = SHAPES[shape]
        if dist == "seed":
            c = workloads.synthetic_counts("seed", tokens, 32, topk) if tokens else list(workloads.SEED_COUNTS)
        else:
            c = counts(dist, tokens, experts, topk)
        suffix = "" if dt == dtype else f"-{dt}"
        cases.append(Case(f"{shape}-{dist}-{sum(c)}{suffix}", source, "contiguous", dt, n, k, c, dist=dist))

    for shape in ("dsv3-gateup", "dsv3-down"):
        for dist in ("uniform", "zipf:0.8", "zipf:1.2"):
            add(shape, dist, 1024)
        add(shape, "seed", None)
    add("dsv3-gateup", "seed", 4024)  # the seed histogram x4: 32192 rows
    for shape in ("q30b-gateup", "q30b-down"):
        for dist in ("uniform", "zipf:1.2"):
            add(shape, dist, 4096)
    for shape in ("q235b-gateup", "q235b-down"):
        for dist in ("uniform", "zipf:1.2"):
            add(shape, dist, 2048)

    def decode(shape: str, m: int, max_m: int, dt: str = dtype) -> None:
        source, n, k, experts = SHAPES[shape]
        suffix = "" if dt == dtype else f"-{dt}"
        cases.append(
            Case(
                f"{shape}-decode-m{m}{suffix}",
                source + " decode",
                "masked",
                dt,
                n,
                k,
                workloads.masked_decode_counts(m, experts, max_m, seed),
                max_m=max_m,
                dist=f"uniform mean {m}",
            )
        )

    for m in (4, 16, 64):
        decode("dsv3-gateup", m, 128)
    for m in (8, 32):
        decode("dsv3-down", m, 128)
    for m in (4, 16):
        decode("q235b-gateup", m, 64)
    # weight gradients: dW[g] = dy[rows_g].T @ x[rows_g] -> out [G, N_fwd, K_fwd]
    cases.append(
        Case(
            "q30b-gateup-wgrad-uniform",
            "Qwen3-30B-A3B gate+up wgrad",
            "k_grouped",
            dtype,
            2048,
            None,
            counts("uniform", 4096, 128),
            m=1536,
            dist="uniform",
        )
    )
    cases.append(
        Case(
            "dsv3-down-wgrad-zipf:1.2",
            "DeepSeek-V3 down wgrad",
            "k_grouped",
            dtype,
            2048,
            None,
            counts("zipf:1.2", 1024, 32),
            m=7168,
            dist="zipf:1.2",
        )
    )
    if fp8:
        add("dsv3-gateup", "uniform", 1024, dt="fp8")
        add("dsv3-gateup", "seed", None, dt="fp8")
        add("dsv3-down", "zipf:1.2", 1024, dt="fp8")
        add("q235b-gateup", "uniform", 2048, dt="fp8")
        decode("dsv3-gateup", 16, 128, dt="fp8")
        decode("dsv3-down", 32, 128, dt="fp8")
    return cases


# ---------------------------------------------------------------------------------------------
# data and implementations
# ---------------------------------------------------------------------------------------------
@dataclass
class Prepared:
    """The operands of one case on the device, and the calls to time."""

    args: tuple
    layout: Any
    calls: dict[str, Callable[[], Any]] = field(default_factory=dict)
    outputs: dict[str, Any] = field(default_factory=dict)


def prepare(case: Case, device: Any, backend: str | None, peers: bool, seed: int) -> Prepared:
    import torch
    import torch.nn.functional as F

    import moe_hal
    from moe_hal.quant import quantize_fp8

    gen = torch.Generator(device=device).manual_seed(seed)
    fp8 = case.dtype == "fp8"
    tdtype = (
        torch.bfloat16 if fp8 else {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[case.dtype]
    )

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=device, dtype=tdtype)

    G = len(case.counts)
    if case.op == "contiguous":
        layout = moe_hal.ContiguousLayout.from_counts(case.counts, alignment=128)
        a, b = randn(layout.num_rows, case.k), randn(G, case.n, case.k) / case.k**0.5
        ends = layout.aligned_ends_on(device)
    elif case.op == "masked":
        masked_m = torch.tensor(case.counts, dtype=torch.int32, device=device)
        mean = max(1, round(sum(case.counts) / G))
        layout = moe_hal.MaskedLayout(masked_m, case.max_m, expected_m=min(mean, case.max_m))
        a, b = randn(G, case.max_m, case.k), randn(G, case.n, case.k) / case.k**0.5
    else:
        layout = moe_hal.KGroupedLayout.from_counts(case.counts, alignment=1)
        a, b = randn(layout.num_rows, case.m), randn(layout.num_rows, case.n) / max(1, layout.num_rows) ** 0.5
        ends = layout.psum_on(device)
    prep = Prepared((a, b), layout)
    if fp8:
        qa = quantize_fp8(a, block=(1, 128))
        qb = quantize_fp8(b, block=(128, 128))
        prep.args = (qa, qb)
    op_a, op_b = prep.args
    prep.calls["moe_hal"] = lambda: moe_hal.grouped_gemm(op_a, op_b, layout, backend=backend)
    if not peers or fp8:
        return prep

    if case.op == "contiguous":
        prep.calls["torch.grouped_mm"] = lambda: F.grouped_mm(a, b.transpose(-2, -1), offs=ends)
        loop_out = torch.zeros(layout.num_rows, case.n, device=device, dtype=tdtype)
        segments = [(g, s, e) for g, s, e in layout.segments() if e > s]

        def loop() -> torch.Tensor:
            for g, s, e in segments:
                torch.mm(a[s:e], b[g].t(), out=loop_out[s:e])
            return loop_out
    elif case.op == "masked":
        prep.calls["torch.grouped_mm"] = lambda: F.grouped_mm(a, b.transpose(-2, -1))
        loop_out = torch.zeros(G, case.max_m, case.n, device=device, dtype=tdtype)
        valid = [(g, c) for g, c in enumerate(case.counts) if c]

        def loop() -> torch.Tensor:
            for g, c in valid:
                torch.mm(a[g, :c], b[g].t(), out=loop_out[g, :c])
            return loop_out
    else:
        prep.calls["torch.grouped_mm"] = lambda: F.grouped_mm(a.t(), b, offs=ends)
        loop_out = torch.zeros(G, case.m, case.n, device=device, dtype=tdtype)
        segments = list(layout.segments())

        def loop() -> torch.Tensor:
            for g, s, e in segments:
                if e > s:
                    torch.mm(a[s:e].t(), b[s:e], out=loop_out[g])
                else:
                    loop_out[g].zero_()
            return loop_out

    prep.calls["torch.mm loop"] = loop
    return prep


# ---------------------------------------------------------------------------------------------
# hardware figures and calibration
# ---------------------------------------------------------------------------------------------
def _hw_entry(device: Any) -> Any:
    from ..devices import match_device

    found = match_device(device)
    return found.entry, found.seen


def base_hardware(device: Any, dtypes: set[str], timer: Timer) -> tuple[Any, dict[str, Any]]:
    """The hardware the model uses: the DB entry (measured values first), with any peak or
    bandwidth the entry lacks measured here. Returns ``(perf.Hardware, notes)``."""
    import os

    from .. import perf
    from ..errors import ArgumentError

    entry, seen = _hw_entry(device)
    notes: dict[str, Any] = {"db_entry": getattr(entry, "id", None), "device_seen": seen, "measured_here": {}}
    peaks: dict[str, float] = {}
    sources: dict[str, str] = {}
    bandwidth = cores = mma = None
    if entry is not None:
        cores, mma = entry.num_cores, entry.mma_min_m
        try:
            db_hw = perf.Hardware.from_entry(entry)
        except ArgumentError as exc:  # an entry without figures (cpu-generic): measured below
            notes["db_incomplete"] = str(exc)
        else:
            peaks, bandwidth, sources = dict(db_hw.peak_flops), db_hw.mem_bandwidth, dict(db_hw.sources)
    if not bandwidth:
        bandwidth = measure_copy_bandwidth(device, timer)
        notes["measured_here"]["bandwidth"] = bandwidth
        sources["bandwidth"] = "measured here (copy, read+write)"
    for d in sorted(dtypes):
        if d not in peaks and d != "fp8":
            peaks[d] = measure_mm_peak(device, d, timer)
            notes["measured_here"][f"peak.{d}"] = peaks[d]
            sources[f"peak.{d}"] = "measured here (dense torch.mm)"
    if not cores:
        cores = os.cpu_count() or 1
        sources["num_cores"] = "os.cpu_count()"
    name = getattr(entry, "id", None) or f"unrecognised {device.type}"
    return perf.Hardware(name, int(cores), peaks, float(bandwidth), mma_min_m=mma, sources=sources), notes


def measure_copy_bandwidth(device: Any, timer: Timer) -> float:
    """Device copy bandwidth in bytes/s, counting read + write (the basis of the H200 entry);
    the fastest repetition."""
    import torch

    nbytes = (1 << 30) if device.type == "cuda" else (256 << 20)
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    t = timer(lambda: dst.copy_(src))["min"]
    return 2 * nbytes / t


def measure_mm_peak(device: Any, dtype: str, timer: Timer) -> float:
    """Dense FLOP/s of one square ``torch.mm`` (8192 on CUDA, 1024 elsewhere); the fastest repetition."""
    import torch

    n = 8192 if device.type == "cuda" else 1024
    td = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    x = torch.randn(n, n, device=device).to(td)
    y = torch.randn(n, n, device=device).to(td)
    return 2 * n**3 / timer(lambda: torch.mm(x, y))["min"]


def calibrate(
    base: Any, device: Any, dtypes: set[str], backend: str | None, timer: Timer, model_opts: dict[str, Any], seed: int
) -> tuple[Any, dict[str, Any]]:
    """A calibrated copy of ``base``, fitted on calls that are not part of the sweep:

    1. ``t_fixed``: a one-row call of the backend, minus the model's time for it;
    2. bandwidth: scaled so the model's memory time of one memory-bound call of the backend
       (16 experts x 8 rows, N = K = 4096 on a GPU) equals its measured time; the device copy
       bandwidth is the starting point, and what is kept when that call is not memory-bound;
    3. per dtype, the peak scaled so the model's compute time of one large single-group call
       (M 8192, N = K 4096 on a GPU) equals its measured time.
    Each fit keeps the fastest repetition and subtracts ``t_fixed``.
    """
    gpu = device.type == "cuda"
    first = sorted(dtypes)[0]
    info: dict[str, Any] = {"copy_bandwidth": measure_copy_bandwidth(device, timer)}
    hw = base.replace(mem_bandwidth=info["copy_bandwidth"], name=base.name + "+calibrated")

    def measure(case: Case) -> float:
        return timer(prepare(case, device, backend, False, seed).calls["moe_hal"])["min"]

    tiny = Case("calibration-tiny", "calibration", "contiguous", first, 128, 128, [1])
    t_tiny = measure(tiny)
    info["t_fixed"] = max(0.0, t_tiny - _predict(tiny, hw, model_opts).t_predicted)
    hw = hw.replace(t_fixed=info["t_fixed"])

    groups, rows, nk = (16, 8, 4096) if gpu else (8, 4, 512)
    stream = Case("calibration-stream", "calibration", "contiguous", first, nk, nk, [rows] * groups)
    t = measure(stream)
    est = _predict(stream, hw, model_opts)
    body = t - info["t_fixed"]
    fitted = est.bound == "memory" and body > 0
    if fitted:
        hw = hw.replace(mem_bandwidth=hw.mem_bandwidth * est.t_memory / body)
    info["bandwidth"] = {
        "value": hw.mem_bandwidth,
        "shape": {"groups": groups, "rows": rows, "n": nk, "k": nk},
        "dtype": first,
        "measured_s": t,
        "fitted": fitted,
    }

    peaks = dict(hw.peak_flops)
    big_m, big_nk = (8192, 4096) if gpu else (1024, 512)
    for d in sorted(dtypes):
        if d not in peaks:
            info[f"peak.{d}"] = "not calibrated: no base peak for this dtype"
            continue
        case = Case(f"calibration-{d}", "calibration", "contiguous", d, big_nk, big_nk, [big_m])
        t = measure(case)
        est = _predict(case, hw.replace(peak_flops=peaks), model_opts)
        body = t - info["t_fixed"]
        fitted = est.bound == "compute" and body > 0
        if fitted:
            peaks[d] = peaks[d] * est.t_compute / body
        info[f"peak.{d}"] = {"value": peaks[d], "shape": [big_m, big_nk, big_nk], "measured_s": t, "fitted": fitted}
    sources = dict(
        hw.sources,
        **{f"peak.{d}": "fitted on one large call of the backend" for d in dtypes if d in peaks},
        bandwidth="fitted on one memory-bound call of the backend"
        if info["bandwidth"]["fitted"]
        else "measured here (copy, read+write)",
        t_fixed="one-row call of the backend",
    )
    return hw.replace(peak_flops=peaks, sources=sources), info


# ---------------------------------------------------------------------------------------------
# model
# ---------------------------------------------------------------------------------------------
def model_options(spec: Any) -> dict[str, Any]:
    """What a backend declares about its kernels for the model (``spec.perf_model``)."""
    from .. import perf

    declared = spec.perf_model
    return {
        "tiles": list(declared.tiles or perf.DEFAULT_TILES),
        **declared.estimate_options(),
        "masked_computes_max_m": declared.masked_computes_max_m,
    }


def _predict(case: Case, hw: Any, opts: dict[str, Any]) -> Any:
    """The best :class:`moe_hal.perf.Estimate` over the backend's tiles for ``case``."""
    from .. import perf

    counts = case.counts
    extra: dict[str, Any] = {"op": case.op}
    if case.op == "masked":
        extra["max_m"] = case.max_m
        if opts["masked_computes_max_m"]:
            counts = [case.max_m] * len(case.counts)
    if case.op == "k_grouped":
        extra["m"] = case.m
    else:
        extra["streams_all_experts"] = opts["streams_all_experts"]
        extra["reads_padding_rows"] = opts["reads_padding_rows"]
    return perf.advise(counts, case.n, case.k, hw, case.dtype, opts["tiles"], **extra).best


def error_summary(errors: list[float]) -> dict[str, Any]:
    """Median and worst absolute relative error, mean signed error, count."""
    if not errors:
        return {"n": 0}
    absolute = [abs(e) for e in errors]
    return {
        "n": len(errors),
        "median_abs_error": statistics.median(absolute),
        "worst_abs_error": max(absolute),
        "mean_error": statistics.fmean(errors),
    }


# ---------------------------------------------------------------------------------------------
# command
# ---------------------------------------------------------------------------------------------
def run(args: argparse.Namespace) -> int:
    import torch
    from rich.console import Console
    from rich.progress import Progress

    import moe_hal

    err = Console(stderr=True)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    full = args.full or (not args.quick and device.type != "cpu")
    dtype = args.dtype or ("fp32" if device.type == "cpu" else "bf16")
    cases = sweep(full, dtype, args.fp8, args.seed)
    if args.only:
        known = cases
        cases = [c for c in cases if args.only in c.name]
        if not cases:
            from ..errors import ArgumentError

            raise ArgumentError(
                "--only",
                f"text contained in a case name of this sweep, one of: {', '.join(c.name for c in known)}",
                repr(args.only),
            )
    timer = Timer(device, args.warmup, args.reps)
    report: dict[str, Any] = {
        "tool": "moe-hal bench",
        "moe_hal": moe_hal.__version__,
        "torch": torch.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": str(device),
        "sweep": "full" if full else "quick",
        "dtype": dtype,
        "timing": timer.method,
        "backend_requested": args.backend,
        "cases": [],
        "notes": [],
        "warnings": [],
    }
    if device.type == "cuda":
        report["device_name"] = torch.cuda.get_device_name(device)
    dtypes = {c.dtype for c in cases}
    hw = hw_cal = None
    options: dict[str, dict[str, Any]] = {}  # model options per backend name
    with Progress(console=err, transient=True) as progress:
        if args.model:
            task = progress.add_task("hardware figures", total=None)
            try:
                hw, notes = base_hardware(device, dtypes, timer)
            except Exception as exc:  # noqa: BLE001 - report and carry on timing: a one-shot GPU run must not be lost
                report["notes"].append(f"no model: the hardware figures failed: {type(exc).__name__}: {exc}")
            else:
                report["hardware"] = {"model": _hw_dict(hw), **notes}
                if device.type == "cpu":
                    report["notes"].append(
                        "the tile/wave model describes GPU/NPU kernels (tiles on cores, waves, MMA floors); it is "
                        "not expected to predict CPU kernels, and CPU timings on a shared machine are noisy: read "
                        "these errors as a report, not a validation"
                    )
                if notes["measured_here"]:
                    report["notes"].append(
                        "the hardware DB lacks some figures for this device; they were measured "
                        "in process (see hardware.measured_here)"
                    )
            progress.remove_task(task)
        task = progress.add_task("cases", total=len(cases))
        for case in cases:
            progress.update(task, description=case.name)
            row = run_case(case, device, args, timer)
            if hw is not None and "error" not in row:
                name = row["backend"]
                if name not in options:
                    options[name] = model_options(moe_hal.get_backend(name).spec)
                    report.setdefault("model_options", {})[name] = {
                        **options[name],
                        "tiles": [list(t) for t in options[name]["tiles"]],
                    }
                    if args.calibrate and "calibration" not in report["hardware"]:
                        progress.update(task, description=f"calibrating on {name}")
                        try:
                            hw_cal, info = calibrate(
                                hw, device, dtypes, args.backend or name, timer, options[name], args.seed
                            )
                        except Exception as exc:  # noqa: BLE001 - a failed fit is reported; the sweep goes on
                            info = {"error": f"{type(exc).__name__}: {exc}"}
                        else:
                            report["hardware"]["calibrated"] = _hw_dict(hw_cal)
                        report["hardware"]["calibration"] = {"backend": args.backend or name, **info}
                try:
                    add_model(row, case, hw, hw_cal, options[name])
                except Exception as exc:  # noqa: BLE001 - a case the model cannot describe keeps its times
                    row["model_error"] = f"{type(exc).__name__}: {exc}"
            report["cases"].append(row)
            for message in row.get("warnings", ()):
                if message not in report["warnings"]:
                    report["warnings"].append(message)
            if hw is not None:
                report["summary"] = summarize(report["cases"], hw_cal is not None)
            if args.out:  # after every case, so an interrupted run keeps what it measured
                _write(report, args.out)
            progress.advance(task)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    if len(options) > 1:
        report["notes"].append(
            f"cases ran on several backends ({', '.join(sorted(options))}); the calibrated "
            "model was fitted on the first"
        )
    if args.out:
        _write(report, args.out)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_report(report)
    ran = sum(1 for r in report["cases"] if "error" not in r)
    return 0 if ran or not cases else 1


def _write(report: dict[str, Any], path: str) -> None:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")


def run_case(case: Case, device: Any, args: argparse.Namespace, timer: Timer) -> dict[str, Any]:
    """Time one case; warnings moe_hal raises on the way (path changes) land in ``row["warnings"]``."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        row = _run_case(case, device, args, timer)
    messages = list(dict.fromkeys(str(w.message) for w in caught))
    if messages:
        row["warnings"] = messages
    return row


def _run_case(case: Case, device: Any, args: argparse.Namespace, timer: Timer) -> dict[str, Any]:
    import moe_hal

    row: dict[str, Any] = {
        "name": case.name,
        "source": case.source,
        "op": case.op,
        "dtype": case.dtype,
        "n": case.n,
        "k": case.k,
        "m": case.m,
        "max_m": case.max_m,
        "dist": case.dist,
        "num_groups": len(case.counts),
        "rows": sum(case.counts),
        "counts": case.counts,
    }
    try:
        prep = prepare(case, device, args.backend, not args.no_peers, args.seed)
        sel = moe_hal.select(*prep.args, prep.layout, backend=args.backend)
    except Exception as exc:  # noqa: BLE001 - recorded per case: one failing case must not end a one-shot GPU run
        row["error"] = f"{type(exc).__name__}: {exc}"
        return row
    row["backend"] = sel.name
    row["mode"] = sel.mode
    row["path"] = sel.chosen.path
    times: dict[str, Any] = {}
    outputs: dict[str, Any] = {}
    for name, fn in prep.calls.items():
        try:
            times[name] = timer(fn)
            outputs[name] = fn()
        except Exception as exc:  # noqa: BLE001 - recorded: a peer that rejects a shape is a result, not a crash
            times[name] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
    row["times"] = times
    if "error" in times["moe_hal"]:
        row["error"] = "the moe_hal call failed: " + times["moe_hal"]["error"]
    ref = outputs.get("torch.mm loop")
    got = outputs.get("moe_hal")
    if ref is not None and got is not None:
        # a sanity check of the timed result, not a conformance test
        scale = ref.float().abs().max().clamp_min(1e-30)
        row["max_rel_diff_vs_loop"] = float(((got.float() - ref.float()).abs().max() / scale).item())
    t = times.get("moe_hal", {}).get("median")
    for peer in ("torch.grouped_mm", "torch.mm loop"):
        tp = times.get(peer, {}).get("median")
        if t and tp:
            row.setdefault("speedup_vs", {})[peer] = tp / t
    del prep, outputs, ref, got
    return row


def add_model(row: dict[str, Any], case: Case, hw: Any, hw_cal: Any, opts: dict[str, Any]) -> None:
    measured = row["times"].get("moe_hal", {}).get("median")
    est = _predict(case, hw, opts)
    model: dict[str, Any] = {
        "tile": list(est.tile),
        "bound": est.bound,
        "occupancy_m": est.occupancy_m,
        "tiles": est.tiles,
        "waves": est.waves,
        "wave_efficiency": est.wave_efficiency,
        "t_roofline": est.t_roofline,
        "t_padded": est.t_padded,
        "t_predicted": est.t_predicted,
    }
    if hw_cal is not None:
        cal = _predict(case, hw_cal, opts)
        model.update(t_predicted_calibrated=cal.t_predicted, tile_calibrated=list(cal.tile), bound_calibrated=cal.bound)
    if measured:
        for key in ("t_roofline", "t_padded", "t_predicted", "t_predicted_calibrated"):
            if key in model:
                model["error_" + key.removeprefix("t_")] = model[key] / measured - 1
    row["model"] = model


def summarize(rows: list[dict[str, Any]], calibrated: bool) -> dict[str, Any]:
    variants = {"roofline": "error_roofline", "padded_roofline": "error_padded", "model": "error_predicted"}
    if calibrated:
        variants["model_calibrated"] = "error_predicted_calibrated"
    out = {}
    for name, key in variants.items():
        errors = [r["model"][key] for r in rows if key in r.get("model", {})]
        out[name] = error_summary(errors)
    out["definition"] = "error = predicted / measured - 1 per case; median and worst of |error|"
    return out


def _hw_dict(hw: Any) -> dict[str, Any]:
    return {
        "name": hw.name,
        "num_cores": hw.num_cores,
        "peak_flops": dict(hw.peak_flops),
        "mem_bandwidth": hw.mem_bandwidth,
        "mma_min_m": hw.mma_min_m,
        "t_fixed": hw.t_fixed,
        "sources": dict(hw.sources),
    }


def print_report(report: dict[str, Any]) -> None:
    from . import render

    console = render.console()
    console.print(
        render.text(
            f"moe-hal bench on {report['device']} {report.get('device_name', '')} "
            f"({report['sweep']} sweep, {report['dtype']}); {report['timing']}"
        )
    )
    rows: list[list[str]] = []
    cols = ["case", "op", "G", "rows", "backend", "moe_hal", "grouped_mm", "mm loop"]
    with_model = "summary" in report
    if with_model:
        cols += ["roofline", "model", "err", "tile", "bound"]
        if "model_calibrated" in report["summary"]:
            cols += ["calibrated", "err"]
    for r in report["cases"]:
        if "error" in r:
            rows.append(
                [
                    r["name"],
                    r["op"],
                    str(r["num_groups"]),
                    str(r["rows"]),
                    "-",
                    r["error"][:60],
                    *[""] * (len(cols) - 6),
                ]
            )
            continue
        t = r["times"]
        cells = [r["name"], r["op"], str(r["num_groups"]), str(r["rows"]), r["backend"]]
        for key in ("moe_hal", "torch.grouped_mm", "torch.mm loop"):
            cells.append(
                f"{t[key]['median'] * 1e6:.1f}" if "median" in t.get(key, {}) else ("err" if key in t else "-")
            )
        if with_model:
            m = r.get("model")
            if m is None:
                cells += ["", r.get("model_error", "-")[:40]] + [""] * (len(cols) - len(cells) - 2)
            else:
                cells += [
                    f"{m['t_roofline'] * 1e6:.1f}",
                    f"{m['t_predicted'] * 1e6:.1f}",
                    f"{m.get('error_predicted', float('nan')):+.0%}",
                    "x".join(map(str, m["tile"])),
                    m["bound"],
                ]
                if "model_calibrated" in report["summary"]:
                    cal = m.get("t_predicted_calibrated")
                    cells += [
                        f"{cal * 1e6:.1f}" if cal else "-",
                        f"{m.get('error_predicted_calibrated', float('nan')):+.0%}",
                    ]
        rows.append(cells)
    words = ("case", "op", "backend", "bound")
    numbers = [c for c in cols if c not in words]
    console.print(render.table("times in us (median)", cols, rows, key=["case", *numbers], right=numbers))
    if with_model:
        for name, s in report["summary"].items():
            if isinstance(s, dict) and s.get("n"):
                console.print(
                    f"{name}: median |error| {s['median_abs_error']:.1%}, worst {s['worst_abs_error']:.1%}, "
                    f"mean {s['mean_error']:+.1%} over {s['n']} cases"
                )
    for note in report["notes"]:
        console.print(render.text(f"note: {note}"))
    for message in report["warnings"]:
        console.print(render.text(f"warning: {message}"))
