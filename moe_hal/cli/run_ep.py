"""``moe-hal run --ep W``: the main job expert-parallel on W local gloo processes.

Each rank takes its block of the main job's tokens, dispatches them with :mod:`moe_hal.ep` to the
ranks holding their experts (contiguous blocks of experts per rank), runs the grouped GEMM on its
local experts and combines the results back. The parent computes the single-process result of the
same global problem (:mod:`moe_hal.routing` dispatch -> grouped GEMM -> combine), compares every
rank's tokens with it and prints per-rank token counts.
"""

from __future__ import annotations

import statistics
import time

from . import job

#: Seconds ``--ep`` gives its W processes unless ``--ep-timeout`` says otherwise.
EP_TIMEOUT_S = 600.0


def _problem(spec: dict):
    """The global problem of the main job (same seeds as ``moe-hal run``), and rank blocks of tokens."""
    from ..quant import quantize_fp8

    hidden, weights, topk_ids, topk_weights, _ = job.tensors(
        **{key: spec[key] for key in ("tokens", "experts", "n", "k", "topk", "dtype", "dist", "seed")}
    )
    if job.is_fp8(spec["dtype"]):
        hidden, weights = quantize_fp8(hidden, block=(1, 128)), quantize_fp8(weights, block=(128, 128))
    W, T = spec["world"], spec["tokens"]
    bounds = [r * T // W for r in range(W + 1)]
    return hidden, weights, topk_ids, topk_weights, bounds


def _rows(x, lo: int, hi: int):
    from ..quant import QuantizedTensor

    if isinstance(x, QuantizedTensor):
        return QuantizedTensor(x.data[lo:hi], x.scale[lo:hi], x.block, x.scale_format)
    return x[lo:hi]


def _rank_job(rank: int, world: int, spec: dict) -> dict:
    import moe_hal
    from moe_hal import ep, timing

    hidden, weights, topk_ids, topk_weights, bounds = _problem(spec)
    lo, hi = bounds[rank], bounds[rank + 1]
    g = ep.EPGroup(None, spec["experts"])
    local = list(g.local_experts)
    w_local = _rows(weights, local[0], local[-1] + 1) if local else _rows(weights, 0, 0)

    def step():
        d = ep.dispatch(
            _rows(hidden, lo, hi),
            topk_ids[lo:hi],
            topk_weights[lo:hi],
            g,
            mode=spec["mode"],
            alignment=spec["alignment"],
            capacity=spec["capacity"],
        )
        return d, ep.combine(moe_hal.grouped_gemm(d.a, w_local, d.layout), d)

    t0 = time.perf_counter()
    d, y = step()
    first_s = time.perf_counter() - t0
    times = timing.wall_seconds(step, "cpu", warmup=0, repeat=spec["repeat"])
    return {
        "rank": rank,
        "tokens": hi - lo,
        "slots_routed": int((topk_ids[lo:hi] >= 0).sum()),
        "sent_to": d.send_counts.tolist(),
        "received_from": d.recv_counts.tolist(),
        "local_experts": [local[0], local[-1]] if local else [],
        "rows_per_local_expert": job.counts_of(d.layout),
        "transport": d.transport,
        "first_call_s": first_s,
        "median_s": statistics.median(times) if times else first_s,
        "y": y.float().numpy(),
    }


def run_ep(args) -> int:
    import torch

    import moe_hal
    from moe_hal import ep, routing

    from ..errors import ArgumentError

    if args.ep < 1:
        raise ArgumentError("--ep", "a positive number of local processes", args.ep)
    timeout_s = EP_TIMEOUT_S if args.ep_timeout is None else args.ep_timeout
    mode = args.ep_mode or "exact"
    if not timeout_s > 0:
        raise ArgumentError("--ep-timeout", "a positive number of seconds", args.ep_timeout)
    spec = {
        "world": args.ep,
        "mode": mode,
        "experts": args.experts,
        "n": args.n,
        "k": args.k,
        "tokens": args.tokens,
        "topk": args.topk,
        "dtype": args.dtype,
        "dist": args.dist,
        "seed": args.seed,
        "alignment": args.alignment,
        "repeat": max(args.repeat, 0),
        "capacity": None,
    }
    hidden, weights, topk_ids, topk_weights, bounds = _problem(spec)
    if args.ep_mode == "capacity":  # exactly full: the largest (source rank, expert) count
        spec["capacity"] = max(
            int((topk_ids[bounds[r] : bounds[r + 1]] == e).sum()) for r in range(args.ep) for e in range(args.experts)
        )
    t0 = time.perf_counter()
    per_rank = ep.spawn_local(_rank_job, args.ep, (spec,), timeout_s=timeout_s)
    wall_s = time.perf_counter() - t0
    d = routing.dispatch(hidden, topk_ids, args.experts, alignment=args.alignment, topk_weights=topk_weights)
    want = routing.combine(moe_hal.grouped_gemm(d.a, weights, d.layout), d).float()
    got = torch.cat([torch.from_numpy(r.pop("y")) for r in per_rank])
    in_dtype = "fp8_e4m3" if isinstance(hidden, moe_hal.QuantizedTensor) else moe_hal.dtypes.name_of(hidden.dtype)
    diff, ok = job.verify(got, want, in_dtype)
    result = {
        "ep": args.ep,
        "mode": mode,
        "capacity": spec["capacity"],
        **job.described(args, in_dtype),
        "spawn_wall_s": wall_s,
        "ranks": per_rank,
        "calc_diff": diff,
        "calc_diff_max": job.CALC_DIFF_MAX[in_dtype],
        "max_abs_err": float((got - want).abs().max()) if got.numel() else 0.0,
        "bit_identical": bool(torch.equal(got, want)),
        "verified": ok,
        "reference": "single process: moe_hal.routing dispatch -> grouped_gemm -> combine",
    }
    job.emit(result, args, _print)
    return 0 if ok else 1


def _print(r: dict) -> None:
    from . import render

    console = render.console()
    capacity = f", capacity {r['capacity']}" if r["capacity"] is not None else ""
    console.print(
        render.join(
            (f"moe-hal run --ep {r['ep']}", "bold"),
            f" ({r['mode']} mode{capacity}): {r['experts']} experts over {r['ep']} gloo ranks, N={r['n']}, "
            f"K={r['k']}, {r['tokens']} tokens x top-{r['topk']} ({r['dist']} routing), {r['dtype']}",
        )
    )
    columns = ("rank", "tokens", "slots", "rows sent to rank 0..", "rows received from rank 0..", "experts")
    columns += ("rows/expert min-max", "ms")
    rows = []
    for x in r["ranks"]:
        per_expert = x["rows_per_local_expert"]
        rows.append(
            (
                x["rank"],
                x["tokens"],
                x["slots_routed"],
                " ".join(map(str, x["sent_to"])),
                " ".join(map(str, x["received_from"])),
                f"{x['local_experts'][0]}..{x['local_experts'][1]}" if x["local_experts"] else "-",
                f"{min(per_expert)}-{max(per_expert)}" if per_expert else "-",
                f"{x['median_s'] * 1e3:.1f}",
            )
        )
    numbers = ("rank", "tokens", "slots", "ms")
    console.print(render.table(None, columns, rows, key=("rank", "experts", *numbers), right=numbers))
    console.print(
        render.text(
            f"transport: {r['ranks'][0]['transport']}; against the {r['reference']}: calc_diff {r['calc_diff']:.3e} "
            f"(bound {r['calc_diff_max']:.0e}), max abs err {r['max_abs_err']:.3e}, "
            f"bit-identical: {'yes' if r['bit_identical'] else 'no'}"
        )
    )
    console.print(job.verdict(r["verified"], "the single-process result"))
