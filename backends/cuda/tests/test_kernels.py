"""Every kernel of cuda_sm90 / cuda_sm100 against the float64 reference, under the Triton interpreter.

Shapes are tiny (the interpreter runs numpy per program) but chosen to hit the edges: empty
groups, group sizes that are not multiples of the tile, N and K that are not multiples of the
block sizes (N=24, K=40; fp8 K=456 and 600, not multiples of 128), skewed routing, masked rows at 0 and
at max_m, K-grouped with and without ``c`` (and in place). fp8 is compared with the reference
computed from the same quantized operands, so quantization error is not counted.
"""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
import torch
from cuda_helpers import assert_matches, magnitude, randn, reference

import moe_hal
from moe_hal.quant import quantize_fp8
from moe_hal_cuda import configs, kernels, launch, scales

BACKENDS = ("cuda_sm90", "cuda_sm100")
ARCH = {"cuda_sm90": "sm90", "cuda_sm100": "sm100"}
FLOATS = (torch.bfloat16, torch.float16)
BF16_THRESHOLD, FP8_THRESHOLD = 1e-5, 1e-3

#: (counts, alignment): empty first/middle/last groups, sizes off the tile, one heavy expert.
CONTIGUOUS_CASES = {
    "empty_and_odd": ([5, 0, 37, 3, 0], 16),
    "skewed": ([0, 1, 71, 2, 0, 9, 0, 1], 8),
    "unaligned": ([13, 7, 22], 1),
}


def _poisoned(shape, dtype):
    return torch.full(shape, float("nan"), dtype=dtype)


def _numpy_sums_rows_alike(rows: int, fewer: int, k: int, n: int) -> bool:
    """Whether numpy's fp32 matmul gives each ``fewer``-row slice of a ``rows``-row block the sums
    it gives that slice alone. The Triton interpreter runs each tile's dot through it, and
    OpenBLAS picks its kernel by CPU and shape: on an AVX-512 AMD EPYC rows 16-31 of a 64-row block
    come out a rounding apart from the same 16 rows alone; with its SkylakeX kernel they do not."""
    gen = np.random.default_rng(0)
    a = gen.standard_normal((rows, k), dtype=np.float32)
    b = gen.standard_normal((k, n), dtype=np.float32)
    whole = a @ b
    return all(np.array_equal(a[i : i + fewer] @ b, whole[i : i + fewer]) for i in range(0, rows, fewer))


def _gap_rows(layout) -> torch.Tensor:
    return layout.gap_rows_on("cpu")


# -- contiguous ----------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("case", sorted(CONTIGUOUS_CASES))
def test_contiguous_float(gen, backend, dtype, case):
    counts, alignment = CONTIGUOUS_CASES[case]
    lay = moe_hal.ContiguousLayout.from_counts(counts, alignment=alignment)
    k, n = 40, 24
    a, b = randn(gen, lay.num_rows, k, dtype=dtype), randn(gen, len(counts), n, k, dtype=dtype)
    out = moe_hal.grouped_gemm(a, b, lay, out=_poisoned((lay.num_rows, n), dtype), backend=backend)
    assert_matches(out, reference(a, b, lay, out_dtype=torch.float32), magnitude(a, b, lay), k, BF16_THRESHOLD)
    assert bool((out[_gap_rows(lay)] == 0).all()), "rows of no group must be exactly zero"


@pytest.mark.parametrize("backend", BACKENDS)
def test_contiguous_fp32_out_and_transposed_b(gen, backend):
    """fp32 output from bf16 operands, weights given as a transposed view of [G, K, N]."""
    lay = moe_hal.ContiguousLayout.from_counts([9, 0, 30], alignment=4)
    k, n = 72, 40
    a = randn(gen, lay.num_rows, k, dtype=torch.bfloat16)
    b = randn(gen, 3, k, n, dtype=torch.bfloat16).transpose(1, 2)
    out = moe_hal.grouped_gemm(
        a, b, lay, out=_poisoned((lay.num_rows, n), torch.float32), out_dtype=torch.float32, backend=backend
    )
    assert_matches(out, reference(a, b, lay, out_dtype=torch.float32), magnitude(a, b, lay), k, BF16_THRESHOLD)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("b_block", [(128, 128), (1, 128)])
