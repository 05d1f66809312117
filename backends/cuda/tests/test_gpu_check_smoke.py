"""The GPU check script's CPU smoke run: every section runs (interpreter, tiny shapes) and the
JSON report has the fields the GPU run will fill. The script ships with the plugin in
``backends/cuda/scripts/``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.py"


def test_cpu_smoke_run_writes_a_complete_report(tmp_path):
    out = tmp_path / "gpu_check.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run(
        [sys.executable, "-W", "ignore", str(SCRIPT), "--cpu-smoke", "--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["schema"] == "moe_hal_cuda.gpu_check/1" and report["complete"] is True
    assert report["mode"].startswith("cpu-smoke")
    names = {row["name"] for row in report["correctness"]}
    for op in ("contiguous", "masked", "k_grouped"):
        for fmt in ("fp8-sm90-fp32-scales", "fp8-sm100-ue8m0-scales", "bfloat16", "float16"):
            assert any(n.startswith(op) and n.endswith(fmt) for n in names), (op, fmt)
    assert all(row["passed"] for row in report["correctness"]), [r for r in report["correctness"] if not r["passed"]]
    assert report["timings"] and "ours_bf16" in report["timings"][0]["paths"]
    skipped = {entry["section"] for entry in report["skipped"]}
    for sweep in ("tile_sweep", "fp8_tile_sweep"):  # filled, or skipped for time on a loaded machine
        assert report["timings"][0][sweep] or "tile_sweep" in skipped, sweep
    assert report["decode"] or "decode" in skipped
    if report["l2_state"]:  # every path in every L2 state, with the ratios the section exists for
        row = report["l2_state"][0]
        states = ("warm", "rotate", "write_flush", "read_flush")
        assert {f"{path}/{state}" for path in ("ours_bf16", "ours_fp8", "torch_mm_bf16") for state in states} <= set(
            row["paths"]
        ), row.get("error")
        assert set(row["ratios"]["ours_fp8"]) == {
            "write_flush_over_read_flush",
            "read_flush_over_rotate",
            "rotate_over_warm",
        }
    else:
        assert "l2_state" in skipped
    if report["partial_wave"]:  # per dtype: a fraction of a wave, the full wave it is compared with, two waves
        for dtype in ("bf16", "fp8"):
            rows = [r for r in report["partial_wave"] if r.get("dtype") == dtype]
            assert all("error" not in r for r in rows), rows
            assert [r["tiles_per_sm"] for r in rows] == [0.5, 1.0, 2.0]
            (full,) = [r for r in rows if r["full_wave"]]
            assert full["over_full_wave"] == 1.0 and all(r["model"]["predicted_ms"] > 0 for r in rows)
    else:
        assert "partial_wave" in skipped
    assert (report["k_grouped"] and "ours_bf16" in report["k_grouped"][0]["paths"]) or "k_grouped" in skipped
    assert report["skipped"][0]["section"] == "gpu_only"  # GPU-only checks come first
    assert set(report["targets"]) >= {
        "bf16_contiguous_vs_torch_grouped_mm",
        "fp8_vs_our_bf16_at_large_m",
        "masked_decode_vs_weight_bandwidth_floor",
        "advisor_vs_best_fixed_tile",
        "bf16_contiguous_vs_occupancy_adjusted_roofline",
        "k_grouped_bf16_vs_torch_grouped_mm_2d2d",
    }
    from moe_hal_cuda import paths

    assert paths.parse(report["path_table_suggestion"]) == {}  # a valid table; no peer timed on the CPU


def test_gpu_check_sh_passes_the_check_status_on():
    """gpu_check.sh exits with gpu_check.py's status (non-zero when a check fails)."""
    text = (SCRIPT.parent / "gpu_check.sh").read_text()
    assert "CHECK_STATUS=${PIPESTATUS[0]}" in text and text.rstrip().endswith('exit "$CHECK_STATUS"')
