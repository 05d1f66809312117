"""Tests of ``moe-hal hw`` (moe_hal/cli/hw.py) and of bench/calibrate.py on the CPU."""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import pytest
import yaml

from moe_hal import hwdb, plugins
from moe_hal.cli import hw

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def clean_db(monkeypatch):
    monkeypatch.delenv("MOE_HAL_HWDB", raising=False)
    hwdb.reload(forget_overlays=True)
    yield
    monkeypatch.undo()
    plugins.reload()  # forgets our overlays and lets the plugin host register its own again


def run(argv, capsys):
    parser = argparse.ArgumentParser(prog="moe-hal")
    hw.register(parser.add_subparsers())
    args = parser.parse_args(["hw", *argv])
    rc = args.func(args)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_list_json(capsys):
    rc, out, _ = run(["list", "--json"], capsys)
    assert rc == 0
    rows = json.loads(out)
    assert [r["id"] for r in rows] == sorted(r["id"] for r in rows)
    by_id = {r["id"]: r for r in rows}
    assert {"nvidia-h200-sxm", "huawei-ascend-910b2", "cpu-generic"} <= set(by_id)
    assert by_id["nvidia-h100-sxm"]["peak_flops"]["bf16"] == pytest.approx(1979e12 / 2)
    assert by_id["cpu-generic"]["features"] == ["cpu"]


def test_list_table(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")  # rich folds cells to the terminal width
    rc, out, _ = run(["list"], capsys)
    assert rc == 0 and "nvidia-b200" in out and "huawei-ascend-950pr" in out


def test_show_json(capsys):
    rc, out, _ = run(["show", "h200", "--json"], capsys)
    assert rc == 0
    data = json.loads(out)
    assert data["id"] == "nvidia-h200-sxm"
    assert data["entry"]["memory"]["bandwidth"] == {
        "value": 4.8,
        "unit": "TB/s",
        "basis": "secondary",
        "source": data["entry"]["memory"]["bandwidth"]["source"],
    }
    assert data["derived"]["num_cores"] == 132
    assert data["derived"]["peak_flops"]["bf16"] == pytest.approx(hwdb.get("h200").peak_flops("bf16"))


def test_show_table_lists_basis_and_source(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")
    rc, out, _ = run(["show", "nvidia-h100-sxm"], capsys)
    assert rc == 0
    assert "peak_dense.bf16" in out and "derived" in out and "hpctech" in out


def test_show_unknown_id(capsys):
    rc, out, err = run(["show", "nvidia-h900", "--json"], capsys)
    assert rc == 2 and out == ""
    assert "nvidia-h900" in err and "nvidia-h200-sxm" in err


def test_show_reports_a_broken_overlay(tmp_path, monkeypatch, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("id: [unclosed\n", encoding="utf-8")
    monkeypatch.setenv("MOE_HAL_HWDB", str(bad))
    rc, _, err = run(["list"], capsys)
    assert rc == 1 and "bad.yaml" in err and "malformed YAML" in err


def test_match_json_this_machine(capsys):
    rc, out, _ = run(["match", "--json"], capsys)
    assert rc == 0
    results = json.loads(out)
    assert results[0]["device"] == "cpu" and results[0]["id"] == "cpu-generic" and results[0]["reason"] is None


def test_match_json_named_devices(capsys):
    rc, out, _ = run(["match", "--device", "cpu", "--device", "mps", "--json"], capsys)
    assert rc == 0
    cpu, mps = json.loads(out)
    assert cpu["id"] == "cpu-generic"
    assert mps == {
        "device": "mps",
        "id": None,
        "seen": "mps",
        "reason": "the hardware DB has no entries for device type 'mps': no installed plugin probes it",
    }


def test_match_table(capsys):
    rc, out, _ = run(["match"], capsys)
    assert rc == 0 and "cpu-generic" in out


def load_calibrate():
    spec = importlib.util.spec_from_file_location("calibrate", REPO / "bench" / "calibrate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_calibrate_writes_a_valid_measured_overlay(tmp_path, monkeypatch, capsys):
    # Runs the committed script on this CPU with tiny sizes, into a temporary directory: it checks
    # the script end to end; the numbers it measures here are not kept.
    calibrate = load_calibrate()
    out = tmp_path / "measured" / "cpu.yaml"
    rc = calibrate.main(
        [
            "--device",
            "cpu",
            "--dtypes",
            "fp32,bf16,fp8",
            "--sizes",
            "64,128",
            "--bytes",
            "4e6",
            "--warmup",
            "1",
            "--repeat",
            "3",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    err = capsys.readouterr().err
    assert "fp8 matmul not measured" in err  # CUDA-only dtypes are reported, not faked
    doc = yaml.safe_load(out.read_text(encoding="utf-8"))
    assert doc["overlay_of"] == "cpu-generic"
    assert set(doc["measured"]["matmul"]) == {"fp32", "bf16"}
    for node in [
        *doc["measured"]["matmul"].values(),
        doc["measured"]["read_bandwidth"],
        doc["measured"]["copy_bandwidth"],
    ]:
        assert node["basis"] == "measured" and node["value"] > 0
        assert node["date"] and node["method"] and node["tool"].startswith("bench/calibrate.py")
    monkeypatch.setenv("MOE_HAL_HWDB", str(out.parent))
    cpu = hwdb.get("cpu-generic")
    assert cpu.peak_flops("bf16") == pytest.approx(doc["measured"]["matmul"]["bf16"]["value"] * 1e12)
    assert cpu.mem_bandwidth() == pytest.approx(doc["measured"]["read_bandwidth"]["value"] * 1e9)
    assert list(tmp_path.joinpath("measured").iterdir()) == [out]  # no temporary file left behind


def test_calibrate_refuses_an_unknown_device_without_hw(monkeypatch, capsys):
    calibrate = load_calibrate()
    monkeypatch.setattr(calibrate, "match_device", lambda device: hwdb.Match(None, "Mystery GPU", "no entry"))
    assert calibrate.main(["--device", "cpu", "--dry-run"]) == 2
    assert "Mystery GPU" in capsys.readouterr().err


def test_measured_dir_holds_no_invented_overlay():
    # Only bench/calibrate.py (measured, on real hardware) and `moe-hal model calibrate` (fitted to
    # the published measurements) write here.
    for path in (REPO / "hwdb" / "measured").glob("*.yaml"):
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        assert "overlay_of" in doc
        matmul = doc.get("measured", {}).get("matmul", {})
        assert all(n["tool"].startswith("bench/calibrate.py") for n in matmul.values())
        for impl in doc.get("achieved", {}).values():
            for name, node in impl.items():
                if name == "typical":  # a flag, not a figure
                    continue
                leaves = [leaf for fam in node.values() for leaf in fam.values()] if name == "compute" else [node]
                assert all("moe-hal model calibrate" in leaf["tool"] for leaf in leaves), path
