"""Host overhead and throughput of ``moe_hal.grouped_gemm`` against its peers, in one process.

Compares, on the current device (the CPU by default):

* ``moe_hal.grouped_gemm`` (automatic selection: the ``torch`` backend on the CPU),
* a direct ``torch.nn.functional.grouped_mm`` call with pre-built offsets (the peer),
* a per-expert ``torch.mm`` loop writing into a preallocated output,

at a tiny size, where the difference is host overhead (validation, the cached selection, the
contract fix-ups), and at a mid size, where it is throughput. Reports medians over repeated
timings; never run as a test.

    python bench/bench_overhead.py [--json results.json] [--dtype bf16] [--repeats 7]
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import torch

import moe_hal
from moe_hal import peers, timing, workloads


def case(
    name: str, counts: list[int], n: int, k: int, dtype: torch.dtype, alignment: int, iters: int, repeats: int
) -> dict:
    """Host seconds per call of moe_hal and its peers (:mod:`moe_hal.peers`) on one contiguous case."""
    prep = peers.prepare(
        workloads.Case(
            name, "bench_overhead", "contiguous", moe_hal.dtypes.name_of(dtype), n, k, counts, alignment=alignment
        ),
        "cpu",
    )
    lay = prep.layout
    ours = prep.calls[peers.MOE_HAL]
    first = time.perf_counter()
    ours()
    first = time.perf_counter() - first
    calls = {"ours": ours, "direct": prep.calls[peers.GROUPED_MM], "loop": prep.calls[peers.MM_LOOP]}
    t = timing.host_seconds_per_call(calls, iters=iters, repeats=repeats)
    t_ours, t_direct, t_loop = t["ours"], t["direct"], t["loop"]
    flops = 2.0 * sum(counts) * n * k
    return {
        "case": name,
        "groups": len(counts),
        "rows": lay.num_rows,
        "valid_rows": sum(counts),
        "n": n,
        "k": k,
        "dtype": moe_hal.dtypes.name_of(dtype),
        "alignment": alignment,
        "backend": moe_hal.select(*prep.args, lay).name,
        "first_call_s": first,
        "moe_hal_s": t_ours,
        "grouped_mm_s": t_direct,
        "loop_s": t_loop,
        "overhead_us": (t_ours - t_direct) * 1e6,
        "throughput_vs_grouped_mm": t_direct / t_ours,
        "throughput_vs_loop": t_loop / t_ours,
        "moe_hal_gflops": flops / t_ours / 1e9,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dtype", default="bf16", help="operand dtype of the mid-size case (fp32, bf16, fp16)")
    p.add_argument("--repeats", type=int, default=15, help="timing rounds (median over them)")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = p.parse_args(argv)
    dtype = moe_hal.dtypes.parse(args.dtype)
    torch.manual_seed(0)
    results = [
        # 8 experts, 2..9 rows each, 16x16: all host overhead.
        case(
            "tiny",
            [2, 5, 3, 9, 4, 6, 2, 7],
            n=16,
            k=16,
            dtype=torch.float32,
            alignment=1,
            iters=2000,
            repeats=args.repeats,
        ),
        # The seed's 32-expert skew scaled to 4096 rows, DeepSeek-V3-like shapes scaled to the CPU.
        case(
            "mid",
            workloads.scale_counts(workloads.SEED_COUNTS, 4096),
            n=512,
            k=1024,
            dtype=dtype,
            alignment=128,
            iters=5,
            repeats=args.repeats,
        ),
    ]
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"moe_hal.grouped_gemm vs peers on {platform.processor() or platform.machine()} "
        f"(torch {torch.__version__}, {torch.get_num_threads()} threads)"
    )
    for col in (
        "case",
        "shape",
        "backend",
        "moe_hal",
        "F.grouped_mm",
        "mm loop",
        "overhead",
        "vs grouped_mm",
        "vs loop",
    ):
        table.add_column(col, justify="right")
    for r in results:
        table.add_row(
            r["case"],
            f"G={r['groups']} M={r['rows']} N={r['n']} K={r['k']} {r['dtype']}",
            r["backend"],
            f"{r['moe_hal_s'] * 1e6:.1f} us",
            f"{r['grouped_mm_s'] * 1e6:.1f} us",
            f"{r['loop_s'] * 1e6:.1f} us",
            f"{r['overhead_us']:.1f} us",
            f"{r['throughput_vs_grouped_mm']:.3f}x",
            f"{r['throughput_vs_loop']:.3f}x",
        )
    Console().print(table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": timing.machine_record(), "results": results}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
