"""Unit tests of the conformance suite's parts: oracle, generator, tolerances, checks, manifest,
waivers, reports. Expected values are worked out by hand in the comments."""

from __future__ import annotations

import copy
import json
import math
import xml.etree.ElementTree as ET

import numpy as np
import pytest
import torch

from moe_hal.conformance import checks, compare, generate, oracle, report, session, suite, waivers
from moe_hal.conformance.tolerances import ToleranceClass, calc_diff
from moe_hal.conformance.tolerances import compare as compare_values
from moe_hal.errors import ConformanceError

from .seed_histogram import SEED_HISTOGRAM


@pytest.fixture(scope="module")
def the_suite():
    return suite.load()


# -- oracle ---------------------------------------------------------------------------------------------


def test_e4m3_codes_by_hand():
    # 1.0 = 2^(7-7) * (1 + 0/8): exponent field 7, mantissa 0 -> 0b0_0111_000 = 0x38.
    assert oracle.e4m3_decode(np.array([0x38]))[0] == 1.0
    # 448 = 2^(15-7) * (1 + 6/8): 0b0_1111_110 = 0x7E; 0x7F is NaN; 0x01 is the smallest subnormal 2^-9.
    assert oracle.e4m3_decode(np.array([0x7E]))[0] == 448.0
    assert math.isnan(oracle.e4m3_decode(np.array([0x7F]))[0])
    assert oracle.e4m3_decode(np.array([0x01]))[0] == 2.0**-9
    x = np.array([1.0, 1.0625, 1.1875, -0.0, 3.0e-3, 448.0, -448.0], dtype=np.float32)
    # 1.0625 lies half-way between 1.0 (0x38) and 1.125 (0x39): ties go to the even code 0x38.
    # 1.1875 lies half-way between 1.125 (0x39) and 1.25 (0x3A): the even code is 0x3A.
    # -0.0 keeps its sign (0x80). 3e-3 = 1.536 * 2^-9 rounds to the subnormal 2 * 2^-9 (0x02).
    assert oracle.e4m3_encode(x).tolist() == [0x38, 0x38, 0x3A, 0x80, 0x02, 0x7E, 0xFE]


def test_quantize_by_hand():
    # One 1x4 block with amax 2: scale = 2/448; 2 -> 448 (0x7E), 1 -> 224 = 2^7 * 1.75 (0x76), 0 -> 0.
    codes, scale = oracle.quantize(np.array([[2.0, 1.0, 0.0, -2.0]], np.float32), (1, 4), ue8m0=False)
    assert scale.tolist() == [[np.float32(2.0) / np.float32(448.0)]]
    assert codes.tolist() == [[0x7E, 0x76, 0x00, 0xFE]]
    # UE8M0: 2/448 = 0.004464... rounds up to 2^-7 = 0.0078125; 2 / 2^-7 = 256 = 2^8 -> 0b0_1111_000 = 0x78.
    codes, scale = oracle.quantize(np.array([[2.0, 1.0, 0.0, -2.0]], np.float32), (1, 4), ue8m0=True)
    assert scale.tolist() == [[2.0**-7]]
    assert codes.tolist() == [[0x78, 0x70, 0x00, 0xF8]]
    # An all-zero block gets the amax floor: scale 1e-4 / 448.
    _, scale = oracle.quantize(np.zeros((1, 3), np.float32), (1, 4), ue8m0=False)
    assert scale[0, 0] == np.float32(np.float32(1e-4) / np.float32(448.0))


def test_contiguous_oracle_by_hand():
    # Groups of 1 and 2 rows, alignment 2: group 0 at row 0, group 1 at row 2, row 1 is padding.
    a = np.array([[1.0, 2.0], [9.0, 9.0], [0.0, 1.0], [3.0, -1.0]])
    b = np.array([[[1.0, 1.0]], [[2.0, -1.0]]])  # G=2, N=1, K=2
    out = oracle.contiguous(a, b, [1, 2], alignment=2, num_rows=4)
    assert out[:, 0].tolist() == [3.0, 0.0, -1.0, 7.0]


