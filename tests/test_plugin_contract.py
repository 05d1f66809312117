"""The plugin contract: the stable import surface, the typed performance-model declaration, the
optional physical_scales method, plugin-declared environment, and denying one plugin."""

from __future__ import annotations

import ast
import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

import moe_hal
from moe_hal import environment, plugin_api, sysinfo
from moe_hal.backend import Backend, BackendSpec, GraphCapture, PerfModel, Signature

ROOT = Path(__file__).resolve().parents[1]
#: The entry-point modules of the plugins in this repository.
PLUGIN_MODULES = [
    ROOT / "backends/cuda/moe_hal_cuda/plugin.py",
    ROOT / "backends/ascend/moe_hal_ascend/plugin.py",
    ROOT / "tests/plugins/moe_hal_fake_vendor/moe_hal_fake_vendor/plugin.py",
]


def test_plugin_api_offers_every_name_without_importing_torch():
    for name in plugin_api.__all__:
        assert getattr(plugin_api, name) is not None, name
    code = (
        "import sys, moe_hal.plugin_api as api; "
        "assert 'torch' not in sys.modules, 'plugin_api imported torch'; "
        "api.BackendSpec, api.Signature, api.PerfModel, api.hookimpl, api.clear_cache(); "
        "assert 'torch' not in sys.modules and 'moe_hal.selection' not in sys.modules; print('ok')"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


@pytest.mark.parametrize("path", PLUGIN_MODULES, ids=lambda p: p.parts[-3])
def test_plugin_entry_modules_import_only_the_stable_surface(path):
    imported = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("moe_hal"):
            imported.add(node.module)
        elif isinstance(node, ast.Import):
            imported.update(a.name for a in node.names if a.name.startswith("moe_hal"))
    assert imported <= {"moe_hal", "moe_hal.plugin_api"}, imported


def test_clear_cache_forgets_selections():
    import torch

    from moe_hal import selection

    a, b = torch.randn(4, 8), torch.randn(2, 4, 8)
    lay = moe_hal.ContiguousLayout.from_counts([2, 2], alignment=1)
    first = moe_hal.select(a, b, lay)
    assert moe_hal.select(a, b, lay) is first  # cached
    moe_hal.clear_cache()
    assert not selection._cache and moe_hal.select(a, b, lay) is not first


def test_perf_model_is_typed_and_validated():
    spec = BackendSpec("x", "v", ("cpu",), "fallback", 0, "m:C", (), perf_model=PerfModel(tiles=[[64, 128]]))
    assert spec.perf_model.tiles == ((64, 128),)
    assert PerfModel(reads_padding_rows=True, impl="acme_kernels").estimate_options() == {
        "streams_all_experts": False,
        "reads_padding_rows": True,
        "impl": "acme_kernels",
    }
    with pytest.raises(ValueError, match="perf_model"):
        BackendSpec("x", "v", ("cpu",), "fallback", 0, "m:C", (), perf_model={"tiles": [[64, 128]]})
    with pytest.raises(ValueError, match="tiles"):
        PerfModel(tiles=[(64, 0)])
    with pytest.raises(ValueError, match="streams_all_experts"):
        PerfModel(streams_all_experts="yes")
    with pytest.raises(ValueError, match="impl"):
        PerfModel(impl="")


def test_the_shipped_backends_declare_their_perf_model():
    host = moe_hal.plugins.host().ensure_loaded()
    assert host.specs["torch"].perf_model.masked_computes_max_m
    if "cuda_sm90" in host.specs:
        tiles = host.specs["cuda_sm90"].perf_model.tiles
        assert tiles and all(len(t) == 2 for t in tiles)


def test_graph_capture_is_declared_per_layout():
    """``graph_capturable`` is a typed per-operation declaration; a bool declares every operation
    alike; an operation left out is not capturable; selection and reports say what the chosen
    backend declares for the call's operation."""
    masked_only = {"masked": GraphCapture(True, replay_reads_layout=True, note="masked_m on the device")}
    spec = BackendSpec("x", "v", ("cpu",), "fallback", 0, "m:C", (), graph_capturable=masked_only)
    assert spec.graph_capture("masked") == masked_only["masked"]
    assert not spec.graph_capture("contiguous").capturable and "not declared" in spec.graph_capture("contiguous").note
    assert spec.graph_capture_report() == {
        "contiguous": "not capturable (not declared by the backend)",
        "masked": "capturable; a replay reads the layout's current device values (masked_m on the device)",
        "k_grouped": "not capturable (not declared by the backend)",
    }
    assert hash(spec) == hash(dataclasses.replace(spec))  # hashable, and replace() keeps the declaration
    assert dataclasses.replace(spec).graph_capture("masked") == masked_only["masked"]
    every = BackendSpec("x", "v", ("cpu",), "fallback", 0, "m:C", (), graph_capturable=True)
    assert all(every.graph_capture(op).capturable for op in ("contiguous", "masked", "k_grouped"))
    for bad in ({"dense": GraphCapture(True)}, {"masked": True}, "yes"):
        with pytest.raises(ValueError, match="graph_capturable"):
            BackendSpec("x", "v", ("cpu",), "fallback", 0, "m:C", (), graph_capturable=bad)
    with pytest.raises(ValueError, match="replay_reads_layout"):
        GraphCapture(False, replay_reads_layout=True)
    host = moe_hal.plugins.host().ensure_loaded()
    for name in ("reference", "torch"):
        assert not any(host.specs[name].graph_capture(op).capturable for op in ("contiguous", "masked", "k_grouped"))
    if "cuda_sm90" in host.specs:
        cuda = host.specs["cuda_sm90"]
        assert cuda.graph_capture("masked").replay_reads_layout
        assert cuda.graph_capture("contiguous").capturable and not cuda.graph_capture("contiguous").replay_reads_layout


def test_selection_reports_the_graph_capture_of_its_operation():
    import torch

    lay = moe_hal.ContiguousLayout.from_counts([3, 5], alignment=4)
    sel = moe_hal.select(torch.zeros(lay.num_rows, 16), torch.zeros(2, 8, 16), lay, backend="reference")
    assert sel.graph_capture == sel.chosen.spec.graph_capture("contiguous")
    assert "graph capture (contiguous): not capturable (reads the layout on the host)" in sel.explain()
    assert sel.as_dict()["graph_capture"] == "not capturable (reads the layout on the host)"


def test_physical_scales_is_an_optional_documented_method():
    spec = BackendSpec("x", "v", ("cpu",), "fallback", 0, "m:C", (Signature({"contiguous"}, {"bf16"}, {"bf16"}),))

    class Plain(Backend):
        pass

    class Transforming(Backend):
        def physical_scales(self, q, role):
            return q

    assert not Plain(spec).has_physical_scales() and Transforming(spec).has_physical_scales()
    with pytest.raises(NotImplementedError, match="physical_scales"):
        Plain(spec).physical_scales(None, "a")
    assert "role" in Backend.physical_scales.__doc__


def test_the_core_lists_no_vendor_variable_or_package():
    vendor_words = ("CUDA", "ASCEND", "NPU", "TRITON", "CANN")
    assert not [
        n for n in (*environment.KNOWN_ENV_VARS, *environment.RELATED_ENV_VARS) if any(w in n for w in vendor_words)
    ]
    assert not [p for p in sysinfo.CORE_PACKAGES if any(w.lower() in p for w in vendor_words)]


def test_plugins_declare_their_environment(fresh_plugins, monkeypatch):
    monkeypatch.setenv("MOE_HAL_PLUGINS", "fake_vendor")
    monkeypatch.setenv("MOE_HAL_FAKE_VENDOR_MODE", "on")
    monkeypatch.setenv("MOE_HAL_NO_SUCH_SWITCH", "1")
    host = fresh_plugins().ensure_loaded()
    assert host.env_vars["MOE_HAL_FAKE_VENDOR_MODE"][1] == "fake_vendor"
    assert "pluggy" in host.packages
    assert ("fake vendor firmware", "fake_vendor") in [(name, plugin) for name, _, plugin in host.facts]
    env = sysinfo.env_vars()
    assert env["MOE_HAL_FAKE_VENDOR_MODE"]["known"] and env["MOE_HAL_FAKE_VENDOR_MODE"]["read_by"] == "fake_vendor"
    assert not env["MOE_HAL_NO_SUCH_SWITCH"]["known"]


def test_a_failing_environment_hook_fails_only_its_plugin(fresh_plugins, monkeypatch):
    import moe_hal_fake_vendor.plugin as fake

    def broken(env_var, package, fact):
        env_var("MOE_HAL_FAKE_HALF_DECLARED", "kept only if the hook succeeds")
        raise RuntimeError("environment probe exploded")

    monkeypatch.setenv("MOE_HAL_PLUGINS", "fake_vendor")
    monkeypatch.setattr(fake, "moe_hal_environment", moe_hal.hookimpl(broken))
    host = fresh_plugins().ensure_loaded()
    failure = next(f for f in host.failures() if f.plugin == "fake_vendor")
    assert failure.phase == "environment" and "exploded" in failure.message
    assert "MOE_HAL_FAKE_HALF_DECLARED" not in host.env_vars
    assert "fake_vendor" in host.specs


def test_disable_plugins_denies_one_plugin(fresh_plugins, monkeypatch):
    monkeypatch.delenv("MOE_HAL_PLUGINS", raising=False)
    monkeypatch.setenv("MOE_HAL_DISABLE_PLUGINS", "fake_vendor, broken_import")
    host = fresh_plugins().ensure_loaded()
    assert host.plugins["fake_vendor"].status == "disabled"
    assert host.plugins["broken_import"].status == "disabled"
    assert "fake_vendor" not in host.specs
    assert not [f for f in host.failures() if f.plugin in ("fake_vendor", "broken_import")]
    assert os.environ["MOE_HAL_DISABLE_PLUGINS"]


@pytest.mark.parametrize(
    "field,value",
    [("dtypes", {"fp8"}), ("dtypes", {"bfloat16"}), ("out_dtypes", {"float32"}), ("scale_formats", {"e8m0"})],
)
def test_signature_refuses_names_outside_the_vocabulary(field, value):
    # Accepted silently, such a signature would never match any call.
    fields = {"ops": {"contiguous"}, "dtypes": {"bf16"}, "out_dtypes": {"bf16"}, field: value}
    with pytest.raises(moe_hal.errors.ArgumentError, match=f"Signature.{field}"):
        Signature(**fields)
