"""The examples run as documented (few steps, so the suite stays fast)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).parents[1] / "examples"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.filterwarnings("ignore::moe_hal.errors.PathWarning")
def test_train_moe_loss_decreases_and_prints_the_routing_histogram(capsys):
    train_moe = _load("train_moe")
    assert train_moe.main(["--steps", "25", "--tokens", "64", "--log-every", "10"]) == 0
    out = capsys.readouterr().out
    assert out.count("routing histogram") == 2
    assert "expert  7" in out
