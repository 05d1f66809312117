"""Gradients of moe_hal.grouped_gemm: float64 gradcheck on the reference backend for every layout
and edge case, exact zeros where no row contributes, bf16 against torch._grouped_mm autograd,
zero-stride incoming gradients, fp32 main_grad accumulation, and fp8's typed refusal."""

from __future__ import annotations

import pytest
import torch

import moe_hal
from moe_hal.errors import GradientError
from moe_hal.quant import quantize_fp8

from .conftest import randn

pytestmark = pytest.mark.filterwarnings("ignore::moe_hal.errors.PathWarning")
f64 = torch.float64


def _ref(a, b, lay, **kw):
    return moe_hal.grouped_gemm(a, b, lay, backend="reference", **kw)


CONTIGUOUS_CASES = {
    "empty_groups_align4": ([3, 0, 5, 0], 4, None),
    "one_row_groups": ([1, 1, 1, 1], 1, None),
    "all_rows_in_one_group": ([0, 7, 0], 1, None),
    "tail_rows": ([2, 3], 2, 9),
}


@pytest.mark.parametrize("case", CONTIGUOUS_CASES)
@pytest.mark.parametrize("transposed_b", [False, True], ids=["b_nk", "b_view_of_kn"])
def test_gradcheck_contiguous(gen, case, transposed_b):
    counts, alignment, num_rows = CONTIGUOUS_CASES[case]
    lay = moe_hal.ContiguousLayout.from_counts(counts, alignment=alignment, num_rows=num_rows)
    a = randn(gen, lay.num_rows, 5, dtype=f64).requires_grad_()
    if transposed_b:
        b = randn(gen, len(counts), 5, 3, dtype=f64).requires_grad_()  # [G, K, N] stored
        fn = lambda a, b: _ref(a, b.transpose(1, 2), lay)
    else:
        b = randn(gen, len(counts), 3, 5, dtype=f64).requires_grad_()
        fn = lambda a, b: _ref(a, b, lay)
    assert torch.autograd.gradcheck(fn, (a, b))


@pytest.mark.parametrize("masked_m", [[2, 0, 4], [0, 0, 0], [4, 4, 4], [1, 3, 0]])
def test_gradcheck_masked(gen, masked_m):
    lay = moe_hal.MaskedLayout(torch.tensor(masked_m, dtype=torch.int32), 4)
    a = randn(gen, 3, 4, 5, dtype=f64).requires_grad_()
    b = randn(gen, 3, 2, 5, dtype=f64).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: _ref(a, b, lay), (a, b))
    bt = randn(gen, 3, 5, 2, dtype=f64).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, bt: _ref(a, bt.transpose(1, 2), lay), (a, bt))


@pytest.mark.parametrize("counts,alignment", [([3, 0, 5], 4), ([1, 1, 1], 1), ([0, 6, 0], 1), ([0, 0, 0], 1)])
@pytest.mark.parametrize("with_c", [False, True])
def test_gradcheck_k_grouped(gen, counts, alignment, with_c):
    lay = moe_hal.KGroupedLayout.from_counts(counts, alignment=alignment, num_rows=max(1, sum(counts) + 4))
    x = randn(gen, lay.num_rows, 3, dtype=f64).requires_grad_()
    dy = randn(gen, lay.num_rows, 2, dtype=f64).requires_grad_()
    if with_c:
        c = randn(gen, len(counts), 3, 2, dtype=f64).requires_grad_()
        assert torch.autograd.gradcheck(lambda x, dy, c: _ref(x, dy, lay, c=c), (x, dy, c))
    else:
        assert torch.autograd.gradcheck(lambda x, dy: _ref(x, dy, lay), (x, dy))


