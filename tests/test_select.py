"""Selection: forcing, preference lists, disabling, caching, explain() and one-time warnings."""

from __future__ import annotations

import warnings

import pytest
import torch

import moe_hal
from moe_hal import errors, notices

from .conftest import randn

LAY = moe_hal.ContiguousLayout.from_counts([2, 3], alignment=1)


def args(gen, dtype=torch.float32):
    return randn(gen, 5, 8, dtype=dtype), randn(gen, 2, 4, 8, dtype=dtype), LAY


def test_forced_backend_by_argument_and_env(fresh_plugins, monkeypatch, gen):
    fresh_plugins()
    assert moe_hal.select(*args(gen), backend="fake_vendor").name == "fake_vendor"
    monkeypatch.setenv("MOE_HAL_BACKEND", "reference")
    sel = moe_hal.select(*args(gen))
    assert sel.name == "reference" and sel.how == "forced"
    assert moe_hal.select(*args(gen), backend="torch").name == "torch"  # the argument wins over the env


def test_forced_ineligible_backend_raises_with_its_reasons(fresh_plugins, gen):
    fresh_plugins()
    a, b, lay = args(gen)
    out = torch.full((5, 4), 9.0)
    with pytest.raises(errors.BackendUnavailableError) as info:
        # fake_vendor declares no fp8; a quantized call is outside its signatures
        from moe_hal.quant import quantize_fp8

        moe_hal.grouped_gemm(
            quantize_fp8(randn(gen, 5, 128)),
            quantize_fp8(randn(gen, 2, 4, 128), block=(128, 128)),
            lay,
            backend="fake_vendor",
        )
    codes = {r.code for r in info.value.reasons}
    assert "dtype_unsupported" in codes and info.value.backend == "fake_vendor"
    assert "not used" in str(info.value)
    with pytest.raises(errors.BackendUnavailableError) as info:
        moe_hal.grouped_gemm(a, b, lay, out=out, backend="no_such_backend")
    assert info.value.reasons[0].code == "unknown_backend"
    assert "torch" in info.value.reasons[0].expected
    assert torch.all(out == 9.0)


def test_preference_list_is_strict_and_ordered(fresh_plugins, monkeypatch, gen):
    fresh_plugins()
    monkeypatch.setenv("MOE_HAL_BACKEND", "fake_vendor,reference")
    sel = moe_hal.select(*args(gen))
    assert sel.name == "fake_vendor" and sel.ranked == ["fake_vendor", "reference"] and sel.how == "preference"
    monkeypatch.setenv("MOE_HAL_BACKEND", "reference,fake_vendor")
    assert moe_hal.select(*args(gen)).name == "reference"
    # nothing in the list can run fp16 -> fp32 with fake_vendor disabled: no fallback to torch
    monkeypatch.setenv("MOE_HAL_DISABLE_BACKENDS", "fake_vendor")
    monkeypatch.setenv("MOE_HAL_BACKEND", "fake_vendor,twin")
    with pytest.raises(errors.NoBackendError) as info:
        moe_hal.select(*args(gen))
    text = info.value.explanation
    assert "disabled_by_env" in text and "name_conflict" in text


def test_duplicate_names_in_preference_are_rejected(fresh_plugins, gen):
    fresh_plugins()
    with pytest.raises(errors.ArgumentError):
        moe_hal.select(*args(gen), backend=["torch", "torch"])


def test_disable_backends(fresh_plugins, monkeypatch, gen):
    fresh_plugins()
    monkeypatch.setenv("MOE_HAL_DISABLE_BACKENDS", "torch")
    notices.reset()
    with pytest.warns(errors.PathWarning, match="fallback backend 'fake_vendor'"):
        sel = moe_hal.select(*args(gen))
    assert sel.name == "fake_vendor"
    reasons = {c.name: [r.code for r in c.reasons] for c in sel.candidates}
    assert reasons["torch"] == ["disabled_by_env"]
    with pytest.raises(errors.BackendUnavailableError) as info:
        moe_hal.select(*args(gen), backend="torch")
    assert [r.code for r in info.value.reasons] == ["disabled_by_env"]


def test_reference_selected_automatically_warns_once(fresh_plugins, monkeypatch, gen):
    monkeypatch.setenv("MOE_HAL_PLUGINS", "")
    monkeypatch.setenv("MOE_HAL_DISABLE_BACKENDS", "torch")
    fresh_plugins()
    with pytest.warns(errors.PathWarning, match="reference backend"):
        moe_hal.grouped_gemm(*args(gen))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        moe_hal.grouped_gemm(*args(gen))  # once per process, not per call


def test_selection_is_cached_per_signature_and_environment(fresh_plugins, monkeypatch, gen):
    fresh_plugins()
    first = moe_hal.select(*args(gen))
    assert moe_hal.select(*args(gen)) is first
    other_k = moe_hal.select(randn(gen, 5, 16), randn(gen, 2, 4, 16), LAY)
    assert other_k is not first
    monkeypatch.setenv("MOE_HAL_DISABLE_BACKENDS", "torch")
    assert moe_hal.select(*args(gen)).name != "torch"
    monkeypatch.delenv("MOE_HAL_DISABLE_BACKENDS")
    assert moe_hal.select(*args(gen)) is first


def test_explain_lists_every_backend_and_reason(fresh_plugins, gen):
    fresh_plugins()
    sel = moe_hal.select(*args(gen))
    text = sel.explain()
    assert text.startswith("call: contiguous fp32 -> fp32, G=2, M=5, N=4, K=8")
    assert "device: cpu" in text and "selected: torch" in text
    assert (
        "also eligible, ranked lower: fake_vendor (fallback, priority -100), reference (reference, priority -1000)"
    ) in text
    names = {c.name for c in sel.candidates}
    assert {"torch", "reference", "fake_vendor", "twin", "broken_impl", "plugin:broken_import"} <= names
    d = sel.as_dict()
    assert d["selected"] == "torch" and d["mode"] == "native"
    assert all(c["eligible"] == (not c["reasons"]) for c in d["candidates"])


def test_explain_never_raises_for_ineligible_calls(fresh_plugins, gen):
    fresh_plugins()
    text = moe_hal.explain(*args(gen), backend="twin")
    assert "name_conflict" in text


def test_unknown_device_has_no_entry_and_a_clear_reason(fresh_plugins):
    from moe_hal.backend import DeviceInfo

    fresh_plugins()
    backend = moe_hal.get_backend("fake_vendor")
    unknown = DeviceInfo("cuda", 0, None, frozenset(), "Mystery GPU (cc 12.3, 7 SMs)")
    codes = [r.code for r in backend.check_device(unknown)]
    assert codes == ["device_type_unsupported"]
    needs = moe_hal.Backend(
        moe_hal.BackendSpec(
            name="needs_tma",
            vendor="t",
            device_types=("cuda",),
            tier="optimized",
            priority=1,
            impl="x:y",
            requires={"tma"},
            signatures=(),
        )
    )
    reasons = needs.check_device(unknown)
    assert [r.code for r in reasons] == ["device_unrecognised"] and "Mystery GPU" in str(reasons[0])


def test_get_backend_and_backends(fresh_plugins):
    fresh_plugins()
    names = [s.name for s in moe_hal.backends()]
    assert names == sorted(names) and {"torch", "reference", "fake_vendor"} <= set(names)
    assert moe_hal.get_backend("torch").spec.plugin == "moe_hal"
    with pytest.raises(errors.BackendUnavailableError):
        moe_hal.get_backend("broken_impl")
