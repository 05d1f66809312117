"""``moe-hal bench``: time grouped GEMM on this device against peers, and validate the model.

For each case of a sweep (:func:`moe_hal.workloads.sweep`: uniform, Zipf and the DeepGEMM issue
#211 histogram for contiguous calls; masked decode shapes; K-grouped weight gradients; N/K of
DeepSeek-V3 and Qwen3-MoE) it times ``moe_hal.grouped_gemm`` on the selected backend,
``torch.nn.functional.grouped_mm`` called directly, and a per-expert ``torch.mm`` loop
(:func:`moe_hal.peers.time_case`). With ``--model`` it adds the plain roofline and the model's
prediction for the backend's best tile, the error of each against the measured time, and the
median and worst absolute error (:mod:`moe_hal.perf_validation`); ``--calibrate`` adds a second
model fitted on three calls of the backend outside the sweep. It reports; it never asserts.

Timing (:class:`moe_hal.timing.Timer`): on an accelerator, device events around each call after an
L2 flush (a 512 MiB memset that also lets the host queue the call before the device reaches it),
median over the repetitions after warm-up; on the CPU ``time.perf_counter`` around call +
synchronize, median. Hardware figures the device's hardware-DB entry lacks (``cpu-generic`` has
none) are measured in process, and the report says so.
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path
from typing import Any

from .. import peers, perf_validation, workloads
from ..timing import Timer
from . import types


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "bench",
        help="time grouped GEMM against peers; --model validates the performance model",
        description="Time moe_hal.grouped_gemm on the selected backend against torch grouped_mm and a "
        "per-expert torch.mm loop over a sweep of MoE shapes; with --model, compare with the "
        "roofline and the model's prediction. Reports, never asserts.",
    )
    p.add_argument("--backend", help="force this backend (default: what moe_hal selects)")
    p.add_argument("--device", type=types.device, help="torch device (default: cuda when available, else cpu)")
    p.add_argument("--model", action="store_true", help="add the model's ideal and prediction and the error summary")
    p.add_argument(
        "--calibrate",
        action="store_true",
        help="also fit a calibrated model (fixed time, bandwidth, peak) on three calls outside the sweep",
    )
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="CPU-sized sweep (the default on CPU)")
    size.add_argument("--full", action="store_true", help="GPU-sized sweep (the default on GPU)")
    p.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), help="operand dtype (default bf16 on GPU, fp32 on CPU)")
    p.add_argument("--fp8", action="store_true", help="add fp8 (1x128 / 128x128 block-scaled) cases")
    p.add_argument("--only", help="run only the cases whose name contains this text")
    p.add_argument("--warmup", type=int, default=3, help="warm-up calls per timing (default 3)")
    p.add_argument("--reps", type=int, default=15, help="timed calls per timing (default 15)")
    p.add_argument("--no-peers", action="store_true", help="time only the moe_hal backend")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic histograms and data")
    p.add_argument("--json", action="store_true", help="print the JSON report instead of a table")
    p.add_argument("--out", metavar="FILE.json", help="also write the JSON report to this file")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch
    from rich.console import Console
    from rich.progress import Progress

    import moe_hal

    err = Console(stderr=True)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    full = args.full or (not args.quick and device.type != "cpu")
    dtype = args.dtype or ("fp32" if device.type == "cpu" else "bf16")
    cases = workloads.sweep(full, dtype, args.fp8, args.seed)
    if args.only:
        known = cases
        cases = [c for c in cases if args.only in c.name]
        if not cases:
            from ..errors import ArgumentError

            raise ArgumentError(
                "--only",
                f"text contained in a case name of this sweep, one of: {', '.join(c.name for c in known)}",
                repr(args.only),
            )
    timer = Timer(device, args.warmup, args.reps)
    report: dict[str, Any] = {
        "tool": "moe-hal bench",
        "moe_hal": moe_hal.__version__,
        "torch": torch.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": str(device),
        "sweep": "full" if full else "quick",
        "dtype": dtype,
        "timing": timer.method,
        "backend_requested": args.backend,
        "cases": [],
        "notes": [],
        "warnings": [],
    }
    if device.type == "cuda":
        report["device_name"] = torch.cuda.get_device_name(device)
    dtypes = {c.dtype for c in cases}
    hw = hw_cal = None
    options: dict[str, dict[str, Any]] = {}  # model options per backend name
    with Progress(console=err, transient=True) as progress:
        if args.model:
            task = progress.add_task("hardware figures", total=None)
            try:
                hw, notes = perf_validation.hardware_here(device, dtypes, timer)
            except Exception as exc:  # noqa: BLE001 - report and carry on timing: a one-shot GPU run must not be lost
                report["notes"].append(f"no model: the hardware figures failed: {type(exc).__name__}: {exc}")
            else:
                report["hardware"] = {"model": perf_validation.hw_dict(hw), **notes}
                if device.type == "cpu":
                    report["notes"].append(
                        "the tile/wave model describes GPU/NPU kernels (tiles on cores, waves, MMA floors); it is "
                        "not expected to predict CPU kernels, and CPU timings on a shared machine are noisy: read "
                        "these errors as a report, not a validation"
                    )
                if notes["measured_here"]:
                    report["notes"].append(
                        "the hardware DB lacks some figures for this device; they were measured "
                        "in process (see hardware.measured_here)"
                    )
            progress.remove_task(task)
        task = progress.add_task("cases", total=len(cases))
        for case in cases:
            progress.update(task, description=case.name)
            row = peers.time_case(case, device, timer, backend=args.backend, peers=not args.no_peers, seed=args.seed)
            if hw is not None and "error" not in row:
                name = row["backend"]
                if name not in options:
                    options[name] = perf_validation.model_options(moe_hal.get_backend(name).spec)
                    report.setdefault("model_options", {})[name] = {
                        **options[name],
                        "tiles": [list(t) for t in options[name]["tiles"]],
                    }
                    if args.calibrate and "calibration" not in report["hardware"]:
                        progress.update(task, description=f"calibrating on {name}")
                        try:
                            hw_cal, info = perf_validation.calibrate(
                                hw, device, dtypes, args.backend or name, timer, options[name], args.seed
                            )
                        except Exception as exc:  # noqa: BLE001 - a failed fit is reported; the sweep goes on
                            info = {"error": f"{type(exc).__name__}: {exc}"}
                        else:
                            report["hardware"]["calibrated"] = perf_validation.hw_dict(hw_cal)
                        report["hardware"]["calibration"] = {"backend": args.backend or name, **info}
                try:
                    perf_validation.add_model(row, case, hw, hw_cal, options[name])
                except Exception as exc:  # noqa: BLE001 - a case the model cannot describe keeps its times
                    row["model_error"] = f"{type(exc).__name__}: {exc}"
            report["cases"].append(row)
            for message in row.get("warnings", ()):
                if message not in report["warnings"]:
                    report["warnings"].append(message)
            if hw is not None:
                report["summary"] = perf_validation.summarize(report["cases"], hw_cal is not None)
            if args.out:  # after every case, so an interrupted run keeps what it measured
                _write(report, args.out)
            progress.advance(task)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    if len(options) > 1:
        report["notes"].append(
            f"cases ran on several backends ({', '.join(sorted(options))}); the calibrated "
            "model was fitted on the first"
        )
    if args.out:
        _write(report, args.out)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_report(report)
    ran = sum(1 for r in report["cases"] if "error" not in r)
    return 0 if ran or not cases else 1


def _write(report: dict[str, Any], path: str) -> None:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")


def print_report(report: dict[str, Any]) -> None:
    from . import render

    console = render.console()
    console.print(
        render.text(
            f"moe-hal bench on {report['device']} {report.get('device_name', '')} "
            f"({report['sweep']} sweep, {report['dtype']}); {report['timing']}"
        )
    )
    rows: list[list[str]] = []
    cols = ["case", "op", "G", "rows", "backend", "moe_hal", "grouped_mm", "mm loop"]
    with_model = "summary" in report
    if with_model:
        cols += ["roofline", "model", "err", "tile", "bound"]
        if "model_calibrated" in report["summary"]:
            cols += ["calibrated", "err"]
    for r in report["cases"]:
        if "error" in r:
            rows.append(
                [
                    r["name"],
                    r["op"],
                    str(r["num_groups"]),
                    str(r["rows"]),
                    "-",
                    r["error"][:60],
                    *[""] * (len(cols) - 6),
                ]
            )
            continue
        t = r["times"]
        cells = [r["name"], r["op"], str(r["num_groups"]), str(r["rows"]), r["backend"]]
        for key in (peers.MOE_HAL, peers.GROUPED_MM, peers.MM_LOOP):
            cells.append(
                f"{t[key]['median'] * 1e6:.1f}" if "median" in t.get(key, {}) else ("err" if key in t else "-")
            )
        if with_model:
            m = r.get("model")
            if m is None:
                cells += ["", r.get("model_error", "-")[:40]] + [""] * (len(cols) - len(cells) - 2)
            else:
                cells += [
                    f"{m['t_roofline'] * 1e6:.1f}",
                    f"{m['t_predicted'] * 1e6:.1f}",
                    f"{m.get('error_predicted', float('nan')):+.0%}",
                    "x".join(map(str, m["tile"])),
                    m["bound"],
                ]
                if "model_calibrated" in report["summary"]:
                    cal = m.get("t_predicted_calibrated")
                    cells += [
                        f"{cal * 1e6:.1f}" if cal else "-",
                        f"{m.get('error_predicted_calibrated', float('nan')):+.0%}",
                    ]
        rows.append(cells)
    words = ("case", "op", "backend", "bound")
    numbers = [c for c in cols if c not in words]
    console.print(render.table("times in us (median)", cols, rows, key=["case", *numbers], right=numbers))
    if with_model:
        for name, s in report["summary"].items():
            if isinstance(s, dict) and s.get("n"):
                console.print(
                    f"{name}: median |error| {s['median_abs_error']:.1%}, worst {s['worst_abs_error']:.1%}, "
                    f"mean {s['mean_error']:+.1%} over {s['n']} cases"
                )
    for note in report["notes"]:
        console.print(render.text(f"note: {note}"))
    for message in report["warnings"]:
        console.print(render.text(f"warning: {message}"))
