"""Physical scale layouts: SM90 TMA-aligned fp32, SM100 UE8M0 x4 per int32, Ascend-950 UE8M0 x2 per int16.

Golden values are derived by hand in the comments; the byte-level checks read the raw storage of the
packed tensors, i.e. what a kernel would see in memory.
"""

from __future__ import annotations

import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from moe_hal.errors import DTypeError, ScaleFormatError, ShapeError
from moe_hal.quant import (
    ceil_to_ue8m0,
    from_tma_aligned,
    pack_ue8m0,
    pack_ue8m0x2,
    quantize_fp8,
    tma_align_mn_major,
    unpack_ue8m0,
    unpack_ue8m0x2,
)

pytestmark = pytest.mark.skipif(sys.byteorder != "little", reason="raw-byte checks assume a little-endian host")


def storage_bytes(t: torch.Tensor) -> list[int]:
    """Every byte of the storage behind ``t``, padding included."""
    raw = torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage())
    return raw.tolist()


# -- SM90: fp32, MN-major, stride align(MN, 4) -----------------------------------------------------


def test_tma_align_golden_2d():
    scale = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])  # MN = 3, SK = 2
    out = tma_align_mn_major(scale)
    assert out.shape == (3, 2) and out.stride() == (1, 4)  # align(3, 4) = 4
    assert torch.equal(out, scale)
    # Memory: column 0 (k-block 0) of all rows, one padding zero, then column 1.
    raw = torch.empty(0, dtype=torch.float32).set_(out.untyped_storage()).tolist()
    assert raw == [1.0, 3.0, 5.0, 0.0, 2.0, 4.0, 6.0, 0.0]


def test_tma_align_golden_3d():
    scale = torch.arange(1, 1 + 2 * 5 * 3, dtype=torch.float32).reshape(2, 5, 3)  # MN = 5 -> 8
    out = tma_align_mn_major(scale)
    assert out.stride() == (8 * 3, 1, 8)
    assert torch.equal(out, scale)
    raw = torch.empty(0, dtype=torch.float32).set_(out.untyped_storage())
    assert raw.numel() == 2 * 8 * 3
    # group 1, k-block 2, rows 0..4 then 3 padding zeros
    assert raw[24 + 16 : 24 + 24].tolist() == [scale[1, r, 2].item() for r in range(5)] + [0.0] * 3


def test_tma_align_keeps_an_aligned_input_and_round_trips():
    scale = torch.rand(8, 3)
    aligned = tma_align_mn_major(scale)
    assert tma_align_mn_major(aligned) is aligned
    back = from_tma_aligned(aligned)
    assert back.is_contiguous() and torch.equal(back, scale)
    # A transposed (MN-major) view with MN % 4 == 0 is already the SM90 layout.
    mn_major = torch.rand(3, 8).t()
    assert tma_align_mn_major(mn_major) is mn_major


