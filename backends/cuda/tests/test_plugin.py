"""The plugin as moe_hal meets it: entry point, declarations, selection, reasons, explain().

These tests need no GPU. Interpreter mode is on for this process (conftest.py); the behaviour
without it is checked in subprocesses with ``MOE_HAL_CUDA_INTERPRET`` unset.
"""

from __future__ import annotations

import importlib
import importlib.metadata as metadata
import importlib.util
import json
import os
import subprocess
import sys
import types

import pytest
import torch
from cuda_helpers import randn

import moe_hal
from moe_hal import DeviceInfo, perf
from moe_hal.quant import quantize_fp8
from moe_hal_cuda import configs, device, paths, peers, plugin

NAMES = ("cuda_sm90", "cuda_sm100")


def _run_python(code: str, interpret: bool) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("MOE_HAL_CUDA_INTERPRET", "TRITON_INTERPRET")}
    if interpret:
        env["MOE_HAL_CUDA_INTERPRET"] = "1"
    return subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code], env=env, capture_output=True, text=True, timeout=120
    )


# -- discovery and declarations -------------------------------------------------------------------
def test_entry_point_is_installed():
    eps = [ep for ep in metadata.entry_points(group="moe_hal.backends") if ep.name == "cuda"]
    assert len(eps) == 1 and eps[0].value == "moe_hal_cuda.plugin"
    assert eps[0].dist.name == "moe-hal-cuda"


def test_backends_listed_through_the_entry_point():
    specs = {s.name: s for s in moe_hal.backends()}
    for name in NAMES:
        assert name in specs
        assert specs[name].plugin == "cuda" and specs[name].distribution == "moe-hal-cuda"
        assert specs[name].device_types == ("cuda",)
        assert "INTERPRETED" in specs[name].description
    assert specs["cuda_sm90"].requires == {"wgmma", "tma"}
    assert specs["cuda_sm100"].requires == {"tcgen05", "tma", "ue8m0_scales"}


def test_requirements_are_hardware_db_features():
    """Every required feature is one the hardware DB declares for some device, and the H200
    entry satisfies cuda_sm90 but not cuda_sm100 (and the B200 the reverse)."""
    from moe_hal import hwdb

    known = set().union(*(set(e.raw.get("features", [])) for e in hwdb.all()))
    sm90, sm100 = plugin.specs()
    assert sm90.requires <= known and sm100.requires <= known
    h200 = set(hwdb.get("nvidia-h200-sxm").raw["features"])
    b200 = set(hwdb.get("nvidia-b200").raw["features"])
    assert sm90.requires <= h200 and not sm100.requires <= h200
    assert sm100.requires <= b200 and not sm90.requires <= b200


