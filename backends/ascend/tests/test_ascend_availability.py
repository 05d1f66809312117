"""Availability reasons, each failure simulated, and the autoload trap.

A fake ``torch_npu`` package written to a temporary directory stands in for each way the real one
fails on machines people actually have (the plugin's README, "The autoload trap"): not installed, installed
without CANN (``libhccl.so``), broken, too old, no device, an SoC the hardware DB does not support.
"""

from __future__ import annotations

import importlib.metadata as metadata
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from ascend_helpers import SOC_910B, SOC_950

from moe_hal import match_device
from moe_hal.backend import DeviceInfo
from moe_hal.plugins import BUILTIN_PLUGIN
from moe_hal.selection import device_info
from moe_hal_ascend import disable_emulation, runtime
from moe_hal_ascend.backend import Ascend950Backend, AscendBackend
from moe_hal_ascend.plugin import specs

LIBHCCL = "libhccl.so: cannot open shared object file: No such file or directory"

#: Module bodies of fake torch_npu packages, one per failure.
FAKES = {
    "cann_missing_oserror": f"raise OSError({LIBHCCL!r})",
    "cann_missing_importerror": "raise ImportError('libascendcl.so: cannot open shared object file')",
    "torch_npu_broken": "raise RuntimeError('Two accelerators cannot be used at the same time in PyTorch: "
    "npu and cuda')",
    "npu_op_missing": "__version__ = '2.0.0'",
    "npu_device_missing": """
        import torch, types
        __version__ = '2.13.0'
        def npu_grouped_matmul(*args, **kwargs): raise AssertionError('never called')
        torch.npu = types.SimpleNamespace(is_available=lambda: False, device_count=lambda: 0)
    """,
}


def _device_fake(soc_name: str) -> str:
    return f"""
        import torch, types
        __version__ = '2.13.0'
        def npu_grouped_matmul(*args, **kwargs): raise AssertionError('never called')
        torch.npu = types.SimpleNamespace(is_available=lambda: True, device_count=lambda: 1,
                                          current_device=lambda: 0, get_device_name=lambda i=0: {soc_name!r})
        npu = types.SimpleNamespace(get_soc_version=lambda: None)
    """


@pytest.fixture
def fake_torch_npu(tmp_path, monkeypatch):
    """``install(body)`` puts a ``torch_npu`` package with that body first on sys.path."""
    monkeypatch.setattr(torch, "npu", getattr(torch, "npu", None), raising=False)
    disable_emulation()

    def install(body: str) -> None:
        package = tmp_path / "torch_npu"
        package.mkdir(exist_ok=True)
        (package / "__init__.py").write_text(textwrap.dedent(body))
        monkeypatch.syspath_prepend(str(tmp_path))
        sys.modules.pop("torch_npu", None)
        runtime.forget()

    yield install
    sys.modules.pop("torch_npu", None)
    runtime.forget()


def _backend(cls=AscendBackend):
    spec = {s.name: s for s in specs()}["ascend" if cls is AscendBackend else "ascend_950"]
    return cls(spec)


def test_torch_npu_missing(monkeypatch):
    disable_emulation()
    monkeypatch.setitem(sys.modules, "torch_npu", None)  # import torch_npu -> ModuleNotFoundError
    runtime.forget()
    try:
        assert [r.code for r in _backend().is_available()] == ["torch_npu_missing"]
    finally:
        runtime.forget()


@pytest.mark.parametrize("fake", sorted(FAKES))
def test_each_failure_has_its_own_reason(fake_torch_npu, fake):
    fake_torch_npu(FAKES[fake])
    assert _backend().is_available() == []  # installed: the import waits for an npu device
    reasons = _backend().check_device(DeviceInfo("npu", 0, None, frozenset(), "npu:0"))
    expected = "cann_missing" if fake.startswith("cann_missing") else fake
    assert [r.code for r in reasons] == [expected]
    assert reasons[0].message and reasons[0].actual is not None
    if expected == "cann_missing":
        assert "TORCH_DEVICE_BACKEND_AUTOLOAD=0" in reasons[0].message