def test_contiguous_fp8(gen, backend, b_block):
    lay = moe_hal.ContiguousLayout.from_counts([0, 21, 3, 0, 50], alignment=8)
    k, n = 600, 24  # five K-blocks: two packed words, a partial last block
    ue8m0 = backend == "cuda_sm100"
    qa = quantize_fp8(randn(gen, lay.num_rows, k), (1, 128), ue8m0=ue8m0)
    qb = quantize_fp8(randn(gen, 5, n, k), b_block, ue8m0=ue8m0)
    out = moe_hal.grouped_gemm(qa, qb, lay, out=_poisoned((lay.num_rows, n), torch.bfloat16), backend=backend)
    assert_matches(out, reference(qa, qb, lay, out_dtype=torch.float32), magnitude(qa, qb, lay), k, FP8_THRESHOLD)
    assert bool((out[_gap_rows(lay)] == 0).all())


@pytest.mark.parametrize("backend", BACKENDS)
def test_fp8_n_major_weight_runs_on_a_k_major_copy(gen, backend):
    """An N-major fp8 weight (a transposed view of [G, K, N]) is made K-major once through the
    prepared cache (fp8 MMAs read K-major operands); the result matches the reference."""
    lay = moe_hal.ContiguousLayout.from_counts([7, 0, 19], alignment=4)
    k, n = 256, 24
    ue8m0 = backend == "cuda_sm100"
    qa = quantize_fp8(randn(gen, lay.num_rows, k), (1, 128), ue8m0=ue8m0)
    q = quantize_fp8(randn(gen, 3, n, k), (128, 128), ue8m0=ue8m0)
    qb = moe_hal.QuantizedTensor(q.data.transpose(1, 2).contiguous().transpose(1, 2), q.scale, q.block, q.scale_format)
    assert qb.data.stride(-1) != 1
    out = moe_hal.grouped_gemm(qa, qb, lay, backend=backend)
    assert_matches(out, reference(qa, qb, lay, out_dtype=torch.float32), magnitude(qa, qb, lay), k, FP8_THRESHOLD)
    copy = moe_hal.get_backend(backend).prepared_k_major(qb).data
    assert copy.stride(-1) == 1 and torch.equal(copy.view(torch.uint8), qb.data.view(torch.uint8))
    assert moe_hal.get_backend(backend).prepared_k_major(qb).data is copy, "the copy is made once per weight"


def test_contiguous_fp8_sm90_takes_fp32_scales(gen):
    """SM90 converts non-power-of-two fp32 scales; SM100 rejects them with a reason."""
    lay = moe_hal.ContiguousLayout.from_counts([17, 4], alignment=1)
    qa = quantize_fp8(randn(gen, lay.num_rows, 136), (1, 128))
    qb = quantize_fp8(randn(gen, 2, 32, 136), (128, 128))
    out = moe_hal.grouped_gemm(qa, qb, lay, backend="cuda_sm90", out_dtype=torch.float32)
    assert_matches(out, reference(qa, qb, lay, out_dtype=torch.float32), magnitude(qa, qb, lay), 136, FP8_THRESHOLD)
    with pytest.raises(moe_hal.errors.BackendUnavailableError) as info:
        moe_hal.grouped_gemm(qa, qb, lay, backend="cuda_sm100")
    assert "scale_format_unsupported" in {r.code for r in info.value.reasons}


# -- masked --------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", FLOATS)
def test_masked_float(gen, backend, dtype):
    g, max_m, k, n = 4, 37, 40, 24  # max_m not a multiple of any tile height
    masked_m = torch.tensor([0, 37, 5, 16], dtype=torch.int32)
    lay = moe_hal.MaskedLayout(masked_m, max_m)
    a, b = randn(gen, g, max_m, k, dtype=dtype), randn(gen, g, n, k, dtype=dtype)
    sentinel = -12345.0
    out = torch.full((g, max_m, n), sentinel, dtype=dtype)
    moe_hal.grouped_gemm(a, b, lay, out=out, backend=backend)
    ref = torch.full((g, max_m, n), sentinel, dtype=torch.float32)
    reference(a, b, lay, out=ref, out_dtype=torch.float32)
    mag = torch.zeros_like(ref)
    reference(a.float().abs(), b.float().abs(), lay, out=mag)
    assert_matches(out, ref, mag, k, BF16_THRESHOLD)
    for gi, rows in enumerate(masked_m.tolist()):
        assert bool((out[gi, rows:] == sentinel).all()), f"group {gi}: rows >= masked_m were written"


