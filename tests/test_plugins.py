"""Plugin discovery and failure isolation, through the real entry points of the test plugins in
tests/plugins (installed by .ci/run), plus simulated entry-point conflicts."""

from __future__ import annotations

import importlib.metadata as metadata
import json
import subprocess
import sys

import pytest

import moe_hal
from moe_hal import errors, hookspecs, plugins

from .conftest import randn

LAY = moe_hal.ContiguousLayout.from_counts([2, 3], alignment=1)


def call(gen, backend=None):
    return moe_hal.select(randn(gen, 5, 8), randn(gen, 2, 4, 8), LAY, backend=backend)


def test_test_plugins_are_installed():
    names = {ep.name for ep in metadata.entry_points(group=hookspecs.ENTRY_POINT_GROUP)}
    assert {
        "fake_vendor",
        "broken_import",
        "broken_hook",
        "broken_reserved",
        "broken_impl",
        "broken_typo",
        "twin_a",
        "twin_b",
    } <= names, "pip install -e tests/plugins/moe_hal_fake_vendor -e tests/plugins/moe_hal_broken_vendor"


def test_import_moe_hal_loads_no_plugin_and_no_vendor_stack():
    code = (
        "import sys, moe_hal; print('torch' in sys.modules); "
        "import moe_hal.plugins as p, moe_hal.api; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('torch_npu', 'triton', 'cuda', 'moe_hal_cuda', 'moe_hal_ascend', 'moe_hal_fake_vendor', "
        "'moe_hal_broken_vendor'))); print(p.host()._loaded)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0] == "False", "import moe_hal alone must not even import torch (names load on first access)"
    assert out[1] == "[]"
    assert out[2] == "False"


def test_public_names_resolve():
    for name in moe_hal.__all__:
        assert getattr(moe_hal, name) is not None
    assert moe_hal.select is moe_hal.api.select  # the function, not the selection module
    assert callable(moe_hal.device_info)


def test_broken_plugins_are_isolated_and_recorded(fresh_plugins, gen):
    host = fresh_plugins()
    with pytest.warns(errors.PluginWarning):
        host.ensure_loaded()
    status = {name: rec.status for name, rec in host.plugins.items()}
    assert status["fake_vendor"] == "loaded"
    assert status["moe_hal"] == "builtin"
    assert status["broken_import"] == "failed"
    assert status["broken_hook"] == "failed"
    assert status["broken_reserved"] == "failed"
    assert status["broken_typo"] == "failed"
    phases = {f.plugin: f.phase for f in host.failures()}
    assert phases == {
        "broken_import": "load",
        "broken_hook": "register_backends",
        "broken_reserved": "register_backends",
        "broken_typo": "validate",
    }
    failure = next(f for f in host.failures() if f.plugin == "broken_import")
    assert "libvendor_kernels.so" in failure.message and "Traceback" in failure.traceback
    assert failure.distribution == "moe-hal-broken-vendor"
    # the built-in torch backend is untouched by the impostor, and calls still work
    assert host.specs["torch"].plugin == "moe_hal"
    assert call(gen).name == "torch"


def test_failures_are_explained_per_backend(fresh_plugins, gen):
    fresh_plugins()
    text = call(gen).explain()
    assert "[backend_import_failed]" in text and "broken_impl" in text
    assert "[name_conflict]" in text and "twin_a" in text and "twin_b" in text
    assert "plugin:broken_import" in text and "libvendor_kernels.so" in text
    with pytest.raises(errors.BackendUnavailableError) as info:
        call(gen, backend="twin")
    assert [r.code for r in info.value.reasons] == ["name_conflict"]
    with pytest.raises(errors.BackendUnavailableError) as info:
        call(gen, backend="broken_impl")
    assert [r.code for r in info.value.reasons] == ["backend_import_failed"]


def test_strict_plugins_raise(fresh_plugins, monkeypatch):
    monkeypatch.setenv("MOE_HAL_STRICT_PLUGINS", "1")
    host = fresh_plugins()
    with pytest.raises(errors.PluginError) as info:
        host.ensure_loaded()
    assert {f.plugin for f in info.value.failures} >= {"broken_import", "broken_hook"}


def test_moe_hal_plugins_empty_loads_builtins_only(fresh_plugins, monkeypatch, gen):
    monkeypatch.setenv("MOE_HAL_PLUGINS", "")
    host = fresh_plugins().ensure_loaded()
    assert sorted(host.specs) == ["reference", "torch"]
    assert host.failures() == []
    assert call(gen).name == "torch"


def test_moe_hal_plugins_list_loads_only_those(fresh_plugins, monkeypatch):
    monkeypatch.setenv("MOE_HAL_PLUGINS", "fake_vendor, not_there")
    host = fresh_plugins().ensure_loaded()
    assert sorted(host.specs) == ["fake_vendor", "reference", "torch"]
    assert host.plugins["broken_import"].status == "disabled"
    missing = host.plugins["not_there"]
    assert missing.status == "not_installed" and "not_there" in missing.failures[0].message


def test_entry_point_conflict_loads_neither(fresh_plugins, monkeypatch):
    a = metadata.EntryPoint("dup", "moe_hal_fake_vendor.plugin", hookspecs.ENTRY_POINT_GROUP)
    b = metadata.EntryPoint("dup", "moe_hal_broken_vendor.twin_a", hookspecs.ENTRY_POINT_GROUP)
    same = metadata.EntryPoint("fake", "moe_hal_fake_vendor.plugin", hookspecs.ENTRY_POINT_GROUP)
    monkeypatch.setattr(plugins.metadata, "entry_points", lambda group: [a, b, same, same])
    host = fresh_plugins().ensure_loaded()
    assert host.plugins["dup"].status == "conflict"
    assert "none is loaded" in host.plugins["dup"].failures[0].message
    assert host.plugins["fake"].status == "loaded"  # an identical duplicate counts once
    assert "fake_vendor" in host.specs


def test_plugin_cannot_take_the_core_name(fresh_plugins, monkeypatch):
    ep = metadata.EntryPoint("moe_hal", "moe_hal_fake_vendor.plugin", hookspecs.ENTRY_POINT_GROUP)
    monkeypatch.setattr(plugins.metadata, "entry_points", lambda group: [ep])
    host = fresh_plugins().ensure_loaded()
    assert host.plugins["moe_hal"].status == "builtin"
    assert "fake_vendor" not in host.specs


def test_ranking_does_not_depend_on_entry_point_order(fresh_plugins, monkeypatch, gen):
    eps = [metadata.EntryPoint(n, f"moe_hal_broken_vendor.{n}", hookspecs.ENTRY_POINT_GROUP) for n in ("twin_a",)]
    eps.append(metadata.EntryPoint("fake_vendor", "moe_hal_fake_vendor.plugin", hookspecs.ENTRY_POINT_GROUP))
    results = []
    for order in (eps, eps[::-1]):
        monkeypatch.setattr(plugins.metadata, "entry_points", lambda group, _o=order: list(_o))
        fresh_plugins()
        sel = call(gen)
        results.append((sel.name, sel.ranked))
    assert results[0] == results[1]
    assert results[0][0] == "twin"  # priority 900 beats torch (0) and fake_vendor (-100)


def test_trace_plugins_prints_to_stderr():
    env = {"MOE_HAL_TRACE_PLUGINS": "1", "MOE_HAL_PLUGINS": "fake_vendor", "PATH": ""}
    code = "import moe_hal.plugins as p; p.host().ensure_loaded()"
    err = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stderr
    assert "loading entry point fake_vendor" in err and "calling moe_hal_register_backends of fake_vendor" in err


def test_info_json_works_with_broken_plugins():
    out = subprocess.run(
        [sys.executable, "-m", "moe_hal", "info", "--json"], capture_output=True, text=True, check=True
    )
    snap = json.loads(out.stdout)
    plugins_by_name = {p["name"]: p for p in snap["plugins"]}
    assert plugins_by_name["broken_hook"]["status"] == "failed"
    assert "Traceback" in plugins_by_name["broken_hook"]["failures"][0]["traceback"]
    backends_by_name = {b["name"]: b for b in snap["backends"]}
    assert backends_by_name["torch"]["devices"]["cpu"]["available"]
    assert not backends_by_name["twin"]["devices"]["cpu"]["available"]
    assert snap["devices"][0]["device"] == "cpu"


def test_every_hookspec_is_documented_with_its_signature():
    import inspect
    from pathlib import Path

    doc = (Path(__file__).parents[1] / "docs" / "plugins.md").read_text()
    for name in (n for n in dir(hookspecs) if n.startswith("moe_hal_")):
        params = ", ".join(inspect.signature(getattr(hookspecs, name)).parameters)
        assert f"{name}({params})" in doc, f"docs/plugins.md must document {name}({params})"


def test_every_hookspec_is_exercised_by_the_fake_vendor():
    import moe_hal_fake_vendor.plugin as fake

    for name in (n for n in dir(hookspecs) if n.startswith("moe_hal_")):
        assert hasattr(fake, name), f"the fake vendor plugin should implement {name} so CI exercises it"


def test_plugin_hardware_db_overlay_reaches_the_database(fresh_plugins):
    from moe_hal import hwdb, match_device

    host = fresh_plugins().ensure_loaded()
    assert any(plugin == "fake_vendor" for _, plugin in host.hw_overlays)
    entry = hwdb.get("example-fake-accelerator")
    assert "fake_feature" in entry.features
    assert hwdb.match_cuda("Example Fake Accelerator", 99, 0).id == "example-fake-accelerator"
    # a device type of the plugin's own, probed by its moe_hal_probe_device hook
    assert match_device("fake_accel:1").id == "example-fake-accelerator"
    assert match_device("fake_accel:1").seen == "Fake Accelerator #1"


def test_malformed_plugin_overlay_fails_only_that_plugin(fresh_plugins, monkeypatch, tmp_path):
    import moe_hal_fake_vendor.plugin as fake

    bad = tmp_path / "bad.yaml"
    bad.write_text("schema_version: 1\nid: example-bad\nunknown_key: 3\n")
    monkeypatch.setattr(fake, "moe_hal_hardware_db", moe_hal.hookimpl(lambda register: register(bad)))
    host = fresh_plugins().ensure_loaded()
    failure = next(f for f in host.failures() if f.plugin == "fake_vendor")
    assert failure.phase == "hardware_db" and failure.exc_type == "HardwareDBError"
    assert "bad.yaml" in failure.message
    assert "fake_vendor" in host.specs  # its backends stay registered


def test_plugin_conformance_manifest_hook(fresh_plugins):
    host = fresh_plugins().ensure_loaded()
    manifests = host.conformance_manifests("fake_vendor")
    assert [plugin for _, plugin in manifests] == ["fake_vendor"]
    assert manifests[0][0].endswith("expected_failures.yaml")
    assert host.conformance_manifests("torch") == []
