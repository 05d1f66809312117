"""Test setup for moe_hal_cuda: every kernel runs under the Triton interpreter on the CPU.

``MOE_HAL_CUDA_INTERPRET=1`` is set here, at import time, before anything imports triton or the
kernels (triton decorates its own helpers when first imported, so the variable must come first).
Run this directory in its own pytest process (``pytest backends/cuda/tests``) so that no other
test has imported triton before.
"""

from __future__ import annotations

import os

os.environ["MOE_HAL_CUDA_INTERPRET"] = "1"

import pytest  # noqa: E402 - after the environment set-up above, which must come first
import torch  # noqa: E402 - after the environment set-up above, which must come first


@pytest.fixture
def gen():
    """A seeded generator: fresh random data per test, reproducible on failure."""
    return torch.Generator().manual_seed(20260611)
