"""``moe-hal info``: devices, plugins, backends and environment variables as moe_hal sees them."""

from __future__ import annotations

import argparse
import json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("info", help="show devices, plugins, backends and environment",
                       description="Show the devices torch sees and their hardware-DB match, every plugin "
                                   "(with failures and tracebacks), every backend with its availability per "
                                   "device, and the MOE_HAL_* variables in force. Works even when every "
                                   "plugin is broken.")
    p.add_argument("--json", action="store_true", help="print the snapshot as JSON")
    p.add_argument("--tracebacks", action="store_true", help="print plugin failure tracebacks")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from .. import environment

    snap = environment.snapshot()
    if args.json:
        print(json.dumps(snap, indent=2, default=str))
        return 0
    from rich.console import Console
    from rich.table import Table

    console = Console()
    v = snap["versions"]
    console.print(f"[bold]moe_hal {v.get('moe-hal', '?')}[/bold]  python {v['python']}  torch {v.get('torch', '-')}"
                  f"  triton {v.get('triton', '-')}  ({v['platform']})")

    t = Table(title="devices", title_justify="left")
    for col in ("device", "hardware DB entry", "features"):
        t.add_column(col)
    for d in snap["devices"]:
        hw = d["hw_id"] or f"[yellow]unrecognised[/yellow]: {d['seen']}"
        t.add_row(d["device"], hw, ", ".join(d["features"]) or "-")
    console.print(t)

    t = Table(title="plugins", title_justify="left")
    for col in ("plugin", "distribution", "status", "backends", "failure"):
        t.add_column(col)
    for p in snap["plugins"]:
        status = p["status"]
        style = {"failed": "red", "conflict": "red", "not_installed": "yellow", "disabled": "dim"}.get(status)
        failure = "; ".join(f"{f['phase']}: {f['exc_type']}: {f['message']}" for f in p["failures"])
        t.add_row(p["name"], f"{p['distribution']} {p['version']}".strip(),
                  f"[{style}]{status}[/{style}]" if style else status, ", ".join(p["backends"]) or "-", failure or "")
    console.print(t)
    if args.tracebacks:
        for p in snap["plugins"]:
            for f in p["failures"]:
                if f["traceback"]:
                    console.rule(f"{p['name']}: {f['phase']}")
                    console.print(f["traceback"], markup=False, highlight=False)

    t = Table(title="backends", title_justify="left")
    for col in ("backend", "tier", "prio", "plugin", *[d["device"] for d in snap["devices"]]):
        t.add_column(col)
    for b in snap["backends"]:
        cells = []
        for d in snap["devices"]:
            st = b["devices"][d["device"]]
            if st["available"]:
                cells.append(f"[green]yes[/green] {st['mode']}")
            else:
                cells.append("[red]no[/red]: " + "; ".join(f"[{r['code']}] {r['message']}" for r in st["reasons"]))
        t.add_row(b["name"], b["tier"], str(b["priority"]), f"{b['plugin']}", *cells)
    console.print(t)

    if snap["env"]:
        t = Table(title="environment", title_justify="left")
        for col in ("variable", "value", "meaning"):
            t.add_column(col)
        for name, e in snap["env"].items():
            meaning = e["meaning"] if e["known"] else f"[yellow]{e['meaning']}[/yellow]"
            t.add_row(name, e["value"], meaning)
        console.print(t)
    else:
        console.print("environment: no MOE_HAL_* variables set")
    return 0
