"""The published validation set (bench/published/cases.yaml) is well formed and self-consistent.

These checks catch transcription errors: a time that does not match the TFLOPS printed beside it,
counts that do not add up to the group count, a case citing a source that is not listed, a device
the hardware DB does not know.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from moe_hal import hwdb

ROOT = Path(__file__).resolve().parents[1] / "bench" / "published"


@pytest.fixture(scope="module")
def published() -> dict:
    return yaml.safe_load((ROOT / "cases.yaml").read_text())


def test_the_set_matches_its_schema(published):
    schema = json.loads((ROOT / "schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(published)


def test_the_set_is_large_and_broad_enough(published):
    cases = published["cases"]
    assert len(cases) >= 60
    assert len({c["device"] for c in cases}) >= 4
    assert {c["layout"] for c in cases} >= {"contiguous", "masked", "k_grouped"}
    assert len({c["source"] for c in cases}) >= 8


def test_ids_are_unique_and_sources_are_listed(published):
    ids = [c["id"] for c in published["cases"]]
    assert len(ids) == len(set(ids))
    cited = {c["source"] for c in published["cases"]}
    assert cited <= set(published["sources"]), cited - set(published["sources"])
    assert set(published["sources"]) <= cited, "a listed source has no case"


def test_every_device_is_in_the_hardware_db(published):
    known = {e.id for e in hwdb.all()}
    for case in published["cases"]:
        assert case["device"] in known, case["id"]


def test_counts_agree_with_the_group_count(published):
    for case in published["cases"]:
        if "counts" in case:
            assert len(case["counts"]) == case["groups"], case["id"]


def _useful_flops(case: dict) -> float:
    if case["layout"] == "k_grouped":
        return 2.0 * case["m"] * case["n"] * case["k_per_group"] * case["groups"]
    rows = sum(case["counts"]) if "counts" in case else case["m_per_group"] * case["groups"]
    return 2.0 * rows * case["n"] * case["k"]


def test_printed_time_and_tflops_agree(published):
    # Sources print integers (us, TFLOPS). Where rows were drawn at random around the expectation
    # (U(0.7, 1.3) per group) the printed TFLOPS counts the drawn rows, so only a loose check holds.
    checked = 0
    for case in published["cases"]:
        measured = case["measured"]
        if "time_us" in measured and "tflops" in measured:
            tflops = _useful_flops(case) / (measured["time_us"] * 1e-6) / 1e12
            tolerance = 0.05 if case["counts_basis"] == "exact" else 0.3
            assert tflops == pytest.approx(measured["tflops"], rel=tolerance), case["id"]
            checked += 1
    assert checked >= 15


#: Sources whose script counts the fp32 scale factors in its GB/s (DeepGEMM tests/test_fp8.py at
#: f85ec64: count_bytes(a, b, d) with a and b (tensor, scales) pairs, deep_gemm/testing/numeric.py).
COUNTS_SCALE_BYTES = {"deepgemm-pr168-h800"}


def test_printed_tflops_and_bandwidth_agree_for_dense_gemms(published):
    # DeepGEMM's README prints both for each dense GEMM: 2*M*N*K / TFLOPS and the bytes it counts
    # (fp8 A and B, bf16 output) / GB/s are the same time when the row is transcribed right.
    checked = 0
    for case in published["cases"]:
        measured = case["measured"]
        if case["layout"] == "dense" and {"tflops", "gbps"} <= set(measured):
            m, n, k = case["m_per_group"], case["n"], case["k"]
            t_flops = 2.0 * m * n * k / (measured["tflops"] * 1e12)
            nbytes = m * k + n * k + 2 * m * n
            if case["source"] in COUNTS_SCALE_BYTES:
                nbytes += 4 * (m * -(-k // 128) + -(-n // 128) * -(-k // 128))
            t_bytes = nbytes / (measured["gbps"] * 1e9)
            assert t_bytes == pytest.approx(t_flops, rel=0.01), case["id"]
            checked += 1
    assert checked >= 18


def _torch_sm90_tile(case: dict) -> tuple[int, int]:
    """The tile PyTorch's SM90 grouped kernels launch (aten/src/ATen/native/cuda/GroupMM.cu and
    ScaledGroupMM.cu, dispatch_*_grouped_*_on_tile_size): M is rows per group (the 2-D x 3-D case
    divides the total by the group count)."""
    m = sum(case["counts"]) // case["groups"] if "counts" in case else case["m_per_group"]
    n, k = case["n"], case["k"]
    small = m <= 128 or n <= 128
    if case["impl"] == "torch_grouped_mm":
        return (64, 128) if small else (128, 256)
    large = (m >= 2048 and k >= 2048) or (m >= 2048 and n >= 2048) or (k >= 2048 and n >= 2048)
    # torch._scaled_grouped_mm defaults to use_fast_accum=False: the slow-accumulation branch
    return (64, 128) if small else (128, 128) if large else (128, 256)


def test_torch_cases_carry_the_tile_torch_dispatches(published):
    torch_cases = [c for c in published["cases"] if c["impl"] in ("torch_grouped_mm", "torch_scaled_grouped_mm")]
    assert len(torch_cases) >= 9
    for case in torch_cases:
        assert tuple(case["tile"]) == _torch_sm90_tile(case), case["id"]


def _next_pow2(x: int) -> int:
    return 1 << (x - 1).bit_length()


def _sm89_fp8_tile(case: dict) -> tuple[int, int]:
    """The tile the SM89 FP8 GEMMs of vLLM (csrc/quantization/cutlass_w8a8/
    scaled_mm_c2x_sm89_fp8_dispatch.cuh, read at 51cccd6) and sgl-kernel (sgl-kernel/csrc/gemm/
    fp8_gemm_kernel.cu, sm89_fp8_dispatch_shape) launch for a dense call of M rows and N columns."""
    m, n = case["m_per_group"], case["n"]
    if case["impl"] == "sgl_kernel_fp8_scaled_mm_sm89_main":
        assert 64 < m and n <= 8192, "only the buckets of the published calls are written out here"
        return (64, 64) if m <= 128 else (128, 64) if m <= 256 else (128, 128)
    mp2, np2 = max(32, _next_pow2(m)), _next_pow2(n)  # the floor of 32 never reaches the M16 branch
    if mp2 <= 32:
        return (32, 128) if 8192 < np2 <= 16384 else (32, 64)
    if mp2 <= 64:
        return (64, 128) if 8196 < np2 <= 16384 else (64, 64)
    if mp2 <= 128:
        return (64, 128) if np2 <= 8192 else (128, 128) if np2 <= 16384 else (128, 64)
    if mp2 <= 256:
        return (64, 128) if np2 <= 4096 else (128, 128)
    return (256, 128) if 4096 < np2 <= 8192 else (128, 128)


def test_sm89_fp8_cases_carry_the_tile_their_dispatch_fixes(published):
    # The M-bucket dispatch fixes one tile per call; a tile list would let the model pick 16 x 64
    # for a call of 2048 rows.
    impls = ("vllm_cutlass_scaled_mm_sm89", "sgl_kernel_fp8_scaled_mm_sm89_main")
    sm89 = [c for c in published["cases"] if c["impl"] in impls]
    assert len(sm89) >= 40
    for case in sm89:
        assert tuple(case["tile"]) == _sm89_fp8_tile(case), case["id"]


def test_deepgemm_cases_launch_only_what_their_version_could():
    # DeepGEMM's get_best_configs (deep_gemm/jit_kernels/gemm.py) listed BLOCK_N in range(16, 129, 8)
    # at a6d97a1; the larger-block branch of PR #74 (55ab91f) added 144 and 160. BLOCK_M was the
    # contiguous alignment, 128, for contiguous calls and `64 if m <= 64 else 128` otherwise.
    from moe_hal.perf import calibration

    cases = {c.id: c for c in calibration.load_published()}
    limits = {"deepgemm-readme-a6d97a1": 128, "deepgemm-readme-55ab91f": 160}
    checked = 0
    for case in cases.values():
        if case.impl == "deepgemm" and case.source in limits:
            assert max(bn for _, bn in case.tiles) == limits[case.source], case.id
            assert min(bn for _, bn in case.tiles) == 16, case.id
            checked += 1
    assert checked >= 38
    assert {bm for bm, _ in cases["h800-readme0-dense-m64-n7168-k2048"].tiles} == {64}
    assert {bm for bm, _ in cases["h800-readme0-dense-m128-n7168-k2048"].tiles} == {128}
    assert {bm for bm, _ in cases["h800-readme0-masked-4x256-n4096-k7168"].tiles} == {128}
    assert {bm for bm, _ in cases["h800-readme1-contig-4x8192-n4096-k7168"].tiles} == {128}
    # a version the source does not pin keeps the implementation's own list
    assert (128, 256) in cases["h200-tileops-deepgemm-glmup-32768"].tiles


def test_a_known_cache_state_names_its_evidence_and_reaches_the_model(published):
    from moe_hal.perf import calibration

    for name, source in published["sources"].items():
        if source["cache_state"] != "unknown":
            # a commit (7 or more hex digits) or a file and line of the benchmark
            evidence = source["cache_evidence"]
            assert any(
                len(w.strip("(),;:")) >= 7 and all(ch in "0123456789abcdef" for ch in w.strip("(),;:"))
                for w in evidence.split()
            ), name
    operands = {c.source: c.operands for c in calibration.load_published()}
    for name, source in published["sources"].items():
        assert operands[name] == ("l2" if source["cache_state"] == "l2_warm" else "hbm"), name


def test_only_the_kernels_that_split_k_are_predicted_split(published):
    from moe_hal.perf import calibration

    declared = {name for name, impl in published["impls"].items() if "split_k" in impl}
    assert declared == {"cublas"}
    for case in calibration.load_published():
        if case.impl in declared and case.op != "k_grouped":
            assert case.split_k == tuple(published["impls"][case.impl]["split_k"]), case.id
        else:
            assert case.split_k == (1,), case.id
    # a K-grouped call is never split further, whatever its kernel declares
    raw = {
        "id": "x",
        "source": "s",
        "device": "nvidia-h100-sxm",
        "impl": "cublas",
        "layout": "k_grouped",
        "dtype": "bf16",
        "out_dtype": "fp32",
        "groups": 2,
        "k_per_group": 256,
        "m": 64,
        "n": 64,
        "measured": {"time_us": 10.0},
    }
    assert calibration._case(raw, published["impls"]["cublas"], "hbm", "published").split_k == (1,)


def test_a_small_call_of_a_splitting_kernel_is_predicted_split():
    # N = 2112 in 64-wide tiles is 33 tiles for the H100's 132 SMs: splitting K fills the chip
    from moe_hal.perf import calibration

    source = [c for c in calibration.load_published() if c.source == "vllm-pr23280-h100"]
    table = calibration.fit(source)  # achieved figures: the MMA of 33 tiles then binds
    case = next(c for c in source if c.id == "h100-vllm23280-bf16-m16-n2112-k7168")
    split = calibration.predict(case, table)
    unsplit = calibration.predict(dataclasses.replace(case, split_k=(1,)), table)
    assert split.split_k > 1 and split.t_predicted < unsplit.t_predicted


def test_a_call_the_silicon_runs_memory_bound_does_not_set_a_compute_fraction():
    # vLLM PR #20578's NVFP4 GEMMs of 1 to 256 rows (11 us for a 14 MB weight in the L2), read as
    # if the kernel launched 128 x 64 tiles: memory-bound at the B200's datasheet rates, so with
    # vLLM's FP8 GEMM's warm calls beside them (PR #19566) their time is read as the kernel's own
    # L2 rate, not as an MMA rate of 0.07 of the FP4 peak that every FP4 kernel without a figure of
    # its own would borrow (as the fit did before the compute-bound rule)
    from moe_hal.perf import calibration

    sources = ("vllm-pr20578-b200", "vllm-pr19566-b200")
    cases = [c for c in calibration.load_published() if c.source in sources]
    narrow = [dataclasses.replace(c, tiles=((128, 64),)) if c.dtype == "fp4" else c for c in cases]
    table = calibration.fit(narrow)
    kinds = {r.kind for r in table.records if r.impl == "vllm_cutlass_scaled_fp4_mm"}
    assert "compute" not in kinds and "l2_bandwidth" in kinds
    fp4 = table.figure("l2_bandwidth", "nvidia-b200", "blackwell", "vllm_cutlass_scaled_fp4_mm")
    fp8 = table.figure("l2_bandwidth", "nvidia-b200", "blackwell", "vllm_cutlass_scaled_mm")
    assert fp4.value < fp8.value / 2  # each kernel its own L2 rate
    # a kernel with no L2 rate of its own takes the faster one, not a pool of the two
    assert table.figure("l2_bandwidth", "nvidia-b200", "blackwell", "new").value == fp8.value


def test_vllm_s_nvfp4_gemm_runs_one_wave_of_its_128_by_256_tiles():
    # Its code before PR #20646 launched 256 x 256 2-SM tiles (128 x 256 per SM) at every M
    # (bench/published/cases.yaml, impls): 1 to 256 rows of N 6144 are 24 to 48 such tiles, one
    # wave, each 2 * 128 * 256 * 4096 FLOP = 268 MFLOP on one SM (4.4 us at the B200's 9 PFLOP/s
    # over 148 SMs). The flat 11.3-11.7 us is that MMA at about 0.6 of the peak plus the fixed
    # times: compute-bound, so its time sets a compute fraction, not an L2 rate.
    from moe_hal.perf import calibration

    sources = ("vllm-pr20578-b200", "vllm-pr19566-b200")
    cases = [c for c in calibration.load_published() if c.source in sources]
    fp4 = [c for c in cases if c.dtype == "fp4"]
    assert {c.tiles for c in fp4} == {((128, 256),)}
    table = calibration.fit(cases)
    mine = {r.kind: r.value for r in table.records if r.impl == "vllm_cutlass_scaled_fp4_mm"}
    assert "l2_bandwidth" not in mine and 0.4 < mine["compute"] < 0.8
    for case in fp4:
        est = calibration.predict(case, table)
        assert est.tiles <= 148 and est.waves == 1
        assert est.t_predicted == pytest.approx(case.t_measured, rel=0.1)
