"""``moe-hal model validate`` and ``moe-hal model calibrate``: the performance model against the
published measurements of ``bench/published/cases.yaml``.

``validate`` fits the achieved efficiency on every source but one and predicts that one
(leave-one-source-out), for every source, then prints each case's error, the median and worst
error of the model and of the plain roofline, split by the bound the model predicts, and
whether the out-of-sample target holds. With ``--hold-out architecture`` it holds out every case
of one GPU architecture at a time instead: how a device of an architecture no source measured is
predicted (the target is stated for sources, so no verdict is given). ``calibrate`` fits on
every case and writes the fit as hardware-DB overlays (``hwdb/measured/<id>.published-fit.yaml``),
which predictions then use.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..perf.calibration import FoldProgress

#: Out-of-sample target of the model on the published set (issue 14): median and worst |error|.
TARGET_MEDIAN = 0.12
TARGET_WORST = 0.30

#: Target median |error| on this project's own GPU runs (issue 14: the gpu_check timings).
TARGET_OWN_MEDIAN = 0.10

#: What the out-of-sample evaluation holds out of the fit for each prediction (``--hold-out``).
HOLD_OUT = ("source", "architecture")

#: The published cases split by whether another source (published or own) timed the same kernel
#: implementation: out of sample, only those can be predicted with that kernel's own figures.
IMPL_ELSEWHERE = "implementation timed by another source too"
IMPL_ONLY_HERE = "implementation timed by this source only"

#: The ``by_layout`` row of the three grouped layouts together; the report's other rows are each
#: grouped kernel family (``moe_hal.perf.efficiency.FAMILY_OF_OP``) and the plain GEMMs (``dense``)
#: the set holds as evidence of the kernels' rates.
GROUPED = "grouped (contiguous, masked, K-grouped)"

_CASES_HELP = (
    "one cases file in the published set's schema (default: bench/published/cases.yaml and "
    "bench/own_measurements/*.yaml of the checkout)"
)
MARKDOWN_HELP = (
    "print the summary, split, layout and per-source tables as docs/perf-model.md holds them, "
    "instead of the text report"
)
JOBS_HELP = "processes the held-out fits run in (default: every CPU; the report is the same for any number)"
NO_PROGRESS_HELP = "no progress bar while the held-out fits run"


def register(model_parser: argparse.ArgumentParser) -> None:
    actions = model_parser.add_subparsers(dest="model_action", metavar="ACTION")
    v = actions.add_parser(
        "validate",
        help="leave-one-source-out error on the published measurements",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    v.add_argument("--cases", help=_CASES_HELP)
    held = v.add_mutually_exclusive_group()
    held.add_argument("--in-sample", action="store_true", help="fit on every case instead (optimistic; for comparison)")
    held.add_argument(
        "--hold-out",
        choices=HOLD_OUT,
        default="source",
        help="what each prediction is held out from the fit by: its source (default) or its whole GPU architecture",
    )
    v.add_argument("--out", metavar="FILE.json", help="write the report as JSON")
    v.add_argument("--plot", metavar="FILE.png", help="predicted vs measured, model and plain roofline")
    shown = v.add_mutually_exclusive_group()
    shown.add_argument("--json", action="store_true", help="print JSON instead of tables")
    shown.add_argument("--markdown", action="store_true", help=MARKDOWN_HELP)
    v.add_argument("--jobs", type=int, default=None, help=JOBS_HELP)
    v.add_argument("--no-progress", action="store_true", help=NO_PROGRESS_HELP)
    v.set_defaults(func=validate)
    c = actions.add_parser(
        "calibrate",
        help="fit achieved efficiency on the published set and store it in the DB",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    c.add_argument("--cases", help=_CASES_HELP)
    c.add_argument(
        "--out-dir", default=None, help="where to write the overlays (default hwdb/measured of the checkout)"
    )
    c.set_defaults(func=calibrate)


def report(
    in_sample: bool = False,
    cases_path: str | None = None,
    hold_out: str = "source",
    jobs: int | None = None,
    progress: FoldProgress | None = None,
) -> dict[str, Any]:
    """The validation report: per case, summary, target verdict (``hold_out``: one of
    :data:`HOLD_OUT`; ignored with ``in_sample``). ``jobs``: processes the held-out fits run in
    (default: every CPU, as ``os.cpu_count()`` counts them; the report is the same for any number).
    ``progress``: told of each held-out fold as it ends (:func:`fold_progress` makes one)."""
    from .. import hwdb
    from ..errors import ArgumentError
    from ..perf import calibration

    if hold_out not in HOLD_OUT:
        raise ArgumentError("hold_out", f"one of {HOLD_OUT}", hold_out)
    cases = calibration.load_cases(cases_path)
    if in_sample:
        outcomes, evaluation = calibration.in_sample(cases), "in-sample (fit on every case)"
    elif hold_out == "architecture":
        outcomes = calibration.leave_one_architecture_out(cases, _jobs(jobs), progress)
        evaluation = "leave-one-architecture-out"
    else:
        outcomes, evaluation = calibration.leave_one_source_out(cases, _jobs(jobs), progress), "leave-one-source-out"
    # the targets are stated for the published set with each source held out (or in sample)
    judged = hold_out == "source" or in_sample
    published = [o for o in outcomes if o.case.origin == "published"]
    own = [o for o in outcomes if o.case.origin == "own"]
    summary = calibration.summarize(published)
    architecture = {c.device: hwdb.get(c.device).architecture for c in cases}
    overall = summary["all"]
    own_summary = calibration.summarize(own)

    def measured_elsewhere(o) -> bool:
        # Out of sample, a kernel no other source timed can only borrow other kernels' figures.
        return any(c.impl == o.case.impl and c.source != o.case.source for c in cases)

    def in_layout(o, layout: str) -> bool:
        return o.case.family != "dense" if layout == GROUPED else o.case.family == layout

    # the cases disagree with each other: no model of the call, device and cache state can be
    # nearer than this at its worst, whatever it is fitted to
    floor = calibration.least_worst_error(calibration.same_call_spread([c for c in cases if c.origin == "published"]))
    return {
        "evaluation": evaluation,
        "cases": len(published),
        "sources": len({o.case.source for o in published}),
        "devices": sorted({o.case.device for o in published}),
        "target": {  # None: no published case in the cases given
            "median": TARGET_MEDIAN,
            "worst": TARGET_WORST,
            "median_met": overall["model_median"] <= TARGET_MEDIAN if published and judged else None,
            "worst_met": overall["model_worst"] <= TARGET_WORST if published and judged else None,
            "least_worst_error": floor,
        },
        "summary": summary,
        "own": {
            "what": "this project's own GPU runs (bench/own_measurements/), fitted and evaluated with the published set",
            "cases": len(own),
            "sources": sorted({o.case.source for o in own}),
            "summary": own_summary,
            "by_impl": {
                impl: calibration.summarize(o for o in own if o.case.impl == impl)["all"]
                for impl in sorted({o.case.impl for o in own})
            },
            "target": {
                "median": TARGET_OWN_MEDIAN,
                "median_met": (bool(own) and own_summary["all"]["model_median"] <= TARGET_OWN_MEDIAN)
                if judged
                else None,
            },
        },
        "by_source": {
            source: calibration.summarize(o for o in outcomes if o.case.source == source)["all"]
            for source in sorted({c.source for c in cases})
        },
        "by_implementation_coverage": {  # of the published set, as the summary
            IMPL_ELSEWHERE: _with_misses([o for o in published if measured_elsewhere(o)]),
            IMPL_ONLY_HERE: _with_misses([o for o in published if not measured_elsewhere(o)]),
        },
        "by_layout": {
            layout: _with_misses([o for o in published if in_layout(o, layout)])
            for layout in (GROUPED, *calibration.FAMILY_OF_OP.values(), "dense")
        },
        "by_architecture": {  # of the published set, as the summary
            arch: calibration.summarize(o for o in published if architecture[o.case.device] == arch)["all"]
            for arch in sorted({architecture[o.case.device] for o in published})
        },
        "per_case": [o.as_dict() for o in outcomes],
        "same_call_spread": calibration.same_call_spread(cases),
    }


def _jobs(jobs: int | None) -> int:
    return (os.cpu_count() or 1) if jobs is None else jobs


@contextlib.contextmanager
def fold_progress(enabled: bool = True) -> Iterator[FoldProgress | None]:
    """A progress bar on stderr for :func:`report`'s held-out fits (minutes on a laptop's CPUs):
    one step per fold, naming the group it held out. None where stderr is not a terminal, or
    ``enabled`` is false."""
    from . import render

    err = render.console(stderr=True)
    if not enabled or not err.is_terminal:
        yield None
        return
    with render.progress_bar(err) as bar:
        task = bar.add_task("fitting the held-out folds", total=None)

        def step(held_out: str, done: int, total: int) -> None:
            bar.update(task, completed=done, total=total, description=f"held out: {held_out}")

        yield step


def validate(args: argparse.Namespace) -> int:
    with fold_progress(not args.no_progress and not args.in_sample) as progress:
        data = report(args.in_sample, args.cases, args.hold_out, args.jobs, progress)
    if args.out:
        Path(args.out).write_text(json.dumps(data, indent=2) + "\n")
    if args.plot:
        try:
            plot(data, args.plot)
        except ImportError:
            print("moe-hal model validate: --plot needs matplotlib: pip install 'moe-hal[plot]'", file=sys.stderr)
            return 2
    if args.json:
        print(json.dumps(data, indent=2))
    elif args.markdown:
        print(markdown(data, published_sources(args.cases)))
    else:
        print_report(data)
    return 0


def calibrate(args: argparse.Namespace) -> int:
    import moe_hal

    from ..perf import calibration

    cases = calibration.load_cases(args.cases)
    table = calibration.fit(cases)
    out_dir = Path(args.out_dir) if args.out_dir else calibration.PUBLISHED.parents[2] / "hwdb" / "measured"
    written = calibration.write_overlays(
        table,
        out_dir,
        suffix=".published-fit",
        method=f"moe_hal.perf.calibration.fit over {len(cases)} measured cases ({_files_of(cases)})",
        tool=f"moe-hal {moe_hal.__version__} (moe-hal model calibrate)",
    )
    for path in written:
        print(f"wrote {path}")
    return 0


def _files_of(cases: list) -> str:
    """Where ``cases`` came from, as the overlays record it."""
    own = sum(c.origin == "own" for c in cases)
    published = "bench/published/cases.yaml"
    return f"{published} and {own} of bench/own_measurements/" if own else published


def _with_misses(outcomes: list) -> dict[str, Any]:
    """The summary of ``outcomes``, with how many miss the worst-case target."""
    from ..perf import calibration

    s = calibration.summarize(outcomes)["all"]
    return {**s, "cases_above_worst_target": sum(abs(o.error) > TARGET_WORST for o in outcomes)}


def _errors(s: dict[str, Any]) -> str:
    """A summary's case count and the model's median and worst error, as every report line says them."""
    return f"{s['cases']:3} cases: model median {s['model_median']:.1%}, worst {s['model_worst']:.1%}"


def print_report(data: dict[str, Any]) -> None:
    own = data["own"]
    print(
        f"{data['evaluation']}: {data['cases']} published cases, {data['sources']} sources, "
        f"devices {', '.join(data['devices'])}; {own['cases']} cases of this project's own runs"
    )
    print(f"{'case':46} {'meas us':>9} {'model us':>9} {'err':>7} {'roofline':>9} {'err':>7}  bound    tile")
    for row in data["per_case"]:
        print(
            f"{row['id'][:46]:46} {row['measured_us']:9.1f} {row['predicted_us']:9.1f} {row['error']:+7.1%} "
            f"{row['roofline_us']:9.1f} {row['roofline_error']:+7.1%}  {row['bound']:8} {row['tile'][0]}x{row['tile'][1]}"
            + (f" split-K {row['split_k']}" if row["split_k"] > 1 else "")
        )
    print()
    print("published set:")
    for name, s in data["summary"].items():
        if not s["cases"]:
            continue
        print(
            f"{name:14} {_errors(s)}; plain roofline median {s['roofline_median']:.1%}, worst {s['roofline_worst']:.1%}"
        )
    print(f"per source ({data['evaluation']}):")
    for source, s in data["by_source"].items():
        print(f"  {source:30} {_errors(s)}; roofline median {s['roofline_median']:.1%}")
    if data["cases"]:
        print("per kernel implementation's coverage (published set):")
    for group, s in data["by_implementation_coverage"].items():
        if not s["cases"]:
            continue
        print(f"  {group:46} {_errors(s)}; {s['cases_above_worst_target']} above {TARGET_WORST:.0%}")
    print("per layout (published set):")
    for layout, s in data["by_layout"].items():
        if s["cases"]:
            print(f"  {layout:46} {_errors(s)}; {s['cases_above_worst_target']} above {TARGET_WORST:.0%}")
    print("per architecture (published set):")
    for arch, s in data["by_architecture"].items():
        print(f"  {arch:30} {_errors(s)}")
    spread = data["same_call_spread"]
    if spread:
        print(
            f"the same call timed by several sources on the same silicon figures ({len(spread)} calls; "
            "slowest / fastest):"
        )
        for row in spread[:8]:
            times = ", ".join(f"{who} {t:.1f} us" for who, t in row["times_us"].items())
            print(f"  {row['ratio']:.2f}x  {row['call']} (operands in {'/'.join(row['operands'])}): {times}")
    t = data["target"]
    if data["cases"] and t["median_met"] is not None:
        print(
            f"target on the published set ({data['evaluation']}): median <= {t['median']:.0%}: "
            f"{'met' if t['median_met'] else 'NOT met'}; worst <= {t['worst']:.0%}: "
            f"{'met' if t['worst_met'] else 'NOT met'}"
        )
        floor = t["least_worst_error"]
        if floor and floor["error"] > t["worst"]:
            print(
                f"  no model of the call, device and cache state can be within {floor['error']:.1%} of every "
                f"case of this set: the sources time {floor['call']} that far apart in one cache state"
            )
    if own["cases"]:
        s = own["summary"]["all"]
        print(
            f"this project's own runs ({', '.join(own['sources'])}), {own['cases']} cases: model median "
            f"{s['model_median']:.1%}, worst {s['model_worst']:.1%}; plain roofline median {s['roofline_median']:.1%}"
        )
        for impl, s in own["by_impl"].items():
            print(f"  {impl:30} {_errors(s)}")
        if own["target"]["median_met"] is not None:
            print(
                f"target on them ({data['evaluation']}): median <= {own['target']['median']:.0%}: "
                f"{'met' if own['target']['median_met'] else 'NOT met'}"
            )


def published_sources(cases_path: str | None = None) -> dict[str, Any]:
    """The ``sources`` records of the cases file (default: the published set), which say each
    source's cache state."""
    import yaml

    from ..perf import calibration

    path = Path(cases_path) if cases_path else calibration.PUBLISHED
    return yaml.safe_load(path.read_text())["sources"]


