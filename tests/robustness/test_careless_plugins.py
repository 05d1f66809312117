"""Careless plugins — bad values, not exceptions — are recorded as broken and skipped, and never
break unrelated calls, ``explain()`` or ``moe-hal info``.

The plugins are the distribution ``tests/plugins/moe_hal_careless_vendor``, installed by this test
session with pip into a directory of its own (a separate environment, put on ``sys.path`` only while
a test runs) and discovered through its real ``moe_hal.backends`` entry points; ``MOE_HAL_PLUGINS``
picks the one a test exercises.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import moe_hal
from moe_hal import errors, sysinfo

PACKAGE = Path(__file__).parents[1] / "plugins" / "moe_hal_careless_vendor"


@pytest.fixture(scope="session")
def careless_site(tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("careless-site")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--target",
            str(site),
            str(PACKAGE),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    assert list(site.glob("moe_hal_careless_vendor-*.dist-info/entry_points.txt"))
    return site


@pytest.fixture
def careless(careless_site, monkeypatch, fresh_plugins):
    """``careless(entry_point)``: discover only that careless plugin (and the built-ins)."""

    def load(entry_point: str):
        monkeypatch.syspath_prepend(str(careless_site))
        importlib.invalidate_caches()
        monkeypatch.setenv("MOE_HAL_PLUGINS", entry_point)
        monkeypatch.delenv("MOE_HAL_STRICT_PLUGINS", raising=False)
        return fresh_plugins().ensure_loaded()

    return load


def _call():
    gen = torch.Generator().manual_seed(3)
    lay = moe_hal.ContiguousLayout.from_counts([2, 0, 3], alignment=1)
    return torch.randn(5, 16, generator=gen), torch.randn(3, 4, 16, generator=gen), lay


def _unrelated_calls_still_work():
    a, b, lay = _call()
    expected = moe_hal.grouped_gemm(a, b, lay, backend="reference")
    torch.testing.assert_close(moe_hal.grouped_gemm(a, b, lay), expected)
    assert moe_hal.explain(a, b, lay)
    snap = sysinfo.snapshot()  # what `moe-hal info` prints
    assert {b["name"] for b in snap["backends"]} >= {"torch", "reference"}
    return snap


@pytest.mark.filterwarnings("ignore::moe_hal.errors.PluginWarning")
@pytest.mark.parametrize(
    "entry_point,field",
    [
        ("api_version_none", "BackendSpec.api_version"),
        ("priority_high", "BackendSpec.priority"),
        ("signatures_str", "BackendSpec.signatures"),
        ("mutated_spec", "BackendSpec.tier"),
    ],
)
def test_a_malformed_spec_fails_its_plugin_naming_the_field(careless, entry_point, field):
    host = careless(entry_point)
    snap = _unrelated_calls_still_work()
    record = host.plugins[entry_point]
    assert record.status == "failed"
    assert record.failures[0].phase == "register_backends"
    assert field in record.failures[0].message
    assert not any(name.startswith("careless_") for name in host.specs)
    shown = {p["name"]: p for p in snap["plugins"]}[entry_point]
    assert shown["status"] == "failed" and field in shown["failures"][0]["message"]


@pytest.mark.filterwarnings("ignore::moe_hal.errors.PluginWarning")
@pytest.mark.parametrize(
    "entry_point,probe",
    [
        ("available_true", "is_available"),
        ("available_str", "is_available"),
        ("mode_none", "execution_mode"),
        ("unsupported_str", "unsupported"),
        ("auto_reason_str", "auto_select_reason"),
        ("path_int", "describe_path"),
        ("check_device_raises", "check_device"),
    ],
)
def test_a_probe_returning_a_bad_value_skips_the_backend_naming_the_probe(careless, entry_point, probe):
    host = careless(entry_point)
    name = f"careless_{entry_point}"
    assert name in host.specs
    a, b, lay = _call()
    sel = moe_hal.select(a, b, lay)
    assert sel.name != name  # priority 1000 would win if the value got through
    cand = next(c for c in sel.candidates if c.name == name)
    assert [r.code for r in cand.reasons] == ["probe_failed"]
    assert f"{name}.{probe}()" in cand.reasons[0].message
    assert name in sel.explain() and f"{probe}()" in sel.explain()
    if probe != "auto_select_reason":  # not asked when the backend is named
        with pytest.raises(errors.BackendUnavailableError, match=probe):
            moe_hal.grouped_gemm(a, b, lay, backend=name)
    snap = _unrelated_calls_still_work()
    record = host.plugins[entry_point]
    assert any(f.phase == f"probe {name}.{probe}" for f in record.failures), record.failures
    if probe not in ("unsupported", "describe_path"):  # the per-device probes `moe-hal info` asks
        row = {r["name"]: r for r in snap["backends"]}[name]
        assert not row["devices"]["cpu"]["available"]


@pytest.mark.filterwarnings("ignore::moe_hal.errors.PluginWarning")
@pytest.mark.parametrize(
    "backend,with_out",
    [
        ("careless_wrong_shape", False),
        ("careless_wrong_dtype", False),
        ("careless_returns_none", False),
        ("careless_returns_none", True),
        ("careless_ignores_out", True),
    ],
)
def test_a_result_breaking_the_output_contract_raises_backend_run_error(careless, backend, with_out):
    careless("results")
    a, b, lay = _call()
    out = torch.full((lay.num_rows, 4), -7.0) if with_out else None
    with pytest.raises(errors.BackendRunError) as info:
        moe_hal.grouped_gemm(a, b, lay, out=out, backend=backend)
    assert info.value.backend == backend and repr(backend) in str(info.value)
    _unrelated_calls_still_work()


@pytest.mark.filterwarnings("ignore::moe_hal.errors.PluginWarning")
def test_a_backend_raising_in_run_surfaces_as_backend_run_error_with_the_cause(careless):
    careless("results")
    a, b, lay = _call()
    out = torch.full((lay.num_rows, 4), -7.0)
    with pytest.raises(errors.BackendRunError, match="careless_raises") as info:
        moe_hal.grouped_gemm(a, b, lay, out=out, backend="careless_raises")
    assert isinstance(info.value.__cause__, IndexError)
    assert "partially written" in str(info.value)
    _unrelated_calls_still_work()


@pytest.mark.filterwarnings("ignore::moe_hal.errors.PluginWarning")
def test_a_slow_availability_probe_of_another_device_type_is_never_waited_for(careless):
    careless("slow_cuda")
    backend = moe_hal.get_backend("careless_slow_cuda")
    start = time.perf_counter()
    for k in (8, 16, 24, 32, 40):  # five new CPU call signatures
        lay = moe_hal.ContiguousLayout.from_counts([2, 1], alignment=1)
        moe_hal.grouped_gemm(torch.randn(3, k), torch.randn(2, 4, k), lay)
    assert type(backend).calls == 0
    assert time.perf_counter() - start < 2.5  # five probes would take 2.5 s
    # Named explicitly, it is asked — once, however many calls follow.
    for k in (8, 16):
        with pytest.raises(errors.BackendUnavailableError):
            moe_hal.select(torch.randn(3, k), torch.randn(2, 4, k), lay, backend="careless_slow_cuda")
    assert type(backend).calls == 1
