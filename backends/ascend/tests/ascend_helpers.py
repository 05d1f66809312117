"""Shared helpers of the Ascend plugin's tests (imported by the test modules)."""

from __future__ import annotations

import torch

import moe_hal

SOC_910B = "Ascend910B2"
SOC_910C = "Ascend910_9391"
SOC_950 = "Ascend950PR_9579"


def reference(*args, **kwargs):
    return moe_hal.grouped_gemm(*args, backend="reference", **kwargs)


#: (rtol, atol as a fraction of the largest expected magnitude) per output dtype vs the float64
#: reference: one rounding of the output (rtol: one ulp) after fp32 accumulation (atol).
TOL = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (8e-3, 1e-5), torch.float16: (1e-3, 1e-5)}


def assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """``actual`` matches the float64 reference's ``expected`` (same dtype and shape, no NaN)."""
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    assert not torch.isnan(actual).any(), "NaN in the output: an unwritten row reached the caller"
    scale = max(expected.double().abs().max().item(), 1.0) if expected.numel() else 1.0
    rtol, atol = TOL[expected.dtype]
    torch.testing.assert_close(actual.double(), expected.double(), rtol=rtol, atol=atol * scale)