def markdown(data: dict[str, Any], sources: dict[str, Any]) -> str:
    """The tables of docs/perf-model.md's "Results" from a report of :func:`report`: the summary
    (model and plain roofline, by bound), the split by architecture and by implementation
    coverage, the split by layout, and one row per published source. ``sources``: the cases
    file's ``sources`` records (each source's ``cache_state``). A device is named by its first
    hardware-DB alias."""
    from .. import hwdb

    def pct(x: float) -> str:
        return f"{100 * x:.1f}%"

    def label(device: str) -> str:
        entry = hwdb.get(device)
        return entry.aliases[0].upper() if entry.aliases else device

    rows = [r for r in data["per_case"] if r["origin"] == "published"]
    summary = data["summary"]
    lines = [
        "| cases | model median | model worst | plain roofline median | plain roofline worst |",
        "|---|---|---|---|---|",
    ]
    for name, s in summary.items():
        if not s["cases"]:
            continue
        first = f"all {s['cases']}" if name == "all" else f"{name.replace('_', '-')} ({s['cases']})"
        bold = "**" if name == "all" else ""
        lines.append(
            f"| {first} | {bold}{pct(s['model_median'])}{bold} | {bold}{pct(s['model_worst'])}{bold} "
            f"| {pct(s['roofline_median'])} | {pct(s['roofline_worst'])} |"
        )
    lines += ["", "| cases | model median | model worst |", "|---|---|---|"]
    for arch, s in data["by_architecture"].items():
        devices = ", ".join(
            dict.fromkeys(label(r["device"]) for r in rows if hwdb.get(r["device"]).architecture == arch)
        )
        name = arch.replace("_", " ").title()
        lines.append(f"| {name} ({devices}): {s['cases']} | {pct(s['model_median'])} | {pct(s['model_worst'])} |")
    for group, s in data["by_implementation_coverage"].items():
        if s["cases"]:
            lines.append(f"| {group}: {s['cases']} | {pct(s['model_median'])} | {pct(s['model_worst'])} |")
    names = {"grouped_contiguous": "contiguous", "grouped_masked": "masked", "k_grouped": "K-grouped"}
    lines += [
        "",
        f"| layout | cases | model median | model worst | above {TARGET_WORST:.0%} |",
        "|---|---|---|---|---|",
    ]
    for layout, s in data["by_layout"].items():
        if s["cases"]:
            lines.append(
                f"| {names.get(layout, layout)} | {s['cases']} | {pct(s['model_median'])} "
                f"| {pct(s['model_worst'])} | {s['cases_above_worst_target']} |"
            )
    lines += [
        "",
        "| source | device | cache | kernel: dtypes, layouts | cases | median | worst |",
        "|---|---|---|---|---|---|---|",
    ]
    for source in sorted({r["source"] for r in rows}):
        mine = [r for r in rows if r["source"] == source]
        kernels = []
        for impl in dict.fromkeys(r["impl"] for r in mine):
            calls = [r for r in mine if r["impl"] == impl]
            dtypes = "/".join(sorted({r["dtype"] for r in calls}))
            layouts = "/".join(sorted({"dense" if r["family"] == "dense" else r["op"] for r in calls}))
            kernels.append(f"`{impl}`: {dtypes}, {layouts}")
        devices = ", ".join(dict.fromkeys(label(r["device"]) for r in mine))
        cache = {"l2_warm": "warm"}.get(sources[source]["cache_state"], sources[source]["cache_state"])
        s = data["by_source"][source]
        lines.append(
            f"| `{source}` | {devices} | {cache} | {'; '.join(kernels)} | {s['cases']} "
            f"| {pct(s['model_median'])} | {pct(s['model_worst'])} |"
        )
    return "\n".join(lines)