def test_plugin_module_is_light():
    code = (
        "import sys, moe_hal, moe_hal_cuda.plugin as p; p.specs(); moe_hal.backends(); "
        "heavy = [m for m in ('triton', 'cuda.bindings', 'moe_hal_cuda.kernels', 'moe_hal_cuda.backend') "
        "if m in sys.modules]; print(heavy)"
    )
    result = _run_python(code, interpret=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


# -- selection on the CPU ---------------------------------------------------------------------------
def test_never_selected_automatically_on_cpu(gen):
    lay = moe_hal.ContiguousLayout.from_counts([3, 4], alignment=1)
    a, b = randn(gen, 7, 32, dtype=torch.bfloat16), randn(gen, 2, 16, 32, dtype=torch.bfloat16)
    sel = moe_hal.select(a, b, lay)
    assert sel.name not in NAMES
    by_name = {c.name: c for c in sel.candidates}
    for name in NAMES:
        assert [r.code for r in by_name[name].reasons] == ["interpreter_only"]


@pytest.mark.parametrize("name", NAMES)
def test_explain_says_interpreted(gen, name):
    lay = moe_hal.ContiguousLayout.from_counts([3, 4], alignment=1)
    a, b = randn(gen, 7, 32, dtype=torch.bfloat16), randn(gen, 2, 16, 32, dtype=torch.bfloat16)
    sel = moe_hal.select(a, b, lay, backend=name)
    assert sel.name == name and sel.mode == "interpreted"
    text = sel.explain()
    assert "INTERPRETED" in text and "Triton interpreter" in text


def test_info_reports_interpreted():
    from moe_hal import sysinfo

    rows = {b["name"]: b for b in sysinfo.backends()}
    for name in NAMES:
        cpu = rows[name]["devices"]["cpu"]
        assert cpu["available"] and cpu["mode"].startswith("interpreted")


def test_without_interpreter_mode_ineligible_with_clean_reasons():
    code = """
import json, torch, moe_hal
from moe_hal.errors import BackendUnavailableError
lay = moe_hal.ContiguousLayout.from_counts([3, 4], alignment=1)
a, b = torch.randn(7, 32), torch.randn(2, 16, 32)
out = {"auto": moe_hal.select(a, b, lay).name, "forced": {}, "available": {}}
for name in ("cuda_sm90", "cuda_sm100"):
    try:
        moe_hal.grouped_gemm(a, b, lay, backend=name)
        out["forced"][name] = "ran"
    except BackendUnavailableError as exc:
        out["forced"][name] = sorted({r.code for r in exc.reasons})
    be = moe_hal.get_backend(name)
    out["available"][name] = [r.code for r in be.is_available()]
print(json.dumps(out))
"""
    result = _run_python(code, interpret=False)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["auto"] not in NAMES
    for name in NAMES:
        codes = out["forced"][name]
        assert codes != "ran" and codes, codes
        assert set(codes) <= {
            "device_type_unsupported",
            "cuda_driver_missing",
            "torch_cuda_missing",
            "cuda_device_missing",
            "triton_missing",
        }
        assert out["available"][name] and set(out["available"][name]) <= {
            "cuda_driver_missing",
            "torch_cuda_missing",
            "cuda_device_missing",
        }


def test_interpreter_imported_too_late_is_a_reason():
    code = """
import triton, os
os.environ["MOE_HAL_CUDA_INTERPRET"] = "1"
import moe_hal
print([r.code for r in moe_hal.get_backend("cuda_sm90").is_available()])
"""
    result = _run_python(code, interpret=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "['interpreter_unusable']"


# -- device facts ----------------------------------------------------------------------------------
def test_device_facts_without_driver_is_a_reason():
    device.device_facts.cache_clear()
    facts = device.device_facts(0)
    assert isinstance(facts, moe_hal.Reason)
    assert facts.code in {"cuda_driver_missing", "torch_cuda_missing", "cuda_device_missing"}


class _FakeDriver:
    """Enough of cuda.bindings.driver to answer the attribute queries (values of an H200)."""

    class CUresult:
        CUDA_SUCCESS = 0

    class CUdevice_attribute:
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = "major"
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = "minor"
        CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = "sms"
        CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE = "l2"
        CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = "smem"

    values = {"major": 9, "minor": 0, "sms": 132, "l2": 60 * 2**20, "smem": 232448}

    def cuInit(self, flags):
        return (0,)

    def cuDriverGetVersion(self):
        return (0, 13000)

    def cuDeviceGetCount(self):
        return (0, 1)

    def cuDeviceGet(self, index):
        return (0, index)

    def cuDeviceGetName(self, length, dev):
        return (0, b"NVIDIA H200\0\0\0")

    def cuDeviceGetAttribute(self, attr, dev):
        return (0, self.values[attr])


def test_device_facts_from_cuda_python(monkeypatch):
    monkeypatch.setattr(device, "_driver_module", lambda: _FakeDriver())
    device.device_facts.cache_clear()
    try:
        facts = device.device_facts(0)
        assert facts == device.DeviceFacts(0, "NVIDIA H200", (9, 0), 132, 60 * 2**20, 232448, 13000, "cuda-python")
        assert facts.arch == "sm_90"
        missing = device.device_facts(3)
        assert isinstance(missing, moe_hal.Reason) and missing.code == "cuda_device_missing"
    finally:
        device.device_facts.cache_clear()


def test_driverless_cuda_python_gives_a_reason(monkeypatch):
    class NoDriver(_FakeDriver):
        def cuInit(self, flags):
            raise RuntimeError('"cuda" is an NVIDIA driver library and can only be found via system search')

    monkeypatch.setattr(device, "_driver_module", lambda: NoDriver())
    device.device_facts.cache_clear()
    try:
        facts = device.device_facts(0)
        assert isinstance(facts, moe_hal.Reason) and facts.code == "cuda_driver_missing"
        assert "NVIDIA driver library" in facts.message
    finally:
        device.device_facts.cache_clear()


# -- checks that need a CUDA device, with a faked one ------------------------------------------------
def test_fp8_needs_the_fp8_feature(monkeypatch):
    monkeypatch.delenv("MOE_HAL_CUDA_INTERPRET")
    fake = DeviceInfo("cuda", 0, "some-hopper", frozenset({"wgmma", "tma"}), "faked")
    select_module = importlib.import_module("moe_hal.selection")
    monkeypatch.setattr(select_module, "device_info", lambda dev: fake)
    be = moe_hal.get_backend("cuda_sm90")
    problem = types.SimpleNamespace(quantized=True, op="contiguous", device=torch.device("cuda", 0))
    assert [r.code for r in be.unsupported(problem)] == ["hw_feature_missing"]
    problem.quantized = False
    assert be.unsupported(problem) == []
    assert be.check_device(DeviceInfo("cpu", None, "cpu-generic", frozenset({"cpu"}), "x"))
    assert be.auto_select_reason(fake) is None and be.execution_mode(fake) in ("native", "interpreted")


def test_peer_blockers():
    cpu = types.SimpleNamespace(device=torch.device("cpu"))
    assert peers.blocker("torch", cpu) == "peers run on CUDA devices only"
    base = dict(
        device=torch.device("cuda", 0),
        in_dtype="bf16",
        out_dtype_name="bf16",
        op="contiguous",
        num_groups=8,
        k=7168,
        n=4096,
        m=1024,
        b_major="k",
    )
    assert peers.blocker("torch", types.SimpleNamespace(**base)) is None
    for change, words in [
        ({"op": "masked"}, "masked_m"),
        ({"in_dtype": "fp16", "out_dtype_name": "fp16"}, "bf16"),
        ({"k": 7170}, "16-byte"),
        ({"num_groups": 2000}, "groups"),
    ]:
        assert words in peers.blocker("torch", types.SimpleNamespace(**{**base, **change}))
    if importlib.util.find_spec("deep_gemm") is None:
        assert peers.blocker("deep_gemm", types.SimpleNamespace(**base)) == "deep_gemm is not installed"


def test_path_table_holds_the_h200_runs_k_grouped_verdicts():
    # bench/results/gpu_check_h200_run2.json: torch grouped_mm's 2D x 2D form beat our bf16
    # K-grouped kernel 1.46x and 1.54x (the first run: 1.44x, 1.52x); nothing else was taken
    table = paths.table()
    assert set(table) == {
        ("sm90", "k_grouped", "bf16", (2048, 256, 4096)),
        ("sm90", "k_grouped", "bf16", (4096, 256, 2048)),
    }
    assert all(e.path == "torch" and e.speedup > 1.4 for e in table.values())
    assert all(e.source.startswith("bench/results/gpu_check_h200_run2.json") for e in table.values())
    # the measured call (8192 tokens over 32 experts, dW 7168 x 2048) falls in the first bucket
    klay = moe_hal.KGroupedLayout.from_counts(perf.synthetic_counts("seed", 8192, 32))
    p = moe_hal.Problem.build(
        torch.zeros(8192, 7168, dtype=torch.bfloat16), torch.zeros(8192, 2048, dtype=torch.bfloat16), klay
    )
    assert paths.lookup("sm90", p).bucket == (2048, 256, 4096)
    assert paths.lookup("sm100", p) is None  # measured on Hopper only


def _bf16_contiguous(counts, n=32, k=64, alignment=16):
    lay = moe_hal.ContiguousLayout.from_counts(counts, alignment=alignment)
    return moe_hal.Problem.build(
        torch.zeros(lay.num_rows, k, dtype=torch.bfloat16), torch.zeros(len(counts), n, k, dtype=torch.bfloat16), lay
    )


def test_shape_bucket_is_the_power_of_two_range_of_each_dimension():
    # rows: align(30, 16) + align(50, 16) = 32 + 64 = 96 -> 48 per group -> [32, 64)
    assert paths.shape_bucket(_bf16_contiguous([30, 50], n=48, k=200)) == (32, 128, 32)
    assert paths.describe_bucket((32, 128, 32)) == "N in [32, 64), K in [128, 256), rows per group in [32, 64)"
    masked = moe_hal.MaskedLayout(torch.tensor([3, 5], dtype=torch.int32), 64, expected_m=5, check=False)
    p = moe_hal.Problem.build(
        torch.zeros(2, 64, 256, dtype=torch.bfloat16), torch.zeros(2, 4096, 256, dtype=torch.bfloat16), masked
    )
    assert paths.shape_bucket(p) == (4096, 256, 4)  # expected_m, not max_m
    klay = moe_hal.KGroupedLayout.from_counts([100, 300])
    p = moe_hal.Problem.build(
        torch.zeros(400, 24, dtype=torch.bfloat16), torch.zeros(400, 40, dtype=torch.bfloat16), klay
    )
    assert paths.shape_bucket(p) == (32, 128, 16)  # N=40, tokens per group 200, output M=24


SYNTHETIC_TABLE = {
    "source": "bench/results/synthetic.json",
    "device": "nvidia-h200-sxm",
    "entries": [
        {
            "arch": "sm90",
            "op": "contiguous",
            "dtype": "bf16",
            "bucket": {"n": 32, "k": 64, "rows_per_group": 32},
            "path": "torch",
            "speedup": 1.3,
        }
    ],
}


def test_path_lookup_is_keyed_by_layout_dtype_and_shape_bucket():
    entries = paths.parse(SYNTHETIC_TABLE)
    covered = _bf16_contiguous([30, 50])  # N=32, K=64, 48 rows per group
    hit = paths.lookup("sm90", covered, entries)
    assert hit is not None and hit.path == "torch" and hit.speedup == 1.3 and hit.device == "nvidia-h200-sxm"
    assert paths.lookup("sm100", covered, entries) is None  # another architecture
    assert paths.lookup("sm90", _bf16_contiguous([30, 50], n=64), entries) is None  # N in another range
    assert paths.lookup("sm90", _bf16_contiguous([30, 50], k=128), entries) is None  # K in another range
    assert paths.lookup("sm90", _bf16_contiguous([100, 120]), entries) is None  # more rows per group
    assert paths.lookup("sm90", _bf16_contiguous([20, 60, 10]), entries) is not None  # 96 / 3 = 32: same range
    fp16 = _bf16_contiguous([30, 50])
    fp16.in_dtype = "fp16"
    assert paths.lookup("sm90", fp16, entries) is None  # another dtype


def test_path_table_rejects_malformed_entries():
    bad = json.loads(json.dumps(SYNTHETIC_TABLE))
    bad["entries"][0]["bucket"]["n"] = 48
    with pytest.raises(ValueError, match="entry 0.*powers of two"):
        paths.parse(bad)
    del bad["entries"][0]["bucket"]
    with pytest.raises(ValueError, match="entry 0.*KeyError"):
        paths.parse(bad)


def test_peer_choice_is_unmeasured_without_a_committed_measurement(monkeypatch):
    """Where the packaged path table has no entry for the call's bucket a native plan runs Triton
    and says the peer choice is unmeasured; an entry from a measurement covers only its shape bucket, and routes the call when
    the peer can take it."""
    monkeypatch.delenv("MOE_HAL_CUDA_INTERPRET")
    from moe_hal_cuda import backend as cuda_backend
    from moe_hal_cuda import plugin

    be = cuda_backend.CudaSM90Backend(plugin.specs()[0])
    problem = _bf16_contiguous([30, 50])
    path, note = be._choose_path(problem)
    assert path == "triton" and "unmeasured" in note and "N in [32, 64)" in note
    monkeypatch.setattr(paths, "table", lambda: paths.parse(SYNTHETIC_TABLE))
    path, note = be._choose_path(problem)
    assert path == "triton" and "1.30x faster" in note and "CUDA devices only" in note  # a CPU call: blocked
    assert "nvidia-h200-sxm" in note and "rows per group in [32, 64)" in note
    path, note = be._choose_path(_bf16_contiguous([30, 50], n=64))
    assert path == "triton" and "unmeasured" in note


# -- tiles -----------------------------------------------------------------------------------------
def test_config_table_fits_and_divides():
    """Every fp8 BLOCK_K divides the 128-wide scale block; every entry's pipeline fits the
    227 KiB of shared memory an SM90/SM100 block may use."""
    for (arch, cls, bm), cfg in configs.TABLE.items():
        assert cfg.block_m == bm
        elem = 1 if cls == "fp8" else 2
        assert cfg.num_stages * (cfg.block_m + cfg.block_n) * cfg.block_k * elem <= 227 * 1024, (arch, cls, bm)
        if cls == "fp8":
            assert 128 % cfg.block_k == 0
    for op, heights in configs.HEIGHTS.items():
        for arch in configs.ARCHS:
            assert [c.block_m for c in configs.candidates(arch, "bf16", op)] == list(heights)


def test_sm100_fp8_tiles_are_block_scaled():
    """SM100 fp8 calls, decode included, are offered only tiles of 128+ rows (the M of the
    block-scaled MMA), and the fallback tile is one of them."""
    for op in configs.HEIGHTS:
        heights = [c.block_m for c in configs.candidates("sm100", "fp8_e4m3", op)]
        assert heights and min(heights) >= 128, (op, heights)
    assert configs.default("sm100", "fp8_e4m3", "masked").block_m == 128
    assert configs.default("sm90", "fp8_e4m3", "masked").block_m == 64


@pytest.mark.parametrize("name,hw", [("cuda_sm90", "nvidia-h200-sxm"), ("cuda_sm100", "nvidia-b200")])
def test_tile_is_the_advisors_choice(gen, name, hw):
    """On skewed routing the plan's tile is what perf.advise picks among the table's tiles."""
    counts = perf.synthetic_counts("zipf:1.5", 4000, 16, seed=3)
    lay = moe_hal.ContiguousLayout.from_counts(counts, alignment=128)
    problem = moe_hal.Problem.build(
        torch.empty(lay.num_rows, 7168, dtype=torch.bfloat16), torch.empty(16, 4096, 7168, dtype=torch.bfloat16), lay
    )
    be = moe_hal.get_backend(name)
    plan = be.plan(problem)
    tiles = [c.tile for c in configs.candidates(be.ARCH, "bf16", "contiguous")]
    expected = perf.advise(counts, 4096, 7168, hw, "bf16", tiles=tiles, out_dtype="bf16", impl=plugin.IMPL).tile
    assert plan.config.tile == expected
    assert f"advisor on {hw}" in be.describe_path(problem)
    assert be.plan(problem) is plan, "plans are cached per layout"


def test_masked_tile_uses_the_decode_shortcut(gen):
    masked_m = torch.tensor([3, 9], dtype=torch.int32)
    lay = moe_hal.MaskedLayout(masked_m, 64, expected_m=8)
    problem = moe_hal.Problem.build(
        torch.empty(2, 64, 2048, dtype=torch.bfloat16), torch.empty(2, 7168, 2048, dtype=torch.bfloat16), lay
    )
    be = moe_hal.get_backend("cuda_sm90")
    tiles = [c.tile for c in configs.candidates("sm90", "bf16", "masked")]
    expected = perf.advise_decode(64, 8, 2, 7168, 2048, "nvidia-h200-sxm", "bf16", tiles=tiles, out_dtype="bf16")
    assert be.plan(problem).config.tile == expected.tile


def test_degenerate_call_keeps_a_table_tile(gen):
    lay = moe_hal.ContiguousLayout.from_counts([2, 3], alignment=1)
    a, b = randn(gen, 5, 0, dtype=torch.bfloat16), randn(gen, 2, 8, 0, dtype=torch.bfloat16)
    out = moe_hal.grouped_gemm(a, b, lay, backend="cuda_sm90")
    assert torch.equal(out, torch.zeros(5, 8, dtype=torch.bfloat16))
    problem = moe_hal.Problem.build(a, b, lay)
    assert "table default" in moe_hal.get_backend("cuda_sm90").describe_path(problem)


def test_weight_scales_prepared_once(gen):
    from moe_hal.prepared import prepared_cache

    lay = moe_hal.ContiguousLayout.from_counts([4, 4], alignment=1)
    qa = quantize_fp8(randn(gen, 8, 128), (1, 128), ue8m0=True)
    qb = quantize_fp8(randn(gen, 2, 16, 128), (128, 128), ue8m0=True)
    be = moe_hal.get_backend("cuda_sm100")
    prepared_cache.clear("cuda_sm100")
    first = be.prepared_weight_scales(qb).tensor
    misses = prepared_cache.stats()["misses"]
    moe_hal.grouped_gemm(qa, qb, lay, backend="cuda_sm100")
    assert be.prepared_weight_scales(qb).tensor is first
    stats = prepared_cache.stats()
    assert stats["misses"] == misses and stats["backends"]["cuda_sm100"]["entries"] == 1
    qb.scale.mul_(1)  # an in-place write bumps the version counter: the scales are rebuilt
    assert be.prepared_weight_scales(qb).tensor is not first


# -- peer adapters, run on the CPU directly (their blockers keep them off the CPU in real calls) -----
def test_torch_peer_adapter_matches_reference(gen):
    lay = moe_hal.ContiguousLayout.from_counts([5, 0, 11], alignment=8)
    a, b = randn(gen, lay.num_rows, 32, dtype=torch.bfloat16), randn(gen, 3, 16, 32, dtype=torch.bfloat16)
    problem = moe_hal.Problem.build(a, b, lay)
    out = peers.run("torch", problem, torch.full((lay.num_rows, 16), float("nan"), dtype=torch.bfloat16))
    assert torch.equal(out, moe_hal.grouped_gemm(a, b, lay, backend="reference"))

    kl = moe_hal.KGroupedLayout.from_counts([7, 0, 9], alignment=4)
    x, dy = randn(gen, kl.num_rows, 16, dtype=torch.bfloat16), randn(gen, kl.num_rows, 24, dtype=torch.bfloat16)
    c = randn(gen, 3, 16, 24, dtype=torch.bfloat16)
    kp = moe_hal.Problem.build(x, dy, kl, c=c)
    got = peers.run("torch", kp, torch.empty(3, 16, 24, dtype=torch.bfloat16))
    want = moe_hal.grouped_gemm(x.float(), dy.float(), kl, c=c.float())
    assert (got.float() - want).abs().max() <= 2**-7 * want.abs().max() + 1e-2


def test_deep_gemm_adapter_plumbing(gen, monkeypatch):
    """A stand-in deep_gemm (computing from what it is given, writing junk into padding rows as
    DeepGEMM's SM100 kernels may) checks our side: operands, m_indices, zeroed gap rows."""
    seen = {}

    def fake_contiguous(a, b, d, m_indices):
        (a_data, a_scale), (b_data, b_scale) = a, b
        seen["m_indices"] = m_indices.clone()
        qa, qb = (
            moe_hal.QuantizedTensor(a_data, a_scale, (1, 128)),
            moe_hal.QuantizedTensor(b_data, b_scale, (128, 128)),
        )
        full = torch.einsum("mk,gnk->gmn", qa.dequantize(), qb.dequantize())
        d.fill_(123.0)
        for row, g in enumerate(m_indices.tolist()):
            if g >= 0:
                d[row] = full[g, row].to(d.dtype)

    fake = types.SimpleNamespace(
        m_grouped_fp8_gemm_nt_contiguous=fake_contiguous, get_mk_alignment_for_contiguous_layout=lambda: 16
    )
    monkeypatch.setitem(sys.modules, "deep_gemm", fake)
    lay = moe_hal.ContiguousLayout.from_counts([5, 0, 20], alignment=16)
    qa = quantize_fp8(randn(gen, lay.num_rows, 256), (1, 128))
    qb = quantize_fp8(randn(gen, 3, 32, 256), (128, 128))
    problem = moe_hal.Problem.build(qa, qb, lay)
    assert (
        peers.blocker(
            "deep_gemm", types.SimpleNamespace(**{**vars(problem_fields(problem)), "device": torch.device("cuda", 0)})
        )
        is None
    )
    out = peers.run("deep_gemm", problem, torch.empty(lay.num_rows, 32, dtype=torch.bfloat16))
    assert torch.equal(seen["m_indices"], lay.m_indices("cpu"))
    assert bool((out[lay.gap_rows_on("cpu")] == 0).all())
    ref = moe_hal.grouped_gemm(qa, qb, lay, backend="reference", out_dtype=torch.float32)
    assert (out.float() - ref).abs().max() <= 2**-7 * ref.abs().max()


def problem_fields(p):
    """The Problem's fields as a namespace (to fake its device)."""
    return types.SimpleNamespace(**{name: getattr(p, name) for name in p.__slots__})
