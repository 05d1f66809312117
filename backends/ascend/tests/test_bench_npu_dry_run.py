"""scripts/bench_npu.py on the torch_npu emulator (``--dry-run``): every case agrees with the
per-expert loop peer and is timed against it (and against the bare op where one exists), so the
script a user runs on an NPU has been run end to end once."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_npu.py"


def test_dry_run_checks_and_times_every_case(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_npu", SCRIPT)
    bench_npu = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_npu)
    out = tmp_path / "bench.json"

    assert bench_npu.main(["--dry-run", "--out", str(out)]) == 0

    report = json.loads(out.read_text())
    assert report["mode"] == "emulated"
    assert [r["case"] for r in report["results"]] == [c[0] for c in bench_npu.DRY_RUN_CASES]
    for r in report["results"]:
        assert r["ok"], r
        assert r["calc_diff_vs_loop"] < 1e-5
        expected = {"moe_hal", "loop"} | ({"gmm_op"} if r["op"] != "masked" else set())
        assert set(r["ms"]) == expected
        assert sum(r["counts"]) == r["tokens"]
