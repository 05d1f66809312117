"""``moe-hal conformance``: run the conformance suite, compare and verify reports, regenerate data.

moe-hal conformance run [--backend NAME|all] [--tier smoke|full|sweep|fuzz] [--report out.json] [--junit out.xml]
moe-hal conformance compare A.json B.json [--json] [--drift 2]
moe-hal conformance verify report.json
moe-hal conformance list [--tier T] [--json]
moe-hal conformance regen [--check]
"""

from __future__ import annotations

import argparse
import json
import sys

from . import render, types


def _case_option(parser: argparse.ArgumentParser) -> None:
    """The ``--case PATTERN`` filter that run, list and regen share."""
    parser.add_argument(
        "--case",
        action="append",
        default=[],
        metavar="PATTERN",
        help="only cases whose id matches this shell pattern; repeatable (default: all)",
    )


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "conformance",
        help="run the conformance suite, compare reports, regenerate data",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="conformance_command", metavar="SUBCOMMAND")
    parser.set_defaults(func=lambda args: (parser.print_help(), 2)[1])

    run = sub.add_parser(
        "run",
        help="run the suite on one backend or all of them",
        description="Run the conformance tiers on a backend (or every registered one): each "
        "case through the backend directly and through the dispatcher, compared "
        "with the stored golden data. Prints a summary with the verdict per "
        "backend, lists waived cases (and those that now pass), writes JSON and "
        "JUnit reports on request. Exit status 1 when a backend is non-conformant.",
    )
    run.add_argument("--backend", default="all", help="backend name, comma list, or 'all' (default: all)")
    run.add_argument(
        "--tier",
        action="append",
        default=None,
        help="smoke, full (default; includes smoke), sweep, fuzz; repeat or comma-separate",
    )
    run.add_argument("--report", metavar="PATH", type=types.output_file, help="write the JSON report here")
    run.add_argument("--junit", metavar="PATH", type=types.output_file, help="write JUnit XML here")
    run.add_argument(
        "--manifest",
        action="append",
        default=[],
        metavar="YAML",
        help="an expected-failure manifest (adds to those the plugins ship); repeatable",
    )
    run.add_argument(
        "--no-plugin-manifests", action="store_true", help="ignore the expected-failure manifests plugins ship"
    )
    run.add_argument(
        "--strict",
        action="store_true",
        help="an unexpected pass or a stale expected-failure entry makes the run non-conformant",
    )
    run.add_argument(
        "--device", type=types.device, help="torch device to test on (default: the backend's own, else the CPU)"
    )
    _case_option(run)
    run.add_argument("--sweep-seed", type=int, help="seed of the sweep tier (default: the manifest's)")
    run.add_argument("--sweep-count", type=int, help="number of sweep cases (default: the manifest's)")
    run.add_argument("--fuzz-examples", type=int, help="hypothesis examples per backend in the fuzz tier")
    run.add_argument("--json", action="store_true", help="print the report as JSON instead of a summary")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    run.set_defaults(func=_run)

    cmp = sub.add_parser(
        "compare",
        help="case-by-case differences between two reports",
        description="Compare two conformance reports case by case (and path by path): "
        "status changes, metrics that drifted, differences in the environment. "
        "Exit status 1 when B regresses against A.",
    )
    cmp.add_argument("a", metavar="A.json", help="the baseline report")
    cmp.add_argument("b", metavar="B.json", help="the report compared with it")
    cmp.add_argument(
        "--drift", type=float, default=2.0, help="report a metric that changed by more than this factor (default 2)"
    )
    cmp.add_argument("--backend-a", help="run of the first report to compare (default: pair by backend name)")
    cmp.add_argument("--backend-b", help="run of the second report to compare")
    cmp.add_argument("--json", action="store_true", help="print the comparison as JSON")
    cmp.set_defaults(func=_compare)

    ver = sub.add_parser(
        "verify",
        help="check a report's internal consistency",
        description="Check that a report is consistent: its counts, verdicts and waivers "
        "agree with its cases. Exit status 1 when it is not.",
    )
    ver.add_argument("report", metavar="REPORT.json", help="the report to check")
    ver.add_argument(
        "--against-installed",
        action="store_true",
        help="also require the installed suite's version, data and must-pass list",
    )
    ver.set_defaults(func=_verify)

    lst = sub.add_parser(
        "list",
        help="list the cases",
        description="List the cases of the installed suite with their tier, signature, problem and tags.",
    )
    lst.add_argument("--tier", action="append", default=None, help="tiers to list (default: full)")
    _case_option(lst)
    lst.add_argument("--json", action="store_true", help="print the cases as JSON")
    lst.set_defaults(func=_list)

    reg = sub.add_parser(
        "regen",
        help="regenerate the stored golden data (in a checkout) or check it",
        description="Regenerate the golden tensors of the suite from their recorded seeds "
        "with the float64 oracle, or (--check) verify that the stored files "
        "still match their manifest hashes.",
    )
    reg.add_argument(
        "--check",
        action="store_true",
        help="regenerate in memory and fail if any file differs from its manifest sha256",
    )
    reg.add_argument("--manifest-dir", help="directory holding manifest.yaml (default: the installed suite)")
    _case_option(reg)
    reg.add_argument(
        "--no-cross-check", action="store_true", help="skip comparing each golden with the reference backend"
    )
    reg.set_defaults(func=_regen)


