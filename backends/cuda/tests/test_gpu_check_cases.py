"""backends/cuda/scripts/gpu_check_cases.py: a committed GPU report becomes measured cases in the
published set's schema, each timing carried over exactly, and a CPU smoke report is refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "backends" / "cuda" / "scripts" / "gpu_check_cases.py"
REPORT = ROOT / "bench" / "results" / "gpu_check_h200.json"
COMMIT = "b616cb5502be8f93c4a392e8cef12ab75d7f1015"


def convert(report: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(report), "--commit", COMMIT, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_committed_h200_report_becomes_valid_cases_with_its_timings(tmp_path):
    out = tmp_path / "cases.yaml"
    result = convert(REPORT, out)
    assert result.returncode == 0, result.stderr
    data = yaml.safe_load(out.read_text())
    schema = json.loads((ROOT / "bench" / "published" / "schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(data)
    (source,) = data["sources"].values()
    assert source["result"] == "bench/results/gpu_check_h200.json" and source["commit"] == COMMIT
    ids = [c["id"] for c in data["cases"]]
    assert len(ids) == len(set(ids))
    report = json.loads(REPORT.read_text())
    # every fixed tile of every sweep, and torch grouped_mm, of every contiguous row
    for row in report["timings"]:
        for sweep, dtype in (("tile_sweep", "bf16"), ("fp8_tile_sweep", "fp8")):
            for tile, timing in row[sweep].items():
                case = next(
                    c
                    for c in data["cases"]
                    if c["impl"] == "moe_hal_triton"
                    and c["layout"] == "contiguous"
                    and c["dtype"] == dtype
                    and c.get("tile") == [int(v) for v in tile.split("x")]
                    and c["counts"] == row["counts"]
                    and (c["n"], c["k"]) == (row["N"], row["K"])
                )
                assert case["measured"]["time_us"] == pytest.approx(timing["median_ms"] * 1e3, abs=1e-3)
    torch_cases = [c for c in data["cases"] if c["impl"] == "torch_grouped_mm"]
    assert len(torch_cases) == len(report["timings"])
    # the committed cases file is this conversion of the committed report
    committed = yaml.safe_load((ROOT / "bench" / "own_measurements" / "gpu_check_h200.yaml").read_text())
    assert committed == data


def test_a_cpu_smoke_report_is_refused(tmp_path):
    smoke = json.loads(REPORT.read_text())
    smoke["mode"] = "cpu-smoke (Triton interpreter)"
    path = tmp_path / "smoke.json"
    path.write_text(json.dumps(smoke))
    result = convert(path, tmp_path / "cases.yaml")
    assert result.returncode != 0 and "not a GPU run" in result.stderr
    assert not (tmp_path / "cases.yaml").exists()


def test_a_k_grouped_row_that_records_its_tile_keeps_it(tmp_path):
    # gpu_check.py now launches our K-grouped kernel at the plan's tile and records it (the path
    # table may route the call itself to torch); the case must carry that tile, not the fastest
    report = json.loads(REPORT.read_text())
    for row in report["k_grouped"]:
        row["tile"], row["routed_to"] = [128, 256], "torch"
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    out = tmp_path / "cases.yaml"
    assert convert(path, out).returncode == 0
    k_grouped = [c for c in yaml.safe_load(out.read_text())["cases"] if c["layout"] == "k_grouped"]
    assert len(k_grouped) == len(report["k_grouped"]) and all(c["tile"] == [128, 256] for c in k_grouped)


def test_partial_wave_rows_become_one_group_cases_at_their_tile(tmp_path):
    # the committed H200 reports predate the section: give one a row as gpu_check.py writes it
    report = json.loads(REPORT.read_text())
    timing = {"median_ms": 0.0412, "min_ms": 0.0405, "host_ms": 0.01, "reps": 10, "copies": 3}
    report["partial_wave"] = [
        {"case": "partial_wave/fp8_e4m3/M512-N1024-K8192", "M": 512, "N": 1024, "K": 8192, "dtype": "fp8",
         "tile": [64, 128], "tiles": 64, "sms": 132, "paths": {"ours": timing}},
        {"case": "partial_wave/bf16/M512-N256-K8192", "error": "RuntimeError: failed", "paths": {}},
    ]  # fmt: skip
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    out = tmp_path / "cases.yaml"
    assert convert(path, out).returncode == 0
    data = yaml.safe_load(out.read_text())
    schema = json.loads((ROOT / "bench" / "published" / "schema.json").read_text())
    (source,) = data["sources"].values()
    assert "partial_wave" in source["location"]
    source["result"] = "bench/results/gpu_check_h200.json"  # the schema wants a committed result; this one is in tmp
    jsonschema.Draft202012Validator(schema).validate(data)
    (case,) = [c for c in data["cases"] if "partial-wave" in c["id"]]  # the failed row is left out
    shape = (case["layout"], case["groups"], case["counts"], case["n"], case["k"])
    assert shape == ("contiguous", 1, [512], 1024, 8192)
    assert (case["dtype"], case["tile"], case["measured"]["time_us"]) == ("fp8", [64, 128], 41.2)
