"""The DeepGEMM shim's surface: signatures against DeepGEMM's sources, errors, settings, install,
passthrough, and replays of how vLLM, SGLang and torchao call these functions."""

from __future__ import annotations

import contextlib
import importlib
import inspect
import json
import pathlib
import sys
import threading
import types
import warnings

import pytest
import torch

import moe_hal.compat.deep_gemm as dg
from moe_hal import notices
from moe_hal.compat.deep_gemm import passthrough
from moe_hal.compat.deep_gemm.errors import DeepGEMMError, NotProvidedError
from moe_hal.conformance.tolerances import calc_diff
from moe_hal.errors import ArgumentError, MoeHalError, PathWarning

TABLE = json.loads((pathlib.Path(__file__).with_name("deepgemm_signatures.json")).read_text())

#: What the issue asks the shim to provide (each must be in DeepGEMM's table, or be a v1 name).
REQUIRED = [
    "m_grouped_fp8_fp4_gemm_nt_contiguous",
    "m_grouped_fp8_gemm_nt_contiguous",
    "m_grouped_fp8_fp4_gemm_nn_contiguous",
    "m_grouped_fp8_gemm_nn_contiguous",
    "m_grouped_fp8_fp4_gemm_nt_masked",
    "m_grouped_fp8_gemm_nt_masked",
    "fp8_m_grouped_gemm_nt_masked",
    "k_grouped_fp8_gemm_tn_contiguous",
    "k_grouped_fp8_gemm_nt_contiguous",
    "m_grouped_bf16_gemm_nt_contiguous",
    "m_grouped_bf16_gemm_nn_contiguous",
    "m_grouped_bf16_gemm_nt_masked",
    "bf16_m_grouped_gemm_nt_masked",
    "k_grouped_bf16_gemm_tn_contiguous",
    "get_mn_major_tma_aligned_tensor",
    "get_mn_major_tma_aligned_packed_ue8m0_tensor",
    "transform_sf_into_required_layout",
    "get_tma_aligned_size",
    "set_num_sms",
    "get_num_sms",
    "set_mk_alignment_for_contiguous_layout",
    "get_mk_alignment_for_contiguous_layout",
    "get_m_alignment_for_contiguous_layout",
    "get_k_alignment_for_contiguous_layout",
    "get_theoretical_mk_alignment_for_contiguous_layout",
    "ceil_div",
    "align",
    "m_grouped_gemm_fp8_fp8_bf16_nt_contiguous",
    "m_grouped_gemm_fp8_fp8_bf16_nt_masked",
    "gemm_fp8_fp8_bf16_nt",
    "get_col_major_tma_aligned_tensor",
]


@pytest.fixture(autouse=True)
def _fresh_settings():
    saved = dg.settings.snapshot()
    notices.reset()
    yield
    dg.settings.restore(saved)


def _default(value):
    return tuple(value) if isinstance(value, list) else value


# -- signatures ---------------------------------------------------------------------------------
def test_the_table_is_pinned_to_deepgemm_2_6_1():
    assert (TABLE["repository"], TABLE["commit"]) == ("deepseek-ai/DeepGEMM", "54e2261")
    assert set(REQUIRED) <= set(TABLE["functions"]) | set(TABLE["aliases"]) | set(TABLE["v1_functions"])


@pytest.mark.parametrize("name", sorted(TABLE["functions"]))
def test_every_deepgemm_function_is_provided_with_its_signature_or_refused_by_name(name):
    entry = TABLE["functions"][name]
    try:
        fn = getattr(dg, name)
    except NotProvidedError as exc:
        assert name not in REQUIRED and exc.name == name and "m_grouped_fp8_gemm_nt_contiguous" in exc.provided
        assert not hasattr(dg, name)  # probing with hasattr keeps working
        return
    params = list(inspect.signature(fn).parameters.values())
    assert all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params), name
    if "positional_only" in entry:  # pybind11 names these arg0, arg1, ...
        required = [p for p in params if p.default is inspect.Parameter.empty]
        assert len(required) <= entry["positional_only"] <= len(params), name
        return
    assert [p.name for p in params] == [p["name"] for p in entry["params"]], name
    for ours, theirs in zip(params, entry["params"]):
        expected = _default(theirs["default"]) if "default" in theirs else inspect.Parameter.empty
        assert ours.default == expected, f"{name}({ours.name}=...)"


def test_every_exported_name_exists():
    assert [name for name in dg.__all__ if name not in vars(dg)] == []