# -- run -------------------------------------------------------------------------------------------------


class _RichProgress:
    """A rich progress bar on stderr for :func:`moe_hal.conformance.session.execute`."""

    def __init__(self, console) -> None:
        self.bar = render.progress_bar(console)
        self.task = None
        self.failed = 0

    def start(self, total: int) -> None:
        self.bar.start()
        self.task = self.bar.add_task("conformance", total=total)

    def step(self, backend: str, result) -> None:
        if result.status in ("fail", "error"):
            self.failed += 1
        self.bar.update(
            self.task,
            advance=1,
            description=f"{backend}: {result.id} [{result.path}]"
            + (f"  ({self.failed} failing)" if self.failed else ""),
        )

    def stop(self) -> None:
        self.bar.stop()


def _run(args) -> int:
    from ..conformance import report as report_mod
    from ..conformance import session
    from ..errors import ConformanceError, MoeHalError

    err = render.console(stderr=True)
    try:
        plan = session.plan(
            args.backend,
            args.tier or ["full"],
            device=args.device,
            manifests=args.manifest,
            strict=args.strict,
            cases=args.case,
            sweep_seed=args.sweep_seed,
            sweep_count=args.sweep_count,
            fuzz_examples=args.fuzz_examples,
            use_plugin_manifests=not args.no_plugin_manifests,
        )
    except (ConformanceError, MoeHalError) as exc:
        err.print(render.join(("error:", "red"), f" {exc}"))
        return 2
    progress = None if args.no_progress or not err.is_terminal else _RichProgress(err)
    try:
        report = session.execute(plan, progress)
    finally:
        if progress:
            progress.stop()
    if args.report:
        report_mod.write_json(report, args.report)
    if args.junit:
        report_mod.write_junit(report, args.junit)
    if args.json:
        json.dump(report, sys.stdout, indent=1, default=str)
        sys.stdout.write("\n")
    else:
        _print_summary(report)
        if args.report:
            print(f"report: {args.report}")
        if args.junit:
            print(f"junit: {args.junit}")
    return _exit_status(report, explicit=args.backend.strip() != "all")


def _print_summary(report: dict) -> None:
    console = render.console()
    numbers = ("pass", "fail", "error", "n/a", "xfail", "xpass", "time")
    rows, styles = [], []
    for run in report["runs"]:
        b, c = run["backend"], run["summary"]["counts"]
        styles.append(
            {"conformant": "green", "conformant with waivers": "yellow", "non-conformant": "red"}.get(
                run["summary"]["verdict"], "dim"
            )
        )
        rows.append(
            (
                b["name"],
                b.get("mode") or "-",
                run["device"]["label"],
                c["pass"],
                c["fail"],
                c["error"],
                c["not_applicable"],
                c["xfail"],
                c["xpass"],
                f"{run['summary']['duration_s']:.1f}s",
                run["summary"]["verdict"],
            )
        )
    console.print(
        render.table(
            f"moe_hal conformance, suite {report['suite']['version']} ({', '.join(report['suite']['tiers'])})",
            ("backend", "mode", "device", *numbers, "verdict"),
            rows,
            key=("backend", *numbers, "verdict"),
            right=numbers,
            row_styles=styles,
        )
    )
    shown = 0
    for run in report["runs"]:
        if not run["available"]:
            reasons = "; ".join(f"[{r['code']}] {r['message']}" for r in run["unavailable_reasons"])
            console.print(render.text(f"{run['backend']['name']}: unavailable: {reasons}", "dim"))
            continue
        waived = [case for case in run["cases"] if case["status"] in ("xfail", "xpass")]
        if waived:
            console.print(render.text(f"{run['backend']['name']}: waived cases:"))
            for case in waived:
                note = "now passes: remove its waiver" if case["status"] == "xpass" else "fails as expected"
                console.print(render.text(f"  {case['id']} [{case['path']}]: {note}", "yellow"))
        for case in run["cases"]:
            if case["status"] in ("fail", "error") and shown < 20:
                console.print(
                    render.join(
                        (case["status"].upper(), "red"), f" {run['backend']['name']}: {case.get('message', '')}"
                    )
                )
                shown += 1
    console.print(render.join("verdict: ", (report["verdict"], "bold")))
    if "fuzz" in report["suite"]["tiers"]:
        console.print("(fuzz results are reported but never part of the verdict)")