@pytest.mark.parametrize(
    "soc_name, ascend, ascend_950",
    [
        (SOC_910B, [], ["soc_unsupported"]),
        (SOC_950, [], []),
        ("Ascend310P3", ["soc_unsupported"], ["soc_unsupported"]),
        ("Ascend910ProB", ["soc_unsupported"], ["soc_unsupported"]),
    ],
)
def test_soc_is_judged_by_hardware_db_features(fake_torch_npu, soc_name, ascend, ascend_950):
    fake_torch_npu(_device_fake(soc_name))
    assert _backend().is_available() == []
    # What selection builds for an NPU tensor (torch.device("npu") needs the real torch_npu).
    match = match_device("npu:0")
    device = DeviceInfo("npu", 0, match.id, frozenset(match.features), match.seen)
    assert match.seen.startswith(soc_name)
    assert [r.code for r in _backend().check_device(device)] == ascend
    assert [r.code for r in _backend(Ascend950Backend).check_device(device)] == ascend_950
    assert _backend().auto_select_reason(device) is None
    assert _backend().execution_mode(device) == "native"


def test_emulated_soc_is_judged_the_same_way(emulate):
    cpu = device_info("cpu")
    emulate("Ascend310P3")
    assert [r.code for r in _backend().check_device(cpu)] == ["soc_unsupported"]
    emulate(SOC_950)
    assert _backend(Ascend950Backend).check_device(cpu) == []
    assert _backend().auto_select_reason(cpu).code == "emulator_only"
    assert _backend().execution_mode(cpu) == "emulated"


def test_distribution_never_pulls_torch_npu():
    requires = metadata.requires("moe-hal-ascend") or []
    torch_npu = [r for r in requires if r.lower().replace("-", "_").startswith("torch_npu")]
    assert torch_npu and all('extra == "npu"' in r for r in torch_npu)
    dist = metadata.distribution("moe-hal-ascend")
    groups = {ep.group for ep in dist.entry_points}
    assert groups == {"moe_hal.backends"}, "the plugin must never take part in torch's device autoload"


def _fake_distribution(root: Path) -> None:
    """A torch_npu installed without CANN: a package whose import fails on libhccl.so, and the
    ``torch.backends`` entry point through which torch autoloads it (as the real wheel declares)."""
    (root / "torch_npu").mkdir()
    (root / "torch_npu" / "__init__.py").write_text(f"raise OSError({LIBHCCL!r})\n")
    info = root / "torch_npu-2.13.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch_npu\nVersion: 2.13.0\n")
    (info / "entry_points.txt").write_text("[torch.backends]\ntorch_npu = torch_npu:_autoload\n")


def test_the_autoload_trap_and_the_plugin_staying_out_of_it(tmp_path):
    _fake_distribution(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MOE_HAL_", "TORCH_DEVICE_BACKEND"))}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])

    trapped = subprocess.run([sys.executable, "-c", "import torch"], env=env, capture_output=True, text=True)
    assert trapped.returncode != 0
    assert "Failed to load the backend extension: torch_npu" in trapped.stderr

    probe = textwrap.dedent(f"""
        import sys, torch, moe_hal
        import moe_hal_ascend.plugin
        assert "torch_npu" not in sys.modules, "the plugin imported torch_npu"
        a = torch.zeros(4, 8); b = torch.zeros(1, 2, 8)
        text = moe_hal.explain(a, b, moe_hal.ContiguousLayout.from_counts([4], alignment=1))
        print(text)
        # A CPU call never imports torch_npu (its import would apply global patches): the
        # backends are excluded by device type, and cann_missing waits for an npu device.
        assert "device_type_unsupported" in text and "cann_missing" not in text
        assert "torch_npu" not in sys.modules, "selection for a CPU call imported torch_npu"
        assert {BUILTIN_PLUGIN!r} in moe_hal.plugins.host().plugins
    """)
    env.update(TORCH_DEVICE_BACKEND_AUTOLOAD="0", MOE_HAL_PLUGINS="ascend")
    ok = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr + ok.stdout


def test_selection_for_cpu_tensors_never_imports_torch_npu(fake_torch_npu):
    # Importing torch_npu applies its global patches: a CPU (or CUDA) program must not pay for it.
    fake_torch_npu("import builtins\nbuiltins._moe_hal_fake_torch_npu_imported = True\n" + FAKES["npu_op_missing"])
    import builtins

    import moe_hal
    from moe_hal import selection

    selection.clear_cache()
    try:
        a, b = torch.randn(4, 8), torch.randn(2, 3, 8)
        out = moe_hal.grouped_gemm(a, b, moe_hal.ContiguousLayout.from_counts([1, 3], alignment=1))
        assert out.shape == (4, 3)
        assert not getattr(builtins, "_moe_hal_fake_torch_npu_imported", False)
        assert "torch_npu" not in sys.modules
    finally:
        builtins.__dict__.pop("_moe_hal_fake_torch_npu_imported", None)
        selection.clear_cache()
