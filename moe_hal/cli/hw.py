"""``moe-hal hw``: list, show and match hardware-database entries."""

from __future__ import annotations

import argparse
import json
from typing import Any

# Short basis tags for tables (the JSON output carries the full words).
_BASIS_TAG = {
    "datasheet": "ds",
    "whitepaper": "wp",
    "secondary": "sec",
    "derived": "der",
    "measured": "meas",
    "fitted": "fit",
}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "hw",
        help="list, show and match hardware-database entries",
        description="The hardware database: one YAML entry per accelerator, every number "
        "with its basis and source (see docs/hwdb.md). Extra entries and "
        "measured overlays come from MOE_HAL_HWDB and plugins.",
    )
    hw_sub = p.add_subparsers(dest="hw_command", metavar="SUBCOMMAND")

    lst = hw_sub.add_parser("list", help="one line per entry", description="List every entry, overlays included.")
    lst.add_argument("--json", action="store_true", help="print JSON")
    lst.set_defaults(func=run_list)

    show = hw_sub.add_parser(
        "show",
        help="every figure of one entry with its basis and source",
        description="Show one entry: recognition, features and every quantity.",
    )
    show.add_argument("id", metavar="ID", help="entry id or alias (e.g. nvidia-h200-sxm, h200)")
    show.add_argument("--json", action="store_true", help="print JSON")
    show.set_defaults(func=run_show)

    match = hw_sub.add_parser(
        "match",
        help="which entry each device of this machine matches",
        description="Recognise the CPU and every accelerator torch already sees (a device type "
        "whose torch extension is not loaded yet only when named with "
        "--device); the plugin of each device type reads its properties.",
    )
    match.add_argument(
        "--device", action="append", metavar="DEV", help="match only this device (e.g. cuda:1, npu:0, cpu); repeatable"
    )
    match.add_argument("--json", action="store_true", help="print JSON")
    match.set_defaults(func=run_match)

    p.set_defaults(func=lambda args: _help(p))


