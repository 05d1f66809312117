"""Helpers shared by the moe_hal_cuda tests (a module name of its own, so that running these tests
in one process with the core's tests never picks up the core's ``conftest`` helpers instead)."""

from __future__ import annotations

import torch

import moe_hal

ULP = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10, torch.float32: 2.0**-23}
FP32_EPS = 2.0**-23


def randn(gen, *shape, dtype=torch.float32):
    return torch.randn(*shape, generator=gen).to(dtype)


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """DeepGEMM's metric ``1 - 2 sum(xy) / sum(x^2 + y^2)`` in float64 (0 for two zero tensors)."""
    x, y = x.double(), y.double()
    denom = (x * x + y * y).sum()
    return 0.0 if denom == 0 else float(1 - 2 * (x * y).sum() / denom)


def reference(*args, **kwargs) -> torch.Tensor:
    """The float64 oracle (``backend="reference"``), rounded once to ``out_dtype``."""
    return moe_hal.grouped_gemm(*args, backend="reference", **kwargs)


def magnitude(a, b, layout, c=None) -> torch.Tensor:
    """fp32 products of |a| and |b| (dequantized for fp8), plus |c|: the size of the sums each
    output element accumulates, which bounds the kernels' fp32 accumulation error."""
    from moe_hal import QuantizedTensor

    def absolute(x):
        return x.dequantize(torch.float32).abs() if isinstance(x, QuantizedTensor) else x.float().abs()

    extra = {} if c is None else {"c": c.float().abs()}
    return reference(absolute(a), absolute(b), layout, out_dtype=torch.float32, **extra)


def assert_matches(out, ref, mag, k: int, threshold: float) -> None:
    """``out`` vs the oracle ``ref`` (fp32-rounded float64 products of the same operands):
    DeepGEMM's calc_diff below ``threshold``, and every element within one ulp of the output
    dtype (the interpreter truncates fp32 -> bf16) + one fp32 ulp (the rounding of ``ref``) +
    ``4 * k * eps32 * mag`` (fp32 accumulation over ``k`` terms whose magnitudes sum to ``mag``)."""
    assert out.shape == ref.shape
    diff = calc_diff(out, ref)
    assert diff < threshold, f"calc_diff {diff:.3e} >= {threshold:.0e}"
    r = ref.double().abs()
    bound = (ULP[out.dtype] + FP32_EPS) * r + 4 * max(k, 1) * FP32_EPS * mag.double() + 1e-30
    err = (out.double() - ref.double()).abs()
    worst = float((err / bound).max()) if err.numel() else 0.0
    assert worst <= 1.0, f"element error {worst:.2f}x the bound (max abs error {float(err.max()):.3e})"
