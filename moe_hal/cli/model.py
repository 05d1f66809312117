"""``moe-hal model``: what the performance model says about one grouped GEMM.

For a routing histogram (``--counts`` or ``--dist``), N, K, a dtype and a hardware-DB entry it
prints, per tile, the M-occupancy, tiles, waves, the plain roofline (the ideal) and the
occupancy- and wave-aware prediction, then answers in words whether padding is free for this
histogram (which experts sit below the ridge height M*) and recommends a tile. ``--plot``
draws the roofline with every expert placed on it and the occupancy-vs-BM curve.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from . import types

#: Within this fraction of the plain roofline, the prediction counts as "at the ideal".
AT_IDEAL = 0.03


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "model",
        help="performance model: occupancy, waves, ideal and predicted time per tile",
        description="Occupancy- and wave-aware roofline of one grouped GEMM (see docs/perf-model.md). "
        "Without --counts or --dist the histogram of DeepGEMM issue #211 is used.",
    )
    p.add_argument("--hw", default="nvidia-h200-sxm", help="hardware-DB id or alias (default nvidia-h200-sxm)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--counts", help="rows per expert, comma-separated (K per group for --op k_grouped)")
    src.add_argument("--dist", help="synthetic histogram: uniform | balanced | zipf:A | seed")
    p.add_argument("--tokens", type=int, help="tokens routed (with --dist; seed: rescale to tokens*topk rows)")
    p.add_argument("--experts", type=int, default=32, help="experts (with --dist, default 32)")
    p.add_argument("--topk", type=int, default=8, help="experts per token (with --dist, default 8)")
    p.add_argument("--seed", type=int, default=0, help="random seed of --dist (default 0)")
    p.add_argument("--n", type=int, default=4096, help="N: output columns per expert (default 4096)")
    p.add_argument("--k", type=int, default=7168, help="K: reduction size (default 7168; unused for k_grouped)")
    p.add_argument("--m", type=int, help="output rows per group for --op k_grouped")
    p.add_argument("--dtype", default="bf16", help="operand dtype: fp32 tf32 bf16 fp16 fp8 int8 fp4 (default bf16)")
    p.add_argument(
        "--out-dtype", help="output dtype (default: bf16 for 8/4-bit inputs, fp32 for k_grouped, else the input dtype)"
    )
    p.add_argument("--op", choices=("contiguous", "masked", "k_grouped"), default="contiguous")
    p.add_argument("--max-m", type=int, help="row capacity per group for --op masked")
    p.add_argument("--tiles", default="64x128,128x128,256x128", help="BMxBN list (default 64x128,128x128,256x128)")
    p.add_argument(
        "--streams-all-experts",
        action="store_true",
        help="the kernel reads every expert's weights, empty ones included",
    )
    p.add_argument(
        "--fast-accumulation",
        action="store_true",
        help="the kernel accumulates FP8 without promoting partial sums per K block (CUTLASS FP8FastAccum): "
        "no K-block latency",
    )
    p.add_argument("--t-fixed-us", type=float, help="launch + prologue time added to predictions (us)")
    p.add_argument("--spec", action="store_true", help="use datasheet figures, not the DB's measured ones")
    p.add_argument("--impl", help="kernel implementation whose achieved efficiency applies (default: the best known)")
    p.add_argument(
        "--no-achieved",
        action="store_true",
        help="predict from the peak and bandwidth themselves, without achieved efficiency (the old model)",
    )
    p.add_argument(
        "--plot",
        metavar="FILE.png",
        type=types.output_file,
        help="draw the roofline and the occupancy-vs-BM curve (needs matplotlib: pip install 'moe-hal[plot]')",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.set_defaults(func=run)
    from . import model_validation

    model_validation.register(p)


def run(args: argparse.Namespace) -> int:
    from .. import perf
    from ..errors import MoeHalError

    try:
        report, advice = build_report(args)
    except MoeHalError as exc:
        print(f"moe-hal model: {exc}", file=sys.stderr)
        return 2
    if args.plot:
        try:
            report["plot_labels"] = plot(
                advice, report, args.plot, perf.resolve_hardware(args.hw, measured=not args.spec)
            )
        except ImportError:
            print(
                "moe-hal model: --plot needs matplotlib; install the plot extra: pip install 'moe-hal[plot]'",
                file=sys.stderr,
            )
            return 2
        report["plot"] = args.plot
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_report(report)
    return 0


# ---------------------------------------------------------------------------------------------
def _parse_counts(text: str) -> list[int]:
    from ..errors import ArgumentError

    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x != ""]
    except ValueError:
        raise ArgumentError("--counts", "comma-separated non-negative ints", text) from None


def _parse_tiles(text: str) -> list[tuple[int, int]]:
    from ..errors import ArgumentError

    tiles = []
    for item in text.replace(" ", "").split(","):
        parts = item.lower().split("x")
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            raise ArgumentError("--tiles", "a comma list of BMxBN such as 64x128,128x128", text)
        tiles.append((int(parts[0]), int(parts[1])))
    return tiles


def histogram(args: argparse.Namespace) -> tuple[list[int], str]:
    """The counts the command models, and a description of where they came from."""
    from .. import perf

    if args.counts is not None:
        return _parse_counts(args.counts), "--counts"
    dist = args.dist or "seed"
    if dist == "seed":
        counts = perf.synthetic_counts("seed", args.tokens, 32, args.topk if args.tokens else 1)
        where = "DeepGEMM issue #211 histogram" + (f" scaled to {sum(counts)} rows" if args.tokens else "")
        return counts, where
    from ..errors import ArgumentError

    if args.tokens is None:
        raise ArgumentError("--tokens", f"a token count with --dist {dist}", None)
    counts = perf.synthetic_counts(dist, args.tokens, args.experts, args.topk, args.seed)
    return counts, f"{dist}: {args.tokens} tokens x top-{args.topk} over {args.experts} experts (seed {args.seed})"


def build_report(args: argparse.Namespace) -> tuple[dict[str, Any], Any]:
    from .. import perf

    counts, where = histogram(args)
    hw = perf.resolve_hardware(args.hw, measured=not args.spec, achieved=not args.no_achieved)
    options: dict[str, Any] = {
        "op": args.op,
        "out_dtype": args.out_dtype,
        "streams_all_experts": args.streams_all_experts,
        "fast_accumulation": args.fast_accumulation,
        "impl": args.impl,
    }
    if args.t_fixed_us is not None:
        options["t_fixed"] = args.t_fixed_us * 1e-6
    k = args.k
    if args.op == "k_grouped":
        options["m"], k = args.m, None
    if args.op == "masked" and args.max_m is not None:
        options["max_m"] = args.max_m
    advice = perf.advise(counts, args.n, k, hw, args.dtype, _parse_tiles(args.tiles), **options)
    best = advice.best
    report = {
        "hardware": {
            "id": hw.name,
            "num_cores": hw.num_cores,
            "peak_flops": best.peak_flops,
            "mem_bandwidth": hw.mem_bandwidth,
            "mma_min_m": hw.min_m(args.dtype),
            "sources": dict(hw.sources),
            "basis": "datasheet" if args.spec else "measured where present",
        },
        "problem": {
            "op": args.op,
            "counts": list(counts),
            "histogram": where,
            "n": args.n,
            "k": k,
            "m": best.m,
            "dtype": best.dtype,
            "out_dtype": best.out_dtype,
            "num_groups": best.num_groups,
            "active_groups": best.active_groups,
            "rows": sum(counts),
        },
        "ridge_m": best.ridge_m,
        "t_roofline": best.t_roofline,
        "ranked": [e.as_dict() for e in advice.ranked],
        "recommendation": {
            "tile": list(advice.tile),
            "reason": advice.reason,
            "tie_band": perf.TIE_BAND,
            "equivalent": [list(e.tile) for e in advice.equivalent],
        },
        "answer": answer(advice, counts),
    }
    return report, advice


def answer(advice: Any, counts: list[int]) -> dict[str, Any]:
    """The seed question answered for this histogram, as data plus plain sentences."""
    best, worst = advice.ranked[0], max(advice.ranked, key=lambda e: e.t_predicted)
    ideal, ridge = best.t_roofline, best.ridge_m
    op = best.op
    lines = [
        f"Plain roofline (the ideal, speed of light): {_us(ideal)} us, "
        f"{'compute' if best.useful_flops / best.peak_flops >= best.bytes_min / best.mem_bandwidth else 'memory'}"
        f"-bound on useful FLOPs and minimum bytes."
    ]
    gap_best = best.t_predicted / ideal - 1 if ideal else 0.0
    gap_worst = worst.t_predicted / ideal - 1 if ideal else 0.0
    lines.append(
        f"Prediction (padded tiles, waves, achieved efficiency): best {best.block_m}x{best.block_n} "
        f"{_us(best.t_predicted)} us "
        f"({gap_best:+.0%} vs ideal), worst {worst.block_m}x{worst.block_n} {_us(worst.t_predicted)} us "
        f"({gap_worst:+.0%})."
    )
    data: dict[str, Any] = {"gap_best": gap_best, "gap_worst": gap_worst, "ridge_m": ridge}
    if op != "k_grouped":
        active = [(g, c) for g, c in enumerate(counts) if c]
        below = [(g, c) for g, c in active if c <= ridge]
        above = [(g, c) for g, c in active if c > ridge]
        rows_below = sum(c for _, c in below)
        total = sum(counts) or 1
        hidden = [(g, c) for g, c in below if best.group_bounds[g] == "memory"]
        if below and best.bound == "memory":
            lines.append(
                f"Ridge height M* = {ridge:.0f} rows: {len(below)} of {len(active)} active experts "
                f"({rows_below} rows, {rows_below / total:.0%} of all rows) have M_g <= M*, and the call "
                f"as a whole is bound by streaming weights, so their padding is hidden ({len(hidden)} of "
                f"them stay memory-bound with {best.block_m}x{best.block_n})."
            )
        elif below:
            lines.append(
                f"Ridge height M* = {ridge:.0f} rows: {len(below)} of {len(active)} active experts "
                f"({rows_below} rows, {rows_below / total:.0%} of all rows) have M_g <= M*: alone, each "
                f"would be bound by streaming its weights. But this call is compute-bound as a whole, and "
                f"a persistent kernel's cores run every padded tile for its full time, so their padding "
                f"is charged too."
            )
        else:
            lines.append(
                f"Ridge height M* = {ridge:.0f} rows: no active expert has M_g <= M*, so no expert's "
                "padding hides behind its weight streaming."
            )
        if above:
            ordered = sorted(above, key=lambda t: -t[1])
            shown = ", ".join(f"e{g}={c}" for g, c in ordered[:8]) + (
                f", ... {len(ordered) - 8} more" if len(ordered) > 8 else ""
            )
            occ = ", ".join(f"{e.block_m}x{e.block_n}: {e.occupancy_m:.3f}" for e in advice.ranked)
            lines.append(
                f"{len(above)} experts are above M* ({shown}): their padded tiles outlast their weight "
                f"streaming, so M-occupancy costs time there (aggregate occupancy {occ})."
            )
        data.update(below=[g for g, _ in below], above=[g for g, _ in above], rows_below=rows_below)
    padding = best.t_padded / ideal - 1 if ideal else 0.0
    if gap_best <= AT_IDEAL:
        verdict = (
            f"At the ideal here: the best tile is within {AT_IDEAL:.0%} of the plain roofline, "
            "which is then a good predictor."
        )
    else:
        verdict = (
            f"Not at the ideal here: the best tile is predicted {gap_best:.0%} above the plain roofline "
            f"(padding alone adds {padding:.0%}; waves, per-tile overhead and achieved efficiency the "
            "rest). Report efficiency against the roofline, but predict with the model."
        )
    lines.append(verdict)
    lines.append(f"Recommendation: {advice.reason}.")
    data.update(free=gap_best <= AT_IDEAL, lines=lines)
    return data


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.1f}"


def print_report(report: dict[str, Any]) -> None:
    from . import render

    console = render.console()
    hw, prob = report["hardware"], report["problem"]
    srcs = hw["sources"]
    console.print(
        render.join(
            (hw["id"], "bold"),
            f": {hw['num_cores']} cores, peak {hw['peak_flops'] / 1e12:.1f} TFLOP/s "
            f"{prob['dtype']} ({srcs.get('peak.' + prob['dtype'], '?')}), bandwidth "
            f"{hw['mem_bandwidth'] / 1e12:.2f} TB/s ({srcs.get('bandwidth', '?')}), MMA min M {hw['mma_min_m']}",
        )
    )
    shape = f"N={prob['n']}, K={prob['k']}" if prob["op"] != "k_grouped" else f"M={prob['m']}, N={prob['n']}"
    console.print(
        render.text(
            f"{prob['op']} {prob['dtype']}->{prob['out_dtype']}, {shape}, {prob['num_groups']} groups "
            f"({prob['active_groups']} active), {prob['rows']} {'tokens' if prob['op'] == 'k_grouped' else 'rows'}"
            f" ({prob['histogram']})"
        )
    )
    console.print(f"ridge M* = {report['ridge_m']:.0f} rows; plain roofline (ideal) = {_us(report['t_roofline'])} us")
    basis = report["ranked"][0]["basis"]
    for term in ("compute", "bandwidth", "tile_overhead", "stage_latency", "launch", "tile_load_rate"):
        # most kernels have no load rate: say so only where one holds the tiles back
        if term != "tile_load_rate" or basis[term] != "not modelled":
            console.print(render.text(f"  prediction {term}: {basis[term]}"))
    columns = (
        "tile",
        "occ M",
        "occ N",
        "tiles",
        "waves",
        "wave eff",
        "T_comp",
        "T_mem",
        "ideal",
        "predicted",
        "vs ideal",
        "serial",
        "bound",
    )
    rows = [
        (
            f"{e['block_m']}x{e['block_n']}",
            f"{e['occupancy_m']:.3f}",
            f"{e['occupancy_n']:.3f}",
            e["tiles"],
            e["waves"],
            f"{e['wave_efficiency']:.3f}",
            _us(e["t_compute"]),
            _us(e["t_memory"]),
            _us(e["t_roofline"]),
            _us(e["t_predicted"]),
            f"{e['t_predicted'] / e['t_roofline'] - 1:+.1%}" if e["t_roofline"] else "-",
            _us(e["t_serial"]),
            e["bound"],
        )
        for e in report["ranked"]
    ]
    # every column is a number a reader compares across rows: none may be cut
    console.print(
        render.table(
            "per tile (times in us)",
            columns,
            rows,
            key=columns,
            right=columns,
            row_styles=["bold green" if i == 0 else None for i in range(len(rows))],
        )
    )
    for line in report["answer"]["lines"]:
        console.print(render.text(line))
    if report.get("plot"):
        console.print(render.text(f"plot written to {report['plot']}"))


# ---------------------------------------------------------------------------------------------
#: Marker of each candidate tile, in rank order, so that tiles at the same point stay distinguishable.
_MARKERS = ("*", "D", "s", "^", "v", "P", "X", "o")


def plot(advice: Any, report: dict[str, Any], path: str, hw: Any) -> dict[str, Any]:
    """Two panels: the roofline with each expert at its arithmetic intensity (filled: the
    plain roofline; hollow: with the recommended tile's padding), and aggregate M-occupancy and
    predicted time against BM. The title carries the call (op, dtype, N, K or M, groups) and the
    best tile's gap to the roofline; each candidate tile has its own marker and label. Returns
    the texts drawn (``title``, ``panels``, ``candidates``). Raises ImportError without matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .. import perf

    best = advice.best
    prob = report["problem"]
    counts = prob["counts"]
    peak, bw = best.peak_flops, best.mem_bandwidth
    common = dict(hw=hw, dtype=best.dtype, out_dtype=best.out_dtype, op=best.op)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5.6))
    k_grouped = best.op == "k_grouped"
    # K-grouped calls group the reduction: each group's size is its K_g (tokens), the tile pads the
    # M x N output of every group, and the shape is given by M and N.
    size_name = "K_g (tokens)" if k_grouped else "M_g (rows)"
    shape = f"M={best.m}, N={best.n}" if k_grouped else f"N={best.n}, K={best.k}"
    gap = best.t_predicted / best.t_roofline - 1 if best.t_roofline else float("nan")
    title = (
        f"{hw.name}: {best.op} {best.dtype}->{best.out_dtype}, {shape}, {len(counts)} groups; best tile "
        f"{best.block_m}x{best.block_n} predicted {best.t_predicted * 1e6:.1f} us, {gap:+.1%} vs the plain "
        f"roofline ({best.t_roofline * 1e6:.1f} us)"
    )
    fig.suptitle(title, fontsize=10)

    # -- roofline: one point per active expert
    xs, ys, ys_pad, colors = [], [], [], []
    if best.op == "k_grouped":
        one = [
            perf.estimate([c], best.n, None, block_m=best.block_m, block_n=best.block_n, m=best.m, **common)
            for c in counts
            if c
        ]
    else:
        one = [
            perf.estimate([c], best.n, best.k, block_m=best.block_m, block_n=best.block_n, **common)
            for c in counts
            if c
        ]
    for e in one:
        ai = e.useful_flops / e.bytes_min
        xs.append(ai)
        ys.append(min(peak, ai * bw) / 1e12)
        ys_pad.append(e.useful_flops / e.t_padded / 1e12)
        colors.append("tab:blue" if e.group_bounds[0] == "memory" else "tab:red")
    lo = min(xs) / 2 if xs else 1.0
    hi = max(xs + [peak / bw]) * 4
    grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    ax1.plot(grid, [min(peak, x * bw) / 1e12 for x in grid], color="black", lw=1.5, label="roofline")
    ax1.axvline(peak / bw, color="grey", ls=":", lw=1)
    ax1.annotate(
        f"ridge: M* ~ {best.ridge_m:.0f} rows",
        (peak / bw, peak / 1e12 / 8),
        rotation=90,
        ha="right",
        va="center",
        fontsize=8,
        color="grey",
    )
    ax1.scatter(xs, ys, c=colors, s=28, zorder=3, label="expert at its roofline (red: compute-bound)")
    ax1.scatter(
        xs,
        ys_pad,
        facecolors="none",
        edgecolors=colors,
        s=28,
        zorder=3,
        label=(
            f"group with its output padded to {best.block_m} rows (alone)"
            if k_grouped
            else f"expert with {best.block_m}-row padding (alone)"
        ),
    )
    candidates = []
    for rank, e in enumerate(advice.ranked):
        ai = e.useful_flops / e.bytes_min if e.bytes_min else 0
        if ai and e.t_predicted:
            e_gap = e.t_predicted / e.t_roofline - 1 if e.t_roofline else float("nan")
            label = f"whole call, {e.block_m}x{e.block_n}: {e.t_predicted * 1e6:.1f} us ({e_gap:+.1%})"
            candidates.append(label)
            # same intensity for every tile: distinct markers, sizes and a hollow face keep each visible
            ax1.scatter(
                [ai],
                [e.useful_flops / e.t_predicted / 1e12],
                marker=_MARKERS[rank % len(_MARKERS)],
                s=160 - 25 * min(rank, 4),
                facecolors="none" if rank else f"C{rank}",
                edgecolors=f"C{rank}",
                linewidths=1.5,
                zorder=5 + len(advice.ranked) - rank,
                label=label,
            )
    ax1.set_xscale("log")
    ax1.set_yscale("log")
    ax1.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax1.set_ylabel("TFLOP/s (useful)")
    panel1 = f"roofline, {'groups' if k_grouped else 'experts'} placed by their {size_name}"
    ax1.set_title(panel1, fontsize=9)
    ax1.legend(fontsize=7, loc="lower right")
    ax1.grid(True, which="both", alpha=0.25)

    # -- occupancy and predicted time against BM (BN of the recommendation)
    bms = list(range(16, 513, 16))
    if best.op == "k_grouped":
        sweep = [
            perf.estimate(counts, best.n, None, block_m=bm, block_n=best.block_n, m=best.m, **common) for bm in bms
        ]
    else:
        sweep = [perf.estimate(counts, best.n, best.k, block_m=bm, block_n=best.block_n, **common) for bm in bms]
    ax2.plot(bms, [e.occupancy_m for e in sweep], color="tab:green", marker=".", label="aggregate M-occupancy")
    ax2.set_xlabel("BM (tile rows of each group's M x N output)" if k_grouped else "BM (tile rows)")
    ax2.set_ylabel("M-occupancy", color="tab:green")
    ax2.set_ylim(0, 1.05)
    twin = ax2.twinx()
    twin.plot(bms, [e.t_predicted * 1e6 for e in sweep], color="tab:purple", ls="--", label="predicted (us)")
    twin.axhline(best.t_roofline * 1e6, color="black", lw=1, label="plain roofline (us)")
    for rank, e in enumerate(advice.ranked):
        twin.scatter(
            [e.block_m], [e.t_predicted * 1e6], marker=_MARKERS[rank % len(_MARKERS)], color=f"C{rank}", s=60, zorder=4
        )
        twin.annotate(
            f"{e.block_m}x{e.block_n}",
            (e.block_m, e.t_predicted * 1e6),
            textcoords="offset points",
            xytext=(4, 6 + 10 * (rank % 2)),
            fontsize=7,
            color=f"C{rank}",
        )
    twin.set_ylabel("time (us)", color="tab:purple")
    twin.set_ylim(0, max(e.t_predicted for e in sweep) * 1.1 * 1e6)
    panel2 = f"occupancy and predicted time vs BM (BN={best.block_n}; marked: candidate tiles)"
    ax2.set_title(panel2, fontsize=9)
    handles = ax2.get_legend_handles_labels()
    handles2 = twin.get_legend_handles_labels()
    ax2.legend(handles[0] + handles2[0], handles[1] + handles2[1], fontsize=8, loc="lower right")
    ax2.grid(True, alpha=0.25)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return {"title": title, "panels": [panel1, panel2], "candidates": candidates}