@pytest.mark.parametrize("backend", BACKENDS)
def test_masked_fp8(gen, backend):
    g, max_m, k, n = 3, 20, 456, 24
    masked_m = torch.tensor([20, 0, 7], dtype=torch.int32)
    lay = moe_hal.MaskedLayout(masked_m, max_m, expected_m=8)
    ue8m0 = backend == "cuda_sm100"
    qa = quantize_fp8(randn(gen, g, max_m, k), (1, 128), ue8m0=ue8m0)
    qb = quantize_fp8(randn(gen, g, n, k), (128, 128), ue8m0=ue8m0)
    sentinel = 77.0
    out = torch.full((g, max_m, n), sentinel, dtype=torch.bfloat16)
    moe_hal.grouped_gemm(qa, qb, lay, out=out, backend=backend)
    ref = torch.full((g, max_m, n), sentinel, dtype=torch.float32)
    reference(qa, qb, lay, out=ref, out_dtype=torch.float32)
    mag = torch.zeros_like(ref)
    reference(qa.dequantize().abs(), qb.dequantize().abs(), lay, out=mag)
    assert_matches(out, ref, mag, k, FP8_THRESHOLD)
    for gi, rows in enumerate(masked_m.tolist()):
        assert bool((out[gi, rows:] == sentinel).all())


# -- K-grouped -----------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("with_c", [False, True])
def test_k_grouped_float(gen, backend, dtype, with_c):
    lay = moe_hal.KGroupedLayout.from_counts([11, 0, 45, 3, 0], alignment=1)
    m, n = 40, 24
    x, dy = randn(gen, lay.num_rows, m, dtype=dtype), randn(gen, lay.num_rows, n, dtype=dtype)
    c = randn(gen, 5, m, n) if with_c else None
    out = moe_hal.grouped_gemm(x, dy, lay, c=c, out_dtype=torch.float32, backend=backend)
    ref = reference(x, dy, lay, c=c, out_dtype=torch.float32)
    assert_matches(out, ref, magnitude(x, dy, lay, c), lay.num_rows, BF16_THRESHOLD)
    if c is None:
        assert bool((out[1] == 0).all()) and bool((out[4] == 0).all()), "empty groups give zeros"
    else:
        assert torch.equal(out[1], c[1]) and torch.equal(out[4], c[4]), "empty groups give c"


@pytest.mark.parametrize("backend", BACKENDS)
def test_k_grouped_in_place_bf16_out(gen, backend):
    """``out`` is ``c`` itself (weight-gradient accumulation), bf16 output, gaps between groups."""
    lay = moe_hal.KGroupedLayout.from_counts([6, 0, 19], alignment=8)
    m, n = 24, 40
    x = randn(gen, lay.num_rows, m, dtype=torch.bfloat16)
    dy = randn(gen, lay.num_rows, n, dtype=torch.bfloat16)
    c = randn(gen, 3, m, n, dtype=torch.bfloat16)
    ref = reference(x.float(), dy.float(), lay, c=c.float())
    mag = magnitude(x, dy, lay, c)
    result = moe_hal.grouped_gemm(x, dy, lay, c=c, out=c, backend=backend)
    assert result.data_ptr() == c.data_ptr()
    assert_matches(c, ref, mag, lay.num_rows, BF16_THRESHOLD)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("with_c", [False, True])
def test_k_grouped_fp8(gen, backend, with_c):
    """Token groups that straddle 128-token scale blocks (alignment 1), an empty group. SM90 runs
    on token-major copies (its fp8 wgmma reads K-major operands only): partial first and last
    steps, whole steps, and a group inside one step."""
    lay = moe_hal.KGroupedLayout.from_counts([100, 0, 90, 70, 300, 20], alignment=1)
    m, n = 24, 40
    ue8m0 = backend == "cuda_sm100"
    qx = quantize_fp8(randn(gen, lay.num_rows, m), (128, 1), ue8m0=ue8m0)
    qdy = quantize_fp8(randn(gen, lay.num_rows, n), (128, 1), ue8m0=ue8m0)
    c = randn(gen, 6, m, n) if with_c else None
    out = moe_hal.grouped_gemm(qx, qdy, lay, c=c, out_dtype=torch.float32, backend=backend)
    ref = reference(qx, qdy, lay, c=c, out_dtype=torch.float32)
    assert_matches(out, ref, magnitude(qx, qdy, lay, c), lay.num_rows, FP8_THRESHOLD)