@pytest.mark.parametrize("alias, target", sorted(TABLE["aliases"].items()))
def test_aliases_are_the_same_function(alias, target):
    assert getattr(dg, alias) is getattr(dg, target)


@pytest.mark.parametrize("name", sorted(TABLE["v1_functions"]))
def test_v1_names(name):
    if name in TABLE["functions"]:
        return  # the v2.6 signature is the one checked
    try:
        fn = getattr(dg, name)
    except NotProvidedError:
        assert "wgrad" in name  # v1 weight-gradient GEMMs are not provided
        return
    ours = list(inspect.signature(fn).parameters)
    assert ours == [p["name"] for p in TABLE["v1_functions"][name]["params"]]


@pytest.mark.parametrize("name", ["einsum", "fp8_fp4_mqa_logits", "fp8_fp4_mega_moe", "SymmBuffer", "cublaslt_gemm_nt"])
def test_other_entry_points_are_not_provided_with_a_typed_error(name):
    with pytest.raises(NotProvidedError) as info:
        getattr(dg, name)
    assert isinstance(info.value, MoeHalError) and isinstance(info.value, AttributeError)
    assert "k_grouped_fp8_gemm_tn_contiguous" in str(info.value)
    assert getattr(dg, name, None) is None


# -- errors ---------------------------------------------------------------------------------------
def _fp8_case(m=128, n=32, k=128, groups=2):
    a = dg.per_token_cast_to_fp8(torch.randn(m, k), False)
    casts = [dg.per_block_cast_to_fp8(torch.randn(n, k), False) for _ in range(groups)]
    b = (torch.stack([c[0] for c in casts]), torch.stack([c[1] for c in casts]))
    return a, b, torch.zeros(m, n, dtype=torch.bfloat16)


def test_invalid_calls_raise_deepgemm_and_moe_hal_types_before_writing_d():
    a, b, d = _fp8_case()
    sentinel = d.clone()
    m_indices = torch.zeros(128, dtype=torch.int32)
    cases = [
        (lambda: dg.m_grouped_fp8_gemm_nt_contiguous(a, b, d.float(), m_indices), "d"),
        (lambda: dg.m_grouped_fp8_gemm_nt_contiguous(a, b, d, m_indices[:5]), "grouped_layout"),
        (lambda: dg.m_grouped_fp8_gemm_nt_contiguous(a, b, d, m_indices.long()), "grouped_layout"),
        (lambda: dg.m_grouped_fp8_gemm_nt_contiguous(a, (b[0], b[1][:, :, :0]), d, m_indices), "b[1]"),
        (lambda: dg.m_grouped_fp8_gemm_nt_contiguous((a[0].float(), a[1]), b, d, m_indices), "a[0]"),
        (
            lambda: dg.m_grouped_fp8_gemm_nt_contiguous(a, b, d, torch.full((128,), 2, dtype=torch.int32)),
            "m_indices[0]",
        ),
    ]
    for call, argument in cases:
        with pytest.raises(ArgumentError) as info:
            call()
        assert isinstance(info.value, RuntimeError) and isinstance(info.value, MoeHalError)
        assert info.value.argument == argument
        assert torch.equal(d, sentinel)
    x = dg.per_channel_cast_to_fp8(torch.randn(128, 8), False)
    for call in (
        lambda: dg.m_grouped_fp8_gemm_nt_contiguous(
            a, b, d, m_indices, recipe=(1, 128, 128), recipe_a=(1, 128), recipe_b=(128, 128)
        ),
        lambda: dg.m_grouped_fp8_gemm_nt_contiguous(a, b, d, m_indices, expected_m_for_psum_layout=64),
        lambda: dg.k_grouped_fp8_gemm_tn_contiguous(  # c is required
            x, x, torch.zeros(1, 8, 8), [128], torch.tensor([128], dtype=torch.int32)
        ),
    ):
        with pytest.raises(DeepGEMMError):
            call()
        assert torch.equal(d, sentinel)


# -- settings -------------------------------------------------------------------------------------
def test_settings_are_per_thread_and_restorable():
    dg.set_num_sms(20)
    dg.set_mk_alignment_for_contiguous_layout(224)
    seen = {}

    def other_thread():
        seen["sms"], seen["align"] = dg.get_num_sms(), dg.get_mk_alignment_for_contiguous_layout()
        dg.set_num_sms(3)

    worker = threading.Thread(target=other_thread)
    worker.start()
    worker.join()
    assert seen["align"] == 128 and seen["sms"] != 20  # a fresh thread starts from the defaults
    assert dg.get_num_sms() == 20  # and cannot change this thread's value
    with dg.scoped_settings(num_sms=7, mk_alignment=96):
        assert (dg.get_num_sms(), dg.get_m_alignment_for_contiguous_layout()) == (7, 96)
    assert (dg.get_num_sms(), dg.get_k_alignment_for_contiguous_layout()) == (20, 224)
    with pytest.raises(ArgumentError, match="mk_alignment"):
        dg.set_mk_alignment_for_contiguous_layout(0)


