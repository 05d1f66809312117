"""One-call GPU check of the cuda_sm90 / cuda_sm100 backends: correctness, timings, targets.

    python backends/cuda/scripts/gpu_check.py --out $OUT/gpu_check.json          # on a GPU (backends/cuda/scripts/gpu_check.sh runs it)
    python backends/cuda/scripts/gpu_check.py --cpu-smoke --out /tmp/smoke.json   # tiny shapes, Triton interpreter, no GPU

Sections, in this order, each recorded in the JSON report (rewritten after every case and every
section; a section is skipped, with the reason, when the time budget ``--budget`` runs out):

0. **GPU-only checks** first: no host sync with a new routing every call on every layout
   (``torch.cuda.set_sync_debug_mode("error")``), CUDA-graph capture and replay of masked calls
   (new ``masked_m`` values) and of contiguous calls, selection on the real device;
1. **correctness** of every kernel against the float64 reference on the device: contiguous,
   masked and K-grouped, bf16 / fp16 / fp8 with SM90 (fp32) and SM100 (packed UE8M0) scale
   formats — the SM100-format kernels run on whatever GPU this is, which is *not* SM100 hardware
   unless the report says so (and ``tl.dot_scaled`` falls back to Triton's emulation off SM100) —
   plus N/K edge sizes, empty groups, skewed routing, masked sentinel rows, and K-grouped calls
   with and without ``c``;
2. **contiguous timings** on DeepSeek-V3 expert shapes (N=4096/K=7168, N=7168/K=2048) for the
   32-expert seed histogram scaled to 8k-64k rows and Zipf routings: our Triton kernel (bf16 and
   fp8) against ``torch.nn.functional.grouped_mm`` (or ``torch._grouped_mm``), a per-expert
   ``torch.mm`` loop, DeepGEMM when importable, and the performance model's ideal,
   occupancy-adjusted roofline and prediction; the advisor's tile against every fixed tile of the
   config table, bf16 and fp8;
3. **K-grouped timings** (weight gradients) against grouped_mm's 2D x 2D form and a loop;
4. **L2 state**: one-group calls (ours bf16 and fp8, ``torch.mm``, per-tensor
   ``torch._scaled_mm``) timed warm, with rotating inputs, and after a zeroing or a reading L2
   flush — whether the dirty lines a zeroing flush leaves slow the timed call;
5. **partial waves**: one-group calls of one fixed tile launching 1/8 of a wave to two waves
   (bf16 and fp8), each timed against the full wave and the model: whether a tile runs faster
   when fewer SMs are busy, which the model's waves term says it does not;
6. **masked decode** (4-64 tokens per expert): eager, CUDA-graph replay and a per-expert loop
   against the weight-bandwidth floor;
7. **targets**: each target of the issue as a ratio measured in this run, per case and summarised.

The kernel checks drive the backends directly (no plugin selection, no hardware DB), so an image
without ``jsonschema`` still runs them; the tile advisor and the model figures need the DB and
say so when it is missing.

Timing: CUDA events around each call, warm-up calls first, the median of the repetitions;
inputs rotate over enough copies that one set is not in L2 when it is used again (``--l2-factor``
times the L2 size). It reports; it never asserts a speed. The exit status is 1 when a correctness
or GPU-only check fails or a section crashes (``gpu_check.sh`` passes it on), 0 otherwise.
"""

from __future__ import annotations

import os
import sys

if "--cpu-smoke" in sys.argv:  # before anything imports triton: run every kernel interpreted
    os.environ["MOE_HAL_CUDA_INTERPRET"] = "1"

import argparse  # noqa: E402 - after the environment set-up above, which must come first
import contextlib  # noqa: E402 - after the environment set-up above, which must come first
import datetime  # noqa: E402 - after the environment set-up above, which must come first
import json  # noqa: E402 - after the environment set-up above, which must come first
import math  # noqa: E402 - after the environment set-up above, which must come first
import platform  # noqa: E402 - after the environment set-up above, which must come first
import statistics  # noqa: E402 - after the environment set-up above, which must come first
import time  # noqa: E402 - after the environment set-up above, which must come first
import traceback  # noqa: E402 - after the environment set-up above, which must come first
from dataclasses import dataclass, field  # noqa: E402 - after the environment set-up above, which must come first
from pathlib import Path  # noqa: E402 - after the environment set-up above, which must come first
from typing import Any, Callable  # noqa: E402 - after the environment set-up above, which must come first

import torch  # noqa: E402 - after the environment set-up above, which must come first

import moe_hal  # noqa: E402 - after the environment set-up above, which must come first
from moe_hal import perf, timing, workloads  # noqa: E402 - after the environment set-up above, which must come first
from moe_hal.conformance.tolerances import calc_diff  # noqa: E402 - after the environment set-up above, which must come first
from moe_hal.quant import quantize_fp8  # noqa: E402 - after the environment set-up above, which must come first

SCHEMA = "moe_hal_cuda.gpu_check/1"
#: DeepSeek-V3 routed-expert GEMMs (weights [G, N, K]): gate+up (N = 2 x 2048, K = 7168) and
#: down (N = 7168, K = 2048); huggingface.co/deepseek-ai/DeepSeek-V3 config.json.
DSV3_SHAPES = ((4096, 7168), (7168, 2048))
TARGETS = {
    "bf16_contiguous_vs_torch_grouped_mm": (1.0, "t(torch grouped_mm) / t(ours), bf16 contiguous"),
    "bf16_contiguous_vs_occupancy_adjusted_roofline": (0.70, "t(occupancy-adjusted roofline) / t(ours), bf16"),
    "fp8_vs_our_bf16_at_large_m": (1.5, "t(ours bf16) / t(ours fp8) at the largest row count"),
    "masked_decode_vs_weight_bandwidth_floor": (0.75, "t(weight bytes / bandwidth) / t(ours, graph replay)"),
    "advisor_vs_best_fixed_tile": (1.0, "t(best fixed tile) / t(advisor's tile), skewed routing"),
    "k_grouped_bf16_vs_torch_grouped_mm_2d2d": (0.9, "t(torch grouped_mm 2D x 2D) / t(ours), bf16 K-grouped"),
}


# ---------------------------------------------------------------------------------------------
# context
# ---------------------------------------------------------------------------------------------
@dataclass
class Check:
    """Run state: device, sizes, the time budget and the report being written."""

    device: torch.device
    smoke: bool
    deadline: float
    l2_bytes: int
    warmup: int
    reps: int
    l2_factor: float
    hw: Any = None
    hw_note: str = ""
    report: dict[str, Any] = field(default_factory=dict)
    gen: torch.Generator | None = None
    out_path: Path | None = None
    section_deadline: float = float("inf")

    def flush(self) -> None:
        """Write the report so far (atomically), so a run killed by its time limit keeps its results."""
        if self.out_path is None:
            return
        self.out_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.out_path.with_suffix(".partial")
        tmp.write_text(json.dumps(self.report, indent=1, default=str) + "\n", encoding="utf-8")
        os.replace(tmp, self.out_path)

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def left(self) -> float:
        """Seconds left for the current section (its share of the budget, never past the end)."""
        return min(self.deadline, self.section_deadline) - time.monotonic()

    def skip(self, section: str, what: str, why: str) -> None:
        self.report["skipped"].append({"section": section, "what": what, "why": why})
        print(f"  skipped {section}/{what}: {why}", flush=True)

    def randn(self, *shape: int, dtype: torch.dtype = torch.bfloat16, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=self.gen, device="cpu") * scale).to(self.device, dtype)

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)