# -- launch level: several tiles per dimension, scan chunks, persistent grids ------------------------------
SMALL = configs.KernelConfig(block_m=16, block_n=16, block_k=32, num_warps=4, num_stages=2, group_m=2)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("block_m", [16, 64])
def test_contiguous_device_schedule_many_tiles(gen, dtype, block_m):
    """Several row, column and K tiles; BLOCK_M below and above the alignment; padding rows and
    an over-allocated tail (rows of no group) come out as exact zeros."""
    lay = moe_hal.ContiguousLayout.from_counts([3, 0, 40, 17, 0], alignment=16, num_rows=112)
    k, n = 70, 40
    a, b = randn(gen, lay.num_rows, k, dtype=dtype), randn(gen, 5, n, k, dtype=dtype)
    config = configs.KernelConfig(block_m, 16, 32, 4, 2, group_m=2)
    out = launch.contiguous(a, b, _poisoned((lay.num_rows, n), torch.float32), lay, config)
    assert_matches(out, reference(a, b, lay, out_dtype=torch.float32), magnitude(a, b, lay), k, BF16_THRESHOLD)
    assert bool((out[_gap_rows(lay)] == 0).all())
    out_small = launch.contiguous(a, b, _poisoned((lay.num_rows, n), torch.float32), lay, SMALL)
    if kernels.INTERPRET and not _numpy_sums_rows_alike(block_m, SMALL.block_m, 32, 16):
        # the tiles' K order is the same, but the interpreter's dot within one K step is numpy's
        # matmul, whose order the CPU's BLAS picks by the block's shape: a rounding apart at most
        bound = 4 * torch.finfo(torch.float32).eps * magnitude(a, b, lay)
        assert bool(((out - out_small).abs() <= bound).all()), "the tile height changes a value"
    else:
        assert torch.equal(out, out_small), "the tile height changes no value (fp32 sums in one K order)"


def test_contiguous_many_groups_cross_scan_chunks(gen, monkeypatch):
    """More groups than one scan chunk: tiles are located across chunk boundaries."""
    monkeypatch.setattr(kernels, "GROUP_CHUNK", 4)
    counts = [0, 3, 1, 0, 0, 5, 2, 0, 0, 0, 7, 1]
    lay = moe_hal.ContiguousLayout.from_counts(counts, alignment=2)
    a, b = randn(gen, lay.num_rows, 24), randn(gen, len(counts), 16, 24)
    out = launch.contiguous(a, b, _poisoned((lay.num_rows, 16), torch.float32), lay, SMALL)
    assert_matches(out, reference(a, b, lay, out_dtype=torch.float32), magnitude(a, b, lay), 24, BF16_THRESHOLD)
    assert bool((out[_gap_rows(lay)] == 0).all())


@pytest.mark.parametrize("programs", [1, 2, 7, 1000])
def test_masked_persistent_grid_any_size(gen, programs, monkeypatch):
    """The persistent masked kernel covers every real tile whatever the grid size, never writes
    past masked_m (sentinels stay), and also across scan chunks."""
    monkeypatch.setattr(kernels, "GROUP_CHUNK", 2)
    masked_m = torch.tensor([0, 33, 5, 16, 0], dtype=torch.int32)
    lay = moe_hal.MaskedLayout(masked_m, 40)
    a, b = randn(gen, 5, 40, 24), randn(gen, 5, 20, 24)
    out = launch.masked(a, b, torch.full((5, 40, 20), 7.0), masked_m, SMALL, programs=programs)
    ref = reference(a, b, lay, out_dtype=torch.float32)
    for g, rows in enumerate(masked_m.tolist()):
        assert_matches(out[g, :rows], ref[g, :rows], reference(a.abs(), b.abs(), lay)[g, :rows], 24, BF16_THRESHOLD)
        assert bool((out[g, rows:] == 7.0).all()), f"rows past masked_m[{g}] were written"