def test_rows_of_no_group_and_empty_groups_get_exact_zero_gradients(gen):
    lay = moe_hal.ContiguousLayout.from_counts([3, 0, 2], alignment=4, num_rows=12)
    a = randn(gen, 12, 8).requires_grad_()
    b = randn(gen, 3, 6, 8).requires_grad_()
    y = moe_hal.grouped_gemm(a, b, lay)
    y.backward(randn(gen, *y.shape))  # nonzero gradient on every row, padding included
    assert bool((b.grad[1] == 0).all())
    assert bool((a.grad[lay.gap_rows_on("cpu")] == 0).all())
    mlay = moe_hal.MaskedLayout(torch.tensor([2, 0, 3], dtype=torch.int32), 4)
    a3 = randn(gen, 3, 4, 8).requires_grad_()
    y3 = moe_hal.grouped_gemm(a3, b, mlay)
    b.grad = None
    y3.backward(randn(gen, *y3.shape))
    assert bool((b.grad[1] == 0).all())
    assert bool((a3.grad[0, 2:] == 0).all()) and bool((a3.grad[2, 3:] == 0).all())


@pytest.mark.parametrize("backend", ["torch", "reference"])
def test_bf16_gradients_match_torch_grouped_mm(gen, backend):
    counts = [5, 0, 11, 3]
    lay = moe_hal.ContiguousLayout.from_counts(counts, alignment=1)
    a0, b0 = randn(gen, lay.num_rows, 64, dtype=torch.bfloat16), randn(gen, 4, 32, 64, dtype=torch.bfloat16)
    dy = randn(gen, lay.num_rows, 32, dtype=torch.bfloat16)
    a, b = a0.clone().requires_grad_(), b0.clone().requires_grad_()
    moe_hal.grouped_gemm(a, b, lay, backend=backend).backward(dy)
    ta, tb = a0.clone().requires_grad_(), b0.clone().requires_grad_()
    torch._grouped_mm(ta, tb.transpose(1, 2), offs=lay.psum).backward(dy)
    for got, want in ((a.grad, ta.grad), (b.grad, tb.grad)):
        assert got.dtype == torch.bfloat16
        torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)


def test_zero_stride_incoming_gradient(gen):
    lay = moe_hal.ContiguousLayout.from_counts([3, 1, 4], alignment=2)
    a = randn(gen, lay.num_rows, 8).requires_grad_()
    b = randn(gen, 3, 6, 8).requires_grad_()
    moe_hal.grouped_gemm(a, b, lay).sum().backward()  # grad is ones expanded: stride (0, 0)
    expected = torch.autograd.grad(moe_hal.grouped_gemm(a, b, lay), (a, b), torch.ones(lay.num_rows, 6))
    assert torch.equal(a.grad, expected[0]) and torch.equal(b.grad, expected[1])
    klay = moe_hal.KGroupedLayout.from_counts([3, 1, 4])
    x, dy = randn(gen, 8, 4).requires_grad_(), randn(gen, 8, 5).requires_grad_()
    moe_hal.grouped_gemm(x, dy, klay).sum().backward()
    expected = torch.autograd.grad(moe_hal.grouped_gemm(x, dy, klay), (x, dy), torch.ones(3, 4, 5))
    assert torch.equal(x.grad, expected[0]) and torch.equal(dy.grad, expected[1])


def test_fp32_output_from_bf16_operands_gives_bf16_gradients(gen):
    lay = moe_hal.ContiguousLayout.from_counts([3, 2], alignment=1)
    a = randn(gen, 5, 16, dtype=torch.bfloat16).requires_grad_()
    b = randn(gen, 2, 8, 16, dtype=torch.bfloat16).requires_grad_()
    y = moe_hal.grouped_gemm(a, b, lay, out_dtype=torch.float32)
    assert y.dtype == torch.float32
    y.sum().backward()
    assert a.grad.dtype == b.grad.dtype == torch.bfloat16


