"""Validate the performance model against measured kernels, in one call.

    python bench/model_validation.py            # on a GPU: full sweep + fp8 cases + calibration
    python bench/model_validation.py --quick    # CPU-sized sweep

Runs ``moe-hal bench --model --calibrate`` (``--fp8`` added on CUDA) and writes the JSON report to
``bench/results/model_validation_<hardware-DB id>.json`` unless ``--out`` is given. Every other
argument is passed to ``moe-hal bench`` (``--backend cuda_sm90``, ``--only dsv3``, ...). The report
holds, per case, the measured times of the backend and its peers, the plain roofline, the model's
prediction with the DB's figures and with the calibrated ones, and the error summaries. It
reports; it never asserts. See docs/perf-model.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    import torch

    from moe_hal import hwdb
    from moe_hal.cli import bench

    argv = list(sys.argv[1:] if argv is None else argv)
    device = torch.device(_value(argv, "--device") or ("cuda" if torch.cuda.is_available() else "cpu"))
    extra = ["--model", "--calibrate"]
    if device.type == "cuda" and "--fp8" not in argv:
        extra.append("--fp8")
    if _value(argv, "--out") is None:
        hw_id = hwdb.match(device).id or f"unrecognised-{device.type}"
        out = Path(__file__).resolve().parent / "results" / f"model_validation_{hw_id}.json"
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
