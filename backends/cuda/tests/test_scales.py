"""Byte-exact checks of the physical scale formats the kernels read (``Backend.physical_scales``).

Expected values are built independently here: exponents with ``math.frexp`` and words with
Python integer arithmetic, not with moe_hal.quant's bit operations.
"""

from __future__ import annotations

import math

import pytest
import torch
from cuda_helpers import randn

import moe_hal
from moe_hal.errors import ScaleFormatError
from moe_hal.quant import quantize_fp8


def _align4(x: int) -> int:
    return (x + 3) // 4 * 4


def _exponent_byte(value: float) -> int:
    mantissa, exp = math.frexp(value)  # value = mantissa * 2**exp, mantissa in [0.5, 1)
    assert mantissa == 0.5, "ue8m0 scales are powers of two"
    return exp - 1 + 127


def _expected_words(rows: list[list[float]]) -> list[list[int]]:
    """Unsigned 32-bit words: byte j of word i = exponent byte of row[4i + j], 0 past the end."""
    out = []
    for row in rows:
        words = []
        for i in range((len(row) + 3) // 4):
            word = 0
            for j in range(4):
                if 4 * i + j < len(row):
                    word |= _exponent_byte(row[4 * i + j]) << (8 * j)
            words.append(word)
        out.append(words)
    return out


def _unsigned(t: torch.Tensor) -> list[list[int]]:
    return [[v & 0xFFFFFFFF for v in row] for row in t.tolist()]


def _storage(t: torch.Tensor) -> torch.Tensor:
    """The whole storage behind ``t`` (padding included) as a flat tensor of its dtype."""
    return torch.empty(0, dtype=t.dtype).set_(t.untyped_storage())


@pytest.mark.parametrize("mn", [37, 40])
def test_sm100_activation_words(gen, mn):
    q = quantize_fp8(randn(gen, mn, 700) * 3, (1, 128), ue8m0=True)  # SK = 6: two words
    packed = moe_hal.get_backend("cuda_sm100").physical_scales(q, "a")
    assert packed.dtype == torch.int32 and tuple(packed.shape) == (mn, 2)
    assert packed.stride() == (1, _align4(mn))
    assert _unsigned(packed) == _expected_words(q.scale.tolist())
    storage = _storage(packed)
    assert storage.numel() == _align4(mn) * 2
    pad_rows = [r for r in range(_align4(mn)) if r >= mn]
    assert all(int(storage[w * _align4(mn) + r]) == 0 for w in range(2) for r in pad_rows)


def test_sm100_weight_words_broadcast_per_row(gen):
    g, n, k = 2, 200, 300  # SN = 2, SK = 3
    q = quantize_fp8(randn(gen, g, n, k), (128, 128), ue8m0=True)
    packed = moe_hal.get_backend("cuda_sm100").physical_scales(q, "b")
    assert tuple(packed.shape) == (g, n, 1)
    assert packed.stride() == (_align4(n), 1, _align4(n))
    for e in range(g):
        per_row = [q.scale[e, row // 128].tolist() for row in range(n)]
        assert _unsigned(packed[e]) == _expected_words(per_row)


def test_sm100_k_grouped_operand_is_transposed(gen):
    q = quantize_fp8(randn(gen, 300, 21), (128, 1), ue8m0=True)  # scale [3, 21]
    packed = moe_hal.get_backend("cuda_sm100").physical_scales(q, "b")
    assert tuple(packed.shape) == (21, 1) and packed.stride() == (1, 24)
    assert _unsigned(packed) == _expected_words(q.scale.t().tolist())


def test_sm100_weight_rejects_non_power_of_two(gen):
    q = quantize_fp8(randn(gen, 1, 128, 128), (128, 128))  # plain fp32 scales
    with pytest.raises(ScaleFormatError):
        moe_hal.get_backend("cuda_sm100").physical_scales(q, "b")


@pytest.mark.parametrize("shape", [(37, 300), (3, 10, 300)])
def test_sm90_activation_mn_major(gen, shape):
    q = quantize_fp8(randn(gen, *shape), (1, 128))
    phys = moe_hal.get_backend("cuda_sm90").physical_scales(q, "a")
    mn, sk = shape[-2], 3
    assert phys.dtype == torch.float32 and tuple(phys.shape) == (*shape[:-1], sk)
    expected_strides = (1, _align4(mn)) if len(shape) == 2 else (_align4(mn) * sk, 1, _align4(mn))
    assert phys.stride() == expected_strides
    assert torch.equal(phys, q.scale)
    assert _storage(phys).numel() == (shape[0] if len(shape) == 3 else 1) * _align4(mn) * sk


def test_sm90_weight_as_given(gen):
    q = quantize_fp8(randn(gen, 2, 200, 300), (128, 128))
    phys = moe_hal.get_backend("cuda_sm90").physical_scales(q, "b")
    assert torch.equal(phys, q.scale) and phys.is_contiguous()


def test_role_is_checked(gen):
    q = quantize_fp8(randn(gen, 4, 128), (1, 128))
    with pytest.raises(ValueError, match="role"):
        moe_hal.get_backend("cuda_sm90").physical_scales(q, "c")
