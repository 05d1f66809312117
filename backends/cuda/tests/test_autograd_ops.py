"""Gradients of moe_hal.grouped_gemm through the CUDA backends' kernels (Triton interpreter, CPU):
the custom ops' backward products run on the backend the forward was forced onto, and agree with
float64 gradients from the reference backend. Small sizes: the interpreter is slow."""

from __future__ import annotations

import pytest
import torch

import moe_hal

pytestmark = pytest.mark.filterwarnings("ignore::moe_hal.errors.PathWarning")


def _grads(fn, inputs, dy, **kw):
    leaves = [x.detach().clone().requires_grad_() for x in inputs]
    y = fn(*leaves, **kw)
    return (y, *torch.autograd.grad(y, leaves, dy.to(y.dtype)))


@pytest.mark.parametrize("backend", ["cuda_sm90", "cuda_sm100"])
def test_gradients_through_cuda_kernels_match_float64_reference(backend, gen):
    lay = moe_hal.ContiguousLayout.from_counts([5, 0, 9], alignment=16)
    mlay = moe_hal.MaskedLayout(torch.tensor([3, 0, 8], dtype=torch.int32), 8)
    klay = moe_hal.KGroupedLayout.from_counts([5, 0, 9], alignment=16)
    cases = [
        (torch.randn(lay.num_rows, 64, generator=gen), torch.randn(3, 32, 64, generator=gen), lay),
        (torch.randn(3, 8, 64, generator=gen), torch.randn(3, 32, 64, generator=gen), mlay),
        (torch.randn(klay.num_rows, 32, generator=gen), torch.randn(klay.num_rows, 64, generator=gen), klay),
    ]
    for a, b, layout in cases:

        def run(a, b, be, layout=layout):
            return moe_hal.grouped_gemm(a, b, layout, backend=be)

        dy = torch.randn(run(a.double(), b.double(), "reference").shape, generator=gen)
        want = _grads(run, (a.double(), b.double()), dy, be="reference")
        got = _grads(run, (a.bfloat16(), b.bfloat16()), dy, be=backend)
        for g, w in zip(got, want):
            assert g.dtype == torch.bfloat16
            torch.testing.assert_close(g.double(), w, rtol=3e-2, atol=0.15 + 1e-2 * float(w.abs().max()))