@settings(max_examples=40, deadline=None)
@given(g=st.integers(0, 3), mn=st.integers(0, 13), sk=st.integers(0, 9), transposed=st.booleans())
def test_tma_align_random_round_trip(g, mn, sk, transposed):
    shape = (g, mn, sk) if g else (mn, sk)
    scale = torch.rand(shape)
    if transposed:
        scale = scale.transpose(-1, -2).contiguous().transpose(-1, -2)
    out = tma_align_mn_major(scale)
    assert torch.equal(out, scale)
    assert out.stride(-2) == 1 and out.stride(-1) == -(-mn // 4) * 4
    if g:
        assert out.stride(0) == -(-mn // 4) * 4 * sk
    assert torch.equal(from_tma_aligned(out), scale)


def test_tma_align_errors():
    with pytest.raises(DTypeError, match="scale"):
        tma_align_mn_major(torch.ones(4, 2, dtype=torch.float16))
    with pytest.raises(ShapeError, match="scale"):
        tma_align_mn_major(torch.ones(4))
    with pytest.raises(ShapeError, match="scale"):
        tma_align_mn_major(torch.ones(1, 2, 4, 2))


# -- SM100: UE8M0, four per int32 -----------------------------------------------------------------


def test_pack_ue8m0_golden_bytes():
    # Exponent bytes by hand: 1.0 = 2^0 -> 127, 2.0 -> 128, 0.5 -> 126, 4.0 -> 129, 8.0 -> 130.
    scale = torch.tensor([[1.0, 2.0, 0.5, 4.0, 8.0]])
    packed = pack_ue8m0(scale)
    assert packed.dtype == torch.int32 and packed.shape == (1, 2)  # ceil(5 / 4) = 2
    assert packed.stride() == (1, 4)  # align(1, 4) = 4
    # Word 0 = bytes (127, 128, 126, 129), least significant first = 0x81_7E_80_7F.
    assert packed[0, 0].item() & 0xFFFFFFFF == 0x817E807F
    assert packed[0, 1].item() == 0x82  # 130, then three zero bytes
    raw = storage_bytes(packed)
    # Storage: word [0,0], 3 padding rows (MN 1 -> 4), word [0,1], 3 padding rows; 4 bytes each.
    assert raw[0:4] == [127, 128, 126, 129]
    assert raw[4:16] == [0] * 12
    assert raw[16:20] == [130, 0, 0, 0]
    assert raw[20:32] == [0] * 12


def test_pack_ue8m0_golden_mn_major_rows():
    # Two rows: row 0 all 1.0 (127), row 1 = 2^-3 (124), 2^3 (130), 2^10 (137), 2^-10 (117).
    scale = torch.tensor([[1.0, 1.0, 1.0, 1.0], [0.125, 8.0, 1024.0, 2.0**-10]])
    packed = pack_ue8m0(scale)
    assert packed.shape == (2, 1) and packed.stride() == (1, 4)
    raw = storage_bytes(packed)
    assert raw == [127, 127, 127, 127, 124, 130, 137, 117] + [0] * 8  # rows 0, 1, then 2 padding words


def test_pack_ue8m0_golden_3d():
    scale = torch.tensor([[[2.0]], [[0.25]]])  # G = 2, MN = 1, SK = 1
    packed = pack_ue8m0(scale)
    assert packed.shape == (2, 1, 1) and packed.stride() == (4, 1, 4)
    assert storage_bytes(packed) == [128, 0, 0, 0] + [0] * 12 + [125, 0, 0, 0] + [0] * 12


def expected_byte(value: float) -> int:
    """Biased exponent of a power of two, from its float value (independent of bit tricks)."""
    m, e = __import__("math").frexp(value)  # value = m * 2^e, m = 0.5
    assert m == 0.5
    return e - 1 + 127


@settings(max_examples=40, deadline=None)
@given(g=st.integers(0, 3), mn=st.integers(0, 9), sk=st.integers(0, 11), seed=st.integers(0, 2**16))
def test_pack_ue8m0_byte_by_byte_random(g, mn, sk, seed):
    gen = torch.Generator().manual_seed(seed)
    shape = (g, mn, sk) if g else (mn, sk)
    exps = torch.randint(-126, 128, shape, generator=gen)
    scale = torch.pow(2.0, exps.double()).float()
    packed = pack_ue8m0(scale)
    words, mn_stride = -(-sk // 4), -(-mn // 4) * 4
    assert packed.shape == shape[:-1] + (words,)
    assert packed.stride()[-2:] == (1, mn_stride)
    raw = storage_bytes(packed)
    flat = scale.reshape(max(g, 1), mn, sk)
    for gi in range(flat.shape[0]):
        for r in range(mn):
            for i in range(words):
                base = 4 * (gi * mn_stride * words + i * mn_stride + r)
                for j in range(4):
                    k = 4 * i + j
                    want = expected_byte(float(flat[gi, r, k])) if k < sk else 0
                    assert raw[base + j] == want, (gi, r, i, j)
    assert torch.equal(unpack_ue8m0(packed, sk), scale)


def test_pack_ue8m0_from_quantize_and_ceil():
    torch.manual_seed(0)
    q = quantize_fp8(torch.randn(37, 700), ue8m0=True)
    assert torch.equal(unpack_ue8m0(pack_ue8m0(q.scale), q.scale.shape[-1]), q.scale)
    s = ceil_to_ue8m0(torch.rand(5, 6) + 1e-3)
    assert torch.equal(unpack_ue8m0(pack_ue8m0(s), 6), s)


@pytest.mark.parametrize(
    "bad,index",
    [
        (3.0, "scale[1, 2]"),  # not a power of two
        (0.0, "scale[1, 2]"),  # zero has no UE8M0 code
        (-2.0, "scale[1, 2]"),  # negative
        (float("inf"), "scale[1, 2]"),
        (float("nan"), "scale[1, 2]"),
        (2.0**-130, "scale[1, 2]"),  # subnormal: exponent byte 0
    ],
)
def test_pack_ue8m0_refuses_non_powers_of_two(bad, index):
    scale = torch.ones(3, 5)
    scale[1, 2] = bad
    scale[2, 4] = 3.0  # a second bad one: the first is named
    for pack in (pack_ue8m0, pack_ue8m0x2):
        with pytest.raises(ScaleFormatError) as info:
            pack(scale)
        assert info.value.argument == index


def test_pack_ue8m0_check_false_takes_the_exponent():
    packed = pack_ue8m0(torch.tensor([[3.0]]), check=False)  # 3.0 = 1.5 * 2^1 -> byte 128 (floored)
    assert packed.item() == 128


def test_pack_errors():
    with pytest.raises(DTypeError, match="scale"):
        pack_ue8m0(torch.ones(2, 2, dtype=torch.float64))
    with pytest.raises(ShapeError, match="scale"):
        pack_ue8m0(torch.ones(4))
    with pytest.raises(ShapeError, match="sk"):
        unpack_ue8m0(pack_ue8m0(torch.ones(2, 5)), 9)  # ceil(9/4) = 3 != 2
    with pytest.raises(DTypeError, match="packed"):
        unpack_ue8m0(torch.ones(2, 2), 5)
    with pytest.raises(DTypeError, match="packed"):
        unpack_ue8m0x2(pack_ue8m0(torch.ones(2, 4)), 2)


# -- Ascend-950 port: UE8M0, two per int16 --------------------------------------------------------


def test_pack_ue8m0x2_golden_bytes():
    scale = torch.tensor([[1.0, 2.0, 0.5, 4.0, 8.0], [0.25, 0.25, 0.25, 0.25, 0.25]])
    packed = pack_ue8m0x2(scale)
    assert packed.dtype == torch.int16 and packed.shape == (2, 3)  # ceil(5 / 2) = 3
    assert packed.stride() == (1, 2)  # MN-major, unpadded
    # Row 0 words: (127, 128) -> 0x807F, (126, 129) -> 0x817E, (130, 0) -> 0x0082.
    assert [v & 0xFFFF for v in packed[0].tolist()] == [0x807F, 0x817E, 0x0082]
    # Storage: word i of row 0, word i of row 1, ...; 0.25 -> 125.
    assert storage_bytes(packed) == [127, 128, 125, 125, 126, 129, 125, 125, 130, 0, 125, 0]


@settings(max_examples=30, deadline=None)
@given(g=st.integers(0, 3), mn=st.integers(0, 9), sk=st.integers(0, 9), seed=st.integers(0, 2**16))
def test_pack_ue8m0x2_byte_by_byte_random(g, mn, sk, seed):
    gen = torch.Generator().manual_seed(seed)
    shape = (g, mn, sk) if g else (mn, sk)
    scale = torch.pow(2.0, torch.randint(-126, 128, shape, generator=gen).double()).float()
    packed = pack_ue8m0x2(scale)
    words = -(-sk // 2)
    assert packed.shape == shape[:-1] + (words,)
    assert packed.stride()[-2:] == (1, mn) or mn * words == 0
    raw = storage_bytes(packed)
    flat = scale.reshape(max(g, 1), mn, sk)
    for gi in range(flat.shape[0]):
        for r in range(mn):
            for i in range(words):
                base = 2 * (gi * mn * words + i * mn + r)
                for j in range(2):
                    k = 2 * i + j
                    assert raw[base + j] == (expected_byte(float(flat[gi, r, k])) if k < sk else 0)
    assert torch.equal(unpack_ue8m0x2(packed, sk), scale)