def test_theoretical_alignment_follows_the_arch():
    assert dg.get_theoretical_mk_alignment_for_contiguous_layout() == 128
    dg.set_arch_major(10)
    assert dg.get_theoretical_mk_alignment_for_contiguous_layout() == 224
    assert [dg.get_theoretical_mk_alignment_for_contiguous_layout(m) for m in (1, 32, 33, 100, 300)] == [
        32,
        32,
        64,
        128,
        224,
    ]


# -- SM100 scale rules ------------------------------------------------------------------------------
def test_sm100_floors_fp32_scales_once_warned_and_refuses_disabled_cast():
    a, b, d = _fp8_case()
    m_indices = torch.tensor([0] * 64 + [1] * 64, dtype=torch.int32)
    dg.set_arch_major(10)
    with pytest.warns(PathWarning, match="floored"):
        dg.m_grouped_fp8_gemm_nt_contiguous(a, b, d, m_indices)
    floored = (dg.scales.floor_to_ue8m0(a[1]), dg.scales.floor_to_ue8m0(b[1]))
    expected = torch.zeros_like(d)
    with dg.scoped_settings(arch_major=None):
        dg.m_grouped_fp8_gemm_nt_contiguous((a[0], floored[0]), (b[0], floored[1]), expected, m_indices)
    assert torch.equal(d, expected)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PathWarning)  # once per operand, not per call
        dg.m_grouped_fp8_gemm_nt_contiguous(a, b, d, m_indices)
    with pytest.raises(DeepGEMMError, match="disable_ue8m0_cast"):
        dg.m_grouped_fp8_gemm_nt_contiguous(a, b, d, m_indices, disable_ue8m0_cast=True)
    dg.set_arch_major(9)
    packed = (a[0], dg.get_mn_major_tma_aligned_packed_ue8m0_tensor(dg.ceil_to_ue8m0(a[1])))
    with pytest.raises(DeepGEMMError, match="SM90 takes fp32"):
        dg.m_grouped_fp8_gemm_nt_contiguous(packed, b, d, m_indices)


# -- install and passthrough -------------------------------------------------------------------------
@contextlib.contextmanager
def _installed():
    dg.install()
    try:
        yield
    finally:
        dg.uninstall()


def test_install_makes_import_deep_gemm_resolve_to_the_shim():
    had = sys.modules.get("deep_gemm")
    with _installed():
        module = importlib.import_module("deep_gemm")
        assert module is dg
        from deep_gemm.testing import calc_diff as imported_calc_diff
        from deep_gemm.utils.layout import (
            get_mn_major_tma_aligned_tensor,  # SGLang's import
        )

        assert get_mn_major_tma_aligned_tensor is dg.get_mn_major_tma_aligned_tensor
        assert imported_calc_diff is calc_diff
    assert sys.modules.get("deep_gemm") is had


def test_passthrough_calls_real_deepgemm_only_on_sm90_sm100(monkeypatch):
    calls = []
    fake = types.ModuleType("deep_gemm")
    fake.m_grouped_bf16_gemm_nt_masked = lambda *args, **kwargs: calls.append((args, kwargs))
    monkeypatch.setattr(passthrough, "_real", [fake])
    a, b = torch.randn(2, 4, 8).bfloat16(), torch.randn(2, 6, 8).bfloat16()
    d, masked_m = torch.zeros(2, 4, 6, dtype=torch.bfloat16), torch.tensor([1, 4], dtype=torch.int32)
    dg.m_grouped_bf16_gemm_nt_masked(a, b, d, masked_m, 4)  # CPU tensors: moe_hal runs it
    assert calls == [] and d.abs().sum() > 0
    monkeypatch.setattr(passthrough, "device_arch_major", lambda tensor: 10)
    dg.m_grouped_bf16_gemm_nt_masked(a, b, d, masked_m, 4, compiled_dims="nk")
    assert calls == [((a, b, d, masked_m, 4), {"compiled_dims": "nk"})]  # arguments untouched
    dg.set_passthrough("never")
    dg.m_grouped_bf16_gemm_nt_masked(a, b, d, masked_m, 4)
    assert len(calls) == 1
    monkeypatch.setattr(passthrough, "_real", [None])
    dg.set_passthrough("always")
    with pytest.raises(DeepGEMMError, match="not importable"):
        dg.m_grouped_bf16_gemm_nt_masked(a, b, d, masked_m, 4)


