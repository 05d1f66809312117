"""The recorded-call replay, the rule table in the docs, SoC recognition against torch_npu's
strings, and run_on_npu.sh's behaviour when things fail (all on the CPU; no NPU)."""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
from pathlib import Path

import pytest
import torch

import moe_hal
from moe_hal import hwdb
from moe_hal_ascend import cann_rules, emulator, replay, soc

HERE = Path(__file__).resolve().parent
DOC = HERE.parent / "docs" / "ascend-backend.md"
SCRIPT = HERE.parent / "scripts" / "run_on_npu.sh"

#: Every Ascend910*/950* SoC name compiled into libtorch_npu.so of the torch_npu 2.13.0 wheel
#: (`strings`), excluding the legacy 910A/910B/Pro/Premium parts (no npu_grouped_matmul).
TORCH_NPU_2_13_SOCS = (
    "Ascend910B1",
    "Ascend910B2",
    "Ascend910B2C",
    "Ascend910B3",
    "Ascend910B4",
    "Ascend910B4-1",
    "Ascend910_9362",
    "Ascend910_9363",
    "Ascend910_9372",
    "Ascend910_9381",
    "Ascend910_9382",
    "Ascend910_9391",
    "Ascend910_9392",
    "Ascend950DT_950x",
    "Ascend950DT_950y",
    "Ascend950DT_9571",
    "Ascend950DT_9572",
    "Ascend950DT_9573",
    "Ascend950DT_9574",
    "Ascend950DT_9575",
    "Ascend950DT_9576",
    "Ascend950DT_9577",
    "Ascend950DT_9578",
    "Ascend950DT_9581",
    "Ascend950DT_9582",
    "Ascend950DT_9582x",
    "Ascend950DT_9583",
    "Ascend950DT_9584",
    "Ascend950DT_9585",
    "Ascend950DT_9586",
    "Ascend950DT_9587",
    "Ascend950DT_9588",
    "Ascend950DT_9591",
    "Ascend950DT_9592",
    "Ascend950DT_9595",
    "Ascend950DT_9596",
    "Ascend950DT_95A1",
    "Ascend950DT_95A2",
    "Ascend950PR_950z",
    "Ascend950PR_9579",
    "Ascend950PR_957b",
    "Ascend950PR_957bx",
    "Ascend950PR_957c",
    "Ascend950PR_957d",
    "Ascend950PR_9589",
    "Ascend950PR_958b",
    "Ascend950PR_9599",
)


@pytest.mark.parametrize("name", TORCH_NPU_2_13_SOCS)
def test_every_torch_npu_soc_string_is_recognised_with_its_version(name):
    match = hwdb.match_npu(name, soc.soc_version(name))
    assert match.id is not None, match.reason
    family = "ascend_a5" if name.startswith("Ascend950") else "ascend_a3" if "_93" in name else "ascend_a2"
    assert family in match.features


@pytest.mark.parametrize(
    "name, version, entry",
    [
        ("Ascend910B1", 220, "huawei-ascend-910b1"),
        ("Ascend910B2C", 222, "huawei-ascend-910b2c"),
        ("Ascend910B4-1", 225, "huawei-ascend-910b4-1"),
        ("Ascend910B4_1", 225, "huawei-ascend-910b4-1"),
        ("Ascend910B4", 224, "huawei-ascend-910b4"),
    ],
)
def test_new_a2_socs_match_by_name_and_version(name, version, entry):
    assert hwdb.match_npu(name, version).id == entry
    assert hwdb.match_npu(name, version + 1).id is None  # a contradicting version is refused


def test_an_unknown_spelling_is_recognised_by_soc_version():
    match = hwdb.match_npu("Ascend910B2c-rev2", 222)
    assert match.id == "huawei-ascend-910b2c" and "soc_version" in match.seen
    assert hwdb.match_npu("Ascend950XX_0000", 260).id is None  # 260 is every 950: ambiguous, not guessed


def test_every_rule_is_in_the_docs_table_with_its_source():
    text = DOC.read_text()
    for rule in cann_rules.RULES.values():
        row = next((line for line in text.splitlines() if line.startswith(f"| `{rule.id}` |")), None)
        assert row is not None, f"rule {rule.id} missing from the table in {DOC.name}"
        assert rule.source in row, f"rule {rule.id}: source differs from cann_rules"


def test_recorded_calls_replay_against_the_rule_table(gen, emulate):
    emulate("Ascend910B1")
    lay = moe_hal.ContiguousLayout.from_counts([3, 0, 5], alignment=1)
    a, b = torch.randn(lay.num_rows, 16, generator=gen).bfloat16(), torch.randn(3, 8, 16, generator=gen).bfloat16()
    with emulator.recording() as calls:
        moe_hal.grouped_gemm(a, b, lay, backend="ascend")
    assert len(calls) == 1 and calls[0]["accepted"] and calls[0]["soc"] == "Ascend910B1"
    report = {"runs": [], "calls": json.loads(json.dumps(calls))}  # through JSON, as on disk
    assert replay.check(report) == []
    assert report["calls"][0]["weight"][0]["stride"] == [128, 1, 16]  # the transposed view, no copy
    tampered = dict(calls[0], split_item=0)
    problems = replay.check({"runs": [], "calls": [tampered]})
    assert len(problems) == 1 and "split_item_single_weight" in problems[0]


def _run_script(tmp_path: Path, env_extra: dict) -> tuple[subprocess.CompletedProcess, Path]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ASCEND", "MOE_HAL_ASCEND"))}
    env.update(HOME=str(tmp_path / "home"), **env_extra)
    out = tmp_path / "bundle"
    done = subprocess.run(
        ["bash", str(SCRIPT), str(out)], check=False, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    return done, out


def test_run_on_npu_without_cann_still_writes_the_bundle(tmp_path):
    done, out = _run_script(tmp_path, {})
    assert done.returncode != 0
    assert "CANN not found" in done.stderr + done.stdout
    with tarfile.open(f"{out}.tar.gz") as tar:
        assert "bundle/environment.json" in tar.getnames()


def test_run_on_npu_finds_set_env_and_keeps_the_bundle_when_torch_npu_fails(tmp_path):
    toolkit = tmp_path / "home" / "Ascend" / "ascend-toolkit" / "latest"
    toolkit.mkdir(parents=True)
    (toolkit / "set_env.sh").write_text(f"export ASCEND_HOME_PATH={toolkit}\nexport LD_LIBRARY_PATH=/nonexistent\n")
    fake = tmp_path / "fake"
    (fake / "torch_npu").mkdir(parents=True)
    (fake / "torch_npu" / "__init__.py").write_text("raise OSError('libhccl.so: cannot open shared object file')\n")
    done, out = _run_script(
        tmp_path,
        {
            "TORCH_DEVICE_BACKEND_AUTOLOAD": "0",
            "PYTHONPATH": os.pathsep.join([str(fake), os.environ.get("PYTHONPATH", "")]),
        },
    )
    assert done.returncode != 0
    assert f"sourcing {toolkit}/set_env.sh" in done.stdout
    with tarfile.open(f"{out}.tar.gz") as tar:
        names = tar.getnames()
        assert "bundle/environment.json" in names and "bundle/steps.log" in names
        report = json.load(tar.extractfile("bundle/environment.json"))
    assert "libhccl.so" in report["error"]
