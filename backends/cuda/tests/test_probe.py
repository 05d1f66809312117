"""The CUDA plugin's device probe (hook ``moe_hal_probe_device``): how ``moe_hal.match_device``
reads a CUDA device's properties, from torch or else from cuda-python; faked here."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from moe_hal import match_device
from moe_hal.testing import only_plugins


@pytest.fixture(autouse=True)
def _only_this_plugin():
    with only_plugins("cuda"):
        yield


def test_match_reads_torch_cuda_properties(monkeypatch):
    calls = []

    def fake_properties(index):
        calls.append(index)
        return types.SimpleNamespace(name="NVIDIA H200", major=9, minor=0, multi_processor_count=132)

    monkeypatch.setattr(torch.cuda, "get_device_properties", fake_properties)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert match_device(torch.device("cuda", 1)).id == "nvidia-h200-sxm"
    assert match_device("cuda").id == "nvidia-h200-sxm"
    assert calls == [1, 3]


def test_match_falls_back_to_cuda_python(monkeypatch):
    # A torch build without CUDA on a machine with a driver: the driver API answers instead.
    def no_cuda(index):
        raise AssertionError("Torch not compiled with CUDA enabled")

    ok = "CUDA_SUCCESS"
    attrs = types.SimpleNamespace(
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR="major",
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR="minor",
        CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT="sms",
    )
    values = {"major": 10, "minor": 0, "sms": 148}
    driver = types.SimpleNamespace(
        CUresult=types.SimpleNamespace(CUDA_SUCCESS=ok),
        CUdevice_attribute=attrs,
        cuInit=lambda flags: (ok,),
        cuDeviceGet=lambda i: (ok, f"dev{i}"),
        cuDeviceGetName=lambda size, dev: (ok, b"NVIDIA B200" + bytes(size - 11)),
        cuDeviceGetAttribute=lambda attr, dev: (ok, values[attr]),
    )
    bindings = types.ModuleType("cuda.bindings")
    bindings.driver = driver
    monkeypatch.setitem(sys.modules, "cuda", types.ModuleType("cuda"))
    monkeypatch.setitem(sys.modules, "cuda.bindings", bindings)
    monkeypatch.setattr(torch.cuda, "get_device_properties", no_cuda)
    m = match_device("cuda:0")
    assert m.id == "nvidia-b200" and m.seen == "NVIDIA B200 (cc 10.0, 148 SMs)"

    driver.cuInit = lambda flags: ("CUDA_ERROR_NO_DEVICE",)
    m = match_device("cuda:0")
    assert m.entry is None and "Torch not compiled with CUDA" in m.reason  # torch's reason is kept


def test_other_device_types_are_not_this_plugins():
    from moe_hal_cuda.plugin import moe_hal_probe_device

    assert moe_hal_probe_device(device_type="npu", index=0) is None
