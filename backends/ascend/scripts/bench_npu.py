"""Benchmark moe_hal's Ascend backends against a per-expert matmul loop, on a real Ascend NPU.

NOT RUN BY THE MOE_HAL MAINTAINERS: nobody on the project had an NPU, so no figure in the docs
comes from this script. It is here for users who have one (``run_on_npu.sh`` calls it).

For each case it times, in the same process and on the same device tensors:

* ``moe_hal``  ``moe_hal.grouped_gemm(..., backend=<ascend backend>)``: the whole path, layout
               translation and contract fix-ups included;
* ``gmm_op``   one bare ``torch_npu.npu_grouped_matmul`` call with the same group list (the op
               alone, without the fix-ups; not for the masked layout, which has no native form);
* ``loop``     the peer: one ``torch.mm`` per non-empty expert into a preallocated output
               (:mod:`moe_hal.peers`, the same peer ``moe-hal bench`` times).

and writes JSON with median times and the ratios ``loop / moe_hal`` and ``gmm_op / moe_hal``
(above 1: moe_hal is faster). Before timing, moe_hal's output is compared with the loop's
(DeepGEMM's ``calc_diff`` and the largest difference); a case that disagrees is not timed.

``--dry-run`` runs the same code on the CPU emulator of torch_npu with tiny shapes, to check the
script itself; its times mean nothing and the JSON says ``"mode": "emulated"``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
from typing import Any, Callable

#: (name, op, G, N, K, tokens, alignment): DeepSeek-V3-sized expert GEMMs on 32 local experts
#: (up-projection N=4096 K=7168, down-projection N=7168 K=2048) at prefill and decode sizes; for
#: k_grouped, M=K is the weight-gradient's row count and tokens its reduction length.
CASES = [
    ("prefill_up", "contiguous", 32, 4096, 7168, 8192, 1),
    ("prefill_down", "contiguous", 32, 7168, 2048, 8192, 1),
    ("prefill_up_aligned128", "contiguous", 32, 4096, 7168, 8192, 128),
    ("decode_up_masked", "masked", 32, 4096, 7168, 256, 0),
    ("wgrad_k_grouped", "k_grouped", 32, 2048, 7168, 8192, 1),
]
DRY_RUN_CASES = [
    ("prefill_up", "contiguous", 4, 64, 96, 64, 1),
    ("prefill_up_aligned16", "contiguous", 4, 64, 96, 64, 16),
    ("decode_up_masked", "masked", 4, 64, 96, 32, 0),
    ("wgrad_k_grouped", "k_grouped", 4, 32, 48, 64, 1),
]


def case_for(spec: tuple, dtype: str, seed: int):
    """The :class:`moe_hal.workloads.Case` of one ``CASES`` row, routed by a Zipf-like router (a few
    hot experts, some nearly empty)."""
    from moe_hal import workloads

    name, op, groups, n, k, tokens, alignment = spec
    counts = workloads.synthetic_counts("zipf:1.2", tokens, groups, 1, seed=seed)
    if op == "k_grouped":  # K is the weight gradient's row count, tokens its reduction length
        return workloads.Case(name, "bench_npu", op, dtype, n, None, counts, m=k, alignment=1, dist="zipf:1.2")
    max_m = (max(counts) or 1) if op == "masked" else None
    return workloads.Case(name, "bench_npu", op, dtype, n, k, counts, max_m=max_m, alignment=alignment, dist="zipf:1.2")


def gmm_op(ops, case, prep):
    """One bare npu_grouped_matmul with the group list moe_hal passes (None for masked, which has
    no native form)."""
    import torch

    a, b = prep.args
    if case.op == "contiguous":
        group_list = prep.layout.aligned_ends_on(a.device).to(torch.int64)
        return lambda: ops.npu_grouped_matmul(
            [a], [b.transpose(1, 2)], group_list=group_list, group_type=0, group_list_type=0, split_item=3
        )[0]
    if case.op == "k_grouped":
        group_list = prep.layout.psum_on(a.device).to(torch.int64)
        return lambda: ops.npu_grouped_matmul(
            [a.t()], [b], group_list=group_list, group_type=2, group_list_type=0, split_item=3
        )[0]
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--backend", default=None, help="ascend or ascend_950 (default: what moe_hal selects)")
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU emulator (checks the script)")
    args = parser.parse_args(argv)

    if args.dry_run:
        os.environ["MOE_HAL_ASCEND_EMULATE"] = os.environ.get("MOE_HAL_ASCEND_EMULATE") or "1"
    import torch

    import moe_hal
    from moe_hal import peers, sysinfo, timing
    from moe_hal.conformance.tolerances import calc_diff
    from moe_hal_ascend import runtime

    if args.dry_run:
        device, specs = torch.device("cpu"), DRY_RUN_CASES
        args.repeats, args.warmup = 2, 1
        backend = args.backend or "ascend"  # on the CPU the Ascend backends run only when named
    else:
        runtime.torch_npu()  # raises with the reason when torch_npu is unusable
        device, specs = torch.device("npu:0"), CASES
        backend = args.backend
    ops = runtime.ops_for(device)

    def timed(fn: Callable[[], Any]) -> float:
        """Median wall milliseconds of ``fn``, the device synchronised after each call."""
        return statistics.median(timing.wall_seconds(fn, device, warmup=args.warmup, repeat=args.repeats)) * 1e3

    results = []
    for index, spec in enumerate(specs):
        case = case_for(spec, args.dtype, seed=index)
        entry: dict[str, Any] = {
            "case": case.name,
            "op": case.op,
            "G": spec[2],
            "N": spec[3],
            "K": spec[4],
            "tokens": spec[5],
            "alignment": spec[6],
            "counts": case.counts,
        }
        try:
            prep = peers.prepare(case, device, backend=backend, seed=20261202 + index)
            a, b = prep.args
            sel = moe_hal.select(a, b, prep.layout, backend=backend)
            entry.update(backend=sel.name, mode=sel.mode, path=sel.chosen.path)
            run, loop = prep.calls[peers.MOE_HAL], prep.calls[peers.MM_LOOP]
            y, peer = run(), loop()
            entry["calc_diff_vs_loop"] = calc_diff(y, peer)
            entry["max_abs_diff_vs_loop"] = (y.double() - peer.double()).abs().max().item()
            entry["ok"] = entry["calc_diff_vs_loop"] < 1e-5
            if entry["ok"]:
                ms = {"moe_hal": timed(run), "loop": timed(loop)}
                bare = gmm_op(ops, case, prep)
                if bare is not None:
                    ms["gmm_op"] = timed(bare)
                entry["ms"] = ms
                entry["ratio_loop_over_moe_hal"] = ms["loop"] / ms["moe_hal"]
                if "gmm_op" in ms:
                    entry["ratio_gmm_op_over_moe_hal"] = ms["gmm_op"] / ms["moe_hal"]
        except Exception as exc:  # noqa: BLE001 - record the failure and go on with the next case
            entry.update(ok=False, error=f"{type(exc).__name__}: {exc}")
        results.append(entry)

    report = {
        "tool": "backends/ascend/scripts/bench_npu.py",
        "mode": "emulated" if args.dry_run else "native",
        "note": (
            "dry run on the CPU emulator of torch_npu: the times mean nothing"
            if args.dry_run
            else "measured on an Ascend NPU"
        ),
        "dtype": args.dtype,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "host": platform.node(),
        "versions": sysinfo.versions(),
        "env": {k: v for k, v in os.environ.items() if k.startswith(("MOE_HAL_", "ASCEND_"))},
        "results": results,
    }
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2)
    failed = [r["case"] for r in results if not r.get("ok")]
    print(f"wrote {args.out}: {len(results)} cases" + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
