"""Benchmark routing (dispatch + combine) and FP8 quantization against plain torch peers.

Measured in one process, on one device (the CPU by default):

* **copy limit** — ``torch.clone`` of a buffer as large as the dispatched activations: the
  bandwidth a pure copy reaches here (bytes read + bytes written per second). Like dispatch and
  combine, it allocates its output, so it pays the same first-touch page faults; ``copy_`` into a
  preallocated buffer is shown beside it to make that cost visible;
* **dispatch** — :func:`moe_hal.routing.dispatch` against a plain peer: a stable ``torch.sort`` of
  the expert ids followed by ``index_select`` of the token rows (no alignment padding, no layout);
* **combine** — :func:`moe_hal.routing.combine` against a plain peer: ``index_add_`` of the
  weighted expert rows into a zero ``[T, N]`` output;
* **quantization** — :func:`moe_hal.quant.quantize_fp8` of the activations (1x128, fp32 and UE8M0
  scales), :func:`~moe_hal.quant.pack_ue8m0` of their scales, and 128x128 weight blocks.

Bytes moved count the payload rows only (index tensors and scales are a few percent at most, and
are left out): dispatch reads the routed token rows and writes every output row, padding
included; combine reads the routed expert-output rows and writes ``[T, N]``; quantization reads the
input and writes the fp8 data and the fp32 scales. Each figure is the median of ``--repeat`` rounds
after ``--warmup`` calls; a round calls every operation once in turn, so that peers see the same
machine load. The 1-minute load average before and after the run is printed and stored: on a
shared host the absolute figures move with it, the ratios between peers much less. This is a measurement script, not a test: CI only smoke-runs it
at a tiny size.

Usage::

    python bench/bench_routing.py                                   # T=16384, H=4096, top-8 of 64, bf16
    python bench/bench_routing.py --tokens 64 --hidden 256 --experts 8 --topk 2 --repeat 1
    python bench/bench_routing.py --json routing.json --markdown routing.md
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Any, Callable

import torch

from moe_hal import dtypes, timing, workloads
from moe_hal.quant import pack_ue8m0, quantize_fp8
from moe_hal.routing import combine, dispatch


def baseline_dispatch(hidden: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The plain peer: sort the slots by expert, gather the token rows."""
    order = torch.sort(ids.reshape(-1), stable=True).indices
    token = torch.div(order, ids.shape[1], rounding_mode="floor")
    return hidden.index_select(0, token), order


def baseline_combine(rows: torch.Tensor, order: torch.Tensor, weights: torch.Tensor, tokens: int) -> torch.Tensor:
    """The plain peer: weight the expert rows and index_add_ them into their tokens."""
    k = weights.shape[1]
    token = torch.div(order, k, rounding_mode="floor")
    w = weights.reshape(-1)[order].to(rows.dtype)
    y = torch.zeros(tokens, rows.shape[1], dtype=rows.dtype, device=rows.device)
    return y.index_add_(0, token, rows * w[:, None])


