"""Turn a committed ``gpu_check.py`` report into measured cases for the performance model.

    python backends/cuda/scripts/gpu_check_cases.py bench/results/gpu_check_h200.json \\
        --commit <the commit whose gpu_check.py ran> --out bench/own_measurements/gpu_check_h200.yaml

The output follows the schema of the published set (``bench/published/schema.json``), with a
source that names the committed result file and script instead of a public URL, so that
``moe-hal model calibrate`` fits on these timings too and ``moe-hal model validate`` reports the
model's error on them. Only timings of one kernel at a known tile become cases:

* ``moe_hal_triton``: every fixed tile of the contiguous tile sweeps (bf16 and fp8), the
  one-group calls of the partial-wave section (one fixed tile, a fraction of a wave to two waves),
  the masked decode calls replayed from a CUDA graph at their planned tile, and the K-grouped bf16
  calls;
* ``torch_grouped_mm``: the contiguous bf16 calls (its SM90 tile rule gives the tile, as for the
  published torch cases).

Not converted: the per-expert ``torch.mm`` loops (many launches, not one kernel), the fp8
K-grouped kernel in the SM100 scale format (``tl.dot_scaled`` is emulated on a Hopper GPU), and
the K-grouped ``torch grouped_mm`` calls (its K-grouped tile rule is not documented here).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

import yaml


#: torch's SM90 bf16 grouped_mm tile rule (aten/src/ATen/native/cuda/GroupMM.cu, as cited by the
#: published set's ``impls.torch_grouped_mm``): 64 x 128 when the rows per group of the 2-D operand
#: (its total over the group count) are at most 128 or N is, else 128 x 256.
def torch_grouped_mm_tile(rows_total: int, groups: int, n: int) -> list[int]:
    return [64, 128] if rows_total // groups <= 128 or n <= 128 else [128, 256]


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _timed(rows: list[dict[str, Any]], path: str):
    """``(row, timing)`` for each row of a report section that timed ``path`` without an error."""
    for row in rows:
        timing = row.get("paths", {}).get(path)
        if "error" not in row and timing:
            yield row, timing


def cases_of(report: dict[str, Any], source: str, device: str) -> list[dict[str, Any]]:
    """The measured cases of one gpu_check report (see the module docstring for which), their ids
    prefixed with the run's start to the minute, so that the cases of several runs stay apart."""
    if report.get("mode") != "gpu":
        raise SystemExit(f"gpu_check_cases: the report's mode is {report.get('mode')!r}, not a GPU run")
    common = {"source": source, "device": device, "device_basis": "stated", "counts_basis": "exact"}
    cases: list[dict[str, Any]] = []
    run = report["date"][:16]

    def add(case_id: str, ms: float, **fields: Any) -> None:
        cases.append({"id": _slug(case_id), **common, **fields, "measured": {"time_us": round(ms * 1e3, 3)}})

    for row in report["timings"]:
        if "error" in row:
            continue
        shape = {"groups": row["G"], "counts": row["counts"], "n": row["N"], "k": row["K"]}
        name = f"{run}-{row['case']}"
        for sweep, dtype in (("tile_sweep", "bf16"), ("fp8_tile_sweep", "fp8")):
            for tile, timing in row.get(sweep, {}).items():
                bm, bn = (int(v) for v in tile.split("x"))
                add(
                    f"{name}-{dtype}-{tile}",
                    timing["median_ms"],
                    impl="moe_hal_triton",
                    layout="contiguous",
                    dtype=dtype,
                    out_dtype="bf16",
                    tile=[bm, bn],
                    **shape,
                )
        peer = row["paths"].get("torch_grouped_mm")
        if peer:
            add(
                f"{name}-bf16-torch",
                peer["median_ms"],
                impl="torch_grouped_mm",
                layout="contiguous",
                dtype="bf16",
                out_dtype="bf16",
                tile=torch_grouped_mm_tile(row["rows"], row["G"], row["N"]),
                **shape,
            )

    def add_at_tile(row: dict[str, Any], timing: dict[str, Any], layout: str, groups: int, counts: list[int]) -> None:
        """A call of our kernel at the tile ``row`` records."""
        add(
            f"{run}-{row['case']}",
            timing["median_ms"],
            impl="moe_hal_triton",
            layout=layout,
            dtype=row["dtype"],
            out_dtype="bf16",
            groups=groups,
            counts=counts,
            n=row["N"],
            k=row["K"],
            tile=row["tile"],
        )

    for row, timing in _timed(report.get("partial_wave", []), "ours"):  # reports before the section have none
        add_at_tile(row, timing, "contiguous", 1, [row["M"]])
    for row, timing in _timed(report["decode"], "ours_graph_replay"):
        add_at_tile(row, timing, "masked", row["G"], row["masked_m"])
    for row, timing in _timed(report["k_grouped"], "ours_bf16"):
        # ours_bf16 is our kernel launched directly; a report that records a routed plan and no tile
        # is from no version of gpu_check.py that times it so, and is skipped rather than misread
        if row.get("routed_to", "triton") != "triton" and "tile" not in row:
            continue
        tokens = row["T"] // row["G"]
        if tokens * row["G"] != row["T"]:
            continue  # the set's K-grouped cases hold one K per group
        tile = {"tile": row["tile"]} if row.get("tile") else {}
        add(
            f"{run}-{row['case']}-bf16",
            timing["median_ms"],
            impl="moe_hal_triton",
            layout="k_grouped",
            dtype="bf16",
            out_dtype="bf16",
            groups=row["G"],
            k_per_group=tokens,
            m=row["M"],
            n=row["N"],
            **tile,
        )
    return cases


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("report", type=Path, help="a committed gpu_check.py JSON report (bench/results/...)")
    p.add_argument("--commit", required=True, help="the 40-hex commit whose gpu_check.py produced the report")
    p.add_argument("--out", type=Path, required=True, help="the cases file to write (bench/own_measurements/...)")
    args = p.parse_args(argv)
    if not re.fullmatch(r"[0-9a-f]{40}", args.commit):
        raise SystemExit(f"gpu_check_cases: --commit must be 40 hex digits, got {args.commit!r}")
    report = json.loads(args.report.read_text())
    device = report["device"]["hw_id"]
    source = _slug(f"moe-hal-gpu-check-{device}-{report['date'][:16]}")
    settings = report["settings"]
    versions = report["versions"]
    data = {
        "schema_version": 1,
        "sources": {
            source: {
                "result": report_path(args.report),
                "script": "backends/cuda/scripts/gpu_check.py",
                "commit": args.commit,
                "location": "sections timings (tile_sweep, fp8_tile_sweep, paths.torch_grouped_mm), "
                + ("partial_wave (paths.ours), " if report.get("partial_wave") else "")
                + "decode (paths.ours_graph_replay), k_grouped (paths.ours_bf16)",
                "method": f"{settings['timer']} around each call, {settings['warmup']} warm-up calls, median of "
                f"{settings['reps']} timed calls (moe_hal.timing.time_calls)",
                "device_statement": f"{report['device']['seen']}; nvidia-smi (driver, SM and memory clocks at the "
                f"start): {report['device'].get('nvidia_smi', '?')}; "
                f"torch {versions['torch']}, Triton {versions.get('triton', '?')}; run {report['date']}",
                "cache_state": "cold",
                "cache_evidence": f"the timed calls rotate over input copies so that {settings['l2_factor']} x the L2 "
                f"({settings['l2_bytes']} bytes) pass between two uses of one copy (gpu_check.py copies_for)",
            }
        },
        "impls": {
            "moe_hal_triton": {
                "source": "backends/cuda/moe_hal_cuda/configs.py at the run's commit: HEIGHTS['k_grouped'] (64, 128) "
                "and the 16-bit BLOCK_N of those heights in TABLE (128, 256); the K-grouped rows of the report "
                "do not record the advisor's tile, so the fastest is assumed",
                "block_m": {"k_grouped": [64, 128]},
                "block_n": [128, 256],
            }
        },
        "cases": cases_of(report, source, device),
    }
    header = (
        "# Written by backends/cuda/scripts/gpu_check_cases.py from a committed gpu_check.py report;\n"
        "# rerun the script rather than editing by hand. Measured by this project (not published elsewhere).\n"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(header + yaml.dump(data, Dumper=_Dumper, sort_keys=False, width=120))
    print(f"gpu_check_cases: {len(data['cases'])} cases from {args.report} -> {args.out}")
    return 0


class _Dumper(yaml.SafeDumper):
    """Lists of numbers inline (a case's counts on a line or two), the rest as blocks, no anchors: the
    cases share count lists, which YAML would otherwise write as aliases."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


_Dumper.add_representer(
    list,
    lambda dumper, data: dumper.represent_sequence(
        "tag:yaml.org,2002:seq", data, flow_style=not any(isinstance(v, (dict, list)) for v in data)
    ),
)


def report_path(path: Path) -> str:
    """``path`` relative to the repository root when it lies inside it (as the set records it)."""
    root = Path(__file__).resolve().parents[3]
    try:
        return str(path.resolve().relative_to(root))
    except ValueError:
        return str(path)


if __name__ == "__main__":
    raise SystemExit(main())
