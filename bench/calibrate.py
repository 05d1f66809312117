"""Measure a device and write a ``measured`` overlay for its hardware-DB entry.

On one device (CUDA GPU, Ascend NPU or the CPU) this measures:

* the dense matmul rate per dtype: square ``torch.matmul`` for fp32 (TF32 off), tf32 (TF32 on),
  bf16 and fp16; ``torch._scaled_mm`` for fp8 e4m3 and ``torch._int_mm`` for int8 (CUDA only;
  skipped with a message where the device or torch lacks them). The best of the sizes tried is
  kept, as a peak figure should be. FLOPs are counted as 2*M*N*K;
* read bandwidth: ``torch.sum`` over a buffer much larger than the L2 cache (bytes read / time);
* copy bandwidth: ``Tensor.copy_`` between two such buffers, counting read + write bytes;
* on CUDA/NPU, the core count and L2 size the runtime reports.

It writes ``hwdb/measured/<id>.yaml`` (``overlay_of: <id>``), validated against the schema before it
replaces any earlier file. Each value carries basis ``measured``, the date, the method and the
tool (this script plus the torch/CUDA versions). Clocks, power limits and other processes are not
controlled: run it on an idle machine, and rerun it after driver or firmware changes.

Usage::

    python bench/calibrate.py                      # first CUDA device, else the first NPU, else the CPU
    python bench/calibrate.py --device cuda:1 --hw nvidia-h200-sxm
    python bench/calibrate.py --device cpu --sizes 1024 --bytes 256e6 --out /tmp/cpu.yaml
    python bench/calibrate.py --dry-run            # print the overlay instead of writing it

Then ``moe-hal hw show <id>`` lists the measured values beside the spec figures.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Callable

import torch
import yaml

from moe_hal import hwdb, match_device, timing

MEASURED_DIR = Path(__file__).resolve().parent.parent / "hwdb" / "measured"
MATMUL_DTYPES = timing.MATMUL_DTYPES


def default_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    npu = getattr(torch, "npu", None)
    if npu is not None and npu.is_available():
        return torch.device("npu", npu.current_device())
    return torch.device("cpu")


def median_seconds(device: torch.device, warmup: int, repeat: int) -> Callable[[Callable[[], object]], float]:
    """How this script times a call: the median wall time of ``repeat`` calls, each timed alone
    after ``warmup`` calls."""
    return lambda fn: statistics.median(timing.wall_seconds(fn, device, warmup=warmup, repeat=repeat))


def measure_matmul(dtype: str, sizes: list[int], device: torch.device, warmup: int, repeat: int) -> tuple[float, int]:
    """(best FLOP/s or OP/s over ``sizes``, the size that reached it)."""
    seconds = median_seconds(device, warmup, repeat)
    return max((timing.matmul_rate(dtype, n, device, seconds), n) for n in sizes)


def device_facts(device: torch.device) -> tuple[str, int | None, int | None]:
    """(device name, core count, L2 bytes) as the runtime reports them."""
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        return p.name, p.multi_processor_count, getattr(p, "L2_cache_size", None)
    if device.type == "npu":
        p = torch.npu.get_device_properties(device)
        return torch.npu.get_device_name(device), getattr(p, "cube_core_num", None), getattr(p, "L2_cache_size", None)
    return hwdb.match_cpu().seen, os.cpu_count(), None


def significant(x: float, digits: int = 4) -> float:
    """``x`` rounded to ``digits`` significant digits (a CPU's TFLOPS are small numbers)."""
    return float(f"{x:.{digits}g}")


def tool_text() -> str:
    parts = [f"bench/calibrate.py; torch {torch.__version__}"]
    if torch.version.cuda:
        parts.append(f"CUDA {torch.version.cuda}")
    return ", ".join(parts)


def build_overlay(args: argparse.Namespace, device: torch.device, entry_id: str) -> dict:
    name, cores, l2 = device_facts(device)
    today = datetime.date.today().isoformat()
    common = {"basis": "measured", "source": f"bench/calibrate.py run on {name}", "date": today, "tool": tool_text()}
    measured: dict = {"matmul": {}}
    for dtype in args.dtypes:
        try:
            rate, n = measure_matmul(dtype, args.sizes, device, args.warmup, args.repeat)
        except Exception as exc:  # noqa: BLE001 - an unsupported dtype is reported, not fatal
            print(f"calibrate: {dtype} matmul not measured: {type(exc).__name__}: {exc}", file=sys.stderr)
            continue
        unit = "TOPS" if dtype == "int8" else "TFLOPS"
        api = {"fp8": "torch._scaled_mm (e4m3, unit scales, bf16 out, fast accumulation)", "int8": "torch._int_mm"}.get(
            dtype, "torch.matmul"
        )
        tf32 = {"fp32": ", TF32 disabled", "tf32": ", fp32 inputs with TF32 enabled"}.get(dtype, "")
        measured["matmul"][dtype] = {
            "value": significant(rate / 1e12),
            "unit": unit,
            **common,
            "shape": [n, n, n],
            "device": name,
            "method": f"{api} on {n}x{n}x{n}{tf32}; best of sizes {args.sizes}; median of {args.repeat} "
            f"timed calls after {args.warmup} warm-up; FLOPs = 2*M*N*K",
        }
        print(f"calibrate: {dtype:5s} {rate / 1e12:10.4g} {unit} (n={n})")
    if not measured["matmul"]:
        del measured["matmul"]

    seconds = median_seconds(device, args.warmup, args.repeat)
    read = timing.read_bandwidth(int(args.bytes), device, seconds)
    copy = timing.copy_bandwidth(int(args.bytes), device, seconds)
    size_text = (
        f"{int(args.bytes) / 1e6:.0f} MB fp32 buffers; median of {args.repeat} timed calls after {args.warmup} warm-up"
    )
    measured["read_bandwidth"] = {
        "value": significant(read / 1e9),
        "unit": "GB/s",
        **common,
        "device": name,
        "bytes_moved": "read only (bytes of the buffer)",
        "method": f"torch.sum over {size_text}",
    }
    measured["copy_bandwidth"] = {
        "value": significant(copy / 1e9),
        "unit": "GB/s",
        **common,
        "device": name,
        "bytes_moved": "read + write (2 x bytes of the buffer)",
        "method": f"Tensor.copy_ between two {size_text}",
    }
    print(f"calibrate: read  {read / 1e9:10.4g} GB/s   copy {copy / 1e9:10.4g} GB/s (read + write)")
    if device.type in ("cuda", "npu") and cores:
        what = "multi_processor_count" if device.type == "cuda" else "cube_core_num"
        measured["units"] = {
            "value": int(cores),
            "unit": "count",
            **common,
            "method": f"get_device_properties().{what}",
        }
    if device.type in ("cuda", "npu") and l2:
        measured["l2"] = {"value": int(l2), "unit": "B", **common, "method": "get_device_properties().L2_cache_size"}
    return {
        "schema_version": 1,
        "overlay_of": entry_id,
        "measured": measured,
        "notes": [
            f"written by: python bench/calibrate.py {' '.join(sys.argv[1:])}".rstrip(),
            "clocks and power limits were not controlled; values are one run on one device",
        ],
    }


def write_overlay(overlay: dict, out: Path) -> None:
    """Validate ``overlay`` against the schema and the database, then move it to ``out``."""
    text = "# Written by bench/calibrate.py; rerun the script rather than editing by hand.\n"
    text += yaml.safe_dump(overlay, sort_keys=False, allow_unicode=True, width=100)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", dir=out.parent, delete=False, encoding="utf-8") as tmp:
        tmp.write(text)
    try:
        hwdb.validate(tmp.name)
        os.replace(tmp.name, out)
    except BaseException:
        os.unlink(tmp.name)
        raise


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", help="torch device to measure (default: first CUDA device, else NPU, else cpu)")
    p.add_argument(
        "--hw", help="hardware-DB id to attach the values to (default: what moe_hal.match_device recognises)"
    )
    p.add_argument(
        "--dtypes",
        type=lambda s: [d.strip() for d in s.split(",") if d.strip()],
        default=list(MATMUL_DTYPES),
        help=f"matmul dtypes, comma-separated (default: {','.join(MATMUL_DTYPES)})",
    )
    p.add_argument(
        "--sizes",
        type=lambda s: [int(x) for x in s.split(",")],
        default=None,
        help="square matmul sizes to try (default: 4096,8192 on accelerators, 1024,2048 on cpu)",
    )
    p.add_argument(
        "--bytes",
        type=float,
        default=None,
        help="bandwidth buffer size in bytes (default: 2e9 on accelerators, 5e8 on cpu)",
    )
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--out", type=Path, help="output file (default: hwdb/measured/<id>.yaml in this checkout)")
    p.add_argument("--dry-run", action="store_true", help="print the overlay instead of writing it")
    args = p.parse_args(argv)
    unknown = sorted(set(args.dtypes) - set(MATMUL_DTYPES))
    if unknown:
        p.error(f"unknown dtypes {unknown}; choose from {list(MATMUL_DTYPES)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device) if args.device else default_device()
    accelerator = device.type != "cpu"
    args.sizes = args.sizes or ([4096, 8192] if accelerator else [1024, 2048])
    args.bytes = args.bytes or (2e9 if accelerator else 5e8)
    if args.hw:
        entry_id = hwdb.get(args.hw).id
    else:
        found = match_device(device)
        if found.entry is None:
            print(
                f"calibrate: {found.seen} is not in the hardware DB ({found.reason}); add an entry or pass --hw ID",
                file=sys.stderr,
            )
            return 2
        entry_id = found.id
    print(f"calibrate: measuring {device} as {entry_id}")
    overlay = build_overlay(args, device, entry_id)
    if args.dry_run:
        print(yaml.safe_dump(overlay, sort_keys=False, allow_unicode=True, width=100))
        return 0
    out = args.out or MEASURED_DIR / f"{entry_id}.yaml"
    write_overlay(overlay, out)
    print(f"calibrate: wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