def test_real_deepgemm_is_not_the_shim_after_install():
    passthrough.forget()
    with _installed():
        real = passthrough.real_module()
    passthrough.forget()
    assert real is None or not getattr(real, "__moe_hal_shim__", False)


# -- replays of downstream callers (their patterns, our code) -------------------------------------------
def _resolve(module, new: str, old: str):
    """vLLM's symbol probing: the new name if the module has it, else the legacy one."""
    for name in (new, old):
        if hasattr(module, name):
            return getattr(module, name)
    return None


def test_vllm_style_probing_and_injected_disable_ue8m0_cast():
    with _installed():
        module = importlib.import_module("deep_gemm")
        dense = _resolve(module, "fp8_gemm_nt", "gemm_fp8_fp8_bf16_nt")
        grouped = _resolve(module, "m_grouped_fp8_gemm_nt_contiguous", "m_grouped_gemm_fp8_fp8_bf16_nt_contiguous")
        masked = _resolve(module, "fp8_m_grouped_gemm_nt_masked", "m_grouped_gemm_fp8_fp8_bf16_nt_masked")
        assert None not in (dense, grouped, masked)
        assert getattr(module, "fp8_paged_mqa_logits", None) is None  # optional kernels probe as absent
    a, b, d = _fp8_case()
    m_indices = torch.tensor([1] * 50 + [-1] * 14 + [0] * 64, dtype=torch.int32)  # any valid form
    a_values, b_values = _dequantized_a(a), _dequantized_b(b)
    ref = torch.zeros(128, 32, dtype=torch.float64)
    for row, g in enumerate(m_indices.tolist()):
        if g >= 0:
            ref[row] = a_values[row] @ b_values[g].T
    grouped(a, b, d, m_indices, disable_ue8m0_cast=True)  # vLLM injects this keyword
    assert calc_diff(d, ref) < 1e-5 and bool((d[50:64] == 0).all())
    dense_out = torch.empty(128, 32, dtype=torch.bfloat16)
    dense(a, (b[0][0], b[1][0]), dense_out, disable_ue8m0_cast=True)
    assert calc_diff(dense_out, a_values @ b_values[0].T) < 1e-5


def _dequantized_a(a):
    """float64 values of a DeepGEMM activation ``(fp8 [M, K], sf [M, K/128])``."""
    return a[0].double() * a[1].double().repeat_interleave(128, dim=1)[:, : a[0].shape[1]]


def _dequantized_b(b):
    """float64 values of DeepGEMM weights ``(fp8 [G, N, K], sf [G, N/128, K/128])``."""
    n, k = b[0].shape[-2:]
    return b[0].double() * b[1].double().repeat_interleave(128, dim=-2).repeat_interleave(128, dim=-1)[:, :n, :k]


@contextlib.contextmanager
def _configure_num_sms(module, num_sms):
    """The scoped override vLLM and SGLang wrap around overlapped kernels."""
    if num_sms is None:
        yield
        return
    original = module.get_num_sms()
    module.set_num_sms(num_sms)
    try:
        yield
    finally:
        module.set_num_sms(original)


def test_set_num_sms_as_a_scoped_override():
    before = dg.get_num_sms()
    with _configure_num_sms(dg, 3):
        assert dg.get_num_sms() == 3
        with pytest.raises(RuntimeError), _configure_num_sms(dg, 5):
            raise RuntimeError("kernel failed inside the override")
        assert dg.get_num_sms() == 3
    assert dg.get_num_sms() == before


def test_torchao_style_v1_calls():
    """torchao's blockwise-fp8 benchmarks call the v1 names with column-major aligned scales."""
    a, b, _ = _fp8_case(m=256, n=64, k=256, groups=1)
    a_scale = dg.get_col_major_tma_aligned_tensor(a[1])
    assert a_scale.stride() == (1, 256)
    out = torch.empty(256, 64, dtype=torch.bfloat16)
    dg.gemm_fp8_fp8_bf16_nt((a[0], a_scale), (b[0][0], b[1][0]), out)
    expected = torch.empty_like(out)
    dg.fp8_gemm_nt(a, (b[0][0], b[1][0]), expected)
    assert torch.equal(out, expected)
    m_indices = torch.tensor([0] * 256, dtype=torch.int32)
    grouped = torch.empty_like(out)
    dg.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous((a[0], a_scale), b, grouped, m_indices)
    assert torch.equal(grouped, expected)