@pytest.mark.parametrize("backend", BACKENDS)
def test_masked_m_strided_view(gen, backend):
    """Issue 15: an expanded (stride-0) masked_m reads as [2, 2, 2, 2], like every other backend."""
    masked_m = torch.tensor([2], dtype=torch.int32).expand(4)
    lay = moe_hal.MaskedLayout(masked_m, 4)
    a, b = randn(gen, 4, 4, 32, dtype=torch.bfloat16), randn(gen, 4, 16, 32, dtype=torch.bfloat16)
    out = moe_hal.grouped_gemm(a, b, lay, out=torch.full((4, 4, 16), 5.0, dtype=torch.bfloat16), backend=backend)
    ref = reference(a, b, lay, out_dtype=torch.float32)
    assert_matches(out[:, :2], ref[:, :2], reference(a.float().abs(), b.float().abs(), lay)[:, :2], 32, BF16_THRESHOLD)
    assert bool((out[:, 2:] == 5.0).all()), "rows past masked_m = 2 were written"
    every_other = masked_m.new_tensor([2, 9, 2, 9, 2, 9, 2, 9])[::2]  # a stride-2 view
    out2 = moe_hal.grouped_gemm(
        a,
        b,
        moe_hal.MaskedLayout(every_other, 4, check=False),
        out=torch.full((4, 4, 16), 5.0, dtype=torch.bfloat16),
        backend=backend,
    )
    assert torch.equal(out2, out)


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
def test_fp8_many_tiles_all_layouts(gen, arch):
    """fp8 with 32-wide K steps (four per scale block) on every layout."""
    ue8m0 = arch == "sm100"
    lay = moe_hal.ContiguousLayout.from_counts([20, 0, 9], alignment=1)
    k, n = 260, 40
    qa = quantize_fp8(randn(gen, lay.num_rows, k), (1, 128), ue8m0=ue8m0)
    qb = quantize_fp8(randn(gen, 3, n, k), (128, 128), ue8m0=ue8m0)
    out = _poisoned((lay.num_rows, n), torch.float32)
    launch.contiguous(qa.data, qb.data, out, lay, SMALL, sa=scales.activation(qa, arch), sb=scales.weight(qb, arch))
    assert_matches(out, reference(qa, qb, lay, out_dtype=torch.float32), magnitude(qa, qb, lay), k, FP8_THRESHOLD)

    masked_m = torch.tensor([5, 0, 18], dtype=torch.int32)
    ml = moe_hal.MaskedLayout(masked_m, 18)
    qa3 = quantize_fp8(randn(gen, 3, 18, k), (1, 128), ue8m0=ue8m0)
    out3 = torch.zeros(3, 18, n)
    launch.masked(qa3.data, qb.data, out3, masked_m, SMALL, sa=scales.activation(qa3, arch), sb=scales.weight(qb, arch))
    ref3 = reference(qa3, qb, ml, out_dtype=torch.float32)
    mag3 = reference(qa3.dequantize().abs(), qb.dequantize().abs(), ml)
    assert_matches(out3, ref3, mag3, k, FP8_THRESHOLD)

    kl = moe_hal.KGroupedLayout.from_counts([150, 0, 61], alignment=1)
    qx = quantize_fp8(randn(gen, kl.num_rows, 24), (128, 1), ue8m0=ue8m0)
    qdy = quantize_fp8(randn(gen, kl.num_rows, n), (128, 1), ue8m0=ue8m0)
    outk = _poisoned((3, 24, n), torch.float32)
    launch.k_grouped(
        qx.data, qdy.data, outk, kl, SMALL, sa=scales.activation(qx, arch), sb=scales.activation(qdy, arch)
    )
    assert_matches(
        outk, reference(qx, qdy, kl, out_dtype=torch.float32), magnitude(qx, qdy, kl), kl.num_rows, FP8_THRESHOLD
    )
    # K-major operands (SM90 fp8): whole steps on token-major copies, partial first/last steps on
    # the MN-major operands; the same K steps in the same order as the MN-major loop, so the same result.
    tx = launch.token_major(qx.data)
    assert tx.stride(0) == 1 and tx.stride(1) % 16 == 0 and tx.shape == qx.data.shape
    assert torch.equal(tx.view(torch.uint8), qx.data.view(torch.uint8))
    outt = _poisoned((3, 24, n), torch.float32)
    sa, sb = scales.activation(qx, arch), scales.activation(qdy, arch)
    launch.k_grouped(qx.data, qdy.data, outt, kl, SMALL, sa=sa, sb=sb, k_major=True)
    assert torch.equal(outt, outk)


def _misaligned(x: torch.Tensor) -> torch.Tensor:
    """A copy of contiguous ``x`` whose base sits one element past a 16-byte boundary: no TMA."""
    flat = torch.empty(x.numel() + 16, dtype=x.dtype)[1 : 1 + x.numel()]
    return flat.view(x.shape).copy_(x)