def _versions() -> dict[str, Any]:
    import importlib.metadata as metadata

    out: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch.version.cuda": str(torch.version.cuda),
    }
    for dist in ("triton", "moe-hal", "moe-hal-cuda", "cuda-bindings", "cuda-python", "deep_gemm"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return out


def _device_record(check: Check) -> dict[str, Any]:
    from moe_hal_cuda import device as cuda_device

    info = moe_hal.match_device(check.device)
    record: dict[str, Any] = {"torch_device": str(check.device), "hw_id": info.id, "seen": info.seen}
    if check.cuda:
        facts = cuda_device.device_facts(check.device.index or 0)
        record["facts"] = facts.as_dict() if isinstance(facts, cuda_device.DeviceFacts) else {"reason": str(facts)}
        record["name"] = torch.cuda.get_device_name(check.device)
        try:
            import subprocess

            smi = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version,clocks.sm,clocks.mem", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
            )
            record["nvidia_smi"] = smi.stdout.strip() or smi.stderr.strip()
        except Exception as exc:  # noqa: BLE001 - informational only
            record["nvidia_smi"] = f"unavailable: {exc}"
    else:
        record["name"] = platform.processor() or platform.machine()
    return record


def _model_hardware(check: Check) -> None:
    """The hardware the model uses: the device's DB entry (measured overlays first) with the SM
    count and L2 the driver reports; in the CPU smoke run the H200 entry (interpreter has no speed)."""
    if not check.cuda:
        check.hw, check.hw_note = perf.resolve_hardware("nvidia-h200-sxm"), "nvidia-h200-sxm (modelled; CPU smoke run)"
        return
    info = moe_hal.match_device(check.device)
    if info.id is None:
        check.hw, check.hw_note = None, f"device not in the hardware DB: {info.reason}"
        return
    props = torch.cuda.get_device_properties(check.device)
    hw = perf.resolve_hardware(info.id).replace(num_cores=props.multi_processor_count)
    check.hw, check.hw_note = hw, f"{info.id}: {dict(hw.sources)}"


# ---------------------------------------------------------------------------------------------
# backends without selection: the kernel checks need no hardware DB (the GPU image may lack jsonschema)
# ---------------------------------------------------------------------------------------------
_BACKENDS: dict[str, Any] = {}


def backend_object(name: str):
    """The backend object ``name`` (``cuda_sm90``, ``cuda_sm100``, ``reference``), built from its
    spec directly: no plugin selection and no hardware-DB lookup, so a missing ``jsonschema`` (the
    DB's validator) cannot stop the kernel checks. The tile advisor needs the DB: without it the
    backends use their table's default tile and say so in ``explain()``."""
    hit = _BACKENDS.get(name)
    if hit is None:
        if name == "reference":
            from moe_hal.builtin import REFERENCE as spec
            from moe_hal.builtin.reference import ReferenceBackend as cls
        else:
            from moe_hal_cuda import backend as cuda_backend
            from moe_hal_cuda import plugin

            spec = {s.name: s for s in plugin.specs()}[name]
            cls = cuda_backend.CudaSM90Backend if name == "cuda_sm90" else cuda_backend.CudaSM100Backend
        hit = _BACKENDS[name] = cls(spec)
    return hit


def gemm(a, b, layout, *, backend: str, c=None, out=None, out_dtype=None):
    """``moe_hal.grouped_gemm(..., backend=name)`` without selection (see :func:`backend`)."""
    problem = moe_hal.Problem.build(a, b, layout, c=c, out=out, out_dtype=out_dtype)
    return backend_object(backend).run(problem, out)


# ---------------------------------------------------------------------------------------------
# timing
# ---------------------------------------------------------------------------------------------
def copies_for(check: Check, bytes_per_set: float) -> int:
    """Input sets to rotate over so that ``l2_factor`` x L2 bytes pass between two uses of one set."""
    if bytes_per_set <= 0:
        return 1
    return max(1, min(8, math.ceil(check.l2_factor * check.l2_bytes / bytes_per_set)))


def fp8_pair(a: torch.Tensor, b: torch.Tensor) -> tuple[Any, Any]:
    """Activations ``a`` and weights ``b`` in the block-scaled fp8 of a DeepSeek-V3 call: 1 x 128
    blocks along K for ``a``, 128 x 128 for ``b``."""
    return quantize_fp8(a.float(), (1, 128)), quantize_fp8(b.float(), (128, 128))


def time_calls(
    check: Check, calls: list[Callable[[], Any]], *, flush: str | None = None, reps: int | None = None
) -> dict[str, float]:
    """Median and min milliseconds of ``calls`` run round-robin (one call per rotating input set),
    timed by CUDA events (:func:`moe_hal.timing.time_calls`; no L2 flush unless ``flush`` names
    one of :data:`moe_hal.timing.FLUSHES`: the input sets rotate), the host's median time to issue
    one, and on a GPU the SM clock just after."""
    t = timing.time_calls(
        calls,
        check.device,
        warmup=check.warmup,
        reps=reps or check.reps,
        flush_bytes=timing.FLUSH_BYTES if flush else 0,
        flush=flush or "write",
    )
    # host_ms: the host's time to issue one call; near median_ms the events time the host, not the
    # kernel (a candidate cause of Backend.run timing slower than a direct launch, cuda-backend.md)
    out = {
        "median_ms": t.median * 1e3,
        "min_ms": t.min * 1e3,
        "host_ms": t.host * 1e3,
        "reps": t.reps,
        "copies": t.copies,
    }
    if check.cuda:
        # the SM clock right after the timing: the same kernel ran slower late in a run than early
        # in it (bench/results/gpu_check_h200*.json), which falling clocks under load would explain
        try:
            out["sm_clock_mhz"] = torch.cuda.clock_rate(check.device)
        except Exception as exc:  # noqa: BLE001 - NVML may be missing; the timing stands without it
            out["sm_clock_mhz"] = f"unavailable: {type(exc).__name__}"
    return out


# ---------------------------------------------------------------------------------------------
# 1. correctness
# ---------------------------------------------------------------------------------------------
def _compare(out: torch.Tensor, ref: torch.Tensor, threshold: float) -> dict[str, Any]:
    finite = bool(torch.isfinite(out.float()).all())
    diff = calc_diff(out, ref) if finite else float("nan")
    err = (out.double() - ref.double()).abs()
    return {
        "calc_diff": diff,
        "threshold": threshold,
        "max_abs_err": float(err.max()) if err.numel() else 0.0,
        "max_abs_ref": float(ref.abs().max()) if ref.numel() else 0.0,
        "finite": finite,
        "passed": finite and diff < threshold,
    }


def _record(check: Check, name: str, fn: Callable[[], dict[str, Any]], section: str = "correctness") -> None:
    if check.left() < 5:
        check.skip(section, name, "time budget")
        return
    t0 = time.monotonic()
    try:
        row = {"name": name, **fn()}
    except Exception as exc:  # noqa: BLE001 - a failing case is a result, not a crash
        row = {
            "name": name,
            "passed": False,
            "error": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc(limit=6),
        }
    row["seconds"] = round(time.monotonic() - t0, 2)
    row["section"] = section
    check.report["correctness"].append(row)
    check.flush()
    print(
        f"  {'ok  ' if row.get('passed') else 'FAIL'} {name} ({row['seconds']} s)"
        + ("" if row.get("passed") else f": {row.get('error') or row}"),
        flush=True,
    )


def _random_operands(check: Check, shapes, blocks, dtype, fp8_format):
    """``(a, b)`` of the given shapes: ``dtype`` tensors, or (``fp8_format`` ``"fp32"``/``"ue8m0"``)
    fp8 QuantizedTensors with scales over ``blocks``."""
    if fp8_format is None:
        return tuple(check.randn(*shape, dtype=dtype) for shape in shapes)
    return tuple(
        quantize_fp8(check.randn(*shape, dtype=torch.float32), block, ue8m0=fp8_format == "ue8m0")
        for shape, block in zip(shapes, blocks)
    )