def run(args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = dtypes.parse(args.dtype)
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    esize = torch.empty(0, dtype=dtype).element_size()
    torch.manual_seed(args.seed)
    tokens, hidden_size, k = args.tokens, args.hidden, args.topk
    hidden = torch.randn(tokens, hidden_size, device=device).to(dtype)
    ids, weights = (t.to(device) for t in workloads.route_tokens(tokens, args.experts, k, "uniform", args.seed))

    d = dispatch(hidden, ids, args.experts, alignment=args.alignment, topk_weights=weights)
    valid, rows = d.layout.num_valid_rows, d.layout.num_rows
    expert_out = d.a  # identity experts: N = H
    peer_rows, peer_order = baseline_dispatch(hidden, ids)
    copy_src = torch.empty(max(rows, 1) * hidden_size, dtype=dtype, device=device).normal_()
    copy_dst = torch.empty_like(copy_src)
    scale = quantize_fp8(hidden, ue8m0=True).scale
    weight = torch.randn(args.weight_groups, args.weight_n, hidden_size, device=device).to(dtype)

    copy_bytes = 2 * copy_src.numel() * esize
    dispatch_bytes = (valid + rows) * hidden_size * esize
    peer_dispatch_bytes = 2 * valid * hidden_size * esize
    combine_bytes = (valid + tokens) * hidden_size * esize
    act_bytes = hidden.numel() * (esize + 1) + hidden.numel() // 128 * 4
    # name -> (callable, bytes moved, name of the peer it is compared with)
    cases: dict[str, tuple[Callable[[], object], int, str | None]] = {
        "copy limit (torch.clone)": (copy_src.clone, copy_bytes, None),
        "copy into a preallocated buffer (copy_)": (lambda: copy_dst.copy_(copy_src), copy_bytes, None),
        "dispatch": (
            lambda: dispatch(hidden, ids, args.experts, alignment=args.alignment),
            dispatch_bytes,
            "dispatch peer (sort + index_select)",
        ),
        "dispatch peer (sort + index_select)": (lambda: baseline_dispatch(hidden, ids), peer_dispatch_bytes, None),
        "combine": (lambda: combine(expert_out, d, weights), combine_bytes, "combine peer (index_add_)"),
        "combine peer (index_add_)": (
            lambda: baseline_combine(peer_rows, peer_order, weights, tokens),
            combine_bytes,
            None,
        ),
        "quantize_fp8 1x128 (fp32 scales)": (lambda: quantize_fp8(hidden), act_bytes, None),
        "quantize_fp8 1x128 (ue8m0 scales)": (lambda: quantize_fp8(hidden, ue8m0=True), act_bytes, None),
        "pack_ue8m0 (activation scales)": (lambda: pack_ue8m0(scale), scale.numel() * 5, None),
        "quantize_fp8 128x128 (weights)": (
            lambda: quantize_fp8(weight, block=(128, 128)),
            weight.numel() * (esize + 1),
            None,
        ),
    }
    times = timing.interleaved_wall_seconds(
        {name: fn for name, (fn, _, _) in cases.items()}, device, warmup=args.warmup, repeat=args.repeat
    )
    times["dispatch + combine"] = [a + b for a, b in zip(times["dispatch"], times["combine"])]
    times["peer dispatch + combine"] = [
        a + b for a, b in zip(times["dispatch peer (sort + index_select)"], times["combine peer (index_add_)"])
    ]
    cases["dispatch + combine"] = (cases["dispatch"][0], dispatch_bytes + combine_bytes, "peer dispatch + combine")
    cases["peer dispatch + combine"] = (cases["dispatch"][0], peer_dispatch_bytes + combine_bytes, None)

    order = [
        "copy limit (torch.clone)",
        "copy into a preallocated buffer (copy_)",
        "dispatch",
        "dispatch peer (sort + index_select)",
        "combine",
        "combine peer (index_add_)",
        "dispatch + combine",
        "peer dispatch + combine",
        "quantize_fp8 1x128 (fp32 scales)",
        "quantize_fp8 1x128 (ue8m0 scales)",
        "pack_ue8m0 (activation scales)",
        "quantize_fp8 128x128 (weights)",
    ]
    results = []
    for name in order:
        seconds = statistics.median(times[name])
        nbytes, peer = cases[name][1], cases[name][2]
        results.append(
            {
                "name": name,
                "seconds": seconds,
                "min_seconds": min(times[name]),
                "bytes": nbytes,
                "gbps": nbytes / seconds / 1e9,
                "peer": peer,
            }
        )
    copy = results[0]
    for row in results:
        row["vs_copy"] = row["gbps"] / copy["gbps"]
        peer = next((r for r in results if r["name"] == row["peer"]), None)
        row["vs_peer"] = peer["seconds"] / row["seconds"] if peer else None
    return {
        "config": {
            "tokens": tokens,
            "hidden": hidden_size,
            "experts": args.experts,
            "topk": k,
            "alignment": args.alignment,
            "dtype": args.dtype,
            "device": str(device),
            "weight_shape": [args.weight_groups, args.weight_n, hidden_size],
            "threads": torch.get_num_threads(),
            "cpus": os.cpu_count(),
            "torch": torch.__version__,
            "repeat": args.repeat,
            "warmup": args.warmup,
            "rows": rows,
            "valid_rows": valid,
            "load_average_1min": {
                "before": load_before,
                "after": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
            },
        },
        "results": results,
    }


def show(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    cfg = report["config"]
    table = Table(
        title=f"routing + fp8 quantization: T={cfg['tokens']}, H={cfg['hidden']}, top-{cfg['topk']} of "
        f"{cfg['experts']}, {cfg['dtype']}, {cfg['device']} ({cfg['threads']} threads); "
        f"{cfg['valid_rows']} routed rows, {cfg['rows']} with padding; 1-min load average "
        f"{cfg['load_average_1min']['before']} -> {cfg['load_average_1min']['after']}"
    )
    for col in ("operation", "ms", "GB/s", "x copy limit", "speed-up vs peer"):
        table.add_column(col, justify="left" if col == "operation" else "right")
    for r in report["results"]:
        table.add_row(
            r["name"],
            f"{r['seconds'] * 1e3:.2f}",
            f"{r['gbps']:.2f}",
            f"{r['vs_copy']:.2f}",
            f"{r['vs_peer']:.2f}x" if r["vs_peer"] is not None else "",
        )
    Console(width=120).print(table)


def markdown(report: dict[str, Any]) -> str:
    """The table as Markdown (for docs), with the configuration line above it."""
    cfg = report["config"]
    load = cfg["load_average_1min"]
    lines = [
        f"T={cfg['tokens']}, H={cfg['hidden']}, top-{cfg['topk']} of {cfg['experts']}, {cfg['dtype']}, "
        f"alignment {cfg['alignment']}, {cfg['device']}, {cfg['threads']} torch thread(s) on {cfg['cpus']} CPUs, "
        f"torch {cfg['torch']}, median of {cfg['repeat']} rounds, 1-min load average "
        f"{load['before']:.1f} -> {load['after']:.1f}"
        if load["before"] is not None
        else "",
        "",
        "| operation | ms | GB/s | x copy limit | speed-up vs peer |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in report["results"]:
        peer = f"{r['vs_peer']:.2f}x" if r["vs_peer"] is not None else ""
        lines.append(f"| {r['name']} | {r['seconds'] * 1e3:.1f} | {r['gbps']:.2f} | {r['vs_copy']:.2f} | {peer} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--experts", type=int, default=64)
    parser.add_argument("--topk", type=int, default=8)
    parser.add_argument("--alignment", type=int, default=128)
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--weight-groups", type=int, default=8, help="G of the [G, N, H] weight quantized")
    parser.add_argument("--weight-n", type=int, default=1024, help="N of the [G, N, H] weight quantized")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    parser.add_argument("--markdown", metavar="PATH", help="also write the table as Markdown")
    args = parser.parse_args(argv)
    report = run(args)
    show(report)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown(report))
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
