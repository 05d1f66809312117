"""The output contracts of docs/design.md §2, checked on every CPU backend against an oracle written here
(plain float64 loops), not against moe_hal's own reference backend."""

from __future__ import annotations

import math

import pytest
import torch

import moe_hal
from moe_hal.quant import quantize_fp8

from .conftest import calc_diff, randn

BACKENDS = ["torch", "reference", "fake_vendor"]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def oracle_contiguous(a, b, starts, counts, num_rows):
    a64, b64 = a.double(), b.double()
    out = torch.zeros(num_rows, b.shape[1], dtype=torch.float64)
    for g, (s, c) in enumerate(zip(starts, counts)):
        out[s : s + c] = a64[s : s + c] @ b64[g].T
    return out


def assert_matches(out, ref64, k):
    """Values match a float64 oracle computed from the same (rounded) inputs."""
    ref = ref64.to(out.dtype).double()
    got = out.double()
    if out.dtype == torch.float32:
        torch.testing.assert_close(got, ref64, rtol=1e-5, atol=1e-5 * math.sqrt(max(k, 1)))
    else:
        eps = {torch.bfloat16: 2**-8, torch.float16: 2**-11}[out.dtype]
        torch.testing.assert_close(got, ref, rtol=2 * eps, atol=2 * eps * math.sqrt(max(k, 1)))
        assert calc_diff(got, ref64) < 1e-5


def expected_layout(counts, alignment):
    starts, end = [], 0
    for c in counts:
        start = -(-end // alignment) * alignment
        starts.append(start)
        end = start + c
    return starts, -(-end // alignment) * alignment


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "counts,alignment", [([5, 0, 17, 1, 0, 9], 8), ([3, 0, 4], 128), ([2, 7, 1], 1), ([0, 0, 0], 4)]
)
def test_contiguous_writes_every_row_and_zeroes_padding(backend, dtype, counts, alignment, gen):
    lay = moe_hal.ContiguousLayout.from_counts(counts, alignment=alignment)
    starts, num_rows = expected_layout(counts, alignment)
    assert list(lay.starts) == starts and lay.num_rows == num_rows
    k, n = 40, 24
    a = randn(gen, num_rows, k, dtype=dtype)
    valid = torch.zeros(num_rows, dtype=torch.bool)
    for s, c in zip(starts, counts):
        valid[s : s + c] = True
    a[~valid] = float("nan")  # garbage in padding rows must not reach the output
    b = randn(gen, len(counts), n, k, dtype=dtype)
    out = torch.full((num_rows, n), 7.0, dtype=dtype)
    res = moe_hal.grouped_gemm(a, b, lay, out=out, backend=backend)
    assert res is out
    assert torch.equal(out[~valid], torch.zeros_like(out[~valid]))
    assert_matches(out[valid], oracle_contiguous(a, b, starts, counts, num_rows)[valid], k)


@pytest.mark.parametrize("backend", BACKENDS)
def test_contiguous_over_allocated_tail_rows_are_zero(backend, gen):
    lay = moe_hal.ContiguousLayout.from_counts([3, 2], alignment=4, num_rows=20)
    a, b = randn(gen, 20, 16), randn(gen, 2, 8, 16)
    out = moe_hal.grouped_gemm(a, b, lay, backend=backend)
    assert out.shape == (20, 8)
    assert torch.equal(out[6:], torch.zeros(14, 8))
    assert torch.equal(out[3:4], torch.zeros(1, 8))


@pytest.mark.parametrize("backend", BACKENDS)
def test_transposed_weight_view_is_accepted(backend, gen):
    counts = [4, 0, 6]
    lay = moe_hal.ContiguousLayout.from_counts(counts, alignment=2)
    a = randn(gen, lay.num_rows, 32)
    w_gkn = randn(gen, 3, 32, 16)  # a user holding [G, K, N]
    b = w_gkn.transpose(1, 2)
    out = moe_hal.grouped_gemm(a, b, lay, backend=backend)
    starts, _ = expected_layout(counts, 2)
    assert_matches(out, oracle_contiguous(a, b, starts, counts, lay.num_rows), 32)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fp32_output_from_half_inputs(backend, dtype, gen):
    counts = [3, 5]
    lay = moe_hal.ContiguousLayout.from_counts(counts, alignment=1)
    a, b = randn(gen, 8, 24, dtype=dtype), randn(gen, 2, 12, 24, dtype=dtype)
    out = moe_hal.grouped_gemm(a, b, lay, out_dtype=torch.float32, backend=backend)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), oracle_contiguous(a, b, [0, 3], counts, 8), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("masked", [[0, 3, 6, 1], [6, 6, 6, 6], [0, 0, 0, 0]])
