"""Shared fixtures for the core tests."""

from __future__ import annotations

import pytest
import torch

import moe_hal
from moe_hal import notices, plugins


@pytest.fixture
def fresh_plugins(monkeypatch):
    """Re-discover plugins under this test's environment, and again after it (so the
    environment a test sets up with monkeypatch never leaks into the plugin host of others)."""

    def reload():
        plugins.reload()
        notices.reset()
        return plugins.host()

    reload()
    yield reload
    monkeypatch.undo()
    reload()


@pytest.fixture
def gen():
    """A seeded generator: fresh random data per test, reproducible on failure."""
    return torch.Generator().manual_seed(1234)


def randn(gen, *shape, dtype=torch.float32):
    return torch.randn(*shape, generator=gen).to(dtype)


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """DeepGEMM's similarity metric: 1 - 2<x,y> / (|x|^2 + |y|^2), in float64."""
    x, y = x.double(), y.double()
    denom = (x * x + y * y).sum()
    return 0.0 if denom == 0 else float(1 - 2 * (x * y).sum() / denom)


def reference(*args, **kwargs):
    return moe_hal.grouped_gemm(*args, backend="reference", **kwargs)
