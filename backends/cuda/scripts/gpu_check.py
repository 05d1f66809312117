"""One-call GPU check of the cuda_sm90 / cuda_sm100 backends: correctness, timings, targets.

    python backends/cuda/scripts/gpu_check.py --out $OUT/gpu_check.json          # on a GPU (backends/cuda/scripts/gpu_check.sh runs it)
    python backends/cuda/scripts/gpu_check.py --cpu-smoke --out /tmp/smoke.json   # tiny shapes, Triton interpreter, no GPU

Sections, each recorded in the JSON report (and skipped, with the reason, when the time budget
``--budget`` runs out):

1. **correctness** of every kernel against the float64 reference on the device: contiguous,
   masked and K-grouped, bf16 / fp16 / fp8 with SM90 (fp32) and SM100 (packed UE8M0) scale
   formats — the SM100-format kernels run on whatever GPU this is, which is *not* SM100 hardware
   unless the report says so — plus N/K edge sizes, empty groups, skewed routing, masked sentinel
   rows, the ``m_indices`` form, no host sync in the masked path, and CUDA-graph capture and
   replay of a masked call with new ``masked_m`` values;
2. **contiguous timings** on DeepSeek-V3 expert shapes (N=4096/K=7168, N=7168/K=2048) for the
   32-expert seed histogram scaled to 8k-64k rows and Zipf routings: our Triton kernel (bf16 and
   fp8) against ``torch.nn.functional.grouped_mm``, a per-expert ``torch.mm`` loop, and the
   performance model's ideal (roofline), occupancy-adjusted roofline and prediction;
3. **tile sweep**: the advisor's tile against every fixed tile of the config table on the same
   skewed cases;
4. **masked decode** (4-64 tokens per expert): eager and CUDA-graph replay against the
   weight-bandwidth floor;
5. **targets**: each target of the issue as a ratio measured in this run, per case and summarised.

Timing: CUDA events around each call, warm-up calls first, the median of the repetitions;
inputs rotate over enough copies that one set is not in L2 when it is used again (``--l2-factor``
times the L2 size). It reports; it never asserts. The exit status is 1 when a correctness check
fails (so a wrapper can tell), 0 otherwise.
"""

from __future__ import annotations

import os
import sys

if "--cpu-smoke" in sys.argv:  # before anything imports triton: run every kernel interpreted
    os.environ["MOE_HAL_CUDA_INTERPRET"] = "1"

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Callable  # noqa: E402

import torch  # noqa: E402

