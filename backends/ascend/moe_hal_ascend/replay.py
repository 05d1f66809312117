"""Recorded-call replay: what the Ascend backends would send to ``npu_grouped_matmul``, audited offline.

``run`` executes conformance tiers on the CPU emulator posing as each named SoC and records every
``npu_grouped_matmul`` call (shapes, strides, dtypes, storage formats and scalar arguments; never
values) into one JSON file; ``check`` replays a recorded file against the rule table
(:mod:`moe_hal_ascend.cann_rules`) without executing anything, so a reviewer without an NPU can
audit exactly what would reach CANN::

    python -m moe_hal_ascend.replay run --soc Ascend910B1 --soc Ascend950PR_9579 --tier smoke \\
        --out ascend-calls.json
    python -m moe_hal_ascend.replay check ascend-calls.json

Both exit non-zero when a conformance case fails, a recorded call breaks a rule, or a SoC's run
made no call at all. Everything here runs on the emulator; nothing here has run on an NPU.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import warnings
from collections.abc import Iterable

from . import cann_rules, emulation, emulator, soc

#: The SoCs the project's CI poses as (one name per family member the issue tracker asked for).
CI_SOCS = ("Ascend910B1", "Ascend910B2C", "Ascend910B4-1", "Ascend910_9391", "Ascend950PR_9579", "Ascend950DT_9571")


def backends_for(soc_name: str) -> tuple[str, ...]:
    """The Ascend backends eligible on ``soc_name`` (by its hardware-DB features)."""
    return ("ascend_950", "ascend") if soc.profile(soc_name).native_fp8 else ("ascend",)


def run(socs: Iterable[str], tiers: Iterable[str]) -> dict:
    """Run ``tiers`` on every backend eligible on each SoC (emulated); returns the report with
    every recorded call and every case that did not pass."""
    from moe_hal.conformance import runner, session, suite
    from moe_hal.plugin_api import clear_cache

    tiers = list(tiers)
    cases = suite.load()
    selected = session.select_cases(cases, tiers)  # stored tiers plus the generated sweep
    report: dict = {"tiers": tiers, "emulated": True, "runs": [], "calls": []}
    try:
        for soc_name in socs:
            emulation.enable(soc_name)
            clear_cache()
            for backend in backends_for(soc_name):
                target = runner.Target.resolve(backend)
                entry = {
                    "soc": soc_name,
                    "backend": backend,
                    "available": target.available,
                    "reasons": [str(r) for r in getattr(target, "reasons", [])],
                    "statuses": {},
                    "failures": [],
                }
                report["runs"].append(entry)
                if not target.available:
                    continue
                statuses: collections.Counter = collections.Counter()
                conformance = runner.Runner(target, cases)
                with emulator.recording() as calls, warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # the announced dequantize / upcast paths
                    for case, path in conformance.items(selected):
                        result = conformance.run_case(case, path)
                        statuses[result.status] += 1
                        allowed = ("pass",) if case.op in suite.GEMM_OPS else ("pass", "not_applicable")
                        if result.status not in allowed:
                            entry["failures"].append(f"{case.id}: {result.status}: {result.message}")
                entry["statuses"] = dict(statuses)
                entry["calls"] = len(calls)
                report["calls"].extend(dict(call, backend=backend) for call in calls)
    finally:
        emulation.reset()
    return report


def check(report: dict) -> list[str]:
    """Problems found by replaying every recorded call against the rule table."""
    problems = []
    for run_entry in report["runs"]:
        if not run_entry["available"]:
            problems.append(f"{run_entry['soc']} / {run_entry['backend']}: not available: {run_entry['reasons']}")
        problems.extend(f"{run_entry['soc']} / {run_entry['backend']}: {f}" for f in run_entry["failures"])
        if run_entry["available"] and not run_entry.get("calls"):
            problems.append(f"{run_entry['soc']} / {run_entry['backend']}: no npu_grouped_matmul call was recorded")
    for i, raw in enumerate(report["calls"]):
        call = emulator.GmmCall.from_dict({k: raw[k] for k in raw if k not in ("accepted", "rule", "backend")})
        try:
            emulator.check_call(call)
        except emulator.AclnnError as exc:
            problems.append(f"call {i} ({call.soc}, {raw.get('backend')}): {exc}")
        except NotImplementedError as exc:
            problems.append(f"call {i} ({call.soc}, {raw.get('backend')}): outside the emulated forms: {exc}")
    return problems


def summary(report: dict) -> dict:
    """Per SoC and backend: calls recorded and the rule-table rules they were checked against."""
    return {
        "rules": sorted(cann_rules.RULES),
        "runs": [{k: r.get(k) for k in ("soc", "backend", "available", "statuses", "calls")} for r in report["runs"]],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m moe_hal_ascend.replay", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run_p = sub.add_parser("run", help="run conformance tiers on the emulator, record and check the calls")
    run_p.add_argument("--soc", action="append", help=f"SoC to emulate (repeatable; default: {', '.join(CI_SOCS)})")
    run_p.add_argument("--tier", default="smoke", help="comma-separated tiers: smoke, full, sweep (default smoke)")
    run_p.add_argument("--out", required=True, help="JSON file for the recorded calls and results")
    check_p = sub.add_parser("check", help="replay a recorded JSON file against the rule table")
    check_p.add_argument("file")
    args = parser.parse_args(argv)
    if args.command == "run":
        report = run(args.soc or CI_SOCS, args.tier.split(","))
        with open(args.out, "w") as fh:
            json.dump(report, fh, indent=1)
    else:
        with open(args.file) as fh:
            report = json.load(fh)
    problems = check(report)
    print(json.dumps(summary(report), indent=1))
    print(
        f"{len(report['calls'])} recorded npu_grouped_matmul calls replayed against {len(cann_rules.RULES)} rules "
        f"(EMULATED: nothing here ran on an NPU); {len(problems)} problem(s)"
    )
    for problem in problems:
        print("  " + problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
