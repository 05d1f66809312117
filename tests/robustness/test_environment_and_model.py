"""Environment variables go through one parser (typed errors naming the variable), and the
performance model neither overflows nor underflows on extreme arguments."""

from __future__ import annotations

import math

import pytest
import torch

import moe_hal
from moe_hal import environment, errors, perf
from moe_hal.prepared import ENV_MAX_BYTES, prepared_cache


@pytest.mark.parametrize(
    "text,value",
    [
        ("1", True),
        ("true", True),
        ("YES", True),
        (" on ", True),
        ("", False),
        ("0", False),
        ("false", False),
        ("False", False),
        ("no", False),
        ("off", False),
    ],
)
def test_boolean_variables(text, value, monkeypatch):
    monkeypatch.setenv("MOE_HAL_STRICT_PLUGINS", text)
    assert environment.flag("MOE_HAL_STRICT_PLUGINS") is value


@pytest.mark.parametrize("text", ["2", "maybe", "ture", "1.0", "-1"])
def test_a_boolean_variable_that_is_no_boolean_names_the_variable(text, monkeypatch):
    monkeypatch.setenv("MOE_HAL_TRACE_PLUGINS", text)
    with pytest.raises(errors.EnvironmentVariableError) as info:
        environment.flag("MOE_HAL_TRACE_PLUGINS")
    assert info.value.argument == "MOE_HAL_TRACE_PLUGINS" and repr(text) in str(info.value)


@pytest.mark.filterwarnings("ignore::moe_hal.errors.PluginWarning")
def test_strict_plugins_false_means_off(monkeypatch, fresh_plugins):
    # the broken test plugins are installed: strict mode would raise PluginError
    monkeypatch.setenv("MOE_HAL_STRICT_PLUGINS", "false")
    host = fresh_plugins().ensure_loaded()
    assert host.failures()
    monkeypatch.setenv("MOE_HAL_STRICT_PLUGINS", "true")
    with pytest.raises(errors.PluginError):
        fresh_plugins().ensure_loaded()


@pytest.mark.parametrize("text", ["1e999", "1e30", "-5", "8 apples", "nan", "inf", "0x10", "1e400GiB"])
def test_a_size_variable_that_is_no_size_names_the_variable(text, monkeypatch):
    monkeypatch.setenv(ENV_MAX_BYTES, text)
    prepared_cache.reset_max_bytes()
    with pytest.raises(errors.EnvironmentVariableError) as info:
        prepared_cache.max_bytes  # noqa: B018 - reading the property is what raises
    assert info.value.argument == ENV_MAX_BYTES


@pytest.mark.parametrize("text,value", [("8e9", 8 * 10**9), ("512MiB", 512 * 2**20), ("", None), ("0", 0)])
def test_size_variables(text, value, monkeypatch):
    monkeypatch.setenv(ENV_MAX_BYTES, text)
    prepared_cache.reset_max_bytes()
    assert prepared_cache.max_bytes == value


def test_an_enum_variable_refuses_values_outside_its_set(monkeypatch):
    monkeypatch.setenv("MOE_HAL_ASCEND_WEIGHT_FORMAT", "fractal")
    with pytest.raises(errors.EnvironmentVariableError, match="MOE_HAL_ASCEND_WEIGHT_FORMAT"):
        environment.choice("MOE_HAL_ASCEND_WEIGHT_FORMAT", ("nd", "nz"), "nd")
    monkeypatch.setenv("MOE_HAL_ASCEND_WEIGHT_FORMAT", " NZ ")
    assert environment.choice("MOE_HAL_ASCEND_WEIGHT_FORMAT", ("nd", "nz"), "nd") == "nz"


# -- the performance model ---------------------------------------------------------------------------
H100 = dict(n=4096, k=7168, hw="nvidia-h100-sxm", dtype="bf16")


@pytest.mark.parametrize("p", [1.0, 2.0, 50.0, 1e6, 1e300])
def test_overlap_p_never_underflows(p):
    est = perf.estimate([128, 64, 0, 300], overlap_p=p, **H100)
    body = est.t_predicted - est.t_fixed
    assert max(est.t_compute, est.t_memory) <= body * (1 + 1e-12)
    assert body <= est.t_compute + est.t_memory + 1e-18
    assert math.isfinite(est.t_predicted) and est.t_predicted > 0


@pytest.mark.parametrize(
    "argument,kwargs",
    [
        ("counts[0]", dict(counts=[10**400])),
        ("counts[1]", dict(counts=[1, 2**60])),
        ("n", dict(counts=[4], n=10**400)),
        ("k", dict(counts=[4], k=2**70)),
        ("block_m", dict(counts=[4], block_m=10**30)),
    ],
)
def test_huge_integers_are_typed_errors(argument, kwargs):
    args = {**H100, **kwargs}
    with pytest.raises(errors.ArgumentError) as info:
        perf.estimate(args.pop("counts"), **args)
    assert info.value.argument == argument


def test_largest_accepted_integers_give_finite_estimates():
    est = perf.estimate([2**53, 2**53], n=2**53, k=2**53, hw="nvidia-h100-sxm", dtype="bf16")
    assert math.isfinite(est.t_predicted) and math.isfinite(est.useful_flops)


def test_meta_tensors_are_a_typed_error():
    lay = moe_hal.ContiguousLayout.from_counts([2], alignment=1)
    with pytest.raises(errors.DeviceError, match="meta"):
        moe_hal.grouped_gemm(torch.empty(2, 8, device="meta"), torch.empty(1, 4, 8, device="meta"), lay)