def test_masked_never_writes_rows_past_masked_m(backend, dtype, masked, gen):
    g, max_m, k, n = 4, 6, 20, 12
    a = randn(gen, g, max_m, k, dtype=dtype)
    b = randn(gen, g, n, k, dtype=dtype)
    lay = moe_hal.MaskedLayout(torch.tensor(masked, dtype=torch.int32), max_m, expected_m=3)
    sentinel = -12345.0
    out = torch.full((g, max_m, n), sentinel, dtype=dtype)
    moe_hal.grouped_gemm(a, b, lay, out=out, backend=backend)
    for gi, rows in enumerate(masked):
        assert torch.all(out[gi, rows:] == sentinel)
        assert_matches(out[gi, :rows], a[gi, :rows].double() @ b[gi].double().T, k)


@pytest.mark.parametrize("backend", BACKENDS)
def test_masked_allocated_output_is_zero_past_masked_m(backend, gen):
    a, b = randn(gen, 2, 4, 8), randn(gen, 2, 5, 8)
    lay = moe_hal.MaskedLayout(torch.tensor([1, 3], dtype=torch.int32), 4)
    out = moe_hal.grouped_gemm(a, b, lay, backend=backend)
    assert torch.equal(out[0, 1:], torch.zeros(3, 5)) and torch.equal(out[1, 3:], torch.zeros(1, 5))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_c", [False, True])
@pytest.mark.parametrize("counts,alignment", [([4, 0, 9, 1], 1), ([4, 0, 9, 1], 8), ([0, 0], 1)])
def test_k_grouped_adds_c(backend, dtype, with_c, counts, alignment, gen):
    lay = moe_hal.KGroupedLayout.from_counts(counts, alignment=alignment)
    starts, t = expected_layout(counts, alignment)
    m, n = 12, 10
    x = randn(gen, t, m, dtype=dtype)
    dy = randn(gen, t, n, dtype=dtype)
    valid = torch.zeros(t, dtype=torch.bool)
    for s, c in zip(starts, counts):
        valid[s : s + c] = True
    x[~valid] = float("nan")  # tokens of no group must not contribute
    c = randn(gen, len(counts), m, n, dtype=dtype) if with_c else None
    out = moe_hal.grouped_gemm(x, dy, lay, c=c, backend=backend)
    ref = torch.zeros(len(counts), m, n, dtype=torch.float64)
    if c is not None:
        ref += c.double()
    for g, (s, cnt) in enumerate(zip(starts, counts)):
        ref[g] += x[s : s + cnt].double().T @ dy[s : s + cnt].double()
    assert out.shape == (len(counts), m, n) and out.dtype == dtype
    assert_matches(out, ref, max(counts + [1]))