def test_descriptors_equal_tritons_and_weight_geometry_is_cached_weakly(gen):
    """The descriptors built without Triton's ``__post_init__`` equal the ones Triton builds (K- and
    N-major weights); a weight's cached geometry neither keeps the weight alive nor survives the
    weight's storage being swapped for a misaligned one in place (then it is loaded by pointer)."""
    a = randn(gen, 40, 64, dtype=torch.bfloat16)
    for w, shape, strides, block, kind in [
        (
            randn(gen, 3, 32, 64, dtype=torch.bfloat16),
            [3, 32, 64],
            [2048, 64, 1],
            [1, SMALL.block_n, SMALL.block_k],
            launch.B_TMA_K_MAJOR,
        ),
        (
            randn(gen, 3, 64, 32, dtype=torch.bfloat16).transpose(1, 2),
            [3, 64, 32],
            [2048, 32, 1],
            [1, SMALL.block_k, SMALL.block_n],
            launch.B_TMA_N_MAJOR,
        ),
    ]:
        for _ in range(2):  # a miss, then a hit
            a_src, a_tma, b_src, b_kind = launch.operand_sources(a, w, SMALL)
            assert a_tma and a_src == kernels.TensorDescriptor(a, [40, 64], [64, 1], [SMALL.block_m, SMALL.block_k])
            assert b_kind == kind and b_src == kernels.TensorDescriptor(w, shape, strides, block)
    w = randn(gen, 3, 32, 64, dtype=torch.bfloat16)
    launch.operand_sources(a, w, SMALL)
    key, ref = id(w), weakref.ref(w)
    assert key in launch._weight_geometry.ids()
    w.set_(_misaligned(w).untyped_storage(), 1, (3, 32, 64), (2048, 64, 1))
    assert launch.operand_sources(a, w, SMALL)[3] == launch.B_POINTER
    del w
    gc.collect()
    assert ref() is None and key not in launch._weight_geometry.ids()


@pytest.mark.parametrize("arch", ["sm90", "sm100", None])
def test_tma_and_pointer_paths_agree(gen, arch):
    """Aligned operands go to the contiguous and masked kernels as TMA descriptors (weights K- and
    N-major), misaligned ones as pointers; both paths match the reference, and each other exactly.
    ``arch`` None: bf16; else fp8 with that architecture's scales."""
    k, n = 256, 48
    lay = moe_hal.ContiguousLayout.from_counts([21, 0, 9], alignment=4)
    masked_m = torch.tensor([5, 0, 18], dtype=torch.int32)
    ml = moe_hal.MaskedLayout(masked_m, 18)
    if arch is None:
        a, a3 = randn(gen, lay.num_rows, k, dtype=torch.bfloat16), randn(gen, 3, 18, k, dtype=torch.bfloat16)
        weights = [randn(gen, 3, n, k, dtype=torch.bfloat16), randn(gen, 3, k, n, dtype=torch.bfloat16).transpose(1, 2)]
        data, kw, kw3, tol = (lambda x: x), {}, {}, BF16_THRESHOLD
    else:
        ue8m0 = arch == "sm100"
        a = quantize_fp8(randn(gen, lay.num_rows, k), (1, 128), ue8m0=ue8m0)
        a3 = quantize_fp8(randn(gen, 3, 18, k), (1, 128), ue8m0=ue8m0)
        weights = [quantize_fp8(randn(gen, 3, n, k), (128, 128), ue8m0=ue8m0)]
        kw = {"sa": scales.activation(a, arch), "sb": scales.weight(weights[0], arch)}
        kw3 = {"sa": scales.activation(a3, arch), "sb": kw["sb"]}
        data, tol = (lambda x: x.data), FP8_THRESHOLD
    for w in weights:
        outs = []
        for prepare in (lambda x: x, _misaligned):
            x, x3 = prepare(data(a)), prepare(data(a3))
            y = data(w) if data(w).stride(-1) != 1 else prepare(data(w))
            sources = launch.operand_sources(x, y, SMALL)
            tma = prepare is not _misaligned
            assert sources[1] == tma and isinstance(sources[0], kernels.TensorDescriptor) == tma
            if tma or data(w).stride(-1) == 1:
                assert (sources[3] != launch.B_POINTER) == tma
            out = launch.contiguous(x, y, _poisoned((lay.num_rows, n), torch.float32), lay, SMALL, **kw)
            out3 = launch.masked(x3, y, torch.full((3, 18, n), 7.0), masked_m, SMALL, **kw3)
            assert_matches(out, reference(a, w, lay, out_dtype=torch.float32), magnitude(a, w, lay), k, tol)
            mag3 = reference(
                a3.dequantize().abs() if arch else a3.float().abs(),
                w.dequantize().abs() if arch else w.float().abs(),
                ml,
            )
            ref3 = torch.full((3, 18, n), 7.0)
            reference(a3, w, ml, out=ref3, out_dtype=torch.float32)
            assert_matches(out3, ref3, mag3, k, tol)
            outs.append((out, out3))
        assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