def _exit_status(report: dict, explicit: bool) -> int:
    runs = report["runs"]
    if any(r["summary"]["verdict"] == "non-conformant" for r in runs):
        return 1
    if explicit and any(not r["available"] for r in runs):
        return 1
    return 1 if report["verdict"] == "unavailable" else 0


# -- compare / verify / list / regen ------------------------------------------------------------------------


def _compare(args) -> int:
    from rich.console import Console

    from ..conformance import compare as compare_mod
    from ..conformance import report as report_mod
    from ..errors import ConformanceError

    try:
        a, b = report_mod.load_json(args.a), report_mod.load_json(args.b)
        comparisons = compare_mod.compare(a, b, args.drift, args.backend_a, args.backend_b)
    except ConformanceError as exc:
        render.console(stderr=True).print(render.join(("error:", "red"), f" {exc}"))
        return 2
    if args.json:
        json.dump([c.as_dict() for c in comparisons], sys.stdout, indent=1, default=str)
        sys.stdout.write("\n")
    else:
        compare_mod.render(comparisons, Console(), args.a, args.b)
    return 1 if any(c.regressions for c in comparisons) else 0


def _verify(args) -> int:
    from ..conformance import report as report_mod
    from ..conformance import suite as suite_mod
    from ..errors import ConformanceError

    try:
        data = report_mod.load_json(args.report)
    except ConformanceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    problems = report_mod.verify(data, suite_mod.load() if args.against_installed else None)
    for p in problems:
        print(f"problem: {p}")
    print(
        f"{args.report}: {'consistent' if not problems else f'{len(problems)} problem(s)'}; verdict {data['verdict']}"
    )
    return 1 if problems else 0


def _list(args) -> int:
    from ..conformance import session
    from ..conformance import suite as suite_mod

    suite = suite_mod.load()
    tiers = session.check_tiers(args.tier or ["full"])
    cases = session.select_cases(suite, tiers, args.case)
    if args.json:
        json.dump(
            {"suite_version": suite.version, "data_version": suite.data_version, "cases": [c.as_dict() for c in cases]},
            sys.stdout,
            indent=1,
        )
        sys.stdout.write("\n")
        return 0
    rows = [
        (
            c.id,
            c.tier,
            ", ".join(f"{k}={v}" for k, v in c.signature.items()),
            ", ".join(f"{k}={v}" for k, v in c.problem.items() if k not in ("counts", "masked_m")),
            " ".join(c.tags),
        )
        for c in cases
    ]
    render.console().print(
        render.table(
            f"suite {suite.version}: {len(cases)} case(s)",
            ("id", "tier", "signature", "problem", "tags"),
            rows,
            key=("id",),
        )
    )
    return 0


def _regen(args) -> int:
    from pathlib import Path

    from ..conformance import regen
    from ..conformance import suite as suite_mod
    from ..errors import ConformanceError

    try:
        if args.check:
            suite = suite_mod.load(args.manifest_dir)
            drifts = regen.check(suite, args.case, cross_check=not args.no_cross_check)
            for d in drifts:
                print(f"drift: {d}")
            print(
                f"{len(suite.select(['full'])) if not args.case else 'selected'} case(s) checked; "
                f"{len(drifts)} differ from the manifest"
            )
            return 1 if drifts else 0
        root = Path(args.manifest_dir) if args.manifest_dir else Path(str(suite_mod.default_root()))
        if not (root / suite_mod.MANIFEST).is_file():
            print(f"error: no {suite_mod.MANIFEST} in {root}", file=sys.stderr)
            return 2
        if not args.manifest_dir and not (root.parent / "pyproject.toml").is_file():
            print(
                f"error: {root} is an installed suite, not a checkout; regenerate in a checkout or pass "
                "--manifest-dir (use --check to verify an installed suite)",
                file=sys.stderr,
            )
            return 2
        done = regen.regenerate(
            root,
            args.case,
            cross_check=not args.no_cross_check,
            progress=lambda c: print(f"regenerating {c.id}", file=sys.stderr),
        )
        total = sum(len(r.blob) for r in done)
        print(f"wrote {len(done)} data file(s), {total / 2**20:.2f} MiB, under {root}; sha256 lines updated")
        return 0
    except ConformanceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