def test_masked_and_k_grouped_oracles_by_hand():
    a = np.arange(12, dtype=np.float64).reshape(2, 3, 2)  # G=2, max_m=3, K=2
    b = np.ones((2, 1, 2))
    out = oracle.masked(a, b, [2, 0])
    assert out[0, :, 0].tolist() == [1.0, 5.0, 0.0] and not out[1].any()
    # K-grouped: tokens 0-1 form group 0, token 2 is a gap (alignment 2 puts group 1 at 4), tokens 4 group 1.
    a = np.array([[1.0], [2.0], [50.0], [60.0], [3.0]])  # T=5, M=1
    bb = np.array([[1.0, 0.0], [1.0, 1.0], [7.0, 7.0], [8.0, 8.0], [2.0, 2.0]])  # N=2
    out = oracle.k_grouped(a, bb, [2, 1], alignment=4, c=np.full((2, 1, 2), 10.0))
    assert out.tolist() == [[[13.0, 12.0]], [[16.0, 16.0]]]


def test_layout_oracles_by_hand():
    # counts [1, 0, 3], alignment 4: group 0 rows 0, group 1 empty at 4, group 2 rows 4-6; 8 rows.
    assert oracle.m_indices([1, 0, 3], 4, 8).tolist() == [0, -1, -1, -1, 2, 2, 2, -1]
    assert oracle.psum([1, 0, 3], 4).tolist() == [1, 4, 7]
    # Exponent bytes 127, 128, 126, 130 | 129: word 0 = 0x827E807F (negative as int32), word 1 = 0x81.
    scale = np.array([[1.0, 2.0, 0.5, 8.0, 4.0]], np.float32)
    span, shape, strides = oracle.pack_ue8m0(scale)
    assert shape == (1, 2) and strides == (1, 4)
    assert span.tolist() == [0x827E807F - 2**32, 0, 0, 0, 0x81]
    span, shape, strides = oracle.pack_ue8m0x2(scale)
    # Two bytes per int16: 0x807F and 0x827E are negative as int16.
    assert strides == (1, 1) and span.tolist() == [0x807F - 2**16, 0x827E - 2**16, 0x81]


def test_dispatch_oracle_by_hand():
    ids = np.array([[1, 0], [1, -1], [0, 1]])
    ref = oracle.dispatch(ids, num_experts=3, alignment=2)
    # Expert 0 holds slots 1 and 4, expert 1 slots 0, 2, 5; expert 2 none.
    assert ref["counts"].tolist() == [2, 3, 0]
    assert ref["slot_of_row"].tolist() == [1, 4, 0, 2, 5, -1]
    assert ref["row_of_slot"].tolist() == [[2, 0], [3, -1], [1, 4]]
    masked = oracle.dispatch_masked(ids, num_experts=3, max_m=2)
    assert masked["masked_m"].tolist() == [2, 2, 0] and masked["dropped"].tolist() == [1]


# -- generator -------------------------------------------------------------------------------------------


def test_splitmix64_matches_its_published_output():
    # SplitMix64 from state 0: the first output is 0xE220A8397B1DCDAF (Vigna's reference code).
    first = generate._mix(np.array([0x9E3779B97F4A7C15], dtype=np.uint64))[0]
    assert int(first) == 0xE220A8397B1DCDAF


def test_streams_are_keyed_by_seed_and_name():
    a = generate.Stream(7, "a").uniform((1000,))
    assert np.array_equal(a, generate.Stream(7, "a").uniform((1000,)))
    assert not np.array_equal(a, generate.Stream(7, "b").uniform((1000,)))
    assert not np.array_equal(a, generate.Stream(8, "a").uniform((1000,)))
    assert 0.0 <= a.min() and a.max() < 1.0 and abs(a.mean() - 0.5) < 0.05


