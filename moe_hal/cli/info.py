"""``moe-hal info``: everything a bug report needs, as one plain block to copy (or ``--json``)."""

from __future__ import annotations

import argparse
import json
from typing import Any


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "info",
        help="bug-report information: versions, machine, devices, plugins, backends",
        description="Print one plain-text block to paste into a bug report: versions of "
        "Python, torch and the libraries that decide results, the CPU and thread "
        "settings, driver and toolkit versions the plugins report, each device "
        "and its hardware-DB entry, each plugin with its hooks and hardware-DB "
        "entries (failures included), each backend on each device with its "
        "reason code, and the MOE_HAL_* variables in force. Works even when "
        "every plugin is broken, under MOE_HAL_STRICT_PLUGINS and with a malformed "
        "hardware-DB file: it prints everything, then the problems it found, "
        "and exits with status 3 when there are any.",
    )
    p.add_argument("--json", action="store_true", help="print the same information as JSON")
    p.add_argument("--tracebacks", action="store_true", help="also print the traceback of each plugin failure")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from .. import sysinfo

    snap = sysinfo.snapshot()
    exit_status = 3 if snap["problems"] else 0
    if args.json:
        print(json.dumps(snap, indent=2, default=str))
        return exit_status
    print("\n".join(report_lines(snap, tracebacks=args.tracebacks)))
    return exit_status


def report_lines(snap: dict[str, Any], tracebacks: bool = False) -> list[str]:
    """The snapshot as plain lines (no markup, no table borders: it is pasted into issues)."""
    v, m = snap["versions"], snap["machine"]
    lines = [f"moe_hal {v.get('moe-hal', '?')}: python {v['python']} on {v['platform']}"]
    libraries = [f"{name} {version}" for name, version in v.items() if name not in ("moe-hal", "python", "platform")]
    lines.append("libraries: " + (", ".join(libraries) or "-"))
    lines.append(f"cpu: {m['cpu']} ({m['logical_cpus']} logical CPUs)")
    lines.append(
        f"threads: torch {m['torch_threads']} (interop {m['torch_interop_threads']}), "
        f"OMP_NUM_THREADS={m['OMP_NUM_THREADS'] or 'unset'}, MKL_NUM_THREADS={m['MKL_NUM_THREADS'] or 'unset'}, "
        f"mkl {'yes' if m['mkl'] else 'no'}, openmp {'yes' if m['openmp'] else 'no'}"
    )
    for name, value in snap["facts"].items():
        lines.append(f"{name}: {value}")

    lines.append("devices:")
    for d in snap["devices"]:
        entry = d["hw_id"] or f"unrecognised ({d['seen']})"
        lines.append(f"  {d['device']}: {entry}; features: {', '.join(d['features']) or '-'}")

    lines.append("plugins:")
    for p in snap["plugins"]:
        who = f"{p['distribution']} {p['version']}".strip() or p["value"] or "-"
        line = f"  {p['name']} ({who}): {p['status']}"
        if p["hooks"]:
            line += f"; hooks: {', '.join(p['hooks'])}"
        if p["backends"]:
            line += f"; backends: {', '.join(p['backends'])}"
        if p["hwdb_entries"]:
            line += f"; hardware-DB entries: {', '.join(p['hwdb_entries'])}"
        lines.append(line)
        for f in p["failures"]:
            lines.append(f"    failed during {f['phase']}: {f['exc_type']}: {f['message']}")
            if tracebacks and f["traceback"]:
                lines += ["      " + t for t in f["traceback"].rstrip().splitlines()]

    lines.append("backends:")
    for b in snap["backends"]:
        for device, state in b["devices"].items():
            head = f"  {b['name']} on {device} ({b['tier']}, priority {b['priority']}, plugin {b['plugin']}): "
            if state["available"]:
                lines.append(head + f"yes, {state['mode']}")
            else:
                reasons = "; ".join(f"[{r['code']}] {r['message']}" for r in state["reasons"])
                lines.append(head + f"no: {reasons}")

    lines.append("environment:" + ("" if snap["env"] else " no MOE_HAL_* variable set"))
    for name, e in snap["env"].items():
        meaning = e["meaning"] + (f" (read by {e['read_by']})" if e.get("read_by") else "")
        lines.append(f"  {name}={e['value']}: {meaning}")
    lines += [f"problem: {problem}" for problem in snap["problems"]]
    return lines
