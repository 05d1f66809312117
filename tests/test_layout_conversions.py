"""contiguous_to_masked / masked_to_contiguous and the counts <-> psum <-> m_indices round trips."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from moe_hal.errors import CapacityError, DeviceError, DTypeError, LayoutError, ShapeError
from moe_hal.layouts import ContiguousLayout, MaskedLayout, contiguous_to_masked, masked_to_contiguous
from moe_hal.quant import QuantizedTensor, quantize_fp8


def test_golden_contiguous_to_masked():
    # counts [2, 0, 3], alignment 4: group 0 rows 0-1, group 1 empty (starts at 4), group 2 rows 4-6.
    layout = ContiguousLayout.from_counts([2, 0, 3], alignment=4)
    assert layout.starts == (0, 4, 4) and layout.num_rows == 8
    a = torch.tensor([[10.0], [11.0], [-1.0], [-1.0], [20.0], [21.0], [22.0], [-1.0]])
    a3, masked = contiguous_to_masked(a, layout)
    assert isinstance(masked, MaskedLayout) and masked.max_m == 3
    assert masked.masked_m.dtype == torch.int32 and masked.masked_m.tolist() == [2, 0, 3]
    assert a3[..., 0].tolist() == [[10, 11, 0], [0, 0, 0], [20, 21, 22]]
    a3, masked = contiguous_to_masked(a, layout, max_m=5)
    assert a3.shape == (3, 5, 1) and a3[2, :, 0].tolist() == [20, 21, 22, 0, 0]


def test_golden_masked_to_contiguous():
    a3 = torch.tensor([[[1.0], [2.0], [9.0]], [[9.0], [9.0], [9.0]], [[3.0], [4.0], [5.0]]])
    masked = MaskedLayout(torch.tensor([2, 0, 3], dtype=torch.int32), max_m=3)
    a, layout = masked_to_contiguous(a3, masked, alignment=2)
    # group 0 rows 0-1, group 1 empty at 2, group 2 rows 2-4, padded to 6 rows.
    assert layout.counts.tolist() == [2, 0, 3] and layout.starts == (0, 2, 2) and layout.num_rows == 6
    assert a[:, 0].tolist() == [1, 2, 3, 4, 5, 0]


@settings(max_examples=50, deadline=None)
@given(
    counts=st.lists(st.integers(0, 9), min_size=0, max_size=7),
    alignment=st.sampled_from([1, 2, 4, 8, 128]),
    extra=st.integers(0, 3),
    seed=st.integers(0, 2**16),
)
def test_round_trip(counts, alignment, extra, seed):
    gen = torch.Generator().manual_seed(seed)
    layout = ContiguousLayout.from_counts(counts, alignment=alignment)
    a = torch.randn(layout.num_rows, 3, generator=gen)
    a[layout.gap_rows_on("cpu")] = float("nan")  # rows of no group are never read
    max_m = max(counts, default=0) + extra
    a3, masked = contiguous_to_masked(a, layout, max_m=max_m)
    for g, c in enumerate(counts):
        s = layout.starts[g]
        assert torch.equal(a3[g, :c], a[s : s + c])
        assert torch.equal(a3[g, c:], torch.zeros(max_m - c, 3))
    for g, c in enumerate(counts):
        a3[g, c:] = float("nan")  # rows past masked_m are never read
    back, layout2 = masked_to_contiguous(a3, masked, alignment=alignment)
    assert layout2 == layout
    expected = a.clone()
    expected[layout.gap_rows_on("cpu")] = 0.0
    assert torch.equal(back, expected)


@settings(max_examples=50, deadline=None)
@given(counts=st.lists(st.integers(0, 9), min_size=1, max_size=7), alignment=st.sampled_from([1, 2, 4, 16]))
def test_counts_psum_m_indices_round_trip(counts, alignment):
    layout = ContiguousLayout.from_counts(counts, alignment=alignment)
    assert ContiguousLayout.from_psum(layout.psum, alignment=alignment) == layout
    assert ContiguousLayout.from_m_indices(layout.m_indices(), len(counts), alignment=alignment) == layout
    m_indices = layout.m_indices()
    assert torch.bincount(m_indices[m_indices >= 0].long(), minlength=len(counts)).tolist() == counts


def test_quantized_rows_move_with_their_scales():
    torch.manual_seed(0)
    layout = ContiguousLayout.from_counts([3, 1], alignment=4)
    q = quantize_fp8(torch.randn(layout.num_rows, 256), ue8m0=True)
    a3, masked = contiguous_to_masked(q, layout)
    assert isinstance(a3, QuantizedTensor) and a3.data.shape == (2, 3, 256) and a3.scale.shape == (2, 3, 2)
    assert torch.equal(a3.dequantize()[0], q.dequantize()[:3])
    assert torch.equal(a3.dequantize()[1, 0], q.dequantize()[4])
    assert torch.equal(a3.scale[1, 1:], torch.ones(2, 2)) and torch.equal(a3.data[1, 1:].float(), torch.zeros(2, 256))
    back, _ = masked_to_contiguous(a3, masked, alignment=4)
    assert torch.equal(back.dequantize()[layout.valid_rows_on("cpu")], q.dequantize()[layout.valid_rows_on("cpu")])
    with pytest.raises(ShapeError, match="a.block"):
        contiguous_to_masked(quantize_fp8(torch.randn(layout.num_rows, 128), block=(128, 128)), layout)


def test_conversion_errors():
    layout = ContiguousLayout.from_counts([2, 3], alignment=1)
    a = torch.zeros(5, 4)
    with pytest.raises(CapacityError) as info:
        contiguous_to_masked(a, layout, max_m=2)
    assert info.value.argument == "layout.counts[1]" and info.value.actual == 3
    with pytest.raises(ShapeError, match="a"):
        contiguous_to_masked(torch.zeros(6, 4), layout)
    with pytest.raises(ShapeError, match="a"):
        contiguous_to_masked(torch.zeros(5), layout)
    with pytest.raises(LayoutError, match="layout"):
        contiguous_to_masked(a, MaskedLayout(torch.zeros(2, dtype=torch.int32), 4))
    with pytest.raises(LayoutError, match="max_m"):
        contiguous_to_masked(a, layout, max_m=-1)
    with pytest.raises(DTypeError, match="a"):
        contiguous_to_masked([[0.0]], layout)
    masked = MaskedLayout(torch.tensor([1, 2], dtype=torch.int32), max_m=3)
    with pytest.raises(ShapeError, match="a3"):
        masked_to_contiguous(torch.zeros(2, 4, 8), masked)
    with pytest.raises(LayoutError, match="layout"):
        masked_to_contiguous(torch.zeros(2, 3, 8), layout)
    with pytest.raises(DeviceError, match="masked_m"):
        masked_to_contiguous(torch.zeros(2, 3, 8, device="meta"), masked)
    unchecked = MaskedLayout(torch.tensor([1, 4], dtype=torch.int32), max_m=3, check=False)
    with pytest.raises(LayoutError) as info:
        masked_to_contiguous(torch.zeros(2, 3, 8), unchecked)
    assert info.value.argument == "masked_m[1]" and info.value.actual == 4
    with pytest.raises(LayoutError, match="alignment"):
        masked_to_contiguous(torch.zeros(2, 3, 8), masked, alignment=0)


def test_device_bounds_golden_and_uploaded_without_waiting(monkeypatch):
    # counts [2, 0, 3], alignment 4: starts (0, 4, 4), ends (2, 4, 7) — worked out by hand.
    layout = ContiguousLayout.from_counts([2, 0, 3], alignment=4)
    psum, bounds = layout.psum_on("cpu"), layout.bounds_on(torch.device("cpu"))
    assert psum.dtype == bounds.dtype == torch.int32
    assert psum.tolist() == [2, 4, 7] and bounds.tolist() == [[0, 4, 4], [2, 4, 7]]
    assert layout.psum_on(torch.device("cpu")) is psum and layout.counts.tolist() == [2, 0, 3]
    assert ContiguousLayout.from_counts([]).bounds_on("cpu").shape == (2, 0)
    # Off the host, the copy is requested non-blocking (meta plays the device here).
    copies = []
    real = torch.Tensor.to
    monkeypatch.setattr(torch.Tensor, "to", lambda self, *a, **k: copies.append(k) or real(self, *a, **k))
    on_meta = ContiguousLayout.from_counts([5, 1], alignment=1).bounds_on("meta")
    assert on_meta.device.type == "meta" and on_meta.shape == (2, 2)
    assert copies == [{"non_blocking": True}]


def test_bounds_first_needed_inside_graph_capture_are_refused(monkeypatch):
    # Nothing may be queued (a host copy cannot be captured): refused before any CUDA call.
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(LayoutError) as info:
        ContiguousLayout.from_counts([3, 1]).psum_on(torch.device("cuda", 0))
    assert info.value.argument == "layout" and "capture" in str(info.value)
