"""Gradients of moe_hal.grouped_gemm through the CUDA backends' kernels (Triton interpreter, CPU):
the custom ops' backward products run on the backend the forward was forced onto, and agree with
float64 gradients from the reference backend (the core's shared check,
:func:`moe_hal.testing.check_gradients`). Small sizes: the interpreter is slow."""

from __future__ import annotations

import pytest
import torch

from moe_hal.testing import check_gradients

pytestmark = pytest.mark.filterwarnings("ignore::moe_hal.errors.PathWarning")


@pytest.mark.parametrize("backend", ["cuda_sm90", "cuda_sm100"])
def test_gradients_through_cuda_kernels_match_float64_reference(backend, gen):
    check_gradients(backend, torch.bfloat16, gen, rtol=3e-2, atol=0.15, atol_per_magnitude=1e-2)
