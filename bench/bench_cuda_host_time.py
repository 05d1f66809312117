"""Host time per call of the CUDA backends' launch path with a new routing layout every call,
measured on the CPU with the Triton launch stubbed (issue 12's target: <= 30 us per call).

What is timed, per call: ``Problem.build`` (the core's validation) + ``CudaBackend.run`` — the
plan (advisor cached per coarse routing histogram), operand/scale preparation, the layout's
group-bound tensor, grid and argument assembly — up to the ``kernel[grid](...)`` call, which is
replaced by a no-op. Two regimes, interleaved in rounds so drifts of a shared machine hit both:

* ``fresh``: every call gets a layout object never seen before, from a routing drawn like a MoE
  step (the DeepSeek-V3 seed histogram of 32 experts scaled to ~256 tokens per expert, jittered
  per step; and uniform routing over 256 experts). Layouts are built before timing (building
  one is the router's cost, reported separately as ``layout_build_us``).
* ``cached``: the same layout object every call (its device tensors and plan already made).

A fresh layout lives as a MoE step's does: the bench holds it only until the round it was used in
ends, and drops it once the round's clock has stopped (its construction and its destruction are
the router's cost, not the launch's). Holding every layout of the run instead would time
something no training loop does: a heap growing by each layout's uploaded group bounds, a page
fault every few calls.

Time is this thread's CPU time (``--clock thread``, the default): on a shared, oversubscribed
host, wall time (``--clock wall``) also counts the time other processes hold the core. Each
figure is the median over the rounds; the least disturbed round (``*_min_us``) is reported too,
and ``reference_loop_ns`` (a fixed pure-Python loop, before and after the cases) shows how fast
the host ran Python during the run.

Operands are CPU tensors (host time does not depend on N and K, so they are small); with the
kernel stubbed, the device operations of the path (output allocation, fp8 activation-scale
conversion, the layout's group-end upload — a no-op on the CPU, one ``cudaMemcpyAsync`` from
pageable memory on a GPU, which does not wait for the device) execute on the CPU, so the fp8
figures include the scale conversion computed here. Nothing here ran on a GPU.

    python bench/bench_cuda_host_time.py [--clock thread|wall] [--json bench/results/cuda_host_time_cpu.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

os.environ.pop("MOE_HAL_CUDA_INTERPRET", None)  # the native launch path (kernels stubbed below)

import torch  # noqa: E402 - after the environment set-up above, which must come first

import moe_hal  # noqa: E402 - after the environment set-up above, which must come first
from moe_hal.problem import Problem  # noqa: E402 - after the environment set-up above, which must come first
from moe_hal.quant import quantize_fp8  # noqa: E402 - after the environment set-up above, which must come first
from moe_hal.timing import CLOCKS  # noqa: E402 - after the environment set-up above, which must come first
from moe_hal.workloads import synthetic_counts  # noqa: E402 - after the environment set-up above, which must come first

TARGET_US = 30.0


def _stub_kernels():
    from moe_hal_cuda import kernels

    class Stub:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: None

    for name in ("contiguous_kernel", "masked_kernel", "k_grouped_kernel"):
        setattr(kernels, name, Stub())


def _backend(arch: str):
    from moe_hal_cuda import backend, plugin

    spec = dict(zip(("sm90", "sm100"), plugin.specs()))[arch]
    return (backend.CudaSM90Backend if arch == "sm90" else backend.CudaSM100Backend)(spec)


def routings(kind: str, steps: int) -> list[list[int]]:
    """Per-step expert counts, a different routing each step: ``seed32`` — the project's seed
    histogram (32 experts) scaled to 256 tokens per expert, with a different expert taking one
    token from another each step (the same coarse shape, as consecutive MoE steps have);
    ``uniform256`` — 4096 tokens x top-8 over 256 experts, a fresh draw each step."""
    if kind == "seed32":
        base = synthetic_counts("seed", 256 * 32, 32)
        out = []
        for step in range(steps):
            counts = list(base)
            donor, taker = step % 32, (step * 7 + 3) % 32
            if counts[donor] and donor != taker:
                counts[donor] -= 1 + step // 32 % 3
                counts[taker] += 1 + step // 32 % 3
            out.append([max(c, 0) for c in counts])
        return out
    return [synthetic_counts("uniform", 4096, 256, topk=8, seed=step) for step in range(steps)]


def _time_rounds(fresh_args: list, cached_args: tuple, call, per_round: int, rounds: int, clock) -> dict:
    """Seconds per call of each regime, one list entry per round, the regimes interleaved in every
    round. ``fresh_args`` is consumed (popped from its end): each call's arguments are held until
    the round ends and released after its clock has stopped (see the module docstring)."""
    samples: dict[str, list[float]] = {"fresh": [], "cached": []}
    for _ in range(max(3, per_round // 10)):
        call(*fresh_args.pop())
        call(*cached_args)
    for _ in range(rounds):
        used = []
        t0 = clock()
        for _ in range(per_round):
            args = fresh_args.pop()
            used.append(args)
            call(*args)
        samples["fresh"].append((clock() - t0) / per_round)
        t0 = clock()
        for _ in range(per_round):
            call(*cached_args)
        samples["cached"].append((clock() - t0) / per_round)
        del used, args  # the round's layouts die here, off the clock
    return samples


def case(arch: str, op: str, dtype: str, routing: str, calls: int, rounds: int, gen, clock) -> dict:
    be = _backend(arch)
    per_round = max(calls // rounds, 1)
    steps = 1 + max(3, per_round // 10) + per_round * rounds
    counts_per_step = routings(routing, steps)
    groups = len(counts_per_step[0])
    k, n = 256, 64
    ue8m0 = arch == "sm100"

    def operand(*shape, block):
        x = torch.randn(*shape, generator=gen)
        return quantize_fp8(x, block, ue8m0=ue8m0) if dtype == "fp8" else x.to(torch.bfloat16)

    if op == "contiguous":
        weight = operand(groups, n, k, block=(128, 128))
        t0 = time.perf_counter()
        layouts = [moe_hal.ContiguousLayout.from_counts(c, alignment=128) for c in counts_per_step]
        build_us = (time.perf_counter() - t0) / len(layouts) * 1e6
        rows = max(lay.num_rows for lay in layouts)
        a = operand(rows, k, block=(1, 128))
        args = [
            (
                a[: lay.num_rows]
                if dtype != "fp8"
                else type(a)(a.data[: lay.num_rows], a.scale[: lay.num_rows], a.block, a.scale_format),
                weight,
                lay,
            )
            for lay in layouts
        ]
    else:  # k_grouped (weight gradients): a[T, M], b[T, N]
        t0 = time.perf_counter()
        layouts = [moe_hal.KGroupedLayout.from_counts(c) for c in counts_per_step]
        build_us = (time.perf_counter() - t0) / len(layouts) * 1e6
        rows = max(lay.num_rows for lay in layouts)
        x, dy = operand(rows, 32, block=(128, 1)), operand(rows, n, block=(128, 1))

        def rows_of(t, r):
            return t[:r] if dtype != "fp8" else type(t)(t.data[:r], t.scale[: -(-r // 128)], t.block, t.scale_format)

        args = [(rows_of(x, lay.num_rows), rows_of(dy, lay.num_rows), lay) for lay in layouts]
    del layouts  # ``args`` holds the only references: a fresh layout dies after its round

    def call(a, b, lay):
        p = Problem.build(a, b, lay, out_dtype=torch.float32 if op == "k_grouped" else None)
        return be.run(p, None)

    cached = args[0]
    call(*cached)  # weights prepared, the first plan of the bucket made: as after a model's first step
    fresh = args[:0:-1]  # every fresh call sees a layout object new to the backend (popped from the end)
    del args
    samples = _time_rounds(fresh, cached, call, per_round, rounds, CLOCKS[clock])
    fresh_us, cached_us = (statistics.median(samples[r]) * 1e6 for r in ("fresh", "cached"))
    return {
        "arch": arch,
        "op": op,
        "dtype": dtype,
        "routing": routing,
        "groups": groups,
        "fresh_layout_us": round(fresh_us, 2),
        "cached_layout_us": round(cached_us, 2),
        "fresh_over_cached": round(fresh_us / cached_us, 3),
        "fresh_layout_min_us": round(min(samples["fresh"]) * 1e6, 2),
        "cached_layout_min_us": round(min(samples["cached"]) * 1e6, 2),
        "layout_build_us": round(build_us, 2),
        "plans_made": len(be._plans),
        # fp8 rows also execute the activation-scale conversion on the CPU (device work on a GPU)
        "meets_target": fresh_us <= TARGET_US if dtype != "fp8" else None,
        # the same test on the least disturbed round: what the code costs when no other tenant
        # of a shared host interferes (timeit's reading of repeated timings); the median decides
        "least_disturbed_meets_target": min(samples["fresh"]) * 1e6 <= TARGET_US if dtype != "fp8" else None,
    }


def reference_ns(clock) -> float:
    """Nanoseconds per iteration of a fixed pure-Python loop on ``clock``: how fast this host runs
    Python right now (a shared host's other tenants slow every figure of a run alike), recorded
    before and after the cases so runs on different days can be compared."""
    t0 = clock()
    total = 0
    for i in range(1_000_000):
        total += i
    return (clock() - t0) * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--calls", type=int, default=1000, help="fresh layouts per case")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument(
        "--clock", choices=sorted(CLOCKS), default="thread", help="thread: this thread's CPU time; wall: elapsed"
    )
    opts = parser.parse_args(argv)
    torch.set_num_threads(1)
    _stub_kernels()
    gen = torch.Generator().manual_seed(0)
    rows = []
    reference_before = reference_ns(CLOCKS[opts.clock])
    for arch, op, dtype, routing in [
        ("sm90", "contiguous", "bf16", "seed32"),
        ("sm90", "contiguous", "fp8", "seed32"),
        ("sm90", "contiguous", "bf16", "uniform256"),
        ("sm100", "contiguous", "fp8", "seed32"),
        ("sm90", "k_grouped", "bf16", "seed32"),
        ("sm100", "k_grouped", "fp8", "seed32"),
    ]:
        row = case(arch, op, dtype, routing, opts.calls, opts.rounds, gen, opts.clock)
        rows.append(row)
        print(
            f"{arch:6} {op:10} {dtype:5} {routing:10} fresh {row['fresh_layout_us']:7.1f} us  "
            f"cached {row['cached_layout_us']:7.1f} us  ratio {row['fresh_over_cached']:.2f}  "
            f"(least disturbed round: {row['fresh_layout_min_us']:.1f} / {row['cached_layout_min_us']:.1f} us)  "
            f"plans {row['plans_made']}  "
            f"{'(includes CPU scale conversion)' if row['meets_target'] is None else 'ok' if row['meets_target'] else 'OVER'}"
        )
    report = {
        "what": "host time per call of the cuda backends' launch path (Problem.build + backend.run, Triton launch "
        "stubbed), a new layout object every call vs one cached layout; CPU only, nothing ran on a GPU",
        "target_us": TARGET_US,
        "clock": "time.thread_time (this thread's CPU time)"
        if opts.clock == "thread"
        else "time.perf_counter (wall time)",
        "statistic": "median over rounds (the *_min_us fields: the least disturbed round)",
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
        "load_average": list(os.getloadavg()),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join(["python", "bench/bench_cuda_host_time.py", *(sys.argv[1:] if argv is None else argv)]),
        "reference_loop_ns": [round(reference_before, 2), round(reference_ns(CLOCKS[opts.clock]), 2)],
        "cases": rows,
    }
    if opts.json:
        with open(opts.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)
            f.write("\n")
    return 0 if all(r["meets_target"] is not False for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