# -- scale-layout helpers beyond DeepGEMM's layout test -------------------------------------------------
def test_packing_with_a_psum_layout_never_reads_gap_rows():
    dg.set_mk_alignment_for_contiguous_layout(32)
    sf = dg.ceil_to_ue8m0(torch.rand(96, 9) + 0.1)
    psum = torch.tensor([20, 40], dtype=torch.int32)  # groups [0, 20), [32, 40); rest gaps
    gappy = sf.clone()
    gappy[20:32], gappy[40:] = float("nan"), float("nan")
    packed = dg.get_mn_major_tma_aligned_packed_ue8m0_tensor(gappy, psum)
    full = dg.get_mn_major_tma_aligned_packed_ue8m0_tensor(sf)
    rows = torch.cat([torch.arange(0, 20), torch.arange(32, 40)])
    assert torch.equal(packed[rows], full[rows]) and bool((packed[20:32] == 0).all())


def test_transform_sf_into_required_layout_follows_the_arch():
    sfa = torch.rand(100, 3) + 0.1  # (1, 128) activation scales, K = 300
    sfb = dg.ceil_to_ue8m0(torch.rand(2, 3) + 0.1)  # (128, 128) weight scales, N = 200
    dg.set_arch_major(9)
    aligned = dg.transform_sf_into_required_layout(sfa, 100, 300, (1, 128, 128), is_sfa=True)
    assert aligned.stride() == (1, 100) and torch.equal(aligned, sfa)
    assert dg.transform_sf_into_required_layout(sfb, 200, 300, (1, 128, 128), is_sfa=False) is sfb
    dg.set_arch_major(10)
    packed = dg.transform_sf_into_required_layout(sfb, 200, 300, (1, 128, 128), is_sfa=False)
    per_row = sfb.repeat_interleave(128, dim=0)[:200]  # broadcast to one row per N
    assert torch.equal(packed, dg.get_mn_major_tma_aligned_packed_ue8m0_tensor(per_row))
    with pytest.raises(DeepGEMMError, match="is_sfa"):
        dg.transform_sf_into_required_layout(sfb, 200, 300, (1, 128, 128))


def test_packed_ue8m0_operands_compute_like_their_fp32_powers_of_two():
    a, b, _ = _fp8_case()
    a = (a[0], dg.ceil_to_ue8m0(a[1]))
    b = (b[0], dg.ceil_to_ue8m0(b[1]))
    m_indices = torch.tensor([0] * 64 + [1] * 64, dtype=torch.int32)
    d_fp32, d_packed = torch.empty(128, 32, dtype=torch.bfloat16), torch.empty(128, 32, dtype=torch.bfloat16)
    dg.m_grouped_fp8_gemm_nt_contiguous(a, b, d_fp32, m_indices)
    per_row_b = b[1].repeat_interleave(128, dim=1)[:, :32]
    packed = (
        (a[0], dg.get_mn_major_tma_aligned_packed_ue8m0_tensor(a[1])),
        (b[0], dg.get_mn_major_tma_aligned_packed_ue8m0_tensor(per_row_b)),
    )
    dg.m_grouped_fp8_gemm_nt_contiguous(*packed, d_packed, m_indices)  # default recipe (1, 1, 128)
    assert torch.equal(d_fp32, d_packed)


def test_k_grouped_packed_ue8m0_scales_compute_like_their_fp32_powers_of_two():
    dg.set_mk_alignment_for_contiguous_layout(128)
    ks = [256, 0, 384]
    layout = torch.tensor(ks, dtype=torch.int32)
    x, y = torch.randn(sum(ks), 16), torch.randn(sum(ks), 24)
    qx, qy = dg.per_channel_cast_to_fp8(x, True), dg.per_channel_cast_to_fp8(y, True)
    d_fp32 = torch.zeros(3, 16, 24)
    dg.k_grouped_fp8_gemm_tn_contiguous(qx, qy, d_fp32, ks, layout, d_fp32)
    packed = [
        (q[0], dg.get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(q[1], layout, ks, 128, 128)) for q in (qx, qy)
    ]
    d_packed = torch.zeros(3, 16, 24)
    dg.k_grouped_fp8_gemm_tn_contiguous(*packed, d_packed, ks, layout, d_packed)
    assert torch.equal(d_fp32, d_packed) and bool((d_packed[1] == 0).all())