@pytest.mark.parametrize("backend", BACKENDS)
def test_k_grouped_accumulates_in_place_into_c(backend, gen):
    lay = moe_hal.KGroupedLayout.from_counts([3, 5])
    x, dy = randn(gen, 8, 6), randn(gen, 8, 4)
    c = randn(gen, 2, 6, 4)
    expected = c.double().clone()
    expected[0] += x[:3].double().T @ dy[:3].double()
    expected[1] += x[3:].double().T @ dy[3:].double()
    res = moe_hal.grouped_gemm(x, dy, lay, c=c, out=c, backend=backend)
    assert res is c
    torch.testing.assert_close(c.double(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", ["torch", "reference"])
@pytest.mark.parametrize("ue8m0", [False, True])
def test_fp8_block_scaled_contiguous_matches_dequantized_oracle(backend, ue8m0, gen):
    counts = [70, 0, 130, 3]
    lay = moe_hal.ContiguousLayout.from_counts(counts, alignment=128)
    k, n = 256, 160
    a = randn(gen, lay.num_rows, k)
    b = randn(gen, len(counts), n, k) * 0.05
    qa = quantize_fp8(a, block=(1, 128), ue8m0=ue8m0)
    qb = quantize_fp8(b, block=(128, 128), ue8m0=ue8m0)
    out = moe_hal.grouped_gemm(qa, qb, lay, backend=backend)
    assert out.dtype == torch.bfloat16
    starts, _ = expected_layout(counts, 128)
    ref = oracle_contiguous(qa.dequantize(torch.float64), qb.dequantize(torch.float64), starts, counts, lay.num_rows)
    valid = lay.m_indices() >= 0
    assert torch.equal(out[~valid], torch.zeros_like(out[~valid]))
    assert calc_diff(out[valid], ref[valid]) < 1e-5
    torch.testing.assert_close(out[valid].double(), ref[valid], rtol=2**-7, atol=2**-7 * math.sqrt(k))


@pytest.mark.parametrize("backend", BACKENDS)
def test_odd_sizes_and_strides(backend, gen):
    # K = 7 bf16 breaks grouped_mm's 16-byte stride rule; the torch backend must repair it.
    counts = [1, 0, 2]
    lay = moe_hal.ContiguousLayout.from_counts(counts, alignment=1)
    a = randn(gen, 3, 7, dtype=torch.bfloat16)
    b = randn(gen, 3, 5, 7, dtype=torch.bfloat16)
    out = moe_hal.grouped_gemm(a, b, lay, backend=backend)
    assert_matches(out, oracle_contiguous(a, b, [0, 1, 1], counts, 3), 7)
    wide = randn(gen, 3, 16)[:, 3:10]  # a strided, non-contiguous view
    out2 = moe_hal.grouped_gemm(wide, b.float(), lay, backend=backend)
    assert_matches(out2, oracle_contiguous(wide, b.float(), [0, 1, 1], counts, 3), 7)


@pytest.mark.parametrize("backend", BACKENDS)
def test_degenerate_dimensions(backend, gen):
    lay = moe_hal.ContiguousLayout.from_counts([2, 3], alignment=1)
    assert torch.equal(
        moe_hal.grouped_gemm(torch.empty(5, 0), torch.empty(2, 4, 0), lay, backend=backend), torch.zeros(5, 4)
    )
    empty = moe_hal.ContiguousLayout.from_counts([], alignment=1, num_rows=3)
    assert torch.equal(
        moe_hal.grouped_gemm(randn(gen, 3, 4), torch.empty(0, 2, 4), empty, backend=backend), torch.zeros(3, 2)
    )
    zero_rows = moe_hal.ContiguousLayout.from_counts([0, 0], alignment=1)
    assert moe_hal.grouped_gemm(torch.empty(0, 4), randn(gen, 2, 3, 4), zero_rows, backend=backend).shape == (0, 3)
    klay = moe_hal.KGroupedLayout.from_counts([0, 0])
    c = randn(gen, 2, 3, 4)
    torch.testing.assert_close(
        moe_hal.grouped_gemm(torch.empty(0, 3), torch.empty(0, 4), klay, c=c, backend=backend), c
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_nan_and_inf_are_computed_through(backend, gen):
    lay = moe_hal.ContiguousLayout.from_counts([2, 2], alignment=1)
    a, b = randn(gen, 4, 8), randn(gen, 2, 3, 8)
    a[1, 0] = float("inf")
    a[2, 3] = float("nan")
    out = moe_hal.grouped_gemm(a, b, lay, backend=backend)
    assert not torch.isfinite(out[1]).any()
    assert torch.isnan(out[2]).all()
    assert torch.isfinite(out[0]).all() and torch.isfinite(out[3]).all()


def test_default_backend_on_cpu_is_torch(gen):
    lay = moe_hal.ContiguousLayout.from_counts([2, 2], alignment=1)
    sel = moe_hal.select(randn(gen, 4, 8), randn(gen, 2, 3, 8), lay)
    assert sel.name == "torch"
    assert "selected: torch" in sel.explain()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("b_order", ["k", "n"])
def test_large_cpu_calls_loop_over_groups_and_keep_the_contract(dtype, b_order, gen):
    """Above ~4M multiply-adds the torch backend multiplies group by group on the CPU."""
    counts = [300, 0, 129, 2, 0]
    lay = moe_hal.ContiguousLayout.from_counts(counts, alignment=128, num_rows=800)
    k, n = 256, 64
    assert sum(counts) * n * k >= 1 << 22
    a = randn(gen, lay.num_rows, k, dtype=dtype)
    valid = lay.m_indices() >= 0
    a[~valid] = float("nan")
    b = randn(gen, len(counts), n, k, dtype=dtype)
    if b_order == "n":
        b = b.transpose(1, 2).contiguous().transpose(1, 2)
    out = torch.full((lay.num_rows, n), 5.0, dtype=dtype)
    moe_hal.grouped_gemm(a, b, lay, out=out, backend="torch")
    assert torch.equal(out[~valid], torch.zeros_like(out[~valid]))
    starts, _ = expected_layout(counts, 128)
    assert_matches(out[valid], oracle_contiguous(a, b, starts, counts, lay.num_rows)[valid], k)
    assert "torch.mm per group" in moe_hal.select(a, b, lay).explain()