@pytest.mark.parametrize("arch", ["sm90", "sm100", None])
def test_k_grouped_tma_and_pointer_paths_agree(gen, arch):
    """K-grouped whole steps read TMA descriptors of aligned operands and pointers otherwise
    (a misaligned base); both match the reference and each other exactly. ``arch`` None: bf16;
    else fp8 with that architecture's scales and, for sm90, K-major (token-major) operands."""
    kl = moe_hal.KGroupedLayout.from_counts([150, 0, 61, 96], alignment=1)
    m, n = 32, 48
    if arch is None:
        x, dy = randn(gen, kl.num_rows, m, dtype=torch.bfloat16), randn(gen, kl.num_rows, n, dtype=torch.bfloat16)
        data, kw, tol = (lambda q: q), {}, BF16_THRESHOLD
    else:
        x = quantize_fp8(randn(gen, kl.num_rows, m), (128, 1), ue8m0=arch == "sm100")
        dy = quantize_fp8(randn(gen, kl.num_rows, n), (128, 1), ue8m0=arch == "sm100")
        kw = {"sa": scales.activation(x, arch), "sb": scales.activation(dy, arch), "k_major": arch == "sm90"}
        data, tol = (lambda q: q.data), FP8_THRESHOLD
    outs = []
    for prepare in (lambda q: q, _misaligned):
        a, b = prepare(data(x)), prepare(data(dy))
        if not kw.get("k_major"):  # the K-major copies are aligned whatever the input
            tma = prepare is not _misaligned
            assert launch._k_grouped_source(a, False, SMALL.block_m, SMALL.block_k)[1] == tma
        out = launch.k_grouped(a, b, _poisoned((4, m, n), torch.float32), kl, SMALL, **kw)
        assert_matches(out, reference(x, dy, kl, out_dtype=torch.float32), magnitude(x, dy, kl), kl.num_rows, tol)
        outs.append(out)
    assert torch.equal(outs[0], outs[1])


def test_sm100_kernel_decodes_packed_bytes(gen):
    """Raising one exponent byte of the packed A scales by one doubles exactly the products of
    that row and K-block: the kernel reads the int32 UE8M0 words, not fp32 values."""
    lay = moe_hal.ContiguousLayout.from_counts([4], alignment=1)
    k, n = 512, 16  # four K-blocks: all bytes of one word
    qa = quantize_fp8(randn(gen, 4, k), (1, 128), ue8m0=True)
    qb = quantize_fp8(randn(gen, 1, n, k), (128, 128), ue8m0=True)
    sa, sb = scales.activation(qa, "sm100"), scales.weight(qb, "sm100")
    base = launch.contiguous(qa.data, qb.data, torch.empty(4, n), lay, SMALL, sa=sa, sb=sb)
    row, block = 2, 3
    bumped = sa.tensor.clone()
    bumped[row, 0] += 1 << (8 * block)  # byte 3 of word 0 of row 2
    out = launch.contiguous(
        qa.data, qb.data, torch.empty(4, n), lay, SMALL, sa=scales.Physical(bumped, sa.kind, 1), sb=sb
    )
    a_block = qa.dequantize()[row, 128 * block : 128 * (block + 1)].double()
    w_block = qb.dequantize()[0, :, 128 * block : 128 * (block + 1)].double()
    expected_change = a_block @ w_block.T  # that block's contribution, counted twice
    assert torch.allclose((out[row] - base[row]).double(), expected_change, rtol=1e-5, atol=1e-4)
    others = [r for r in range(4) if r != row]
    assert torch.equal(out[others], base[others])