import moe_hal  # noqa: E402
from moe_hal import perf, timing, workloads  # noqa: E402
from moe_hal.conformance.tolerances import calc_diff  # noqa: E402
from moe_hal.quant import quantize_fp8  # noqa: E402

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

    out: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                           "torch.version.cuda": str(torch.version.cuda)}
    for dist in ("triton", "moe-hal", "moe-hal-cuda", "cuda-bindings", "cuda-python", "deep_gemm"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return out


def _device_record(check: Check) -> dict[str, Any]:
    from moe_hal_cuda import device as cuda_device

    info = moe_hal.hwdb.match(check.device)
    record: dict[str, Any] = {"torch_device": str(check.device), "hw_id": info.id, "seen": info.seen}
    if check.cuda:
        facts = cuda_device.device_facts(check.device.index or 0)
        record["facts"] = facts.as_dict() if isinstance(facts, cuda_device.DeviceFacts) else {"reason": str(facts)}
        record["name"] = torch.cuda.get_device_name(check.device)
        try:
            import subprocess

            smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,clocks.sm,clocks.mem",
                                  "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
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
    info = moe_hal.hwdb.match(check.device)
    if info.id is None:
        check.hw, check.hw_note = None, f"device not in the hardware DB: {info.reason}"
        return
    props = torch.cuda.get_device_properties(check.device)
    hw = perf.resolve_hardware(info.id).replace(num_cores=props.multi_processor_count)
    check.hw, check.hw_note = hw, f"{info.id}: {dict(hw.sources)}"


# ---------------------------------------------------------------------------------------------
# timing
# ---------------------------------------------------------------------------------------------
def copies_for(check: Check, bytes_per_set: float) -> int:
    """Input sets to rotate over so that ``l2_factor`` x L2 bytes pass between two uses of one set."""
    if bytes_per_set <= 0:
        return 1
    return max(1, min(8, math.ceil(check.l2_factor * check.l2_bytes / bytes_per_set)))


def time_calls(check: Check, calls: list[Callable[[], Any]]) -> dict[str, float]:
    """Median and min milliseconds of ``calls`` run round-robin (one call per rotating input set),
    timed by CUDA events (:func:`moe_hal.timing.time_calls`; no L2 flush: the input sets rotate)."""
    t = timing.time_calls(calls, check.device, warmup=check.warmup, reps=check.reps)
    return {"median_ms": t.median * 1e3, "min_ms": t.min * 1e3, "reps": t.reps, "copies": t.copies}


# ---------------------------------------------------------------------------------------------
# 1. correctness
# ---------------------------------------------------------------------------------------------
def _compare(out: torch.Tensor, ref: torch.Tensor, threshold: float) -> dict[str, Any]:
    finite = bool(torch.isfinite(out.float()).all())
    diff = calc_diff(out, ref) if finite else float("nan")
    err = (out.double() - ref.double()).abs()
    return {"calc_diff": diff, "threshold": threshold, "max_abs_err": float(err.max()) if err.numel() else 0.0,
            "max_abs_ref": float(ref.abs().max()) if ref.numel() else 0.0, "finite": finite,
            "passed": finite and diff < threshold}


def _record(check: Check, name: str, fn: Callable[[], dict[str, Any]]) -> None:
    if check.left() < 5:
        check.skip("correctness", name, "time budget")
        return
    t0 = time.monotonic()
    try:
        row = {"name": name, **fn()}
    except Exception as exc:  # noqa: BLE001 - a failing case is a result, not a crash
        row = {"name": name, "passed": False, "error": f"{type(exc).__name__}: {exc}",
               "traceback": traceback.format_exc(limit=6)}
    row["seconds"] = round(time.monotonic() - t0, 2)
    check.report["correctness"].append(row)
    check.flush()
    print(f"  {'ok  ' if row.get('passed') else 'FAIL'} {name} ({row['seconds']} s)"
          + ("" if row.get("passed") else f": {row.get('error') or row}"), flush=True)


def correctness(check: Check) -> None:
    from moe_hal_cuda import configs, launch, scales

    s = check.smoke
    big_n, big_k = (24, 200) if s else (4096, 7168)
    rows = 96 if s else 4096
    experts = 5 if s else 16
    counts = workloads.synthetic_counts("zipf:1.2", rows, experts, seed=1)
    counts[1] = 0                                   # an empty group, whatever the draw
    contiguous_cases = [("dsv3", counts, 8 if s else 128, big_n, big_k),
                        ("edges", [0, 37, 0, 5], 1, 24, 40)]

    def contiguous(backend, dtype, counts, alignment, n, k, fp8_format=None):
        def run():
            lay = moe_hal.ContiguousLayout.from_counts(counts, alignment=alignment)
            if fp8_format is None:
                a, b = check.randn(lay.num_rows, k, dtype=dtype), check.randn(len(counts), n, k, dtype=dtype)
                threshold = 1e-5
            else:
                ue8m0 = fp8_format == "ue8m0"
                a = quantize_fp8(check.randn(lay.num_rows, k, dtype=torch.float32), (1, 128), ue8m0=ue8m0)
                b = quantize_fp8(check.randn(len(counts), n, k, dtype=torch.float32), (128, 128), ue8m0=ue8m0)
                threshold = 1e-3
            out_dtype = torch.bfloat16 if fp8_format else dtype
            poisoned = torch.full((lay.num_rows, n), float("nan"), dtype=out_dtype, device=check.device)
            if backend == "sm100-format":     # the SM100 kernels on this GPU, through the launcher
                be = moe_hal.get_backend("cuda_sm100")
                cfg = be.plan(moe_hal.Problem.build(a, b, lay)).config
                out = launch.contiguous(a.data, b.data, poisoned, lay, cfg, sa=scales.activation(a, "sm100"),
                                        sb=be.prepared_weight_scales(b))
            else:
                out = moe_hal.grouped_gemm(a, b, lay, out=poisoned, backend=backend)
            ref = moe_hal.grouped_gemm(a, b, lay, backend="reference", out_dtype=torch.float32)
            row = _compare(out, ref, threshold)
            gaps = lay.gap_rows_on(check.device)
            row["gap_rows_zero"] = bool((out[gaps] == 0).all()) if gaps.numel() else True
            row["passed"] = row["passed"] and row["gap_rows_zero"]
            row["shape"] = {"G": len(counts), "rows": lay.num_rows, "N": n, "K": k, "alignment": alignment}
            if fp8_format is not None:         # quantization error, for information only
                exact = moe_hal.grouped_gemm(a.dequantize(torch.bfloat16), b.dequantize(torch.bfloat16), lay,
                                             backend="reference", out_dtype=torch.float32)
                row["calc_diff_vs_dequantized_bf16"] = calc_diff(out, exact)
            return row
        return run

    for label, cnt, alignment, n, k in contiguous_cases:
        for dtype in (torch.bfloat16, torch.float16):
            name = f"contiguous/{label}/{str(dtype).removeprefix('torch.')}"
            _record(check, name, contiguous("cuda_sm90", dtype, cnt, alignment, n, k))
        kf = 200 if label == "edges" else k
        _record(check, f"contiguous/{label}/fp8-sm90-fp32-scales", contiguous("cuda_sm90", None, cnt, alignment, n, kf, "fp32"))
        _record(check, f"contiguous/{label}/fp8-sm100-ue8m0-scales",
                contiguous("sm100-format", None, cnt, alignment, n, kf, "ue8m0"))

    def m_indices_form():
        lay = moe_hal.ContiguousLayout.from_counts(counts, alignment=16 if s else 128)
        a, b = check.randn(lay.num_rows, big_k), check.randn(len(counts), big_n, big_k)
        cfg = configs.KernelConfig(16, 32, 32, 4, 2) if s else configs.lookup("sm90", "bf16", 64)
        out = launch.contiguous(a, b, torch.full((lay.num_rows, big_n), float("nan"), dtype=torch.bfloat16,
                                                 device=check.device), lay, cfg, form="m_indices")
        return _compare(out, moe_hal.grouped_gemm(a, b, lay, backend="reference", out_dtype=torch.float32), 1e-5)

    _record(check, "contiguous/m_indices-form/bf16", m_indices_form)

    g, max_m = (4, 24) if s else (16, 256)
    masked_m_host = torch.randint(0, max_m + 1, (g,), generator=check.gen, dtype=torch.int32)
    masked_m_host[0], masked_m_host[-1] = 0, max_m

    def masked(backend, dtype, fp8_format=None):
        def run():
            masked_m = masked_m_host.to(check.device)
            lay = moe_hal.MaskedLayout(masked_m, max_m, expected_m=max(1, max_m // 4), check=False)
            if fp8_format is None:
                a, b = check.randn(g, max_m, big_k, dtype=dtype), check.randn(g, big_n, big_k, dtype=dtype)
                threshold, out_dtype = 1e-5, dtype
            else:
                ue8m0 = fp8_format == "ue8m0"
                a = quantize_fp8(check.randn(g, max_m, big_k, dtype=torch.float32), (1, 128), ue8m0=ue8m0)
                b = quantize_fp8(check.randn(g, big_n, big_k, dtype=torch.float32), (128, 128), ue8m0=ue8m0)
                threshold, out_dtype = 1e-3, torch.bfloat16
            sentinel = -4242.0
            out = torch.full((g, max_m, big_n), sentinel, dtype=out_dtype, device=check.device)
            if backend == "sm100-format":
                be = moe_hal.get_backend("cuda_sm100")
                cfg = be.plan(moe_hal.Problem.build(a, b, lay)).config
                launch.masked(a.data, b.data, out, masked_m, cfg, sa=scales.activation(a, "sm100"),
                              sb=be.prepared_weight_scales(b))
            else:
                moe_hal.grouped_gemm(a, b, lay, out=out, backend=backend)
            ref = torch.full((g, max_m, big_n), sentinel, dtype=torch.float32, device=check.device)
            moe_hal.grouped_gemm(a, b, lay, out=ref, backend="reference", out_dtype=torch.float32)
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
            t = lay.num_rows
            if fp8_format is None:
                x, dy = check.randn(t, km, dtype=dtype), check.randn(t, kn, dtype=dtype)
            else:
                ue8m0 = fp8_format == "ue8m0"
                x = quantize_fp8(check.randn(t, km, dtype=torch.float32), (128, 1), ue8m0=ue8m0)
                dy = quantize_fp8(check.randn(t, kn, dtype=torch.float32), (128, 1), ue8m0=ue8m0)
            c = check.randn(len(kcounts), km, kn, dtype=torch.float32) if with_c else None
            ref = moe_hal.grouped_gemm(x, dy, lay, c=c, backend="reference", out_dtype=torch.float32)
            if backend == "sm100-format":
                be = moe_hal.get_backend("cuda_sm100")
                cfg = be.plan(moe_hal.Problem.build(x, dy, lay, c=c, out_dtype=torch.float32)).config
                out = torch.full((len(kcounts), km, kn), float("nan"), device=check.device)
                launch.k_grouped(x.data, dy.data, out, lay, cfg, c=c, sa=scales.activation(x, "sm100"),
                                 sb=scales.activation(dy, "sm100"))
            else:
                out = moe_hal.grouped_gemm(x, dy, lay, c=c, out_dtype=torch.float32, backend=backend)
            row = _compare(out, ref, 1e-3 if fp8_format else 1e-5)
            row["shape"] = {"G": len(kcounts), "M": km, "N": kn, "counts": kcounts, "with_c": with_c}
            return row
        return run

    for with_c in (False, True):
        tag = "with-c" if with_c else "no-c"
        for dtype in (torch.bfloat16, torch.float16):
            _record(check, f"k_grouped/{tag}/{str(dtype).removeprefix('torch.')}", k_grouped("cuda_sm90", dtype, with_c))
        _record(check, f"k_grouped/{tag}/fp8-sm90-fp32-scales", k_grouped("cuda_sm90", None, with_c, "fp32"))
        _record(check, f"k_grouped/{tag}/fp8-sm100-ue8m0-scales", k_grouped("sm100-format", None, with_c, "ue8m0"))

    if check.cuda:
        _record(check, "masked/no-host-sync", lambda: _no_host_sync(check))
        _record(check, "masked/cuda-graph-replay", lambda: _graph_replay(check))
        _record(check, "selection/on-this-device", lambda: _selection(check))


def _masked_inputs(check: Check, g: int, max_m: int, n: int, k: int):
    a, b = check.randn(g, max_m, k), check.randn(g, n, k)
    masked_m = torch.zeros(g, dtype=torch.int32, device=check.device)
    return a, b, masked_m, moe_hal.MaskedLayout(masked_m, max_m, expected_m=16, check=False)


def _no_host_sync(check: Check) -> dict[str, Any]:
    a, b, masked_m, lay = _masked_inputs(check, 8, 64, 1024, 512)
    masked_m.copy_(torch.tensor([3, 0, 64, 17, 5, 9, 1, 40], dtype=torch.int32))
    out = torch.zeros(8, 64, 1024, dtype=torch.bfloat16, device=check.device)
    moe_hal.grouped_gemm(a, b, lay, out=out, backend="cuda_sm90")       # warm: compile, select, plan
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        moe_hal.grouped_gemm(a, b, lay, out=out, backend="cuda_sm90")
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    return {"passed": True, "detail": "a masked call ran under torch.cuda.set_sync_debug_mode('error')"}


def _graph_replay(check: Check) -> dict[str, Any]:
    g, max_m, n, k = 8, 64, 1024, 512
    a, b, masked_m, lay = _masked_inputs(check, g, max_m, n, k)
    sentinel = 99.0
    out = torch.full((g, max_m, n), sentinel, dtype=torch.bfloat16, device=check.device)
    masked_m.fill_(max_m)
    moe_hal.grouped_gemm(a, b, lay, out=out, backend="cuda_sm90")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        moe_hal.grouped_gemm(a, b, lay, out=out, backend="cuda_sm90")
    results = []
    for trial in range(3):
        new = torch.randint(0, max_m + 1, (g,), generator=check.gen, dtype=torch.int32)
        masked_m.copy_(new.to(check.device))
        out.fill_(sentinel)
        graph.replay()
        torch.cuda.synchronize()
        ref = torch.full((g, max_m, n), sentinel, dtype=torch.float32, device=check.device)
        moe_hal.grouped_gemm(a, b, moe_hal.MaskedLayout(masked_m.clone(), max_m), out=ref, backend="reference",
                             out_dtype=torch.float32)
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
    return {"passed": sel.name == "cuda_sm90" and sel.mode == "native", "selected": sel.name, "mode": sel.mode,
            "cuda_sm100_reasons": [r.as_dict() for r in sm100.reasons], "explain": sel.explain()}


# ---------------------------------------------------------------------------------------------
# 2-3. contiguous timings and the tile sweep
# ---------------------------------------------------------------------------------------------
def contiguous_cases(check: Check) -> list[tuple[str, list[int]]]:
    if check.smoke:
        return [("seed-64", workloads.synthetic_counts("seed", 64, 32))]
    cases = [(f"seed-{t // 1024}k", workloads.synthetic_counts("seed", t, 32)) for t in (8192, 32768, 65536)]
    cases += [(f"zipf{a}-32k", workloads.synthetic_counts(f"zipf:{a}", 32768, 32, seed=7)) for a in ("1.0", "1.5")]
    return cases


def _grouped_mm() -> Callable[..., torch.Tensor]:
    """``torch.nn.functional.grouped_mm``, or ``torch._grouped_mm`` on torch builds before it was public."""
    import torch.nn.functional as F

    return getattr(F, "grouped_mm", None) or torch._grouped_mm


def _estimate(check: Check, counts, n, k, dtype, tile) -> dict[str, float]:
    if check.hw is None:
        return {}
    est = perf.estimate(counts, n, k, check.hw, dtype, tile[0], tile[1])
    return {"ideal_ms": est.t_roofline * 1e3, "occupancy_adjusted_roofline_ms": est.t_padded * 1e3,
            "predicted_ms": est.t_predicted * 1e3, "occupancy_m": est.occupancy_m, "waves": est.waves,
            "bound": est.bound}


def contiguous_timings(check: Check) -> None:
    from moe_hal_cuda import configs, launch

    grouped_mm = _grouped_mm()
    be = moe_hal.get_backend("cuda_sm90")
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
            row: dict[str, Any] = {"case": name, "counts": counts, "rows": lay.num_rows, "valid_rows": sum(counts),
                                   "N": n, "K": k, "G": G, "alignment": alignment, "paths": {}}
            try:
                problem = moe_hal.Problem.build(sets[0][0], sets[0][1], lay)
                plan = be.plan(problem)
                row["advisor_tile"] = list(plan.config.tile)
                row["path"] = be.describe_path(problem)
                row["paths"]["ours_bf16"] = time_calls(check, [
                    (lambda a=a, b=b: moe_hal.grouped_gemm(a, b, lay, out=out, backend="cuda_sm90")) for a, b in sets])
                ours = moe_hal.grouped_gemm(sets[0][0], sets[0][1], lay, backend="cuda_sm90")
                if check.cuda:
                    ends = lay.aligned_ends_on(check.device)
                    row["paths"]["torch_grouped_mm"] = time_calls(check, [
                        (lambda a=a, b=b: grouped_mm(a, b.transpose(1, 2), offs=ends)) for a, b in sets])
                    peer = grouped_mm(sets[0][0], sets[0][1].transpose(1, 2), offs=ends)
                    valid = lay.valid_rows_on(check.device)
                    row["calc_diff_vs_torch_grouped_mm"] = calc_diff(ours[valid], peer[valid])
                segs = [(g, s, e) for g, s, e in lay.segments() if e > s]

                def loop(a, b):
                    for g, s, e in segs:
                        torch.mm(a[s:e], b[g].t(), out=out[s:e])
                row["paths"]["per_expert_loop"] = time_calls(check, [(lambda a=a, b=b: loop(a, b)) for a, b in sets])
                fp8_sets = [(quantize_fp8(a.float(), (1, 128)), quantize_fp8(b.float(), (128, 128))) for a, b in sets]
                fp8_plan = be.plan(moe_hal.Problem.build(fp8_sets[0][0], fp8_sets[0][1], lay))
                row["fp8_advisor_tile"] = list(fp8_plan.config.tile)
                row["paths"]["ours_fp8"] = time_calls(check, [
                    (lambda a=a, b=b: moe_hal.grouped_gemm(a, b, lay, out=out, backend="cuda_sm90")) for a, b in fp8_sets])
                fp8_out = moe_hal.grouped_gemm(fp8_sets[0][0], fp8_sets[0][1], lay, backend="cuda_sm90")
                valid = lay.valid_rows_on(check.device)
                row["fp8_calc_diff_vs_bf16"] = calc_diff(fp8_out[valid], ours[valid])
                row["model_bf16"] = _estimate(check, counts, n, k, "bf16", plan.config.tile)
                row["model_fp8"] = _estimate(check, counts, n, k, "fp8", fp8_plan.config.tile)
                # tile sweep: every fixed tile of the table against the advisor's choice
                sweep = {}
                for cfg in configs.candidates("sm90", "bf16", "contiguous"):
                    if check.left() < 10:
                        check.skip("tile_sweep", f"{name}/BM{cfg.block_m}", "time budget")
                        break
                    sweep[f"{cfg.block_m}x{cfg.block_n}"] = time_calls(check, [
                        (lambda a=a, b=b, cfg=cfg: launch.contiguous(a, b, out, lay, cfg)) for a, b in sets])
                row["tile_sweep"] = sweep
            except Exception as exc:  # noqa: BLE001
                row["error"] = f"{type(exc).__name__}: {exc}"
                row["traceback"] = traceback.format_exc(limit=6)
            check.report["timings"].append(row)
            check.flush()
            _print_timing(row)
            del sets
            if check.cuda:
                torch.cuda.empty_cache()


def _print_timing(row: dict[str, Any]) -> None:
    paths = " ".join(f"{k}={v['median_ms']:.3f}ms" for k, v in row.get("paths", {}).items())
    print(f"  {row['case']}: tile {row.get('advisor_tile', row.get('tile'))} {paths} {row.get('error', '')}", flush=True)


# ---------------------------------------------------------------------------------------------
# 4. masked decode
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
        row: dict[str, Any] = {"case": name, "G": g, "expected_m": expected, "max_m": max_m, "N": n, "K": k,
                               "dtype": dt, "paths": {}}
        try:
            masked_m = torch.randint(max(1, expected // 2), min(max_m, 2 * expected) + 1, (g,), generator=check.gen,
                                     dtype=torch.int32)
            row["masked_m"] = masked_m.tolist()
            masked_dev = masked_m.to(check.device)
            lay = moe_hal.MaskedLayout(masked_dev, max_m, expected_m=expected, check=False)
            weight_bytes = g * n * k * (1 if dt == "fp8" else 2)
            copies = copies_for(check, weight_bytes)
            sets = []
            for _ in range(copies):
                a, b = check.randn(g, max_m, k, scale=0.1), check.randn(g, n, k, scale=0.1)
                if dt == "fp8":
                    a, b = quantize_fp8(a.float(), (1, 128)), quantize_fp8(b.float(), (128, 128))
                sets.append((a, b))
            out = torch.zeros(g, max_m, n, dtype=torch.bfloat16, device=check.device)
            be = moe_hal.get_backend("cuda_sm90")
            problem = moe_hal.Problem.build(sets[0][0], sets[0][1], lay, out=out)
            row["tile"] = list(be.plan(problem).config.tile)
            calls = [(lambda a=a, b=b: moe_hal.grouped_gemm(a, b, lay, out=out, backend="cuda_sm90")) for a, b in sets]
            row["paths"]["ours_eager"] = time_calls(check, calls)
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
                est = perf.estimate(masked_m.tolist(), n, k, check.hw, "fp8" if dt == "fp8" else "bf16",
                                    row["tile"][0], row["tile"][1], op="masked", max_m=max_m)
                row["model"] = {"ideal_ms": est.t_roofline * 1e3, "predicted_ms": est.t_predicted * 1e3}
        except Exception as exc:  # noqa: BLE001
            row["error"] = f"{type(exc).__name__}: {exc}"
            row["traceback"] = traceback.format_exc(limit=6)
        check.report["decode"].append(row)
        check.flush()
        _print_timing(row)


# ---------------------------------------------------------------------------------------------
# 5. targets
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
    for r in check.report["decode"]:
        t = _ms(r, "ours_graph_replay") or _ms(r, "ours_eager")
        if t and r.get("weight_bandwidth_floor_ms"):
            per["masked_decode_vs_weight_bandwidth_floor"][r["case"]] = r["weight_bandwidth_floor_ms"] / t
    out = {}
    for key, (goal, meaning) in TARGETS.items():
        values = per[key]
        summary: dict[str, Any] = {"target": goal, "ratio_meaning": meaning, "per_case": values}
        if values:
            summary.update(min=min(values.values()), median=statistics.median(values.values()),
                           met_in_every_case=min(values.values()) >= goal,
                           met_by_median=statistics.median(values.values()) >= goal)
        else:
            summary["note"] = "not measured in this run"
        out[key] = summary
    if check.smoke:
        out["note"] = "CPU smoke run: interpreter timings, meaningless as performance"
    check.report["targets"] = out


def path_table_suggestion(check: Check) -> None:
    """Cases where torch grouped_mm beat our bf16 kernel: the entry configs.path_table would take
    if most cases agree (the lead decides whether to commit it)."""
    ratios = list(check.report["targets"].get("bf16_contiguous_vs_torch_grouped_mm", {}).get("per_case", {}).values())
    entries = []
    if ratios and statistics.median(ratios) < 1.0:
        entries.append({"arch": "sm90", "op": "contiguous", "dtype": "bf16", "path": "torch",
                        "speedup": round(1 / statistics.median(ratios), 3)})
    check.report["path_table_suggestion"] = {"source": "backends/cuda/scripts/gpu_check.py on " + check.report["device"].get("name", "?"),
                                             "entries": entries}


# ---------------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="JSON report to write")
    p.add_argument("--budget", type=float, default=220.0, help="seconds this script may take (default 220)")
    p.add_argument("--cpu-smoke", action="store_true", help="tiny shapes under the Triton interpreter, no GPU")
    p.add_argument("--warmup", type=int, default=None, help="warm-up calls per timing (default 3; 1 in smoke)")
    p.add_argument("--reps", type=int, default=None, help="timed calls per timing (default 10; 2 in smoke)")
    p.add_argument("--l2-factor", type=float, default=3.0, help="bytes between two uses of one input set, in L2 sizes")
    p.add_argument("--skip", default="", help="comma list of sections to skip: correctness,timings,decode")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    smoke = args.cpu_smoke
    if not smoke and not torch.cuda.is_available():
        print("gpu_check: no CUDA device; use --cpu-smoke for the interpreter run", file=sys.stderr)
        return 2
    device = torch.device("cpu") if smoke else torch.device("cuda", torch.cuda.current_device())
    l2 = 60 * 2 ** 20 if smoke else torch.cuda.get_device_properties(device).L2_cache_size
    check = Check(device=device, smoke=smoke, deadline=started + args.budget, l2_bytes=l2,
                  warmup=args.warmup if args.warmup is not None else (1 if smoke else 3),
                  reps=args.reps if args.reps is not None else (2 if smoke else 10), l2_factor=args.l2_factor)
    check.gen = torch.Generator().manual_seed(0)
    check.out_path = args.out
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    check.report = {"schema": SCHEMA, "mode": "cpu-smoke (Triton interpreter)" if smoke else "gpu",
                    "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                    "versions": _versions(), "device": {}, "settings": {
                        "budget_s": args.budget, "warmup": check.warmup, "reps": check.reps,
                        "l2_factor": args.l2_factor, "l2_bytes": l2, "timer": "cuda events" if check.cuda else "perf_counter"},
                    "complete": False, "correctness": [], "timings": [], "decode": [], "skipped": [], "targets": {}}
    check.report["device"] = _device_record(check)
    _model_hardware(check)
    check.report["model_hardware"] = {"note": check.hw_note, "num_cores": getattr(check.hw, "num_cores", None),
                                      "peak_flops": dict(getattr(check.hw, "peak_flops", {}) or {}),
                                      "mem_bandwidth": getattr(check.hw, "mem_bandwidth", None)}
    print(f"gpu_check: {check.report['mode']} on {check.report['device'].get('name')} "
          f"({check.report['device'].get('hw_id')}), budget {args.budget:.0f} s", flush=True)
    # Each section may use its share of what is left when it starts, so that a slow one (Triton
    # compiles every kernel variant on first use) cannot starve the others.
    sections = [("correctness", correctness, 0.45), ("timings", contiguous_timings, 0.65), ("decode", decode_timings, 1.0)]
    for name, fn, share in sections:
        if name in skip:
            check.skip(name, "*", "--skip")
            continue
        check.section_deadline = time.monotonic() + share * max(0.0, check.deadline - time.monotonic())
        print(f"[{name}] {check.left():.0f} s", flush=True)
        try:
            fn(check)
        except Exception as exc:  # noqa: BLE001 - keep the other sections and the report
            check.report.setdefault("errors", []).append({"section": name, "error": f"{type(exc).__name__}: {exc}",
                                                          "traceback": traceback.format_exc()})
            print(f"  section {name} failed: {exc}", flush=True)
    targets(check)
    path_table_suggestion(check)
    failed = [r["name"] for r in check.report["correctness"] if not r.get("passed")]
    check.report["summary"] = {"correctness_checks": len(check.report["correctness"]), "correctness_failed": failed,
                               "elapsed_s": round(time.monotonic() - started, 1)}
    check.report["complete"] = True
    check.flush()
    print("[targets]")
    for key, t in check.report["targets"].items():
        if isinstance(t, dict) and "median" in t:
            print(f"  {key}: min {t['min']:.3f} median {t['median']:.3f} (target >= {t['target']})")
        elif isinstance(t, dict):
            print(f"  {key}: {t.get('note')}")
    print(f"gpu_check: {len(failed)} correctness failures of {len(check.report['correctness'])}; "
          f"wrote {args.out} in {check.report['summary']['elapsed_s']} s", flush=True)
    return 1 if failed or check.report.get("errors") else 0


if __name__ == "__main__":
    sys.exit(main())