def test_seed_histogram_cases_are_the_seed_scaled_down(the_suite):
    assert the_suite.raw["seed_histogram"]["counts"] == SEED_HISTOGRAM
    by16 = [-(-c // 16) for c in SEED_HISTOGRAM]
    for case in the_suite.cases:
        if "seed_histogram" in case.tags and "counts" in case.problem:
            assert case.problem["counts"] == by16, case.id
    masked = the_suite.case("masked/bf16/seed32_decode@1").problem
    assert masked["masked_m"] == [min(-(-c // 32), 32) for c in SEED_HISTOGRAM]


def test_manifest_covers_the_required_edges(the_suite):
    tags = {t for c in the_suite.cases for t in c.tags}
    assert {
        "seed_histogram",
        "all_to_one",
        "empty_groups",
        "single_token",
        "unaligned_m",
        "edge_k",
        "edge_n",
        "masked_zero_rows",
        "masked_full",
        "with_c",
        "zero_blocks",
        "outliers",
    } <= tags
    assert 30 <= len(the_suite.select(["full"])) <= 60
    assert 8 <= len(the_suite.select(["smoke"])) <= 12
    ops = {c.op for c in the_suite.cases}
    assert ops == set(suite.OPS)


def test_stored_fp8_cases_have_different_scales_per_k_block(the_suite):
    for cid in ("contiguous/fp8_ue8m0/kblock_scales@1", "masked/fp8_ue8m0/mixed@1"):
        t = the_suite.tensors(the_suite.case(cid))
        exps = torch.log2(t["a.scale"]).round()
        # Every row's K-block scales are not all equal, so a permutation of them changes results.
        assert bool((exps.amax(-1) != exps.amin(-1)).all()), cid


# -- tolerances --------------------------------------------------------------------------------------------


def test_calc_diff_by_hand():
    x = torch.tensor([1.0, 2.0])
    assert calc_diff(x, x) == 0.0
    # y = 2x: 1 - 2 * (2 + 8) / (5 + 20) = 1 - 20/25 = 0.2
    assert calc_diff(x, 2 * x) == pytest.approx(0.2)
    assert calc_diff(torch.zeros(3), torch.zeros(3)) == 0.0


def test_elementwise_bound_and_caps():
    cls = ToleranceClass(
        "t", rtol=0.01, atol=0.1, acc_eps=0.0, acc_factor=0.0, calc_diff=1.0, mismatch_fraction=0.25, gross_factor=10.0
    )
    ref = torch.tensor([10.0, 10.0, 10.0, 10.0])
    mag = torch.zeros(4)
    # bound = 0.1 + 0.01 * 10 = 0.2 per element.
    ok = compare_values(ref + torch.tensor([0.2, 0.0, 0.0, 0.0]), ref, mag, 1, cls)
    assert ok.ok and ok.metrics["mismatches"] == 0
    one = compare_values(ref + torch.tensor([0.3, 0.0, 0.0, 0.0]), ref, mag, 1, cls)
    assert one.ok and one.metrics["mismatches"] == 1  # 1 of 4 allowed (fraction 0.25)
    two = compare_values(ref + torch.tensor([0.3, 0.3, 0.0, 0.0]), ref, mag, 1, cls)
    assert not two.ok and "2 of 4 elements outside" in two.message
    gross = compare_values(ref + torch.tensor([2.5, 0.0, 0.0, 0.0]), ref, mag, 1, cls)
    assert not gross.ok and "beyond 10x the bound" in gross.message


def test_accumulation_term_scales_with_sqrt_k_and_magnitude():
    cls = ToleranceClass(
        "t", rtol=0.0, atol=0.0, acc_eps=1e-3, acc_factor=2.0, calc_diff=1.0, mismatch_fraction=0.0, gross_factor=10.0
    )
    # 2 * sqrt(16) * 1e-3 * 5 = 0.04
    assert float(cls.bound(torch.tensor([0.0]), torch.tensor([5.0]), 16)[0]) == pytest.approx(0.04)


def test_nonfinite_positions_must_match():
    cls = ToleranceClass("t", 0.01, 0.01, 0.0, 0.0, 1.0, 0.0, 10.0)
    ref = torch.tensor([float("nan"), float("inf"), 1.0])
    assert compare_values(ref.clone(), ref, torch.zeros(3), 1, cls).ok
    bad = compare_values(torch.tensor([0.0, float("inf"), 1.0]), ref, torch.zeros(3), 1, cls)
    assert not bad.ok and "NaN/Inf position" in bad.message
    bad = compare_values(torch.tensor([float("nan"), float("-inf"), 1.0]), ref, torch.zeros(3), 1, cls)
    assert not bad.ok


def test_manifest_tolerance_classes_follow_the_documented_floors(the_suite):
    classes = the_suite.tolerance_classes
    assert classes["bf16_bf16"]["rtol"] == 1.6e-2 and classes["fp16_fp16"]["rtol"] == 1e-3
    assert classes["fp32_fp32"]["rtol"] == 1.3e-6
    assert classes["bf16_bf16"]["calc_diff"] == 1e-5 and classes["fp8_bf16"]["calc_diff"] == 1e-3
    assert classes["fp32_fp32"]["acc_eps"] == 2.0**-24 and classes["fp8_bf16"]["acc_eps"] == 2.0**-14


# -- checks ------------------------------------------------------------------------------------------------


def test_sentinel_checks_use_exact_bits():
    out = checks.fill_sentinel(torch.empty(2, 3, dtype=torch.bfloat16), 0x7FA5)
    assert checks.all_written(out, 0x7FA5, "r").failed
    keep = torch.tensor([[False], [True]])
    out[0] = 1.0
    assert not checks.untouched(out, 0x7FA5, keep, "r").failed
    assert not checks.all_written(out[:1], 0x7FA5, "r").failed
    out[1, 2] = float("nan")  # a canonical NaN is not the sentinel's payload
    result = checks.untouched(out, 0x7FA5, keep, "r")
    assert result.failed and "first at (1, 2)" in result.message


def test_exact_bytes_names_the_first_difference():
    a = torch.tensor([1, 2, 3], dtype=torch.int32)
    assert checks.exact_bytes("x", a, a.clone()) is None
    msg = checks.exact_bytes("x", a, torch.tensor([1, 2, 4], dtype=torch.int32))
    assert "element (2,)" in msg and "got 3" in msg and "expected 4" in msg
    assert "dtype" in checks.exact_bytes("x", a, a.to(torch.int64))


# -- manifest and waivers -----------------------------------------------------------------------------------


def test_manifest_validation_rejects_bad_entries(the_suite):
    raw = copy.deepcopy(the_suite.raw)
    raw["cases"][0]["checks"] = ["values", "bytes"]
    with pytest.raises(ConformanceError, match="do not apply to op"):
        suite.validate_manifest(raw)
    raw = copy.deepcopy(the_suite.raw)
    raw["cases"][1]["id"] = raw["cases"][0]["id"]
    with pytest.raises(ConformanceError, match="duplicate id"):
        suite.validate_manifest(raw)
    raw = copy.deepcopy(the_suite.raw)
    raw["cases"][0]["tolerance"] = "fp32_fp32"
    with pytest.raises(ConformanceError, match="does not match the signature"):
        suite.validate_manifest(raw)


def test_waiver_needs_a_reason():
    with pytest.raises(ConformanceError, match="reason"):
        waivers.parse("entries:\n  - {id: 'masked/*', kind: bug}\n", "x.yaml")
    with pytest.raises(ConformanceError, match="reason"):
        waivers.parse("entries:\n  - {id: 'masked/*', kind: bug, reason: '  '}\n", "x.yaml")
    found, info = waivers.parse("backend: other\nentries:\n  - {id: 'x', kind: bug, reason: r}\n", "x.yaml", "mine")
    assert found == [] and info["applies"] is False


def test_example_manifest_is_valid():
    from moe_hal.conformance.suite import default_root

    text = (default_root() / "expected_failures" / "example.yaml").read_text()
    found, info = waivers.parse(text, "example.yaml", "example_vendor")
    assert len(found) == 2 and all(w.reason for w in found)


def test_waivers_turn_failures_into_xfail_and_report_stale_entries(tmp_path):
    import tests.test_conformance_wrong_backends as wrong

    manifest = tmp_path / "xfails.yaml"
    manifest.write_text(
        "entries:\n"
        "  - {id: 'masked/bf16/mixed@1', kind: bug, reason: 'writes one row too many'}\n"
        "  - {id: 'masked/bf16/all_full@1', kind: bug, reason: 'it is not actually failing'}\n"
        "  - {id: 'no/such/case@1', kind: bug, reason: 'stale'}\n"
    )
    backend = wrong.WritesPastMaskedM(wrong._spec("past_masked_m"))
    cases = ["masked/bf16/mixed@1", "masked/bf16/all_full@1"]
    rep = session.run(backend, ["full"], cases=cases, manifests=[str(manifest)], use_plugin_manifests=False)
    (run,) = rep["runs"]
    status = {c["id"]: c["status"] for c in run["cases"]}
    assert status == {"masked/bf16/mixed@1": "xfail", "masked/bf16/all_full@1": "xpass"}
    assert run["summary"]["verdict"] == "conformant with waivers"
    assert [w["id"] for w in run["waivers"]["stale"]] == ["no/such/case@1"]
    strict = session.run(
        backend, ["full"], cases=cases, manifests=[str(manifest)], strict=True, use_plugin_manifests=False
    )
    assert strict["runs"][0]["summary"]["verdict"] == "non-conformant"
    assert report.verify(rep) == [] and report.verify(strict) == []


def test_not_applicable_comes_with_reason_codes():
    rep = session.run("fake_vendor", ["smoke"], cases=["contiguous/fp8_ue8m0/*"])
    (run,) = rep["runs"]
    if not run["available"]:
        pytest.skip("the fake vendor plugin is not installed")
    assert {c["status"] for c in run["cases"]} == {"not_applicable"}
    assert all(any(r["code"] == "dtype_unsupported" for r in c["reasons"]) for c in run["cases"])
    # The plugin's expected-failure manifest arrives through the moe_hal_conformance_manifest hook.
    assert [s["plugin"] for s in run["waivers"]["sources"]] == ["fake_vendor"]


def test_unknown_backend_is_unavailable_not_conformant():
    rep = session.run("no_such_backend", ["smoke"])
    (run,) = rep["runs"]
    assert not run["available"] and run["summary"]["verdict"] == "unavailable"
    assert run["unavailable_reasons"][0]["code"] == "unknown_backend"
    assert rep["verdict"] == "unavailable"


# -- reports ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smoke_report():
    return session.run("reference", ["smoke"])


def test_report_content(smoke_report, the_suite):
    rep = smoke_report
    assert rep["suite"]["version"] == the_suite.version and rep["suite"]["data_version"] == the_suite.data_version
    run = rep["runs"][0]
    assert run["backend"]["name"] == "reference" and run["backend"]["mode"] == "native"
    assert run["device"]["hw_id"] and run["device"]["hwdb"]["id"] == run["device"]["hw_id"]
    assert run["selection"] and all("explain" in v for v in run["selection"].values())
    assert "moe_hal_env" in rep["environment"] and rep["environment"]["torch"] == torch.__version__
    values = [c for c in run["cases"] if c["op"] == "contiguous" and c["path"] == "direct"]
    assert all(c["metrics"]["calc_diff"] is not None for c in values)  # metrics recorded on pass
    json.dumps(rep, allow_nan=False)
    assert report.verify(rep, the_suite) == []


def test_verify_detects_tampering(smoke_report):
    rep = copy.deepcopy(smoke_report)
    rep["runs"][0]["cases"][0]["status"] = "fail"
    problems = report.verify(rep)
    assert any("summary says" in p for p in problems) and any("verdict" in p for p in problems)
    rep = copy.deepcopy(smoke_report)
    rep["runs"][0]["cases"][0]["status"] = "xfail"
    assert any("without a waiver reason" in p for p in report.verify(rep))


def test_junit_xml_counts(smoke_report):
    root = ET.fromstring(report.junit_xml(smoke_report))
    (suite_el,) = root.findall("testsuite")
    cases = suite_el.findall("testcase")
    assert len(cases) == len(smoke_report["runs"][0]["cases"]) == int(suite_el.get("tests"))
    assert int(suite_el.get("failures")) == 0
    assert int(suite_el.get("skipped")) == smoke_report["runs"][0]["summary"]["counts"]["not_applicable"]


def test_compare_reports_status_changes_and_drift(smoke_report):
    other = copy.deepcopy(smoke_report)
    run = other["runs"][0]
    run["cases"][0]["status"] = "fail"
    gemm = next(c for c in run["cases"] if c["metrics"].get("calc_diff") is not None and c["status"] == "pass")
    gemm["metrics"]["max_err_over_bound"] = (gemm["metrics"]["max_err_over_bound"] or 0) * 10 + 0.5
    other["environment"]["torch"] = "9.9.9"
    (comp,) = compare.compare(smoke_report, other)
    keys = {d.key: d for d in comp.cases}
    first = f"{run['cases'][0]['id']} [{run['cases'][0]['path']}]"
    assert keys[first].regression and keys[first].status_b == "fail"
    assert "max_err_over_bound" in keys[f"{gemm['id']} [{gemm['path']}]"].drift
    assert comp.header["torch"] == (torch.__version__, "9.9.9")
    (same,) = compare.compare(smoke_report, smoke_report)
    assert same.cases == [] and same.header == {}
