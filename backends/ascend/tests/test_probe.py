"""The Ascend plugin's device probe (hook ``moe_hal_probe_device``): how ``moe_hal.match_device``
reads an NPU's SoC name and version through torch_npu; faked here."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from moe_hal import match_device
from moe_hal.testing import only_plugins


@pytest.fixture(autouse=True)
def _only_this_plugin():
    with only_plugins("ascend"):
        yield


def test_match_reads_torch_npu_lazily(monkeypatch):
    fake_npu = types.SimpleNamespace(get_device_name=lambda i: "Ascend910_9382", current_device=lambda: 0)
    fake_torch_npu = types.ModuleType("torch_npu")
    fake_torch_npu.npu = types.SimpleNamespace(get_soc_version=lambda: 253)
    monkeypatch.setitem(sys.modules, "torch_npu", fake_torch_npu)
    monkeypatch.setattr(torch, "npu", fake_npu, raising=False)
    m = match_device("npu:0")  # torch.device("npu") needs the real torch_npu
    assert m.id == "huawei-ascend-910c" and m.seen == "Ascend910_9382 (soc_version 253)"


def test_match_npu_without_torch_npu_is_a_clear_result(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_npu", None)  # import torch_npu raises ImportError
    m = match_device("npu:0")
    assert m.entry is None and m.seen == "npu:0" and "torch_npu" in m.reason


def test_other_device_types_are_not_this_plugins():
    from moe_hal_ascend.plugin import moe_hal_probe_device

    assert moe_hal_probe_device(device_type="cuda", index=0) is None
