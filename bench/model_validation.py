"""Validate the performance model, in one command.

    python bench/model_validation.py                # published measurements, leave-one-source-out
    python bench/model_validation.py --hold-out architecture   # ... each GPU architecture held out
    python bench/model_validation.py --markdown     # ... the tables of docs/perf-model.md instead of the text report
    python bench/model_validation.py --measure      # this machine's kernels (on a GPU: full sweep + fp8)
    python bench/model_validation.py --measure --quick

Default: the model against ``bench/published/cases.yaml`` (timings other people measured and
published, each with its source), fitted on every source but one and evaluated on that one, for
every source (``moe-hal model validate``). Writes ``bench/results/model_validation_published.json``
and the predicted-vs-measured plot ``docs/perf-model-validation.png`` (model and plain roofline),
and prints per-case errors, median and worst, split compute-/memory-bound. ``--hold-out
architecture`` holds out every case of one GPU architecture at a time (how a device of an
architecture no source measured is predicted) and writes
``bench/results/model_validation_published_by_architecture.json`` (a plot only with ``--plot``).

``--measure``: runs ``moe-hal bench --model --calibrate`` (``--fp8`` added on CUDA) and writes
``bench/results/model_validation_<hardware-DB id>.json`` unless ``--out`` is given; every other
argument is passed to ``moe-hal bench`` (``--backend cuda_sm90``, ``--only dsv3``, ...). The report
holds, per case, the measured times of the backend and its peers, the plain roofline, the model's
prediction with the DB's figures and with the calibrated ones, and the error summaries.

Both report; neither asserts (tests/test_model_validation.py holds the CI gate). See
docs/perf-model.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
PLOT = Path(__file__).resolve().parents[1] / "docs" / "perf-model-validation.png"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--measure" in argv:
        argv.remove("--measure")
        return measure(argv)
    from moe_hal.cli import model_validation

    parser = argparse.ArgumentParser(prog="bench/model_validation.py")
    held = parser.add_mutually_exclusive_group()
    held.add_argument("--in-sample", action="store_true", help="fit on every case (optimistic comparison)")
    held.add_argument("--hold-out", choices=model_validation.HOLD_OUT, default="source")
    parser.add_argument("--out", help="the JSON report (default: by the evaluation, under bench/results/)")
    parser.add_argument("--plot", help=f"predicted vs measured (default {PLOT.name} for leave-one-source-out)")
    parser.add_argument("--jobs", type=int, default=None, help=model_validation.JOBS_HELP)
    parser.add_argument("--markdown", action="store_true", help=model_validation.MARKDOWN_HELP)
    parser.add_argument("--no-progress", action="store_true", help=model_validation.NO_PROGRESS_HELP)
    args = parser.parse_args(argv)
    by_architecture = args.hold_out == "architecture"  # --in-sample leaves the default, "source"
    name = "model_validation_published_by_architecture.json" if by_architecture else "model_validation_published.json"
    out = args.out or str(RESULTS / name)
    plot = args.plot or (None if by_architecture else str(PLOT))
    with model_validation.fold_progress(not args.no_progress and not args.in_sample) as progress:
        data = model_validation.report(args.in_sample, hold_out=args.hold_out, jobs=args.jobs, progress=progress)
    Path(out).write_text(json.dumps(data, indent=2) + "\n")
    if plot:
        model_validation.plot(data, plot)
    if args.markdown:
        print(model_validation.markdown(data, model_validation.published_sources()))
    else:
        model_validation.print_report(data)
    print(f"wrote {out}" + (f" and {plot}" if plot else ""))
    return 0


def measure(argv: list[str]) -> int:
    """The device sweep of ``moe-hal bench --model --calibrate``."""
    import torch

    from moe_hal import match_device
    from moe_hal.cli import bench

    device = torch.device(_value(argv, "--device") or ("cuda" if torch.cuda.is_available() else "cpu"))
    extra = ["--model", "--calibrate"]
    if device.type == "cuda" and "--fp8" not in argv:
        extra.append("--fp8")
    if _value(argv, "--out") is None:
        hw_id = match_device(device).id or f"unrecognised-{device.type}"
        out = RESULTS / f"model_validation_{hw_id}.json"
        extra += ["--out", str(out)]
    parser = argparse.ArgumentParser(prog="bench/model_validation.py")
    bench.register(parser.add_subparsers())
    args = parser.parse_args(["bench", *extra, *argv])
    return args.func(args)


def _value(argv: list[str], flag: str) -> str | None:
    for i, item in enumerate(argv):
        if item == flag and i + 1 < len(argv):
            return argv[i + 1]
        if item.startswith(flag + "="):
            return item.split("=", 1)[1]
    return None


if __name__ == "__main__":
    sys.exit(main())
