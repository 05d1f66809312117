"""Fixtures for the Ascend plugin's tests: everything runs on the CPU emulator of torch_npu.

Emulation is switched on here, before any test module imports moe_hal, exactly as a user would
(``MOE_HAL_ASCEND_EMULATE=1``). ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` keeps ``import torch`` working
on machines where torch_npu is installed without CANN (the autoload trap, README).
"""

from __future__ import annotations

import os

os.environ["MOE_HAL_ASCEND_EMULATE"] = "1"
os.environ.pop("MOE_HAL_ASCEND_SOC", None)
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
os.environ["MOE_HAL_PLUGINS"] = "ascend"  # this plugin and the built-ins, nothing else installed
for _name in ("MOE_HAL_BACKEND", "MOE_HAL_DISABLE_BACKENDS", "MOE_HAL_ASCEND_WEIGHT_FORMAT"):
    os.environ.pop(_name, None)

import pytest  # noqa: E402 - after the environment set-up above, which must come first
import torch  # noqa: E402 - after the environment set-up above, which must come first

from moe_hal import notices  # noqa: E402 - after the environment set-up above, which must come first
from moe_hal_ascend import emulation  # noqa: E402 - after the environment set-up above, which must come first


@pytest.fixture(autouse=True)
def _emulation_from_env():
    """Every test starts from the environment's setting (910B2 emulation) and notices shown anew."""
    emulation.reset()
    notices.reset()
    yield
    emulation.reset()


@pytest.fixture
def emulate():
    """``emulate(soc)`` switches the emulated SoC for the rest of the test."""
    return emulation.enable


@pytest.fixture
def gen(request):
    """A generator seeded from the test's name: fresh data per test, reproducible on failure."""
    seed = sum(map(ord, request.node.nodeid)) * 7919 % (2**31)
    return torch.Generator().manual_seed(seed)
