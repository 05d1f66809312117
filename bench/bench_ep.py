"""Benchmark expert-parallel dispatch + combine against a bare ``all_to_all_single`` of the same bytes.

W local processes join one gloo group on 127.0.0.1 (:func:`moe_hal.ep.spawn_local`). Each rank
routes ``--tokens`` tokens of ``--hidden`` bf16 features to ``--topk`` of ``--experts`` experts
(uniform, distinct per token), then times, interleaved round by round so both see the same load:

* **ep** — :func:`moe_hal.ep.dispatch` then :func:`moe_hal.ep.combine` with an identity expert
  (``expert_out = d.a``), so only the movement is timed: planning, the count all-gather, the row
  gathers, two all-to-alls, the fixed-order fp32 combine;
* **bare** — two ``torch.distributed.all_to_all_single`` calls moving the same rows with the same
  split sizes (rows to the experts, rows back): the strongest honest peer on the same group.

Bytes per call count the payload rows each rank sends and receives in both all-to-alls (capacity
mode moves its padded fixed-size blocks, and its bare peer moves the same blocks). bytes/s uses the
slowest rank's median time; ``ratio`` = ep bytes/s / bare bytes/s. **host s/call** is the time a
dispatch + combine spends outside the transport's collectives (measured by timing the transport's
two methods). The 1-minute load average before and after is stored: on a shared host absolute
figures move with it. A measurement script, not a test.

Usage::

    python bench/bench_ep.py                                        # W=2, T=2048, H=1024, top-4 of 16
    python bench/bench_ep.py --world 4 --json bench/results/ep_gloo_cpu.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time

import torch
import torch.distributed as dist

from moe_hal import ep, timing, workloads


def _rank(rank: int, world: int, cfg: dict) -> dict:
    torch.manual_seed(rank)
    g = ep.EPGroup(None, cfg["experts"])
    ids, weights = workloads.route_tokens(cfg["tokens"], cfg["experts"], cfg["topk"], "uniform", seed=rank)
    x = torch.randn(cfg["tokens"], cfg["hidden"]).to(torch.bfloat16)
    return {mode: _measure(mode, g, x, ids, weights, cfg) for mode in ("exact", "capacity")}


def _measure(mode: str, g: ep.EPGroup, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, cfg: dict) -> dict:
    kw = {"capacity": cfg["capacity"]} if mode == "capacity" else {}
    d = ep.dispatch(x, ids, weights, g, mode=mode, alignment=1, overflow="drop", **kw)
    transport = ep.select(g, mode).transport
    inside = [0.0]
    for name in ("all_to_all", "all_gather"):  # time spent inside the collectives
        method = getattr(type(transport), name)

        def timed(*args, _m=method, _t=transport):
            t0 = time.perf_counter()
            _m(_t, *args)
            inside[0] += time.perf_counter() - t0

        setattr(transport, name, timed)
    if mode == "exact":
        send, recv = d.send_counts.tolist(), d.recv_counts.tolist()
    else:  # the padded blocks capacity mode moves
        send = [len(e) * cfg["capacity"] for e in g.experts_of_rank]
        recv = [g.num_local_experts * cfg["capacity"]] * g.world_size
    s_buf = torch.empty(sum(send), x.shape[1], dtype=x.dtype)
    r_buf = torch.empty(sum(recv), x.shape[1], dtype=x.dtype)

    def run_ep():
        dd = ep.dispatch(x, ids, weights, g, mode=mode, alignment=1, overflow="drop", **kw)
        ep.combine(dd.a, dd)

    def run_bare():
        dist.all_to_all_single(r_buf, s_buf, recv, send)
        dist.all_to_all_single(s_buf, r_buf, send, recv)

    for _ in range(cfg["warmup"]):
        run_ep()
        run_bare()
    inside[0] = 0.0
    times = timing.interleaved_wall_seconds({"ep": run_ep, "bare": run_bare}, "cpu", warmup=0, repeat=cfg["repeat"])
    del transport.all_to_all, transport.all_gather  # the class's methods again
    return {
        "ep_s": statistics.median(times["ep"]),
        "bare_s": statistics.median(times["bare"]),
        "bytes": 2 * (sum(send) + sum(recv)) * x.shape[1] * x.element_size(),
        "dropped": int(d.dropped),
        # outside the transport's collectives: planning, gathers, the fp32 combine
        "host_s_per_call": max(0.0, (sum(times["ep"]) - inside[0]) / cfg["repeat"]),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--tokens", type=int, default=2048, help="tokens per rank")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--experts", type=int, default=16)
    p.add_argument("--topk", type=int, default=4)
    p.add_argument(
        "--capacity-factor",
        type=float,
        default=1.25,
        help="capacity = factor * tokens * topk / experts rows per (source rank, expert)",
    )
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--json", metavar="FILE", help="write the results here")
    args = p.parse_args(argv)
    capacity = math.ceil(args.capacity_factor * args.tokens * args.topk / args.experts)
    cfg = {
        "tokens": args.tokens,
        "hidden": args.hidden,
        "experts": args.experts,
        "topk": args.topk,
        "warmup": args.warmup,
        "repeat": args.repeat,
        "capacity": capacity,
    }
    load_before = os.getloadavg()[0]
    per_rank = ep.spawn_local(_rank, args.world, (cfg,), timeout_s=900, threads=args.threads)
    load_after = os.getloadavg()[0]
    result = {
        "benchmark": "bench/bench_ep.py",
        "command": " ".join(["python", "bench/bench_ep.py", *sys.argv[1:]]),
        "world": args.world,
        "backend": "gloo (127.0.0.1, one process per rank)",
        "dtype": "bf16",
        "config": cfg,
        "threads_per_rank": args.threads,
        "torch": torch.__version__,
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "load_avg_1min": [load_before, load_after],
        "timing": "wall time per call, rounds interleaved (ep, bare); median per rank; slowest rank",
        "modes": {},
    }
    for mode in ("exact", "capacity"):
        ep_s = max(r[mode]["ep_s"] for r in per_rank)
        bare_s = max(r[mode]["bare_s"] for r in per_rank)
        total_bytes = sum(r[mode]["bytes"] for r in per_rank)
        result["modes"][mode] = {
            "bytes_per_call_all_ranks": total_bytes,
            "ep_s_per_call": ep_s,
            "bare_s_per_call": bare_s,
            "ep_gb_per_s": total_bytes / ep_s / 1e9,
            "bare_gb_per_s": total_bytes / bare_s / 1e9,
            "ratio": bare_s / ep_s,
            "host_s_per_call": max(r[mode]["host_s_per_call"] for r in per_rank),
            "dropped_slots": sum(r[mode]["dropped"] for r in per_rank),
        }
    for mode, m in result["modes"].items():
        print(
            f"{mode:9s} ep {m['ep_gb_per_s']:.3f} GB/s vs bare all_to_all_single {m['bare_gb_per_s']:.3f} GB/s: "
            f"ratio {m['ratio']:.2f}; ep {m['ep_s_per_call'] * 1e3:.2f} ms/call, host (outside collectives) "
            f"{m['host_s_per_call'] * 1e3:.2f} ms/call"
        )
    print(f"load average (1 min) before/after: {load_before:.1f} / {load_after:.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
