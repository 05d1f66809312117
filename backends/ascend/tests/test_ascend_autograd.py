"""Gradients of moe_hal.grouped_gemm through the Ascend backend (torch_npu emulator on the CPU):
the custom ops' backward products run on ``ascend``, and agree with float64 gradients from the
reference backend for every layout (the core's shared check, :func:`moe_hal.testing.check_gradients`)."""

from __future__ import annotations

import pytest
import torch

from moe_hal.testing import check_gradients

pytestmark = pytest.mark.filterwarnings("ignore::moe_hal.errors.PathWarning")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gradients_through_ascend_match_float64_reference(dtype, gen):
    tol = {"rtol": 3e-2, "atol": 0.2} if dtype == torch.bfloat16 else {"rtol": 1e-4, "atol": 1e-4}
    check_gradients("ascend", dtype, gen, **tol)
