"""DeepGEMM's own layouts in the core: any alignment, per-group K-grouped scale blocks, every
m_indices form, checked raw layout constructors, and DeepGEMM's fp8 rounding."""

from __future__ import annotations

import warnings

import pytest
import torch

import moe_hal
from moe_hal.backend import Signature
from moe_hal.errors import LayoutError, ShapeError
from moe_hal.layouts import ContiguousLayout, KGroupedLayout, SegmentLayout
from moe_hal.problem import Problem
from moe_hal.quant import (
    QuantizedTensor,
    quantize_fp8,
    to_group_origin,
    to_tensor_origin,
)

pytestmark = pytest.mark.filterwarnings("ignore::moe_hal.errors.MoeHalWarning")


def _segments(layout: SegmentLayout) -> tuple[tuple[int, int], ...]:
    return tuple((s, e) for _, s, e in layout.segments())


# -- 1. alignment: any positive int ------------------------------------------------------------
@pytest.mark.parametrize("alignment", [224, 160, 96, 3])
def test_any_positive_alignment_places_groups_at_its_multiples(alignment):
    layout = ContiguousLayout.from_counts([5, 0, 300, 1], alignment=alignment)
    assert all(s % alignment == 0 for s in layout.starts)
    assert layout.num_rows % alignment == 0
    a = torch.randn(layout.num_rows, 16)
    b = torch.randn(4, 8, 16)
    out = moe_hal.grouped_gemm(a, b, layout, backend="torch")
    for g, s, e in layout.segments():
        torch.testing.assert_close(out[s:e], a[s:e] @ b[g].T)
    assert ContiguousLayout.from_psum(layout.psum, alignment=alignment) == layout
    assert ContiguousLayout.from_m_indices(layout.m_indices(), 4).starts == layout.starts


@pytest.mark.parametrize("bad", [0, -128, 1.5, True, "128"])
def test_alignment_must_be_a_positive_int(bad):
    with pytest.raises(LayoutError, match="alignment"):
        ContiguousLayout.from_counts([1], alignment=bad)


def test_a_backend_needing_a_power_of_two_says_so():
    sig = Signature(ops={"contiguous"}, dtypes={"fp32"}, out_dtypes={"fp32"}, alignment_power_of_two=True)
    b = torch.zeros(2, 4, 8)
    odd = Problem.build(torch.zeros(448, 8), b, ContiguousLayout.from_counts([100, 100], alignment=224))
    even = Problem.build(torch.zeros(256, 8), b, ContiguousLayout.from_counts([100, 100], alignment=128))
    (reason,) = sig.mismatches(odd)
    assert (reason.code, reason.actual) == ("alignment_unsupported", 224)
    assert sig.mismatches(even) == []


# -- 2. K-grouped fp8: per-group block origin --------------------------------------------------
def _k_grouped_case(ks=(150, 100, 100, 100), alignment=160, m=48, n=40, seed=0):
    gen = torch.Generator().manual_seed(seed)
    layout = KGroupedLayout.from_counts(list(ks), alignment=alignment)
    x = torch.randn(layout.num_rows, m, generator=gen)
    dy = torch.randn(layout.num_rows, n, generator=gen)
    return layout, x, dy