def _help(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def _guarded(run):
    """Run a subcommand after loading plugins, turning moe_hal errors into a message and an exit status."""

    def wrapper(args: argparse.Namespace) -> int:
        import sys

        from .. import plugins
        from ..errors import ArgumentError, HardwareDBError, MoeHalError

        try:
            # Plugins contribute hardware-DB overlays when they load; a broken one is recorded
            # (see `moe-hal info`) and does not stop the listing.
            plugins.host().ensure_loaded()
            return run(args)
        except HardwareDBError as exc:
            print(f"moe-hal hw: hardware DB error: {exc}", file=sys.stderr)
            return 1
        except ArgumentError as exc:
            print(f"moe-hal hw: {exc}", file=sys.stderr)
            return 2
        except MoeHalError as exc:
            print(f"moe-hal hw: {exc}", file=sys.stderr)
            return 1

    return wrapper


def _figure(entry: Any, path: str, scale: float = 1.0) -> str:
    """A quantity as ``value tag`` in the given display scale (SI divided by ``scale``)."""
    q = entry.quantity(path)
    if q is None:
        return "-"
    return f"{q.si / scale:.6g} {_BASIS_TAG[q.basis]}"


def _peak(entry: Any, dtype: str) -> str:
    """The spec peak (one basis across devices, so they compare), and a measured rate beside it."""
    text = _figure(entry, f"peak_dense.{dtype}", 1e12)
    measured = entry.quantity(f"measured.matmul.{dtype}")
    if measured is not None:
        text += f" (meas {measured.si / 1e12:.6g})"
    return text


def _achieved(entry: Any) -> str:
    """The implementations with achieved-efficiency figures, and their basis."""
    out = []
    for impl, figures in sorted(entry.raw.get("achieved", {}).items()):
        if impl == "*":
            continue
        bases = {
            leaf["basis"]
            for name, node in figures.items()
            if name != "typical"
            for leaf in ([x for fam in node.values() for x in fam.values()] if name == "compute" else [node])
        }
        own = "" if figures.get("typical", True) else ", own kernel"
        out.append(f"{impl} ({'/'.join(_BASIS_TAG[b] for b in sorted(bases))}{own})")
    return ", ".join(out) or "-"


def _summary(entry: Any) -> dict[str, Any]:
    return {
        "id": entry.id,
        "name": entry.name,
        "vendor": entry.vendor,
        "architecture": entry.architecture,
        "aliases": list(entry.aliases),
        "features": sorted(entry.features),
        "path": entry.path,
        "measured_paths": list(entry.measured_paths),
        "num_cores": entry.num_cores,
        "peak_flops": {d: entry.peak_flops(d) for d in ("bf16", "fp8", "fp4")},
        "mem_bandwidth": entry.mem_bandwidth(),
    }


@_guarded
def run_list(args: argparse.Namespace) -> int:
    from .. import hwdb

    entries = hwdb.all()
    if args.json:
        print(json.dumps([_summary(e) for e in entries], indent=2))
        return 0
    from . import render

    rows = []
    for e in entries:
        cores = e.quantity("compute.units")
        kind = e.raw["compute"]["unit_kind"]
        rows.append(
            (
                e.id,
                e.name,
                e.architecture,
                f"{int(cores.value)} {kind}" if cores else "-",
                _peak(e, "bf16"),
                _peak(e, "fp8"),
                _peak(e, "fp4"),
                _figure(e, "memory.capacity", 1e9),
                _figure(e, "memory.bandwidth", 1e12),
                _achieved(e),
                ", ".join(sorted(e.features)),
            )
        )
    numbers = ("cores", "bf16 TFLOPS", "fp8 TFLOPS", "fp4 TFLOPS", "memory GB", "BW TB/s")
    render.console().print(
        render.table(
            "hardware database (dense spec peaks, measured rate in brackets; basis: ds/wp/sec/der/meas/fit; "
            "achieved: implementations with achieved-efficiency figures)",
            ("id", "name", "arch", *numbers, "achieved", "features"),
            rows,
            key=("id", *numbers),
            right=numbers,
        )
    )
    return 0


@_guarded
def run_show(args: argparse.Namespace) -> int:
    from .. import hwdb

    entry = hwdb.get(args.id)
    if args.json:
        print(json.dumps(entry.to_dict(), indent=2))
        return 0
    from . import render

    console = render.console()
    console.print(render.join((entry.id, "bold"), f"  {entry.name}  ({entry.vendor}, {entry.architecture})"))
    console.print(render.text(f"file: {entry.path}"))
    for path in entry.measured_paths:
        console.print(render.text(f"measured overlay: {path}"))
    if entry.aliases:
        console.print(render.text(f"aliases: {', '.join(entry.aliases)}"))
    console.print(render.text(f"features: {', '.join(sorted(entry.features)) or '-'}"))
    recognition = {k: v for k, v in entry.raw["recognition"].items() if k not in ("source", "note")}
    console.print(render.text(f"recognition: {json.dumps(recognition)}"))

    rows = []
    for path, node in entry.quantities():
        value = "unknown" if node["value"] is None else f"{node['value']:g}"
        basis = node.get("basis", "-")
        text = node.get("source", "")
        if basis == "measured":
            text += f" [{node['date']}; {node['method']}; {node['tool']}]"
        elif basis == "fitted":
            text += f" [fitted over {node['cases']} cases; {node['method']}]"
        if node.get("note"):
            text += f" -- {node['note']}" if text else node["note"]
        rows.append((path, value, node["unit"], basis, text))
    console.print(
        render.table(
            "quantities",
            ("field", "value", "unit", "basis", "source / note"),
            rows,
            key=("field", "value", "unit"),
            right=("value",),
        )
    )
    for note in entry.raw.get("notes", ()):
        console.print(render.text(f"note: {note}"))
    return 0


@_guarded
def run_match(args: argparse.Namespace) -> int:
    from .. import sysinfo
    from ..devices import match_device

    devices = args.device or [str(d) for d in sysinfo.visible_devices()]
    results = [{"device": d, **match_device(d).to_dict()} for d in devices]
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    from . import render

    rows = [(r["device"], r["id"] or render.text("none", "yellow"), r["seen"], r["reason"] or "") for r in results]
    render.console().print(
        render.table("hardware-DB match", ("device", "entry", "seen", "reason"), rows, key=("device", "entry"))
    )
    return 0