def _sm100_format(a, b, lay, out: torch.Tensor, **build) -> torch.Tensor:
    """The SM100 kernels (fp8 with packed UE8M0 scales) on this GPU, through ``cuda_sm100``'s launch
    path with its own plan: selection would refuse the call on an SM90 device."""
    be = backend_object("cuda_sm100")
    problem = moe_hal.Problem.build(a, b, lay, **build)
    return be.launch(problem, be.plan(problem).config, out)


def correctness(check: Check) -> None:
    s = check.smoke
    big_n, big_k = (24, 200) if s else (4096, 7168)
    rows = 96 if s else 4096
    experts = 5 if s else 16
    counts = workloads.synthetic_counts("zipf:1.2", rows, experts, seed=1)
    counts[1] = 0  # an empty group, whatever the draw
    contiguous_cases = [("dsv3", counts, 8 if s else 128, big_n, big_k), ("edges", [0, 37, 0, 5], 1, 24, 40)]

    def contiguous(backend, dtype, counts, alignment, n, k, fp8_format=None):
        def run():
            lay = moe_hal.ContiguousLayout.from_counts(counts, alignment=alignment)
            shapes = ((lay.num_rows, k), (len(counts), n, k))
            a, b = _random_operands(check, shapes, ((1, 128), (128, 128)), dtype, fp8_format)
            threshold = 1e-3 if fp8_format else 1e-5
            out_dtype = torch.bfloat16 if fp8_format else dtype
            poisoned = torch.full((lay.num_rows, n), float("nan"), dtype=out_dtype, device=check.device)
            if backend == "sm100-format":
                out = _sm100_format(a, b, lay, poisoned)
            else:
                out = gemm(a, b, lay, out=poisoned, backend=backend)
            ref = gemm(a, b, lay, backend="reference", out_dtype=torch.float32)
            row = _compare(out, ref, threshold)
            gaps = lay.gap_rows_on(check.device)
            row["gap_rows_zero"] = bool((out[gaps] == 0).all()) if gaps.numel() else True
            row["passed"] = row["passed"] and row["gap_rows_zero"]
            row["shape"] = {"G": len(counts), "rows": lay.num_rows, "N": n, "K": k, "alignment": alignment}
            if fp8_format is not None:  # quantization error, for information only
                exact = gemm(
                    a.dequantize(torch.bfloat16),
                    b.dequantize(torch.bfloat16),
                    lay,
                    backend="reference",
                    out_dtype=torch.float32,
                )
                row["calc_diff_vs_dequantized_bf16"] = calc_diff(out, exact)
            return row

        return run

    for label, cnt, alignment, n, k in contiguous_cases:
        for dtype in (torch.bfloat16, torch.float16):
            name = f"contiguous/{label}/{str(dtype).removeprefix('torch.')}"
            _record(check, name, contiguous("cuda_sm90", dtype, cnt, alignment, n, k))
        kf = 200 if label == "edges" else k
        _record(
            check,
            f"contiguous/{label}/fp8-sm90-fp32-scales",
            contiguous("cuda_sm90", None, cnt, alignment, n, kf, "fp32"),
        )
        _record(
            check,
            f"contiguous/{label}/fp8-sm100-ue8m0-scales",
            contiguous("sm100-format", None, cnt, alignment, n, kf, "ue8m0"),
        )

    g, max_m = (4, 24) if s else (16, 256)
    masked_m_host = torch.randint(0, max_m + 1, (g,), generator=check.gen, dtype=torch.int32)
    masked_m_host[0], masked_m_host[-1] = 0, max_m

    def masked(backend, dtype, fp8_format=None):
        def run():
            masked_m = masked_m_host.to(check.device)
            lay = moe_hal.MaskedLayout(masked_m, max_m, expected_m=max(1, max_m // 4), check=False)
            shapes = ((g, max_m, big_k), (g, big_n, big_k))
            a, b = _random_operands(check, shapes, ((1, 128), (128, 128)), dtype, fp8_format)
            threshold, out_dtype = (1e-3, torch.bfloat16) if fp8_format else (1e-5, dtype)
            sentinel = -4242.0
            out = torch.full((g, max_m, big_n), sentinel, dtype=out_dtype, device=check.device)
            if backend == "sm100-format":
                _sm100_format(a, b, lay, out)
            else:
                gemm(a, b, lay, out=out, backend=backend)
            ref = torch.full((g, max_m, big_n), sentinel, dtype=torch.float32, device=check.device)
            gemm(a, b, lay, out=ref, backend="reference", out_dtype=torch.float32)
            row = _compare(out, ref, threshold)
            rows = torch.arange(max_m, device=check.device)[None, :, None]
            beyond = (rows >= masked_m[:, None, None]).expand_as(out)
            row["sentinel_rows_untouched"] = bool((out[beyond] == sentinel).all())
            row["passed"] = row["passed"] and row["sentinel_rows_untouched"]
            row["shape"] = {"G": g, "max_m": max_m, "N": big_n, "K": big_k, "masked_m": masked_m_host.tolist()}
            return row

        return run

    for dtype in (torch.bfloat16, torch.float16):
        _record(check, f"masked/{str(dtype).removeprefix('torch.')}", masked("cuda_sm90", dtype))
    _record(check, "masked/fp8-sm90-fp32-scales", masked("cuda_sm90", None, "fp32"))
    _record(check, "masked/fp8-sm100-ue8m0-scales", masked("sm100-format", None, "ue8m0"))

    km, kn = (24, 40) if s else (4096, 2048)
    kcounts = [0 if s else 900, 77, 0, 1500 if not s else 130, 64]

    def k_grouped(backend, dtype, with_c, fp8_format=None):
        def run():
            lay = moe_hal.KGroupedLayout.from_counts(kcounts, alignment=1)
            shapes = ((lay.num_rows, km), (lay.num_rows, kn))
            x, dy = _random_operands(check, shapes, ((128, 1), (128, 1)), dtype, fp8_format)
            c = check.randn(len(kcounts), km, kn, dtype=torch.float32) if with_c else None
            ref = gemm(x, dy, lay, c=c, backend="reference", out_dtype=torch.float32)
            if backend == "sm100-format":
                out = torch.full((len(kcounts), km, kn), float("nan"), device=check.device)
                _sm100_format(x, dy, lay, out, c=c, out_dtype=torch.float32)
            else:
                out = gemm(x, dy, lay, c=c, out_dtype=torch.float32, backend=backend)
            row = _compare(out, ref, 1e-3 if fp8_format else 1e-5)
            row["shape"] = {"G": len(kcounts), "M": km, "N": kn, "counts": kcounts, "with_c": with_c}
            return row

        return run

    for with_c in (False, True):
        tag = "with-c" if with_c else "no-c"
        for dtype in (torch.bfloat16, torch.float16):
            _record(
                check, f"k_grouped/{tag}/{str(dtype).removeprefix('torch.')}", k_grouped("cuda_sm90", dtype, with_c)
            )
        _record(check, f"k_grouped/{tag}/fp8-sm90-fp32-scales", k_grouped("cuda_sm90", None, with_c, "fp32"))
        _record(check, f"k_grouped/{tag}/fp8-sm100-ue8m0-scales", k_grouped("sm100-format", None, with_c, "ue8m0"))


def gpu_only(check: Check) -> None:
    """The checks only a GPU can make, first: no host sync with a new layout every call (every
    layout), CUDA-graph capture and replay (masked with new masked_m values; contiguous), and
    selection on the real device."""
    if not check.cuda:
        check.skip("gpu_only", "*", "no GPU (CPU smoke run)")
        return
    _record(check, "no-host-sync/fresh-layout-every-call", lambda: _no_host_sync(check), "gpu_only")
    _record(check, "masked/cuda-graph-replay", lambda: _graph_replay(check), "gpu_only")
    _record(check, "contiguous/cuda-graph-replay", lambda: _graph_replay_contiguous(check), "gpu_only")
    _record(check, "selection/on-this-device", lambda: _selection(check), "gpu_only")


def _masked_inputs(check: Check, g: int, max_m: int, n: int, k: int):
    a, b = check.randn(g, max_m, k), check.randn(g, n, k)
    masked_m = torch.zeros(g, dtype=torch.int32, device=check.device)
    return a, b, masked_m, moe_hal.MaskedLayout(masked_m, max_m, expected_m=16, check=False)


def _no_host_sync(check: Check) -> dict[str, Any]:
    """Every layout under ``torch.cuda.set_sync_debug_mode("error")`` with a layout never seen
    before on every call (contiguous and K-grouped: a new routing object; masked: new values)."""
    n, k = 1024, 512
    b = check.randn(8, n, k)
    a_rows = check.randn(8 * 96, k)
    xs, dys = check.randn(8 * 96, 256), check.randn(8 * 96, n)
    masked_a, _, masked_m, mlay = _masked_inputs(check, 8, 64, n, k)
    fp8_a, fp8_b = fp8_pair(a_rows, b)

    def routings(step):
        gen = torch.Generator().manual_seed(step)
        return torch.randint(0, 96, (8,), generator=gen).tolist()

    def calls(step):
        counts = routings(step)
        clay = moe_hal.ContiguousLayout.from_counts(counts, alignment=1, num_rows=8 * 96)
        klay = moe_hal.KGroupedLayout.from_counts(counts)
        gemm(a_rows, b, clay, backend="cuda_sm90")
        qa = moe_hal.QuantizedTensor(fp8_a.data, fp8_a.scale, fp8_a.block, fp8_a.scale_format)
        gemm(qa, fp8_b, clay, backend="cuda_sm90")
        gemm(xs[: klay.num_rows], dys[: klay.num_rows], klay, backend="cuda_sm90", out_dtype=torch.float32)
        gemm(masked_a, b, mlay, backend="cuda_sm90")

    calls(0)  # warm: compile, weights prepared, plans made
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for step in range(1, 6):
            calls(step)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    return {
        "passed": True,
        "detail": "5 steps x (contiguous bf16, contiguous fp8, K-grouped bf16, masked) with a "
        "new routing each step ran under torch.cuda.set_sync_debug_mode('error')",
    }


def _graph_replay_contiguous(check: Check) -> dict[str, Any]:
    """A contiguous call captured in a CUDA graph (its layout used once before capture) and
    replayed with new operand values: the replay must equal an eager call."""
    lay = moe_hal.ContiguousLayout.from_counts([30, 0, 77, 5], alignment=16)
    a, b = check.randn(lay.num_rows, 512), check.randn(4, 1024, 512)
    out = torch.empty(lay.num_rows, 1024, dtype=torch.bfloat16, device=check.device)
    gemm(a, b, lay, out=out, backend="cuda_sm90")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gemm(a, b, lay, out=out, backend="cuda_sm90")
    a.copy_(check.randn(lay.num_rows, 512))
    graph.replay()
    torch.cuda.synchronize()
    eager = gemm(a, b, lay, backend="cuda_sm90")
    return {"passed": bool(torch.equal(out, eager)), "detail": "replay after new a values equals an eager call"}


def _graph_replay(check: Check) -> dict[str, Any]:
    g, max_m, n, k = 8, 64, 1024, 512
    a, b, masked_m, lay = _masked_inputs(check, g, max_m, n, k)
    sentinel = 99.0
    out = torch.full((g, max_m, n), sentinel, dtype=torch.bfloat16, device=check.device)
    masked_m.fill_(max_m)
    gemm(a, b, lay, out=out, backend="cuda_sm90")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gemm(a, b, lay, out=out, backend="cuda_sm90")
    results = []
    for _ in range(3):
        new = torch.randint(0, max_m + 1, (g,), generator=check.gen, dtype=torch.int32)
        masked_m.copy_(new.to(check.device))
        out.fill_(sentinel)
        graph.replay()
        torch.cuda.synchronize()
        ref = torch.full((g, max_m, n), sentinel, dtype=torch.float32, device=check.device)
        gemm(a, b, moe_hal.MaskedLayout(masked_m.clone(), max_m), out=ref, backend="reference", out_dtype=torch.float32)
        row = _compare(out, ref, 1e-5)
        beyond = (torch.arange(max_m, device=check.device)[None, :, None] >= masked_m[:, None, None]).expand_as(out)
        row["sentinel_rows_untouched"] = bool((out[beyond] == sentinel).all())
        row["masked_m"] = new.tolist()
        results.append(row)
    return {"passed": all(r["passed"] and r["sentinel_rows_untouched"] for r in results), "replays": results}


def _selection(check: Check) -> dict[str, Any]:
    lay = moe_hal.ContiguousLayout.from_counts([100, 0, 300], alignment=128)
    a, b = check.randn(lay.num_rows, 1024), check.randn(3, 512, 1024)
    sel = moe_hal.select(a, b, lay)
    sm100 = next(c for c in sel.candidates if c.name == "cuda_sm100")
    return {
        "passed": sel.name == "cuda_sm90" and sel.mode == "native",
        "selected": sel.name,
        "mode": sel.mode,
        "cuda_sm100_reasons": [r.as_dict() for r in sm100.reasons],
        "explain": sel.explain(),
    }


# ---------------------------------------------------------------------------------------------
# 2-3. contiguous timings and the tile sweep
# ---------------------------------------------------------------------------------------------
def contiguous_cases(check: Check) -> list[tuple[str, list[int]]]:
    if check.smoke:
        return [("seed-64", workloads.synthetic_counts("seed", 64, 32))]
    cases = [(f"seed-{t // 1024}k", workloads.synthetic_counts("seed", t, 32)) for t in (8192, 32768, 65536)]
    cases += [(f"zipf{a}-32k", workloads.synthetic_counts(f"zipf:{a}", 32768, 32, seed=7)) for a in ("1.0", "1.5")]
    # last, so a short budget drops it first: 64 rows per expert, where padding and tile height matter most
    cases.append(("seed-2k", workloads.synthetic_counts("seed", 2048, 32)))
    return cases


def _grouped_mm() -> Callable[..., torch.Tensor]:
    """``torch.nn.functional.grouped_mm``, or ``torch._grouped_mm`` on torch builds before it was public."""
    import torch.nn.functional as F

    return getattr(F, "grouped_mm", None) or torch._grouped_mm


def _estimate(check: Check, counts, n, k, dtype, tile) -> dict[str, float]:
    if check.hw is None:
        return {}
    est = perf.estimate(counts, n, k, check.hw, dtype, tile[0], tile[1])
    return {
        "ideal_ms": est.t_roofline * 1e3,
        "occupancy_adjusted_roofline_ms": est.t_padded * 1e3,
        "predicted_ms": est.t_predicted * 1e3,
        "occupancy_m": est.occupancy_m,
        "waves": est.waves,
        "bound": est.bound,
    }


def _tile_sweep(check: Check, be, name: str, dtype: str, operand_sets, lay, out: torch.Tensor) -> dict[str, Any]:
    """Timings of every tile the config table offers for ``dtype`` contiguous calls, launched
    through the backend (operand and scale preparation as in a real call), one per input set."""
    from moe_hal_cuda import configs

    problems = [moe_hal.Problem.build(a, b, lay, out=out) for a, b in operand_sets]
    sweep = {}
    for cfg in configs.candidates("sm90", dtype, "contiguous"):
        if check.left() < 10:
            check.skip("tile_sweep", f"{name}/BM{cfg.block_m}", "time budget")
            break
        sweep[f"{cfg.block_m}x{cfg.block_n}"] = time_calls(
            check, [(lambda p=p, cfg=cfg: be.launch(p, cfg, out)) for p in problems]
        )
    return sweep


def contiguous_timings(check: Check) -> None:
    grouped_mm = _grouped_mm()
    be = backend_object("cuda_sm90")
    alignment = 8 if check.smoke else 128
    shapes = ((24, 40),) if check.smoke else DSV3_SHAPES
    for case_name, counts in contiguous_cases(check):
        for n, k in shapes:
            name = f"{case_name}/N{n}-K{k}"
            if check.left() < 20:
                check.skip("timings", name, "time budget")
                continue
            lay = moe_hal.ContiguousLayout.from_counts(counts, alignment=alignment)
            G = len(counts)
            bytes_per_set = lay.num_rows * k * 2 + G * n * k * 2
            copies = copies_for(check, bytes_per_set)
            sets = [(check.randn(lay.num_rows, k, scale=0.1), check.randn(G, n, k, scale=0.1)) for _ in range(copies)]
            out = torch.empty(lay.num_rows, n, dtype=torch.bfloat16, device=check.device)
            row: dict[str, Any] = {
                "case": name,
                "counts": counts,
                "rows": lay.num_rows,
                "valid_rows": sum(counts),
                "N": n,
                "K": k,
                "G": G,
                "alignment": alignment,
                "paths": {},
            }
            with _timing_row(check, "timings", row):
                problem = moe_hal.Problem.build(sets[0][0], sets[0][1], lay)
                plan = be.plan(problem)
                row["advisor_tile"] = list(plan.config.tile)
                row["path"] = be.describe_path(problem)
                row["routed_to"] = plan.path
                row["paths"]["ours_bf16"] = time_calls(
                    check, [(lambda a=a, b=b: gemm(a, b, lay, out=out, backend="cuda_sm90")) for a, b in sets]
                )
                ours = gemm(sets[0][0], sets[0][1], lay, backend="cuda_sm90")
                if check.cuda:
                    ends = lay.aligned_ends_on(check.device)
                    row["paths"]["torch_grouped_mm"] = time_calls(
                        check, [(lambda a=a, b=b: grouped_mm(a, b.transpose(1, 2), offs=ends)) for a, b in sets]
                    )
                    peer = grouped_mm(sets[0][0], sets[0][1].transpose(1, 2), offs=ends)
                    valid = lay.valid_rows_on(check.device)
                    row["calc_diff_vs_torch_grouped_mm"] = calc_diff(ours[valid], peer[valid])
                segs = [(g, s, e) for g, s, e in lay.segments() if e > s]

                def loop(a, b):
                    for g, s, e in segs:
                        torch.mm(a[s:e], b[g].t(), out=out[s:e])

                row["paths"]["per_expert_loop"] = time_calls(check, [(lambda a=a, b=b: loop(a, b)) for a, b in sets])
                fp8_sets = [fp8_pair(a, b) for a, b in sets]
                fp8_plan = be.plan(moe_hal.Problem.build(fp8_sets[0][0], fp8_sets[0][1], lay))
                row["fp8_advisor_tile"] = list(fp8_plan.config.tile)
                row["paths"]["ours_fp8"] = time_calls(
                    check, [(lambda a=a, b=b: gemm(a, b, lay, out=out, backend="cuda_sm90")) for a, b in fp8_sets]
                )
                fp8_out = gemm(fp8_sets[0][0], fp8_sets[0][1], lay, backend="cuda_sm90")
                from moe_hal_cuda import peers

                fp8_problem = moe_hal.Problem.build(fp8_sets[0][0], fp8_sets[0][1], lay, out=out)
                blocked = peers.blocker("deep_gemm", fp8_problem)
                if blocked is None:
                    row["paths"]["deep_gemm_fp8"] = time_calls(
                        check,
                        [
                            (lambda a=a, b=b: peers.run("deep_gemm", moe_hal.Problem.build(a, b, lay, out=out), out))
                            for a, b in fp8_sets
                        ],
                    )
                else:
                    row["deep_gemm_fp8"] = f"not timed: {blocked}"
                valid = lay.valid_rows_on(check.device)
                row["fp8_calc_diff_vs_bf16"] = calc_diff(fp8_out[valid], ours[valid])
                row["model_bf16"] = _estimate(check, counts, n, k, "bf16", plan.config.tile)
                row["model_fp8"] = _estimate(check, counts, n, k, "fp8", fp8_plan.config.tile)
                # tile sweeps: every fixed tile of the table against the advisor's choice
                row["tile_sweep"] = _tile_sweep(check, be, f"{name}/bf16", "bf16", sets, lay, out)
                row["fp8_tile_sweep"] = _tile_sweep(check, be, f"{name}/fp8", "fp8_e4m3", fp8_sets, lay, out)
            del sets
            if check.cuda:
                torch.cuda.empty_cache()


@contextlib.contextmanager
def _timing_row(check: Check, section: str, row: dict[str, Any]):
    """Records ``row`` in ``check.report[section]`` whatever happens in the block: an exception
    becomes the row's error and traceback (the run goes on), and the JSON is written at once."""
    try:
        yield row
    except Exception as exc:  # noqa: BLE001 - a failing case is recorded and the run goes on
        row["error"] = f"{type(exc).__name__}: {exc}"
        row["traceback"] = traceback.format_exc(limit=6)
    check.report[section].append(row)
    check.flush()
    _print_timing(row)


def _print_timing(row: dict[str, Any]) -> None:
    paths = " ".join(f"{k}={v['median_ms']:.3f}ms" for k, v in row.get("paths", {}).items())
    print(
        f"  {row['case']}: tile {row.get('advisor_tile', row.get('tile', row.get('tiles')))} {paths} {row.get('error', '')}",
        flush=True,
    )


# ---------------------------------------------------------------------------------------------
# K-grouped (weight gradients) against torch grouped_mm's 2D x 2D form
# ---------------------------------------------------------------------------------------------
def k_grouped_timings(check: Check) -> None:
    grouped_mm = _grouped_mm()
    shapes = ((24, 40),) if check.smoke else ((7168, 2048), (2048, 7168))  # (M, N) of dW = x.T @ dy
    tokens = 64 if check.smoke else 8192
    for m, n in shapes:
        name = f"k_grouped/seed-{tokens}/M{m}-N{n}"
        if check.left() < 15:
            check.skip("k_grouped", name, "time budget")
            continue
        counts = perf.synthetic_counts("seed", tokens, 32)
        row: dict[str, Any] = {"case": name, "M": m, "N": n, "T": sum(counts), "G": len(counts), "paths": {}}
        with _timing_row(check, "k_grouped", row):
            lay = moe_hal.KGroupedLayout.from_counts(counts)
            x, dy = check.randn(lay.num_rows, m, scale=0.1), check.randn(lay.num_rows, n, scale=0.1)
            out = torch.empty(len(counts), m, n, dtype=torch.bfloat16, device=check.device)
            # our Triton kernel itself, launched at the plan's tile, whatever the path table routes
            # the call to (a routed call is timed apart: "routed")
            be = backend_object("cuda_sm90")
            problem = moe_hal.Problem.build(x, dy, lay, out=out)
            plan = be.plan(problem)
            row["tile"], row["routed_to"] = list(plan.config.tile), plan.path
            row["paths"]["ours_bf16"] = time_calls(check, [lambda: be.launch(problem, plan.config, out)])
            if plan.path != "triton":
                row["paths"]["routed"] = time_calls(check, [lambda: gemm(x, dy, lay, out=out, backend="cuda_sm90")])
            if check.cuda:
                offs = lay.psum_on(check.device)
                row["paths"]["torch_grouped_mm_2d2d"] = time_calls(check, [lambda: grouped_mm(x.t(), dy, offs=offs)])
            segs = [(g, st, e) for g, st, e in lay.segments()]

            def loop():
                for g, st, e in segs:
                    torch.mm(x[st:e].t(), dy[st:e], out=out[g])

            row["paths"]["per_expert_loop"] = time_calls(check, [loop])
            qx, qdy = quantize_fp8(x.float(), (128, 1), ue8m0=True), quantize_fp8(dy.float(), (128, 1), ue8m0=True)
            launched = backend_object("cuda_sm100")
            from moe_hal_cuda import launch, scales

            cfg = launched.plan(moe_hal.Problem.build(qx, qdy, lay, out_dtype=torch.bfloat16)).config
            sx, sdy = scales.activation(qx, "sm100"), scales.activation(qdy, "sm100")
            row["paths"]["ours_fp8_sm100_format"] = time_calls(
                check, [lambda: launch.k_grouped(qx.data, qdy.data, out, lay, cfg, sa=sx, sb=sdy)]
            )


# ---------------------------------------------------------------------------------------------
# 4. what the L2 held before a timed call
# ---------------------------------------------------------------------------------------------
#: (M, N, K) of the one-group calls timed in every L2 state: SGLang PR #6756's L40S shapes, whose
#: cold timings (256 MB zeroing flush) ran 2-3x slower than vLLM PR #6677's warm ones of one kernel
#: (docs/perf-model.md, "Where the model is known to be wrong").
L2_STATE_SHAPES = ((128, 4096, 4096), (512, 4096, 4096), (2048, 4096, 4096), (128, 6144, 4096))

#: The states, each as (whether the input sets rotate, the flush before each call): ``warm`` (one
#: input set, nothing between calls), ``rotate`` (no flush: cold operands behind clean lines), and
#: a flush of :data:`moe_hal.timing.FLUSH_BYTES` that writes (dirty lines, as
#: ``triton.testing.do_bench`` leaves) or reads (:data:`moe_hal.timing.FLUSHES`).
L2_STATES: dict[str, tuple[bool, str | None]] = {
    "warm": (False, None),
    "rotate": (True, None),
    "write_flush": (False, "write"),
    "read_flush": (False, "read"),
}


def l2_state_timings(check: Check) -> None:
    """One call timed with the L2 in each of :data:`L2_STATES`: whether a zeroing flush slows the
    timed call by the write-backs of the lines it leaves dirty. Published cold timings come from
    such flushes, this project's own from rotating inputs; the ratios say whether a model fitted to
    one may predict the other."""
    shapes = ((16, 24, 40),) if check.smoke else L2_STATE_SHAPES
    be = backend_object("cuda_sm90")
    for m, n, k in shapes:
        name = f"l2_state/M{m}-N{n}-K{k}"
        if check.left() < 15:
            check.skip("l2_state", name, "time budget")
            continue
        lay = moe_hal.ContiguousLayout.from_counts([m], alignment=8 if check.smoke else 128)
        copies = copies_for(check, (m * k + n * k) * 2)
        sets = [(check.randn(lay.num_rows, k, scale=0.1), check.randn(1, n, k, scale=0.1)) for _ in range(copies)]
        out = torch.empty(lay.num_rows, n, dtype=torch.bfloat16, device=check.device)
        row: dict[str, Any] = {
            "case": name,
            "M": m,
            "N": n,
            "K": k,
            "copies": copies,
            "l2_bytes": check.l2_bytes,
            "flush_bytes": timing.FLUSH_BYTES,
            "paths": {},
            "ratios": {},
        }
        with _timing_row(check, "l2_state", row):
            fp8_sets = [fp8_pair(a, b) for a, b in sets]
            row["tiles"] = {
                path: list(be.plan(moe_hal.Problem.build(a, b, lay)).config.tile)
                for path, (a, b) in (("ours_bf16", sets[0]), ("ours_fp8", fp8_sets[0]))
            }
            paths: dict[str, tuple[list[Callable[[], Any]], int]] = {
                "ours_bf16": ([lambda a=a, b=b: gemm(a, b, lay, out=out, backend="cuda_sm90") for a, b in sets], 2),
                "ours_fp8": ([lambda a=a, b=b: gemm(a, b, lay, out=out, backend="cuda_sm90") for a, b in fp8_sets], 1),
                "torch_mm_bf16": ([lambda a=a, b=b: torch.mm(a, b[0].t(), out=out) for a, b in sets], 2),
            }
            if check.cuda:  # per-tensor FP8 through cuBLAS (torch._scaled_mm): a kernel not ours
                one = torch.ones((), device=check.device)
                e4m3 = [(a.to(torch.float8_e4m3fn), b[0].to(torch.float8_e4m3fn)) for a, b in sets]
                paths["torch_scaled_mm_fp8"] = (
                    [lambda a=a, b=b: torch._scaled_mm(a, b.t(), one, one, out_dtype=torch.bfloat16) for a, b in e4m3],
                    1,
                )
            reps = max(check.reps, 2 if check.smoke else 30)
            for path, (calls, operand_bytes) in paths.items():
                row[f"{path}_bytes"] = {"operands": (m * k + n * k) * operand_bytes, "output": lay.num_rows * n * 2}
                ms = {}
                for state, (rotate, flush) in L2_STATES.items():
                    timed = time_calls(check, calls if rotate else calls[:1], flush=flush, reps=reps)
                    row["paths"][f"{path}/{state}"] = timed
                    ms[state] = timed["median_ms"]
                row["ratios"][path] = {
                    "write_flush_over_read_flush": ms["write_flush"] / ms["read_flush"],
                    "read_flush_over_rotate": ms["read_flush"] / ms["rotate"],
                    "rotate_over_warm": ms["rotate"] / ms["warm"],
                }
        del sets
        if check.cuda:
            torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------
# 5. partial waves
# ---------------------------------------------------------------------------------------------
#: Fractions of one wave (tiles over SMs) the partial-wave calls launch; the call nearest 1 from
#: below is the full wave the others are compared with, 2 a second wave.
WAVE_FRACTIONS = (0.125, 0.25, 0.5, 0.75, 1.0, 2.0)

#: Row blocks of every partial-wave call (its M is this many tile heights): each column of B is
#: reused by this many tiles from the L2, so even a full wave reads its weights from memory in
#: less time than its MMAs take, and the calls stay compute-bound.
WAVE_ROW_BLOCKS = 8


def partial_wave_timings(check: Check) -> None:
    """One-group calls of one fixed tile with fewer tiles than SMs, then one and two full waves:
    whether a tile runs faster when fewer SMs are busy. The model charges every tile of a wave the
    same time, however many SMs the wave leaves idle (its waves term); vLLM PR #6677's warm L40S
    calls of 64 to 96 tiles on 142 SMs ran as fast per FLOP as the calls that filled the chip
    (docs/perf-model.md, "Ada: two sources of one kernel"), as a per-SM rate rising when fewer SMs
    draw power would make them. Each row records its time over the full wave's (1 under the waves
    term; the fraction of a wave under a shared rate) and the model's estimate."""
    from moe_hal_cuda import configs

    # the smoke run pretends to 4 SMs and two row blocks, so that its interpreted calls stay small
    sms = 4 if check.smoke else torch.cuda.get_device_properties(check.device).multi_processor_count
    row_blocks, k = (2, 64) if check.smoke else (WAVE_ROW_BLOCKS, 8192)
    be = backend_object("cuda_sm90")
    for dtype in ("bf16", "fp8_e4m3"):
        cfg = next(c for c in configs.candidates("sm90", dtype, "contiguous") if c.tile == (64, 128))
        m = row_blocks * cfg.block_m
        columns = sorted({max(1, round(f * sms / row_blocks)) for f in WAVE_FRACTIONS})
        full = max((c for c in columns if c * row_blocks <= sms), default=None)
        rows = []
        for c in columns:
            n = c * cfg.block_n
            name = f"partial_wave/{dtype}/M{m}-N{n}-K{k}"
            if check.left() < 10:
                check.skip("partial_wave", name, "time budget")
                continue
            tiles = c * row_blocks
            row: dict[str, Any] = {
                "case": name,
                "M": m,
                "N": n,
                "K": k,
                "dtype": "fp8" if dtype.startswith("fp8") else dtype,
                "tile": list(cfg.tile),
                "tiles": tiles,
                "sms": sms,
                "tiles_per_sm": tiles / sms,
                "full_wave": c == full,
                "paths": {},
            }
            with _timing_row(check, "partial_wave", row):
                lay = moe_hal.ContiguousLayout.from_counts([m], alignment=cfg.block_m)
                copies = copies_for(check, (m * k + n * k) * 2)
                sets = [(check.randn(m, k, scale=0.1), check.randn(1, n, k, scale=0.1)) for _ in range(copies)]
                if dtype.startswith("fp8"):
                    sets = [fp8_pair(a, b) for a, b in sets]
                out = torch.empty(m, n, dtype=torch.bfloat16, device=check.device)
                problems = [moe_hal.Problem.build(a, b, lay, out=out) for a, b in sets]
                row["paths"]["ours"] = time_calls(check, [(lambda p=p: be.launch(p, cfg, out)) for p in problems])
                row["model"] = _estimate(check, [m], n, k, row["dtype"], cfg.tile)
            rows.append(row)
        reference = next((r for r in rows if r["full_wave"] and "error" not in r), None)
        for row in rows:
            if reference is not None and "error" not in row:
                row["over_full_wave"] = row["paths"]["ours"]["median_ms"] / reference["paths"]["ours"]["median_ms"]
        check.flush()
        if check.cuda:
            torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------
# 6. masked decode
# ---------------------------------------------------------------------------------------------
def decode_timings(check: Check) -> None:
    if check.smoke:
        cases = [(4, 2, 24, 40, "bf16")]
    else:
        cases = [(32, m, n, k, dt) for n, k in DSV3_SHAPES for m in (4, 16, 64) for dt in ("bf16", "fp8")]
    for g, expected, n, k, dt in cases:
        name = f"decode/G{g}-m{expected}/N{n}-K{k}/{dt}"
        if check.left() < 15:
            check.skip("decode", name, "time budget")
            continue
        max_m = max(8, 2 * expected)
        row: dict[str, Any] = {
            "case": name,
            "G": g,
            "expected_m": expected,
            "max_m": max_m,
            "N": n,
            "K": k,
            "dtype": dt,
            "paths": {},
        }
        with _timing_row(check, "decode", row):
            masked_m = torch.randint(
                max(1, expected // 2), min(max_m, 2 * expected) + 1, (g,), generator=check.gen, dtype=torch.int32
            )
            row["masked_m"] = masked_m.tolist()
            masked_dev = masked_m.to(check.device)
            lay = moe_hal.MaskedLayout(masked_dev, max_m, expected_m=expected, check=False)
            weight_bytes = g * n * k * (1 if dt == "fp8" else 2)
            copies = copies_for(check, weight_bytes)
            sets = []
            for _ in range(copies):
                a, b = check.randn(g, max_m, k, scale=0.1), check.randn(g, n, k, scale=0.1)
                if dt == "fp8":
                    a, b = fp8_pair(a, b)
                sets.append((a, b))
            out = torch.zeros(g, max_m, n, dtype=torch.bfloat16, device=check.device)
            be = backend_object("cuda_sm90")
            problem = moe_hal.Problem.build(sets[0][0], sets[0][1], lay, out=out)
            row["tile"] = list(be.plan(problem).config.tile)
            calls = [(lambda a=a, b=b: gemm(a, b, lay, out=out, backend="cuda_sm90")) for a, b in sets]
            row["paths"]["ours_eager"] = time_calls(check, calls)
            if dt == "bf16":
                active = [(g_, int(m_)) for g_, m_ in enumerate(masked_m.tolist()) if m_]

                def loop(a, b):
                    for g_, m_ in active:
                        torch.mm(a[g_, :m_], b[g_].t(), out=out[g_, :m_])

                row["paths"]["per_expert_loop"] = time_calls(check, [(lambda a=a, b=b: loop(a, b)) for a, b in sets])
            if check.cuda:
                graphs = []
                for call in calls:
                    call()
                    torch.cuda.synchronize()
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph):
                        call()
                    graphs.append(graph)
                row["paths"]["ours_graph_replay"] = time_calls(check, [graph.replay for graph in graphs])
            if check.hw is not None:
                active = int((masked_m > 0).sum())
                e_b = perf.operand_bytes("fp8" if dt == "fp8" else "bf16")[1]
                row["weight_bandwidth_floor_ms"] = active * n * k * e_b / check.hw.mem_bandwidth * 1e3
                row["bandwidth_used_bytes_per_s"] = check.hw.mem_bandwidth
                est = perf.estimate(
                    masked_m.tolist(),
                    n,
                    k,
                    check.hw,
                    "fp8" if dt == "fp8" else "bf16",
                    row["tile"][0],
                    row["tile"][1],
                    op="masked",
                    max_m=max_m,
                )
                row["model"] = {"ideal_ms": est.t_roofline * 1e3, "predicted_ms": est.t_predicted * 1e3}


# ---------------------------------------------------------------------------------------------
# 7. targets
# ---------------------------------------------------------------------------------------------
def _ms(row: dict[str, Any], path: str) -> float | None:
    entry = row.get("paths", {}).get(path)
    return entry["median_ms"] if entry else None


def targets(check: Check) -> None:
    per: dict[str, dict[str, float]] = {key: {} for key in TARGETS}
    timings = [r for r in check.report["timings"] if "error" not in r]
    for r in timings:
        ours, torch_t, fp8 = _ms(r, "ours_bf16"), _ms(r, "torch_grouped_mm"), _ms(r, "ours_fp8")
        if ours and torch_t:
            per["bf16_contiguous_vs_torch_grouped_mm"][r["case"]] = torch_t / ours
        padded = r.get("model_bf16", {}).get("occupancy_adjusted_roofline_ms")
        if ours and padded:
            per["bf16_contiguous_vs_occupancy_adjusted_roofline"][r["case"]] = padded / ours
        sweep = {k: v["median_ms"] for k, v in r.get("tile_sweep", {}).items()}
        advisor = r.get("advisor_tile")
        key = f"{advisor[0]}x{advisor[1]}" if advisor else None
        if sweep and key in sweep:
            per["advisor_vs_best_fixed_tile"][r["case"]] = min(sweep.values()) / sweep[key]
    if timings:
        largest = max(r["rows"] for r in timings)
        for r in timings:
            ours, fp8 = _ms(r, "ours_bf16"), _ms(r, "ours_fp8")
            if r["rows"] == largest and ours and fp8:
                per["fp8_vs_our_bf16_at_large_m"][r["case"]] = ours / fp8
    for r in check.report["k_grouped"]:
        ours, peer = _ms(r, "ours_bf16"), _ms(r, "torch_grouped_mm_2d2d")
        if ours and peer:
            per["k_grouped_bf16_vs_torch_grouped_mm_2d2d"][r["case"]] = peer / ours
    for r in check.report["decode"]:
        t = _ms(r, "ours_graph_replay") or _ms(r, "ours_eager")
        if t and r.get("weight_bandwidth_floor_ms"):
            per["masked_decode_vs_weight_bandwidth_floor"][r["case"]] = r["weight_bandwidth_floor_ms"] / t
    out = {}
    for key, (goal, meaning) in TARGETS.items():
        values = per[key]
        summary: dict[str, Any] = {"target": goal, "ratio_meaning": meaning, "per_case": values}
        if values:
            summary.update(
                min=min(values.values()),
                median=statistics.median(values.values()),
                met_in_every_case=min(values.values()) >= goal,
                met_by_median=statistics.median(values.values()) >= goal,
            )
        else:
            summary["note"] = "not measured in this run"
        out[key] = summary
    if check.smoke:
        out["note"] = "CPU smoke run: interpreter timings, meaningless as performance"
    check.report["targets"] = out


def path_table_suggestion(check: Check) -> None:
    """Entries for ``moe_hal_cuda/path_table.json`` (format in :mod:`moe_hal_cuda.paths`): the
    shape buckets where torch grouped_mm beat our bf16 kernel by the median of this run's cases in
    that bucket (the lead decides whether to commit them, with this run's JSON)."""
    from moe_hal_cuda.paths import floor_pow2

    targets_ = check.report["targets"]
    by_bucket: dict[tuple, list[float]] = {}
    sources = (
        ("contiguous", check.report["timings"], "bf16_contiguous_vs_torch_grouped_mm", lambda r: r["rows"] // r["G"]),
        ("k_grouped", check.report["k_grouped"], "k_grouped_bf16_vs_torch_grouped_mm_2d2d", lambda r: r["M"]),
    )
    for op, rows, target, rows_per_group in sources:
        ratios = targets_.get(target, {}).get("per_case", {})
        for r in rows:
            if r["case"] in ratios:
                k = r["K"] if op == "contiguous" else r["T"] // r["G"]
                bucket = (floor_pow2(r["N"]), floor_pow2(k), floor_pow2(rows_per_group(r)))
                by_bucket.setdefault((op, bucket), []).append(ratios[r["case"]])
    entries = [
        {
            "arch": "sm90",
            "op": op,
            "dtype": "bf16",
            "bucket": dict(zip(("n", "k", "rows_per_group"), bucket)),
            "path": "torch",
            "speedup": round(1 / statistics.median(ratios), 3),
        }
        for (op, bucket), ratios in sorted(by_bucket.items())
        if statistics.median(ratios) < 1.0
    ]
    check.report["path_table_suggestion"] = {
        "source": "backends/cuda/scripts/gpu_check.py on " + check.report["device"].get("name", "?"),
        "device": check.report["device"].get("name", "?"),
        "entries": entries,
    }


# ---------------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="JSON report to write")
    p.add_argument("--budget", type=float, default=220.0, help="seconds this script may take (default 220)")
    p.add_argument("--cpu-smoke", action="store_true", help="tiny shapes under the Triton interpreter, no GPU")
    p.add_argument("--warmup", type=int, default=None, help="warm-up calls per timing (default 3; 1 in smoke)")
    p.add_argument("--reps", type=int, default=None, help="timed calls per timing (default 10; 2 in smoke)")
    p.add_argument("--l2-factor", type=float, default=3.0, help="bytes between two uses of one input set, in L2 sizes")
    p.add_argument(
        "--skip",
        default="",
        help="comma list of sections to skip: gpu_only,correctness,timings,k_grouped,l2_state,partial_wave,decode",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    smoke = args.cpu_smoke
    if not smoke and not torch.cuda.is_available():
        print("gpu_check: no CUDA device; use --cpu-smoke for the interpreter run", file=sys.stderr)
        return 2
    device = torch.device("cpu") if smoke else torch.device("cuda", torch.cuda.current_device())
    l2 = 60 * 2**20 if smoke else torch.cuda.get_device_properties(device).L2_cache_size
    check = Check(
        device=device,
        smoke=smoke,
        deadline=started + args.budget,
        l2_bytes=l2,
        warmup=args.warmup if args.warmup is not None else (1 if smoke else 3),
        reps=args.reps if args.reps is not None else (2 if smoke else 10),
        l2_factor=args.l2_factor,
    )
    check.gen = torch.Generator().manual_seed(0)
    check.out_path = args.out
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    check.report = {
        "schema": SCHEMA,
        "mode": "cpu-smoke (Triton interpreter)" if smoke else "gpu",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "versions": _versions(),
        "device": {},
        "settings": {
            "budget_s": args.budget,
            "warmup": check.warmup,
            "reps": check.reps,
            "l2_factor": args.l2_factor,
            "l2_bytes": l2,
            "timer": "cuda events" if check.cuda else "perf_counter",
        },
        "complete": False,
        "correctness": [],
        "timings": [],
        "k_grouped": [],
        "decode": [],
        "l2_state": [],
        "partial_wave": [],
        "skipped": [],
        "targets": {},
    }
    check.flush()  # a JSON exists before anything can fail
    try:  # the hardware DB needs jsonschema; the kernel checks do not
        check.report["device"] = _device_record(check)
        _model_hardware(check)
    except Exception as exc:  # noqa: BLE001 - a failing check is recorded and the run goes on
        check.report["device"] = {
            "torch_device": str(device),
            "hardware_db_error": f"{type(exc).__name__}: {exc}",
            "name": torch.cuda.get_device_name(device) if check.cuda else platform.machine(),
        }
        check.hw, check.hw_note = None, f"hardware DB unavailable: {type(exc).__name__}: {exc}"
    check.flush()
    check.report["model_hardware"] = {
        "note": check.hw_note,
        "num_cores": getattr(check.hw, "num_cores", None),
        "peak_flops": dict(getattr(check.hw, "peak_flops", {}) or {}),
        "mem_bandwidth": getattr(check.hw, "mem_bandwidth", None),
    }
    print(
        f"gpu_check: {check.report['mode']} on {check.report['device'].get('name')} "
        f"({check.report['device'].get('hw_id')}), budget {args.budget:.0f} s",
        flush=True,
    )
    # Each section may use its share of what is left when it starts, so that a slow one (Triton
    # compiles every kernel variant on first use) cannot starve the others.
    sections = [
        ("gpu_only", gpu_only, 0.15),
        ("correctness", correctness, 0.4),
        ("timings", contiguous_timings, 0.5),
        ("k_grouped", k_grouped_timings, 0.4),
        ("l2_state", l2_state_timings, 0.2),
        # a quarter of what is left: its host work (random operands of up to 70 MB, three copies
        # per call) takes seconds where the timed calls take milliseconds
        ("partial_wave", partial_wave_timings, 0.25),
        ("decode", decode_timings, 1.0),
    ]
    for name, fn, share in sections:
        if name in skip:
            check.skip(name, "*", "--skip")
            continue
        check.section_deadline = time.monotonic() + share * max(0.0, check.deadline - time.monotonic())
        print(f"[{name}] {check.left():.0f} s", flush=True)
        try:
            fn(check)
        except Exception as exc:  # noqa: BLE001 - keep the other sections and the report
            check.report.setdefault("errors", []).append(
                {"section": name, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
            )
            print(f"  section {name} failed: {exc}", flush=True)
        check.flush()  # the JSON after every section
    targets(check)
    path_table_suggestion(check)
    failed = [r["name"] for r in check.report["correctness"] if not r.get("passed")]
    check.report["summary"] = {
        "correctness_checks": len(check.report["correctness"]),
        "correctness_failed": failed,
        "elapsed_s": round(time.monotonic() - started, 1),
    }
    check.report["complete"] = True
    check.flush()
    print("[targets]")
    for key, t in check.report["targets"].items():
        if isinstance(t, dict) and "median" in t:
            print(f"  {key}: min {t['min']:.3f} median {t['median']:.3f} (target >= {t['target']})")
        elif isinstance(t, dict):
            print(f"  {key}: {t.get('note')}")
    print(
        f"gpu_check: {len(failed)} correctness failures of {len(check.report['correctness'])}; "
        f"wrote {args.out} in {check.report['summary']['elapsed_s']} s",
        flush=True,
    )
    return 1 if failed or check.report.get("errors") else 0


if __name__ == "__main__":
    sys.exit(main())