def test_deepgemm_k_grouped_scales_without_an_origin_are_refused_not_misread():
    # ks = [150, 100, 100, 100], k_alignment 160: 5 scale rows whichever origin is meant.
    layout, x, dy = _k_grouped_case()
    groups = _segments(layout)
    qx = quantize_fp8(x, (128, 1), row_groups=groups)
    qdy = quantize_fp8(dy, (128, 1), row_groups=groups)
    assert qx.scale.shape[0] == -(-layout.num_rows // 128)  # the coincidence
    bare_x = QuantizedTensor(qx.data, qx.scale, (128, 1))
    bare_dy = QuantizedTensor(qdy.data, qdy.scale, (128, 1))
    with pytest.raises(LayoutError) as info:
        moe_hal.grouped_gemm(bare_x, bare_dy, layout, backend="reference")
    assert info.value.argument == "a.row_groups"


@pytest.mark.parametrize("backend", ["reference", "torch"])
@pytest.mark.parametrize("ks, alignment", [((150, 100, 100, 100), 160), ((128, 0, 300, 7), 128), ((40, 90), 32)])
def test_per_group_scale_blocks_compute_what_they_encode(backend, ks, alignment):
    layout, x, dy = _k_grouped_case(ks, alignment)
    groups = _segments(layout)
    qx = quantize_fp8(x, (128, 1), row_groups=groups)
    qdy = quantize_fp8(dy, (128, 1), row_groups=groups)
    c = torch.randn(layout.num_groups, x.shape[1], dy.shape[1])
    out = moe_hal.grouped_gemm(qx, qdy, layout, c=c, backend=backend)
    expected = c.double().clone()
    for g, s, e in layout.segments():
        expected[g] += qx.dequantize(torch.float64)[s:e].T @ qdy.dequantize(torch.float64)[s:e]
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-4)


def test_per_group_blocks_must_name_the_layouts_groups():
    layout, x, dy = _k_grouped_case()
    other = ((0, 150), (160, 260), (320, 420), (480, 570))
    qx = quantize_fp8(x, (128, 1), row_groups=other)
    qdy = quantize_fp8(dy, (128, 1), row_groups=other)
    with pytest.raises(LayoutError, match="row_groups"):
        moe_hal.grouped_gemm(qx, qdy, layout, backend="reference")


def test_block_origin_conversions_both_ways():
    layout, x, _ = _k_grouped_case()
    groups = _segments(layout)
    per_group = quantize_fp8(x, (128, 1), row_groups=groups)
    from_row0 = to_tensor_origin(per_group)  # exact: blocks of gcd(128, 160) = 32
    assert from_row0.block == (32, 1) and from_row0.row_groups == ((0, layout.num_rows),)
    assert torch.equal(from_row0.dequantize(), per_group.dequantize())
    assert from_row0.data is per_group.data
    back = to_group_origin(from_row0, groups, 128)  # exact again: each block nests
    assert torch.equal(back.scale, per_group.scale)
    assert torch.equal(back.data.view(torch.uint8), per_group.data.view(torch.uint8))
    # row-0 blocks of 128 with 160-aligned groups do not nest: re-quantized per group
    requantized = to_group_origin(quantize_fp8(x, (128, 1)), groups)
    assert requantized.row_groups == groups and requantized.scale.shape == per_group.scale.shape
    dequantized = requantized.dequantize()
    for s, e in groups:  # two fp8 roundings
        assert (dequantized[s:e] - x[s:e]).norm() < 0.06 * x[s:e].norm()


def test_row_groups_are_checked():
    x = torch.randn(10, 4)
    for bad in [((0, 11),), ((5, 8), (0, 2)), ((3, 1),)]:
        with pytest.raises(ShapeError, match="row_groups"):
            quantize_fp8(x, (4, 1), row_groups=bad)
    with pytest.raises(ShapeError, match="row_groups"):
        quantize_fp8(torch.randn(2, 10, 4), (4, 1), row_groups=((0, 10),))


