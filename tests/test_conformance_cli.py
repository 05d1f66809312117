"""`moe-hal conformance` subcommands and the pytest plugin, end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from moe_hal.cli import main


def _run(*argv: str) -> int:
    return main(["conformance", *argv])


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    out = tmp_path_factory.mktemp("conformance")
    paths = {}
    for backend in ("reference", "fake_vendor"):
        report, junit = out / f"{backend}.json", out / f"{backend}.xml"
        rc = _run(
            "run",
            "--backend",
            backend,
            "--tier",
            "smoke",
            "--report",
            str(report),
            "--junit",
            str(junit),
            "--no-progress",
        )
        paths[backend] = (rc, report, junit)
    return paths


def test_run_writes_a_consistent_report_and_junit(reports, capsys):
    rc, report, junit = reports["reference"]
    assert rc == 0
    data = json.loads(report.read_text())
    assert data["verdict"] == "conformant" and data["runs"][0]["backend"]["name"] == "reference"
    root = ET.parse(junit).getroot()
    assert int(root.get("tests")) == len(data["runs"][0]["cases"]) and root.get("failures") == "0"
    assert _run("verify", str(report), "--against-installed") == 0
    assert "consistent" in capsys.readouterr().out


def test_compare_two_backends(reports, capsys):
    _, a, _ = reports["reference"]
    rc_b, b, _ = reports["fake_vendor"]
    if json.loads(b.read_text())["runs"][0]["available"] is False:
        pytest.skip("the fake vendor plugin is not installed")
    assert rc_b == 0
    capsys.readouterr()
    rc = _run("compare", str(a), str(b), "--json")
    out = json.loads(capsys.readouterr().out)
    (comp,) = out
    assert comp["backend_a"] == "reference" and comp["backend_b"] == "fake_vendor"
    # The fake vendor declares no fp8: those cases turn from pass to not_applicable (not a regression).
    changed = {c["case"]: (c["status_a"], c["status_b"]) for c in comp["cases"]}
    assert changed["contiguous/fp8_ue8m0/kblock_scales@1 [direct]"] == ("pass", "not_applicable")
    assert rc == 0 and comp["regressions"] == 0
    assert _run("compare", str(a), str(b)) == 0
    assert "case(s) differ" in capsys.readouterr().out


def test_verify_fails_on_an_inconsistent_report(reports, tmp_path, capsys):
    _, report, _ = reports["reference"]
    data = json.loads(report.read_text())
    data["runs"][0]["summary"]["verdict"] = "conformant with waivers"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    assert _run("verify", str(bad)) == 1
    assert "verdict" in capsys.readouterr().out


def test_list_and_errors(capsys):
    assert _run("list", "--tier", "smoke", "--json") == 0
    listed = json.loads(capsys.readouterr().out)
    assert len(listed["cases"]) == 10 and all(c["tier"] == "smoke" for c in listed["cases"])
    assert _run("list", "--tier", "sweep", "--json") == 0
    assert all(c["id"].startswith("sweep/") for c in json.loads(capsys.readouterr().out)["cases"])
    assert _run("run", "--backend", "reference", "--tier", "nightly", "--no-progress") == 2
    assert _run("run", "--backend", "no_such_backend", "--tier", "smoke", "--no-progress") == 1
    assert "unavailable" in capsys.readouterr().out


def test_sweep_tier_runs_generated_cases(capsys):
    assert (
        _run("run", "--backend", "reference", "--tier", "sweep", "--sweep-count", "6", "--json", "--no-progress") == 0
    )
    data = json.loads(capsys.readouterr().out)
    ids = {c["id"] for c in data["runs"][0]["cases"]}
    assert len(ids) == 6 and all(i.startswith("sweep/") for i in ids)


def test_regen_check_subset(capsys):
    assert _run("regen", "--check", "--case", "layout_indices/*", "--case", "masked/bf16/mixed@1") == 0
    assert "0 differ" in capsys.readouterr().out


def _pytest(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "moe_hal.conformance.plugin",
            "--pyargs",
            "moe_hal.conformance",
            "-q",
            "-p",
            "no:cacheprovider",
            *args,
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_pytest_plugin_runs_the_suite_for_a_vendor(tmp_path):
    report = tmp_path / "out" / "report.json"
    proc = _pytest(
        tmp_path,
        "--moe-backend",
        "reference",
        "--moe-tier",
        "smoke",
        "--moe-report",
        str(report),
        "--junitxml",
        str(tmp_path / "junit.xml"),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "passed" in proc.stdout
    data = json.loads(report.read_text())
    assert data["runs"][0]["summary"]["verdict"] == "conformant"
    assert main(["conformance", "verify", str(report)]) == 0
    names = {tc.get("name") for tc in ET.parse(tmp_path / "junit.xml").getroot().iter("testcase")}
    assert "test_case[contiguous/bf16/seed32_div16@1:direct]" in names


def test_pytest_plugin_reports_an_unavailable_backend(tmp_path):
    proc = _pytest(tmp_path, "--moe-backend", "no_such_backend", "--moe-tier", "smoke")
    assert proc.returncode == 1
    assert "cannot run here" in proc.stdout and "unknown_backend" in proc.stdout


def test_pytest_plugin_skips_when_no_backend_is_configured(tmp_path):
    proc = _pytest(tmp_path, "-rs")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "no backend configured" in proc.stdout and "skipped" in proc.stdout and "error" not in proc.stdout


def test_pytest_plugin_reads_its_ini_settings_and_reports_waived_passes(tmp_path):
    # The two files a vendor adds (docs/conformance.md): pytest.ini and an expected-failure manifest
    # that waives a case the backend passes.
    (tmp_path / "ci").mkdir()
    (tmp_path / "ci" / "xfails.yaml").write_text(
        'entries:\n  - id: "layout_indices/*"\n    kind: bug\n    reason: "believed broken"\n'
    )
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\nmoe_backend = reference\nmoe_tier = smoke\nmoe_case =\n    layout_indices/*\n"
        "moe_manifest =\n    ci/xfails.yaml\nmoe_report = out/report.json\n"
    )
    proc = _pytest(tmp_path, "-rX")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "xpassed" in proc.stdout and "passes now: remove the waiver" in proc.stdout
    assert "moe_hal conformance: waived cases" in proc.stdout
    data = json.loads((tmp_path / "out" / "report.json").read_text())
    assert data["runs"][0]["backend"]["name"] == "reference"  # the ini backend
    assert {c["status"] for c in data["runs"][0]["cases"] if c["id"].startswith("layout_indices/")} == {"xpass"}
