"""Smoke test: bench/bench_routing.py runs end to end at a tiny size (figures are not checked)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench" / "bench_routing.py"


def test_bench_routing_runs_at_a_tiny_size(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_routing", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "routing.json"
    report = module.main(
        [
            "--tokens",
            "64",
            "--hidden",
            "256",
            "--experts",
            "8",
            "--topk",
            "2",
            "--weight-groups",
            "2",
            "--weight-n",
            "128",
            "--warmup",
            "0",
            "--repeat",
            "1",
            "--json",
            str(out),
            "--markdown",
            str(tmp_path / "routing.md"),
        ]
    )
    assert json.loads(out.read_text())["config"]["tokens"] == 64
    names = {r["name"] for r in report["results"]}
    assert {"copy limit (torch.clone)", "dispatch + combine", "quantize_fp8 1x128 (fp32 scales)"} <= names
    assert all(r["seconds"] > 0 for r in report["results"])
    assert "| dispatch + combine |" in (tmp_path / "routing.md").read_text()
