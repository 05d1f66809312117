"""Shared helpers of the Ascend plugin's tests (imported by the test modules)."""

from __future__ import annotations

import torch

import moe_hal

SOC_910B = "Ascend910B2"
SOC_910C = "Ascend910_9391"
SOC_950 = "Ascend950PR_9579"


def reference(*args, **kwargs):
    return moe_hal.grouped_gemm(*args, backend="reference", **kwargs)


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """DeepGEMM's similarity metric: 1 - 2<x,y> / (|x|^2 + |y|^2), in float64."""
    x, y = x.double(), y.double()
    denom = (x * x + y * y).sum()
    return 0.0 if denom == 0 else float(1 - 2 * (x * y).sum() / denom)


#: (rtol, atol as a fraction of the largest expected magnitude) per output dtype vs the float64
#: reference: one rounding of the output after fp32 accumulation is within one ulp; the atol term
#: covers a second rounding where a sum cancels (K-grouped ``+ c``).
TOL = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (8e-3, 4e-3), torch.float16: (1e-3, 5e-4)}


def assert_close(actual: torch.Tensor, expected: torch.Tensor, *, fp8: bool = False) -> None:
    """``actual`` matches the float64 reference's ``expected`` (same dtype and shape, no NaN)."""
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    assert not torch.isnan(actual).any(), "NaN in the output: an unwritten row reached the caller"
    if fp8:
        # dequantize-to-bf16 paths round each operand once more: checked like DeepGEMM checks fp8
        assert calc_diff(actual, expected) < 1e-4
    scale = max(expected.double().abs().max().item(), 1.0) if expected.numel() else 1.0
    rtol, atol = TOL[expected.dtype] if not fp8 else (3e-2, 1.5e-2)
    torch.testing.assert_close(actual.double(), expected.double(), rtol=rtol, atol=atol * scale)
