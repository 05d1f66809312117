"""FP8 block quantization: quantize_fp8, dequantize, ceil_to_ue8m0."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from moe_hal.errors import DTypeError, ShapeError
from moe_hal.quant import AMAX_FLOOR, QuantizedTensor, ceil_to_ue8m0, dequantize, quantize_fp8

E4M3_MAX = 448.0


def naive_scales(x: torch.Tensor, block: tuple[int, int], ue8m0: bool) -> torch.Tensor:
    """Block scales by an explicit loop over blocks (float64 amax, then the fp32 formula)."""
    br, bc = block
    *lead, rows, cols = x.shape
    flat = x.reshape(-1, rows, cols).double()
    sr, sc = math.ceil(rows / br), math.ceil(cols / bc)
    out = torch.empty(flat.shape[0], sr, sc, dtype=torch.float32)
    for b in range(flat.shape[0]):
        for i in range(sr):
            for j in range(sc):
                amax = float(flat[b, i * br : (i + 1) * br, j * bc : (j + 1) * bc].abs().max())
                s = max(amax, AMAX_FLOOR) / E4M3_MAX
                if ue8m0:
                    s = 2.0 ** math.ceil(math.log2(s))  # smallest power of two >= s
                out[b, i, j] = s
    return out.reshape(*lead, sr, sc)


CASES = [
    ((4, 256), (1, 128)),
    ((3, 130), (1, 128)),  # K not a multiple of 128: partial edge block
    ((1, 1), (1, 128)),
    ((2, 200, 300), (128, 128)),
    ((1, 128, 128), (128, 128)),
    ((300, 5), (128, 1)),
    ((7, 96), (1, 32)),
]


@pytest.mark.parametrize("shape,block", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("ue8m0", [False, True])
def test_scales_shapes_and_error_bound(shape, block, dtype, ue8m0):
    torch.manual_seed(0)
    x = (torch.randn(shape) * torch.rand(shape[:-1] + (1,)) * 10).to(dtype)
    q = quantize_fp8(x, block=block, ue8m0=ue8m0)
    assert isinstance(q, QuantizedTensor)
    assert q.data.dtype == torch.float8_e4m3fn and q.data.shape == x.shape
    assert q.scale.dtype == torch.float32
    assert q.block == block and q.scale_format == ("ue8m0" if ue8m0 else "fp32")
    expected = naive_scales(x.float(), block, ue8m0)
    if ue8m0:
        assert torch.equal(q.scale, expected)
    else:
        torch.testing.assert_close(q.scale, expected, rtol=2e-7, atol=0)
    # e4m3 has 3 mantissa bits: relative error <= 2^-4 in the normal range; absolute <= 2^-10
    # (half the subnormal spacing 2^-9) in units of the scale below it.
    xf = x.double()
    deq = dequantize(q, torch.float64)
    bound = xf.abs() * 2.0**-4 + q.expanded_scale().double() * 2.0**-10
    assert bool(((deq - xf).abs() <= bound * (1 + 1e-6)).all())
    # The largest element of each block maps to (nearly) the fp8 max: the scale is not wasteful.
    assert float(q.data.float().abs().max()) <= E4M3_MAX


def test_all_zero_block_uses_the_floor():
    x = torch.zeros(2, 256)
    x[1, :128] = 3.0
    q = quantize_fp8(x)
    floor = torch.tensor(AMAX_FLOOR, dtype=torch.float32) / 448.0
    assert torch.equal(q.scale[0], torch.stack([floor, floor]))
    assert q.scale[1, 1] == floor
    assert q.scale[1, 0] == torch.tensor(3.0) / 448.0
    assert torch.equal(q.dequantize()[0], torch.zeros(256))
    assert bool(torch.isfinite(q.dequantize()).all())


def test_weights_blocks_never_straddle_experts():
    w = torch.ones(2, 128, 128)
    w[1] *= 100.0
    q = quantize_fp8(w, block=(128, 128))
    assert q.scale.shape == (2, 1, 1)
    assert q.scale[0, 0, 0] == torch.tensor(1.0) / 448 and q.scale[1, 0, 0] == torch.tensor(100.0) / 448
    assert torch.equal(q.dequantize(), w)


def test_transposed_input_and_dequantize_matches_method():
    x = torch.randn(256, 64).t()  # non-contiguous view [64, 256]
    q = quantize_fp8(x)
    assert q.data.is_contiguous()
    assert torch.equal(dequantize(q), q.dequantize())
    assert dequantize(q, torch.bfloat16).dtype == torch.bfloat16
    ref = quantize_fp8(x.contiguous())
    assert torch.equal(q.scale, ref.scale) and torch.equal(q.data.view(torch.uint8), ref.data.view(torch.uint8))


def test_exactly_representable_values_round_trip():
    # Values on the e4m3 grid times a power-of-two scale come back exactly.
    grid = torch.tensor([0.0, 1.0, -2.0, 0.5, 448.0, 3.5, -0.015625, 240.0])
    x = torch.cat([grid, grid.flip(0)]).repeat(8).reshape(1, 128) * 2.0**-5
    q = quantize_fp8(x, ue8m0=True)
    assert q.scale.item() == 2.0**-5  # amax = 448 * 2^-5 -> scale exactly 2^-5
    assert torch.equal(q.dequantize(), x)


def test_quantize_errors():
    with pytest.raises(DTypeError, match="x"):
        quantize_fp8(torch.zeros(4, 4, dtype=torch.int32))
    with pytest.raises(DTypeError):
        quantize_fp8([[1.0]])
    with pytest.raises(ShapeError, match="x"):
        quantize_fp8(torch.zeros(4))
    with pytest.raises(ShapeError, match="block"):
        quantize_fp8(torch.zeros(4, 4), block=(0, 128))
    with pytest.raises(ShapeError, match="block"):
        quantize_fp8(torch.zeros(4, 4), block=(1, 2, 3))
    with pytest.raises(DTypeError, match="q"):
        dequantize(torch.zeros(2, 2))


def test_empty_inputs():
    q = quantize_fp8(torch.zeros(0, 256))
    assert q.data.shape == (0, 256) and q.scale.shape == (0, 2)
    q = quantize_fp8(torch.zeros(3, 0, 128), block=(128, 128))
    assert q.scale.shape == (3, 0, 1)


# -- ceil_to_ue8m0 -------------------------------------------------------------------------------


def test_ceil_to_ue8m0_examples():
    x = torch.tensor([1.0, 1.5, 3.0, 0.75, 2.0**-20, 2.0**-20 * 1.0001, 6.0, 1e30])
    expected = torch.tensor([1.0, 2.0, 4.0, 1.0, 2.0**-20, 2.0**-19, 8.0, 2.0**100])  # 2^99 < 1e30 < 2^100
    assert torch.equal(ceil_to_ue8m0(x), expected)


def test_ceil_to_ue8m0_clamps_like_deepgemm():
    tiny = 2.0**-126
    x = torch.tensor([0.0, 1e-45, float("inf"), 2.0**127 * 1.5, -3.0])
    assert torch.equal(ceil_to_ue8m0(x), torch.tensor([tiny, tiny, 2.0**127, 2.0**127, 4.0]))


@settings(max_examples=200, deadline=None)
@given(st.floats(min_value=2.0**-126, max_value=2.0**127, allow_nan=False, width=32))
def test_ceil_to_ue8m0_is_the_smallest_power_of_two_above(v):
    out = float(ceil_to_ue8m0(torch.tensor([v], dtype=torch.float32))[0])
    m, e = math.frexp(out)
    assert m == 0.5  # a power of two
    assert out >= v  # not below the input
    assert out / 2 < v  # minimal


def test_ceil_to_ue8m0_rejects_non_fp32():
    with pytest.raises(DTypeError, match="scale"):
        ceil_to_ue8m0(torch.ones(3, dtype=torch.float64))


@settings(max_examples=40, deadline=None)
@given(
    lead=st.lists(st.integers(1, 3), max_size=2),
    rows=st.integers(1, 140),
    cols=st.integers(1, 300),
    block=st.sampled_from([(1, 128), (128, 128), (128, 1), (1, 32), (3, 5)]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
    ue8m0=st.booleans(),
    seed=st.integers(0, 2**16),
    zero_rows=st.booleans(),
)
def test_quantize_properties(lead, rows, cols, block, dtype, ue8m0, seed, zero_rows):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(*lead, rows, cols, generator=gen) * 10.0 ** torch.randint(-3, 4, (1,), generator=gen).item()
    if zero_rows:
        x[..., : rows // 2, :] = 0.0
    x = x.to(dtype)
    q = quantize_fp8(x, block=block, ue8m0=ue8m0)
    assert q.data.shape == x.shape
    assert q.scale.shape == (*lead, math.ceil(rows / block[0]), math.ceil(cols / block[1]))
    # The scale covers its block's amax (no fp8 overflow) and is not larger than needed.
    expected = naive_scales(x.float(), block, ue8m0)
    if ue8m0:
        assert torch.equal(q.scale, expected)
    else:
        torch.testing.assert_close(q.scale, expected, rtol=2e-7, atol=0)
    assert bool(torch.isfinite(q.data.float()).all())
    xf = x.double()
    bound = xf.abs() * 2.0**-4 + q.expanded_scale().double() * 2.0**-10
    assert bool(((q.dequantize(torch.float64) - xf).abs() <= bound * (1 + 1e-6)).all())


@pytest.mark.parametrize("block", [(1, 128), (128, 128), (128, 1)])
def test_chunked_cpu_path_matches_one_chunk(monkeypatch, block):
    import moe_hal.quant as quant

    torch.manual_seed(0)
    x = torch.randn(3, 300, 260).bfloat16()
    whole = quantize_fp8(x, block=block, ue8m0=True)
    monkeypatch.setattr(quant, "_CPU_CHUNK_ELEMENTS", 1000)  # many chunks, one of them partial
    chunked = quantize_fp8(x, block=block, ue8m0=True)
    assert torch.equal(chunked.scale, whole.scale)
    assert torch.equal(chunked.data.view(torch.uint8), whole.data.view(torch.uint8))