# -- 3. m_indices in every valid DeepGEMM form ---------------------------------------------------
@pytest.mark.parametrize(
    "m_indices",
    [
        [1, 1, 0, 0, -1, -1, 2, 2],  # groups out of order
        [0, 0, 1, 1, 0, 0, -1, -1],  # group 0 split into two runs
        [-1, -1, 0, 0, -1, -1, 1, 1, -1, -1],  # -1 blocks before and between groups
        [2, 2, 2, 2],  # groups 0 and 1 empty
    ],
)
def test_m_indices_in_any_order_convert_with_a_row_permutation(m_indices):
    ids = torch.tensor(m_indices, dtype=torch.int32)
    num_groups = 3
    a = torch.randn(len(m_indices), 8)
    b = torch.randn(num_groups, 5, 8)
    layout, source = ContiguousLayout.from_m_indices_permuted(ids, num_groups, alignment=2)
    assert layout.counts.tolist() == [m_indices.count(g) for g in range(num_groups)]
    valid = source >= 0
    out = moe_hal.grouped_gemm(a[source.clamp(min=0)] * valid[:, None], b, layout, backend="reference")
    d = torch.zeros(len(m_indices), 5)
    d[source[valid]] = out[valid]
    for r, g in enumerate(m_indices):
        expected = a[r] @ b[g].T if g >= 0 else torch.zeros(5)
        torch.testing.assert_close(d[r], expected)


def test_canonical_m_indices_still_refuse_other_forms_and_point_to_the_permuting_constructor():
    with pytest.raises(LayoutError, match="from_m_indices_permuted"):
        ContiguousLayout.from_m_indices(torch.tensor([1, 0], dtype=torch.int32), 2)


# -- 4. raw layout constructors validate -----------------------------------------------------------
@pytest.mark.parametrize(
    "counts, starts, alignment, num_rows, argument",
    [
        ([4], [0], 1, 2, "num_rows"),  # segment past num_rows
        ([2, 2], [0, 9], 1, 16, "starts[1]"),  # start past the aligned end of the previous group
        ([4, 4], [0, 2], 1, 8, "starts[1]"),  # overlapping segments
        ([2], [1], 1, 4, "starts[0]"),  # the first group starts at 0
        ([-1], [0], 1, 4, "counts[0]"),
        ([1], [0], 0, 4, "alignment"),
    ],
)
def test_raw_constructors_validate(counts, starts, alignment, num_rows, argument):
    for cls in (ContiguousLayout, KGroupedLayout):
        with pytest.raises(LayoutError) as info:
            cls(counts, starts, alignment, num_rows)
        assert info.value.argument == argument


def test_raw_constructor_accepts_what_from_counts_builds():
    layout = ContiguousLayout.from_counts([3, 0, 5], alignment=4, num_rows=20)
    assert ContiguousLayout([3, 0, 5], list(layout.starts), 4, 20) == layout


# -- 5. DeepGEMM's fp8 rounding ------------------------------------------------------------------
def test_reciprocal_rounding_matches_deepgemm_formula_byte_for_byte():
    gen = torch.Generator().manual_seed(3)
    x = (torch.randn(512, 1024, generator=gen) * 3).to(torch.bfloat16)
    q = quantize_fp8(x, (1, 128), rounding="reciprocal")
    blocks = x.float().view(512, 8, 128)
    sf = blocks.abs().amax(-1).clamp(min=1e-4) / 448.0  # DeepGEMM's per-token cast
    codes = (blocks * (1.0 / sf.unsqueeze(-1))).to(torch.float8_e4m3fn).view(512, 1024)
    assert torch.equal(q.scale, sf)
    assert torch.equal(q.data.view(torch.uint8), codes.view(torch.uint8))
    divided = quantize_fp8(x, (1, 128))  # the default: x / s
    assert torch.equal(
        divided.data.view(torch.uint8),
        (blocks / sf.unsqueeze(-1)).to(torch.float8_e4m3fn).view(512, 1024).view(torch.uint8),
    )


def test_roundings_agree_on_ue8m0_scales_and_reject_unknown_modes():
    x = torch.randn(64, 256)
    a = quantize_fp8(x, ue8m0=True)
    b = quantize_fp8(x, ue8m0=True, rounding="reciprocal")
    assert torch.equal(a.data.view(torch.uint8), b.data.view(torch.uint8))
    with pytest.raises(ShapeError, match="rounding"):
        quantize_fp8(x, rounding="truncate")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        quantize_fp8(x, rounding="divide")
