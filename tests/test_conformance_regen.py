"""The stored golden data is exactly what `regen` produces, and tampering is detected."""

from __future__ import annotations

import shutil

import pytest

from moe_hal.conformance import regen, suite
from moe_hal.errors import ConformanceError


def test_regenerating_reproduces_every_stored_hash():
    drifts = regen.check()
    assert drifts == [], "\n".join(map(str, drifts))


@pytest.fixture
def suite_copy(tmp_path):
    root = suite.default_root()
    (tmp_path / "data").mkdir()
    (tmp_path / "manifest.yaml").write_text((root / "manifest.yaml").read_text())
    for case in suite.load().cases:
        (tmp_path / case.file).write_bytes((root / case.file).read_bytes())
    return tmp_path


def test_regenerate_writes_the_same_bytes_and_hashes(suite_copy):
    text = (suite_copy / "manifest.yaml").read_text()
    for case in suite.load(suite_copy).cases[:3]:
        (suite_copy / case.file).unlink()
    done = regen.regenerate(
        suite_copy, ["contiguous/bf16/seed32_div16@1", "contiguous/fp16/seed32*", "contiguous/fp32/basic@1"]
    )
    assert [r.case.id for r in done] == [c.id for c in suite.load(suite_copy).cases[:3]]
    assert (suite_copy / "manifest.yaml").read_text() == text
    fresh = suite.load(suite_copy)
    for case in fresh.cases[:3]:
        assert (suite_copy / case.file).read_bytes() == (suite.default_root() / case.file).read_bytes()


def test_tampered_data_is_refused(suite_copy):
    case = suite.load(suite_copy).case("masked/bf16/mixed@1")
    blob = bytearray((suite_copy / case.file).read_bytes())
    blob[-1] ^= 0x01
    (suite_copy / case.file).write_bytes(bytes(blob))
    with pytest.raises(ConformanceError, match="sha256"):
        suite.load(suite_copy).data_bytes(case)
    (drift,) = regen.check(suite.load(suite_copy), [case.id], cross_check=False)
    assert "golden.out" in drift.detail or "tensors differ" in drift.detail


def test_changed_generator_entry_is_reported_as_drift(suite_copy):
    path = suite_copy / "manifest.yaml"
    path.write_text(path.read_text().replace("generator: {seed: 1003}", "generator: {seed: 1004}"))
    (drift,) = regen.check(suite.load(suite_copy), ["contiguous/fp32/basic@1"], cross_check=False)
    assert drift.case.id == "contiguous/fp32/basic@1" and "a" in drift.detail


def test_missing_data_file_is_a_clear_error(suite_copy):
    case = suite.load(suite_copy).case("masked/bf16/mixed@1")
    shutil.move(str(suite_copy / case.file), str(suite_copy / "elsewhere"))
    with pytest.raises(ConformanceError, match="missing"):
        suite.load(suite_copy).data_bytes(case)
