"""Tests of the validation harness ``moe-hal bench`` (moe_hal/cli/bench.py, with the sweep of
moe_hal/workloads.py and the model comparison of moe_hal/perf_validation.py) on the CPU.

They check that the harness runs and reports consistently; timings themselves are never asserted.
"""

from __future__ import annotations

import argparse
import json

import pytest

from moe_hal import perf, perf_validation, workloads
from moe_hal.cli import bench


def run(argv, capsys):
    parser = argparse.ArgumentParser(prog="moe-hal")
    bench.register(parser.add_subparsers())
    args = parser.parse_args(["bench", *argv])
    rc = args.func(args)
    return rc, capsys.readouterr().out


def test_full_sweep_covers_the_issue():
    cases = workloads.sweep(full=True, dtype="bf16", fp8=True)
    assert len(cases) >= 20
    names = {c.name for c in cases}
    assert len(names) == len(cases)
    dists = {c.dist for c in cases}
    assert {"uniform", "zipf:0.8", "zipf:1.2", "seed"} <= dists
    assert any(c.counts == list(perf.SEED_COUNTS) for c in cases)
    shapes = {(c.n, c.k) for c in cases if c.op != "k_grouped"}
    assert {(4096, 7168), (7168, 2048), (1536, 2048), (2048, 768), (3072, 4096), (4096, 1536)} <= shapes
    decode = [c for c in cases if c.op == "masked"]
    assert decode and all(max(c.counts) <= c.max_m for c in decode)
    assert {round(sum(c.counts) / len(c.counts)) for c in decode} >= {4, 16, 64}
    assert any(c.op == "k_grouped" for c in cases) and any(c.dtype == "fp8" for c in cases)
    assert all(c.dtype == "bf16" for c in cases if "fp8" not in c.name)


def test_quick_sweep_is_small():
    cases = workloads.sweep(full=False, dtype="fp32", fp8=False)
    assert {c.op for c in cases} == {"contiguous", "masked", "k_grouped"}
    assert max(len(c.counts) * c.n * (c.k or c.m) for c in cases) <= 32 * 256 * 512


def test_cpu_run_reports_model_errors(capsys, tmp_path):
    out_file = tmp_path / "res" / "bench.json"
    rc, out = run(
        ["--quick", "--model", "--only", "small-", "--warmup", "1", "--reps", "3", "--json", "--out", str(out_file)],
        capsys,
    )
    assert rc == 0
    report = json.loads(out)
    assert json.loads(out_file.read_text()) == report
    assert report["device"] == "cpu" and report["sweep"] == "quick"
    assert report["hardware"]["db_entry"] == "cpu-generic"
    # cpu-generic has no figures: they are measured here, and the report says so
    assert set(report["hardware"]["measured_here"]) >= {"bandwidth", "peak.fp32"}
    assert report["notes"]
    ran = [c for c in report["cases"] if "error" not in c]
    assert len(ran) == len(report["cases"]) >= 6
    errors = []
    for c in ran:
        t = c["times"]["moe_hal"]["median"]
        assert t > 0 and c["backend"] == "torch"
        assert c["max_rel_diff_vs_loop"] < 1e-4  # the timed calls computed the same thing
        m = c["model"]
        assert m["error_predicted"] == pytest.approx(m["t_predicted"] / t - 1)
        assert m["error_roofline"] == pytest.approx(m["t_roofline"] / t - 1)
        assert m["t_predicted"] >= m["t_roofline"] * (1 - 1e-12)
        errors.append(m["error_predicted"])
    s = report["summary"]["model"]
    assert s["n"] == len(ran)
    assert s["median_abs_error"] == pytest.approx(
        sorted(abs(e) for e in errors)[len(errors) // 2]
        if len(errors) % 2
        else sum(sorted(abs(e) for e in errors)[len(errors) // 2 - 1 : len(errors) // 2 + 1]) / 2
    )
    assert s["worst_abs_error"] == pytest.approx(max(abs(e) for e in errors))


def test_calibrated_run_and_table(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    rc, out = run(
        ["--quick", "--model", "--calibrate", "--only", "small-wgrad", "--warmup", "1", "--reps", "3", "--no-peers"],
        capsys,
    )
    assert rc == 0
    assert "model_calibrated" in out and "small-wgrad" in out


def test_unsupported_case_is_reported_not_raised(capsys):
    rc, out = run(
        [
            "--quick",
            "--only",
            "small-fp8",
            "--fp8",
            "--backend",
            "no-such-backend",
            "--json",
            "--warmup",
            "1",
            "--reps",
            "2",
        ],
        capsys,
    )
    report = json.loads(out)
    assert rc == 1 and "error" in report["cases"][0] and "no-such-backend" in report["cases"][0]["error"]


def test_error_summary_by_hand():
    s = perf_validation.error_summary([0.1, -0.3, 0.05, 0.2])
    assert s["n"] == 4
    assert s["median_abs_error"] == pytest.approx((0.1 + 0.2) / 2)
    assert s["worst_abs_error"] == pytest.approx(0.3)
    assert s["mean_error"] == pytest.approx(0.0125)
    assert perf_validation.error_summary([]) == {"n": 0}


def test_backend_declarations_reach_the_model():
    from moe_hal.backend import PerfModel

    class Spec:
        perf_model = PerfModel(tiles=[[64, 256]], masked_computes_max_m=True)

    class Plain:
        perf_model = PerfModel()

    opts = perf_validation.model_options(Spec())
    assert opts["tiles"] == [(64, 256)] and opts["masked_computes_max_m"] and not opts["streams_all_experts"]
    assert perf_validation.model_options(Plain())["tiles"] == list(perf.DEFAULT_TILES)
    hw = perf.Hardware("x", 132, {"bf16": 788e12}, 4.3e12, mma_min_m=64)
    case = workloads.Case("d", "t", "masked", "bf16", 4096, 7168, [3, 0, 5], max_m=64)
    full = perf_validation.predict(case, hw, opts)
    assert full.tile == (64, 256) and full.counts == (64, 64, 64)
    sparse = perf_validation.predict(case, hw, perf_validation.model_options(Plain()))
    assert sparse.counts == (3, 0, 5)


def test_failures_are_recorded_and_the_run_goes_on(capsys, tmp_path, monkeypatch):
    def broken_calibration(*args, **kwargs):
        raise RuntimeError("calibration exploded")

    monkeypatch.setattr(perf_validation, "calibrate", broken_calibration)
    real_add_model = perf_validation.add_model

    def add_model(row, case, *rest):
        if case.op == "masked":
            raise ValueError("model exploded")
        return real_add_model(row, case, *rest)

    monkeypatch.setattr(perf_validation, "add_model", add_model)
    monkeypatch.setenv("COLUMNS", "300")
    out_file = tmp_path / "r.json"
    rc, out = run(
        [
            "--quick",
            "--model",
            "--calibrate",
            "--only",
            "small-",
            "--warmup",
            "1",
            "--reps",
            "2",
            "--no-peers",
            "--out",
            str(out_file),
        ],
        capsys,
    )
    assert rc == 0
    report = json.loads(out_file.read_text())
    assert report["hardware"]["calibration"]["error"] == "RuntimeError: calibration exploded"
    assert "model_calibrated" not in report["summary"]
    masked = [c for c in report["cases"] if c["op"] == "masked"]
    assert masked and all(c["model_error"] == "ValueError: model exploded" for c in masked)
    assert report["summary"]["model"]["n"] == len(report["cases"]) - len(masked)
    assert "model exploded" in out  # the table shows it
