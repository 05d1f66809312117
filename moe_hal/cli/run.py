"""``moe-hal run``: the main job — one realistic MoE grouped GEMM, verified against the reference.

Builds an MoE problem (DeepSeek-V3-like expert shapes scaled to the CPU by default, routing skewed
like the seed's 32-expert histogram), routes tokens with :mod:`moe_hal.routing`, runs the grouped
GEMM on the selected backend, verifies it against the float64 reference, combines the expert
outputs back per token, and prints the selection, the error metrics and the time.
"""

from __future__ import annotations

import argparse
import statistics
import time

from ..errors import ArgumentError
from . import job, types
from .run_ep import EP_TIMEOUT_S, run_ep

# Defaults: DeepSeek-V3's routed-expert up-projection (N = 2 x 2048, K = 7168, 256 experts, top-8)
# scaled down 8x in N and K and to 32 experts so that the float64 verification runs in seconds.
DEFAULTS = dict(experts=32, n=512, k=896, tokens=2048, topk=8, dtype="bf16", dist="seed", alignment=128)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="run a realistic MoE grouped GEMM and verify it against the reference",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--op",
        choices=("contiguous", "masked", "k_grouped"),
        default="contiguous",
        help="grouped-GEMM operation (default: contiguous)",
    )
    p.add_argument("--experts", "-G", type=types.positive_int, default=DEFAULTS["experts"], help="number of experts G")
    p.add_argument("--n", type=types.positive_int, default=DEFAULTS["n"], help="output features N per expert")
    p.add_argument("--k", type=types.positive_int, default=DEFAULTS["k"], help="input features K (hidden size)")
    p.add_argument("--tokens", "-T", type=types.positive_int, default=DEFAULTS["tokens"], help="tokens routed")
    p.add_argument("--topk", type=types.positive_int, default=DEFAULTS["topk"], help="experts per token")
    p.add_argument(
        "--dtype",
        default=DEFAULTS["dtype"],
        choices=("fp32", "bf16", "fp16", "fp8"),
        help="operand dtype; fp8 is block-scaled e4m3 (default: %(default)s)",
    )
    p.add_argument(
        "--dist",
        default=DEFAULTS["dist"],
        help="routing skew: seed (the 32-expert histogram of DeepGEMM #211), uniform, zipf:A",
    )
    p.add_argument(
        "--alignment", type=types.positive_int, default=DEFAULTS["alignment"], help="row alignment per expert"
    )
    p.add_argument("--seed", type=int, default=0, help="random seed")
    p.add_argument("--backend", default=None, help="force a backend (default: automatic selection)")
    p.add_argument("--repeat", type=types.non_negative_int, default=3, help="timed repetitions after the first call")
    p.add_argument(
        "--conformance",
        default="smoke",
        metavar="TIER",
        help="also run this conformance tier on the selected backend and print its verdict "
        "(smoke, full; 'none' to skip; default smoke)",
    )
    p.add_argument("--json", action="store_true", help="print the results as JSON instead of a table")
    p.add_argument(
        "--out", metavar="FILE.json", type=types.output_file, help="also write the results as JSON to this file"
    )
    p.add_argument(
        "--ep",
        type=int,
        default=None,
        metavar="W",
        help="run it expert-parallel on W local gloo processes, verified against one process",
    )
    p.add_argument(
        "--ep-mode",
        choices=("exact", "capacity"),
        default=None,
        help="with --ep: the dispatch mode (default exact; capacity: exactly full, the largest rank/expert count)",
    )
    p.add_argument(
        "--ep-timeout",
        type=float,
        default=None,
        help=f"with --ep: seconds before the W processes are stopped ({EP_TIMEOUT_S:g})",
    )
    p.set_defaults(func=run)


def build(args):
    """The problem: operands, layout and the routing that produced them."""
    import torch

    from .. import routing
    from ..layouts import KGroupedLayout, align
    from ..quant import quantize_fp8

    fp8 = job.is_fp8(args.dtype)
    hidden, weights, topk_ids, topk_weights, g = job.tensors(
        tokens=args.tokens,
        experts=args.experts,
        n=args.n,
        k=args.k,
        topk=args.topk,
        dtype=args.dtype,
        dist=args.dist,
        seed=args.seed,
    )
    if args.op == "k_grouped":
        d = routing.dispatch(hidden, topk_ids, args.experts, alignment=args.alignment)
        grad = torch.randn(d.a.shape[0], args.n, generator=g).to(hidden.dtype)
        layout = KGroupedLayout.from_counts(d.layout.counts_list, alignment=args.alignment)
        a, b = d.a, grad
        if fp8:
            a, b = quantize_fp8(a, block=(128, 1)), quantize_fp8(b, block=(128, 1))
        return dict(a=a, b=b, layout=layout, dispatch=None, topk_weights=topk_weights, rows=sum(d.layout.counts_list))
    if fp8:
        hidden = quantize_fp8(hidden, block=(1, 128))
        weights = quantize_fp8(weights, block=(128, 128))
    if args.op == "contiguous":
        d = routing.dispatch(hidden, topk_ids, args.experts, alignment=args.alignment)
    else:
        max_m = align(int(torch.bincount(topk_ids.flatten(), minlength=args.experts).max()), args.alignment)
        d = routing.dispatch_masked(hidden, topk_ids, args.experts, max_m=max_m)
    return dict(a=d.a, b=weights, layout=d.layout, dispatch=d, topk_weights=topk_weights, rows=args.tokens * args.topk)