def plot(data: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = data["per_case"]
    fig, ax = plt.subplots(figsize=(6.5, 6))
    devices = sorted({r["device"] for r in rows})
    # one marker per device; past the list they repeat (the legend still names each device)
    markers = dict(zip(devices, itertools.cycle("osD^v<>pPhX*d")))
    # this project's own runs in their own colours: they are not part of the published target
    colours = {"published": ("tab:blue", "tab:red", ""), "own": ("tab:green", "tab:orange", " (our runs)")}
    for device in devices:
        for origin, (model_colour, roofline_colour, note) in colours.items():
            mine = [r for r in rows if r["device"] == device and r["origin"] == origin]
            if not mine:
                continue
            ax.scatter(
                [r["measured_us"] for r in mine],
                [r["predicted_us"] for r in mine],
                marker=markers[device],
                color=model_colour,
                alpha=0.8,
                label=f"model, {device}{note}",
            )
            ax.scatter(
                [r["measured_us"] for r in mine],
                [r["roofline_us"] for r in mine],
                marker=markers[device],
                facecolors="none",
                edgecolors=roofline_colour,
                alpha=0.8,
                label=f"plain roofline, {device}{note}",
            )
    lo = min(min(r["measured_us"], r["predicted_us"], r["roofline_us"]) for r in rows) / 1.5
    hi = max(max(r["measured_us"], r["predicted_us"], r["roofline_us"]) for r in rows) * 1.5
    ax.plot([lo, hi], [lo, hi], color="black", lw=1)
    for i, f in enumerate((1 + TARGET_WORST, 1 / (1 + TARGET_WORST))):
        ax.plot(
            [lo, hi],
            [lo * f, hi * f],
            color="grey",
            lw=0.8,
            ls=":",
            label=f"+-{TARGET_WORST:.0%} (worst-case target)" if i == 0 else None,
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured time (us): published, and this project's runs")
    ax.set_ylabel("predicted time (us)")
    s = data["summary"]["all"]
    title = f"{data['evaluation']}, {data['cases']} published cases"
    if data["cases"]:
        title += (
            f"\nmodel median {s['model_median']:.0%} / worst {s['model_worst']:.0%}; "
            f"roofline {s['roofline_median']:.0%} / {s['roofline_worst']:.0%}"
        )
    if data["own"]["cases"]:
        o = data["own"]["summary"]["all"]
        title += (
            f"\n{data['own']['cases']} cases of our runs: model {o['model_median']:.0%} / {o['model_worst']:.0%}; "
            f"roofline {o['roofline_median']:.0%} / {o['roofline_worst']:.0%}"
        )
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=6, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