def test_main_grad_accumulates_weight_gradients_in_fp32(gen):
    lay = moe_hal.ContiguousLayout.from_counts([3, 0, 4], alignment=1)
    a = randn(gen, 7, 16, dtype=torch.bfloat16).requires_grad_()
    w = torch.nn.Parameter(randn(gen, 3, 8, 16, dtype=torch.bfloat16))
    w.main_grad = torch.zeros(3, 8, 16, dtype=torch.float32)
    dys = [randn(gen, 7, 8, dtype=torch.bfloat16) for _ in range(2)]
    for dy in dys:
        moe_hal.grouped_gemm(a, w, lay).backward(dy)
    assert w.grad is None
    klay = moe_hal.KGroupedLayout.from_counts([3, 0, 4])
    want = sum(_ref(dy.double(), a.detach().double(), klay) for dy in dys)
    torch.testing.assert_close(w.main_grad, want.float(), rtol=1e-5, atol=1e-4)
    assert bool((w.main_grad[1] == 0).all())


def test_main_grad_accumulates_also_under_compile(gen):
    from torch._dynamo.testing import CompileCounterWithBackend

    lay = moe_hal.ContiguousLayout.from_counts([3, 0, 4], alignment=1)
    a = randn(gen, 7, 16, dtype=torch.bfloat16).requires_grad_()
    w = torch.nn.Parameter(randn(gen, 3, 8, 16, dtype=torch.bfloat16))
    dy = randn(gen, 7, 8, dtype=torch.bfloat16)
    counter = CompileCounterWithBackend("aot_eager")
    run = torch.compile(lambda a, w: moe_hal.grouped_gemm(a, w, lay), backend=counter, fullgraph=True)
    w.main_grad = torch.zeros(3, 8, 16, dtype=torch.float32)
    moe_hal.grouped_gemm(a, w, lay).backward(dy)
    eager = w.main_grad.clone()
    for step in (1, 2):
        run(a, w).backward(dy)
        assert w.grad is None
        torch.testing.assert_close(w.main_grad, eager * (step + 1), rtol=0, atol=0)
    assert counter.frame_count == 1


def test_main_grad_of_the_wrong_dtype_or_shape_is_refused(gen):
    from moe_hal.errors import DTypeError, ShapeError

    lay = moe_hal.ContiguousLayout.from_counts([3, 0, 4], alignment=1)
    a = randn(gen, 7, 16).requires_grad_()
    w = torch.nn.Parameter(randn(gen, 3, 8, 16))
    w.main_grad = torch.zeros(3, 8, 16, dtype=torch.bfloat16)
    with pytest.raises(DTypeError, match="main_grad"):
        moe_hal.grouped_gemm(a, w, lay)
    w.main_grad = torch.zeros(3, 16, 8)
    with pytest.raises(ShapeError, match="main_grad"):
        moe_hal.grouped_gemm(a, w, lay)


def test_fp8_operands_are_forward_only(gen):
    lay = moe_hal.ContiguousLayout.from_counts([3, 0, 5], alignment=4)
    x = randn(gen, lay.num_rows, 128).requires_grad_()
    qb = quantize_fp8(randn(gen, 3, 8, 128), (128, 128))
    with pytest.raises(GradientError, match="fp8"):
        moe_hal.grouped_gemm(quantize_fp8(x, (1, 128)), qb, lay)
    with torch.no_grad():
        y = moe_hal.grouped_gemm(quantize_fp8(x, (1, 128)), qb, lay)
    assert y.dtype == torch.bfloat16 and not y.requires_grad


def test_fp8_backward_through_the_op_raises_gradient_error(gen):
    from moe_hal import ops

    lay = moe_hal.ContiguousLayout.from_counts([3, 0, 5], alignment=4)
    qa = quantize_fp8(randn(gen, lay.num_rows, 128), (1, 128))
    qb = quantize_fp8(randn(gen, 3, 8, 128), (128, 128))
    ta, tb, fp8 = ops.operand_args(qa, qb)
    fp8["a_scale"] = fp8["a_scale"].clone().requires_grad_()
    y = ops.grouped_gemm_fp8_op(ta, tb, lay.psum, "contiguous", 4, **fp8)
    with pytest.raises(GradientError, match="forward only"):
        y.float().sum().backward()