def run(args: argparse.Namespace) -> int:
    for option, value in (("--ep-mode", args.ep_mode), ("--ep-timeout", args.ep_timeout)):
        if value is not None and args.ep is None:
            raise ArgumentError(option, "--ep W as well (it applies to the expert-parallel run)", value)
    if args.ep is not None:
        return run_ep(args)
    import torch

    import moe_hal
    from moe_hal import routing, timing
    from moe_hal.conformance.tolerances import calc_diff

    t0 = time.perf_counter()
    prob = build(args)
    a, b, layout = prob["a"], prob["b"], prob["layout"]
    setup_s = time.perf_counter() - t0
    sel = moe_hal.select(a, b, layout, backend=args.backend)

    def call():
        return moe_hal.grouped_gemm(a, b, layout, backend=args.backend)

    t0 = time.perf_counter()
    out = call()
    first_s = time.perf_counter() - t0
    times = timing.wall_seconds(call, "cpu", warmup=0, repeat=args.repeat)
    t0 = time.perf_counter()
    ref = moe_hal.grouped_gemm(a, b, layout, backend="reference", out_dtype=torch.float32)
    ref_s = time.perf_counter() - t0

    if args.op == "masked":
        rows = torch.arange(layout.max_m)[None, :] < layout.masked_m[:, None]
        got, want = out[rows], ref[rows]
    elif args.op == "contiguous":
        rows = layout.m_indices() >= 0
        got, want = out[rows], ref[rows]
        padding_zero = bool((out[~rows] == 0).all())
    else:
        got, want = out, ref
    in_dtype = moe_hal.dtypes.name_of(a.dtype)
    diff, ok = job.verify(got, want, in_dtype)
    err = (got.double() - want.double()).abs()
    if args.op == "contiguous":
        ok = ok and padding_zero
    combined = None
    if prob["dispatch"] is not None:
        combine = routing.combine if args.op == "contiguous" else routing.combine_masked
        y = combine(out, prob["dispatch"], prob["topk_weights"])
        y_ref = combine(ref.to(out.dtype), prob["dispatch"], prob["topk_weights"])
        combined = {"shape": list(y.shape), "calc_diff": calc_diff(y, y_ref)}
    median = statistics.median(times) if times else first_s
    useful_flops = 2.0 * prob["rows"] * args.n * args.k
    result = {
        "op": args.op,
        **job.described(args, in_dtype),
        "out_dtype": moe_hal.dtypes.name_of(out.dtype),
        "counts": job.counts_of(layout),
        "backend": sel.name,
        "mode": sel.mode,
        "explain": sel.explain(),
        "setup_s": setup_s,
        "first_call_s": first_s,
        "median_s": median,
        "reference_s": ref_s,
        "useful_gflops_per_s": useful_flops / median / 1e9,
        "calc_diff": diff,
        "calc_diff_max": job.CALC_DIFF_MAX[in_dtype],
        "max_abs_err": float(err.max()) if err.numel() else 0.0,
        "max_rel_err": float((err / want.double().abs().clamp_min(1e-6)).max()) if err.numel() else 0.0,
        "padding_rows_zero": padding_zero if args.op == "contiguous" else None,
        "combine": combined,
        "verified": ok,
        "conformance": None,
    }
    if args.conformance != "none":
        from .. import conformance

        report = conformance.run(sel.name, tiers=[args.conformance])
        result["conformance"] = {
            "tier": args.conformance,
            "verdict": report["verdict"],
            "summary": conformance.summary(report),
        }
        ok = ok and report["verdict"] in ("conformant", "conformant with waivers")
        result["verified"] = ok
    job.emit(result, args, _print)
    return 0 if ok else 1


def _print(r: dict) -> None:
    from . import render

    console = render.console()
    console.print(
        render.join(
            ("moe-hal run", "bold"),
            f": {r['op']} grouped GEMM, {r['experts']} experts, N={r['n']}, K={r['k']}, "
            f"{r['tokens']} tokens x top-{r['topk']} ({r['dist']} routing), {r['dtype']} -> {r['out_dtype']}",
        )
    )
    counts = r["counts"]
    console.print(
        f"rows per expert: min {min(counts)}, max {max(counts)}, empty {sum(c == 0 for c in counts)}; "
        f"alignment {r['alignment']}"
    )
    console.print(render.text(r["explain"]))
    rows = []
    rows.append(("backend", f"{r['backend']} ({r['mode']})"))
    rows.append(
        (
            "time",
            f"median {r['median_s'] * 1e3:.2f} ms, first call {r['first_call_s'] * 1e3:.2f} ms, "
            f"{r['useful_gflops_per_s']:.1f} useful GFLOP/s",
        )
    )
    rows.append(("reference", f"float64 oracle in {r['reference_s']:.2f} s"))
    rows.append(("calc_diff", f"{r['calc_diff']:.3e} (bound {r['calc_diff_max']:.0e})"))
    rows.append(("max error", f"abs {r['max_abs_err']:.3e}, rel {r['max_rel_err']:.3e}"))
    if r["padding_rows_zero"] is not None:
        rows.append(("padding rows", "zero" if r["padding_rows_zero"] else render.text("NOT zero", "red")))
    if r["combine"]:
        rows.append(("combine", f"y {tuple(r['combine']['shape'])}, calc_diff {r['combine']['calc_diff']:.3e}"))
    if r["conformance"]:
        rows.append((f"conformance ({r['conformance']['tier']})", r["conformance"]["summary"]))
    rows.append(("verdict", job.verdict(r["verified"], "the reference")))
    t = render.table(None, ("what", "result"), rows, key=("what",), right=("what",))
    t.show_header = False
    console.print(t)
