"""Routing: dispatch / combine (contiguous) and dispatch_masked / combine_masked, against a plain-loop
reference written independently of the vectorized implementation."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from moe_hal.errors import ArgumentError, CapacityError, DeviceError, DTypeError, LayoutError, ShapeError
from moe_hal.layouts import ContiguousLayout, MaskedLayout
from moe_hal.quant import QuantizedTensor, quantize_fp8
from moe_hal.routing import Dispatch, MaskedDispatch, combine, combine_masked, dispatch, dispatch_masked


def align_up(x: int, a: int) -> int:
    return (x + a - 1) // a * a


def ref_dispatch(hidden, ids, num_experts, alignment):
    """Loop reference: expert-major, then token, then slot; segments aligned; padding rows zero."""
    tokens, k = ids.shape
    per_expert = [[(t, j) for t in range(tokens) for j in range(k) if int(ids[t, j]) == e] for e in range(num_experts)]
    starts, end = [], 0
    for slots in per_expert:
        start = align_up(end, alignment)
        starts.append(start)
        end = start + len(slots)
    num_rows = align_up(end, alignment)
    a = torch.zeros(num_rows, hidden.shape[1], dtype=hidden.dtype)
    row_of_slot = torch.full((tokens, k), -1, dtype=torch.int64)
    slot_of_row = torch.full((num_rows,), -1, dtype=torch.int64)
    for e, slots in enumerate(per_expert):
        for i, (t, j) in enumerate(slots):
            r = starts[e] + i
            a[r] = hidden[t]
            row_of_slot[t, j] = r
            slot_of_row[r] = t * k + j
    return a, [len(s) for s in per_expert], row_of_slot, slot_of_row


def ref_combine(expert_out, row_of_slot, weights):
    tokens, k = row_of_slot.shape
    y = torch.zeros(tokens, expert_out.shape[-1], dtype=torch.float64)
    flat = expert_out.reshape(-1, expert_out.shape[-1]).double()
    for t in range(tokens):
        for j in range(k):
            r = int(row_of_slot[t, j])
            if r >= 0:
                y[t] += float(weights[t, j]) * flat[r]
    return y


def ref_dispatch_masked(hidden, ids, num_experts, max_m):
    tokens, k = ids.shape
    a = torch.zeros(num_experts, max_m, hidden.shape[1], dtype=hidden.dtype)
    masked_m = [0] * num_experts
    row_of_slot = torch.full((tokens, k), -1, dtype=torch.int64)
    dropped = 0
    for e in range(num_experts):
        for t in range(tokens):
            for j in range(k):
                if int(ids[t, j]) != e:
                    continue
                if masked_m[e] == max_m:
                    dropped += 1
                    continue
                a[e, masked_m[e]] = hidden[t]
                row_of_slot[t, j] = e * max_m + masked_m[e]
                masked_m[e] += 1
    return a, masked_m, row_of_slot, dropped


@st.composite
def routings(draw, max_tokens=24):
    tokens = draw(st.integers(0, max_tokens))
    k = draw(st.integers(1, 8))
    num_experts = draw(st.integers(1, 9))
    kind = draw(st.sampled_from(["uniform", "one_expert", "skewed", "sparse"]))
    p_skip = draw(st.sampled_from([0.0, 0.0, 0.3, 1.0]))
    seed = draw(st.integers(0, 2**20))
    gen = torch.Generator().manual_seed(seed)
    if kind == "uniform":
        ids = torch.randint(0, num_experts, (tokens, k), generator=gen)
    elif kind == "one_expert":  # every token to one expert, the others empty
        ids = torch.full((tokens, k), draw(st.integers(0, num_experts - 1)), dtype=torch.int64)
    elif kind == "skewed":  # a power law: most slots on few experts
        probs = torch.tensor([2.0**-e for e in range(num_experts)])
        ids = torch.multinomial(probs, max(tokens * k, 1), replacement=True, generator=gen)[: tokens * k]
        ids = ids.view(tokens, k)
    else:  # only the even experts used: odd ones empty
        ids = torch.randint(0, (num_experts + 1) // 2, (tokens, k), generator=gen) * 2
    skip = torch.rand(tokens, k, generator=gen) < p_skip
    ids = torch.where(skip, -1, ids)
    if draw(st.booleans()):
        ids = ids.to(torch.int32)
    return ids, num_experts, seed


@settings(max_examples=60, deadline=None)
@given(
    routing=routings(),
    alignment=st.sampled_from([1, 2, 4, 8, 128]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
)
def test_dispatch_matches_loop_reference(routing, alignment, dtype):
    ids, num_experts, seed = routing
    gen = torch.Generator().manual_seed(seed + 1)
    hidden = torch.randn(ids.shape[0], 5, generator=gen).to(dtype)
    weights = torch.rand(ids.shape, generator=gen)
    d = dispatch(hidden, ids, num_experts, alignment=alignment, topk_weights=weights)
    a, counts, row_of_slot, slot_of_row = ref_dispatch(hidden, ids, num_experts, alignment)
    assert isinstance(d, Dispatch) and isinstance(d.layout, ContiguousLayout)
    assert d.layout.counts.tolist() == counts
    assert d.layout.alignment == alignment and d.layout.num_rows == a.shape[0]
    assert d.a.dtype == dtype and torch.equal(d.a, a)
    assert torch.equal(d.row_of_slot, row_of_slot)
    assert torch.equal(d.slot_of_row, slot_of_row)
    k = ids.shape[1]
    assert torch.equal(d.token_of_row, torch.where(slot_of_row >= 0, slot_of_row // k, -1))
    # row_weights: the weight of the slot in each row, 0 on padding rows.
    expected_rw = torch.tensor([float(weights.view(-1)[s]) if s >= 0 else 0.0 for s in slot_of_row.tolist()])
    assert torch.equal(d.row_weights(), expected_rw)

    # combine against the float64 loop on fresh random expert outputs of another width.
    out = torch.randn(d.layout.num_rows, 7, generator=gen).to(dtype)
    gaps = d.layout.gap_rows_on("cpu")
    out[gaps] = float("nan")  # padding rows must never be read
    y = combine(out, d)
    assert y.dtype == dtype and y.shape == (ids.shape[0], 7)
    ref = ref_combine(out, row_of_slot, weights.to(dtype))
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(y.double(), ref, rtol=tol, atol=tol)


@settings(max_examples=60, deadline=None)
@given(routing=routings(), max_m=st.integers(0, 12), drop=st.booleans())
def test_dispatch_masked_matches_loop_reference(routing, max_m, drop):
    ids, num_experts, seed = routing
    gen = torch.Generator().manual_seed(seed + 2)
    hidden = torch.randn(ids.shape[0], 6, generator=gen)
    weights = torch.rand(ids.shape, generator=gen)
    a, masked_m, row_of_slot, dropped = ref_dispatch_masked(hidden, ids, num_experts, max_m)
    if dropped and not drop:
        with pytest.raises(CapacityError):
            dispatch_masked(hidden, ids, num_experts, max_m)
        return
    md = dispatch_masked(hidden, ids, num_experts, max_m, overflow="drop" if drop else "error", topk_weights=weights)
    assert isinstance(md, MaskedDispatch) and isinstance(md.layout, MaskedLayout)
    assert md.dropped == dropped
    assert md.layout.masked_m.dtype == torch.int32 and md.layout.masked_m.tolist() == masked_m
    assert md.layout.max_m == max_m
    assert torch.equal(md.a, a)
    assert torch.equal(md.row_of_slot, row_of_slot)
    out = torch.randn(num_experts, max_m, 3, generator=gen)
    for g, m in enumerate(masked_m):
        out[g, m:] = float("nan")  # rows past masked_m are never written by a GEMM
    torch.testing.assert_close(
        combine_masked(out, md).double(), ref_combine(out, row_of_slot, weights), rtol=1e-5, atol=1e-5
    )


@settings(max_examples=40, deadline=None)
@given(routing=routings(), alignment=st.sampled_from([1, 8, 128]))
def test_dispatch_then_combine_with_identity_experts(routing, alignment):
    """combine(dispatch(x).a, d, ones) == x * c[t], c[t] = number of slots of token t with id != -1.

    Integer-valued inputs keep every partial sum exact, so the check is equality in bf16 and fp32.
    """
    ids, num_experts, seed = routing
    gen = torch.Generator().manual_seed(seed + 3)
    hidden = torch.randint(-16, 17, (ids.shape[0], 8), generator=gen).float()
    valid = (ids >= 0).sum(1, keepdim=True).float()
    ones = torch.ones(ids.shape)
    for dtype in (torch.float32, torch.bfloat16):
        x = hidden.to(dtype)
        d = dispatch(x, ids, num_experts, alignment=alignment)
        assert torch.equal(combine(d.a, d, ones), (hidden * valid).to(dtype))
        md = dispatch_masked(x, ids, num_experts, max_m=ids.numel())
        assert md.dropped == 0
        assert torch.equal(combine_masked(md.a, md, ones), (hidden * valid).to(dtype))


def test_golden_small_example():
    # 4 tokens, top-2 of 3 experts; token 3 has one non-local slot. By hand:
    # expert 0 <- slots (0,0), (2,1); expert 1 <- (1,0), (2,0), (3,1); expert 2 <- (0,1), (1,1).
    hidden = torch.tensor([[1.0], [2.0], [3.0], [4.0]])
    ids = torch.tensor([[0, 2], [1, 2], [1, 0], [-1, 1]])
    d = dispatch(hidden, ids, 3, alignment=4)
    assert d.layout.counts.tolist() == [2, 3, 2] and d.layout.starts == (0, 4, 8) and d.layout.num_rows == 12
    assert d.a.flatten().tolist() == [1, 3, 0, 0, 2, 3, 4, 0, 1, 2, 0, 0]
    assert d.row_of_slot.tolist() == [[0, 8], [4, 9], [5, 1], [-1, 6]]
    assert d.slot_of_row.tolist() == [0, 5, -1, -1, 2, 4, 7, -1, 1, 3, -1, -1]
    assert d.layout.m_indices().tolist() == [0, 0, -1, -1, 1, 1, 1, -1, 2, 2, -1, -1]
    w = torch.tensor([[0.5, 0.25], [1.0, 2.0], [4.0, 8.0], [16.0, 32.0]])
    out = torch.arange(12, dtype=torch.float32)[:, None] * 10  # row r -> 10 r
    # y0 = .5*0 + .25*80; y1 = 1*40 + 2*90; y2 = 4*50 + 8*10; y3 = 32*60
    assert combine(out, d, w).flatten().tolist() == [20.0, 220.0, 280.0, 1920.0]
    md = dispatch_masked(hidden, ids, 3, max_m=2, overflow="drop")
    assert md.dropped == 1  # expert 1's third slot (3,1)
    assert md.layout.masked_m.tolist() == [2, 2, 2]
    assert md.a[..., 0].tolist() == [[1, 3], [2, 3], [1, 2]]
    assert md.row_of_slot.tolist() == [[0, 4], [2, 5], [3, 1], [-1, -1]]


def test_quantized_hidden_moves_scales_with_rows():
    torch.manual_seed(0)
    x = torch.randn(6, 300)
    q = quantize_fp8(x, ue8m0=True)
    ids = torch.tensor([[1], [0], [1], [-1], [0], [1]])
    d = dispatch(q, ids, 2, alignment=4)
    assert isinstance(d.a, QuantizedTensor) and d.a.scale_format == "ue8m0" and d.a.block == (1, 128)
    deq = d.a.dequantize()
    for r, t in enumerate(d.token_of_row.tolist()):
        if t >= 0:
            assert torch.equal(deq[r], q.dequantize()[t])
        else:
            assert torch.equal(d.a.data[r].float(), torch.zeros(300)) and torch.equal(d.a.scale[r], torch.ones(3))
    # Mostly padding (alignment 128): the zero-buffer path must give the same rows.
    wide = dispatch(q, ids, 2, alignment=128)
    for r, t in enumerate(wide.token_of_row.tolist()):
        expected_data = q.data[t] if t >= 0 else torch.zeros(300, dtype=torch.float8_e4m3fn)
        expected_scale = q.scale[t] if t >= 0 else torch.ones(3)
        assert torch.equal(wide.a.data[r].view(torch.uint8), expected_data.view(torch.uint8))
        assert torch.equal(wide.a.scale[r], expected_scale)
    md = dispatch_masked(q, ids, 2, max_m=4)
    assert md.a.data.shape == (2, 4, 300) and md.a.scale.shape == (2, 4, 3)
    assert torch.equal(md.a.dequantize()[1, :3], q.dequantize()[[0, 2, 5]])
    with pytest.raises(ShapeError, match="hidden.block"):
        dispatch(quantize_fp8(x, block=(128, 128)), ids, 2)


def test_empty_and_degenerate_inputs():
    # T = 0
    d = dispatch(torch.zeros(0, 4), torch.zeros(0, 3, dtype=torch.int64), 5)
    assert d.a.shape == (0, 4) and d.layout.num_rows == 0 and d.row_of_slot.shape == (0, 3)
    assert combine(torch.zeros(0, 2), d, torch.zeros(0, 3)).shape == (0, 2)
    md = dispatch_masked(torch.zeros(0, 4), torch.zeros(0, 2, dtype=torch.int64), 3, max_m=4)
    assert torch.equal(md.a, torch.zeros(3, 4, 4)) and md.layout.masked_m.tolist() == [0, 0, 0]
    assert combine_masked(torch.full((3, 4, 2), float("nan")), md, torch.zeros(0, 2)).shape == (0, 2)
    # every slot skipped: nothing dispatched, combine gives zeros.
    ids = torch.full((3, 2), -1)
    d = dispatch(torch.ones(3, 4), ids, 4)
    assert d.a.shape == (0, 4)
    assert torch.equal(combine(torch.zeros(0, 5), d, torch.ones(3, 2)), torch.zeros(3, 5))
    # zero experts with everything skipped is legal.
    d = dispatch(torch.ones(3, 4), ids, 0)
    assert d.layout.num_groups == 0 and d.a.shape == (0, 4)


def test_combine_uses_dispatch_weights_or_requires_them():
    hidden = torch.ones(2, 3)
    ids = torch.tensor([[0, 1], [1, 1]])
    w = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    d = dispatch(hidden, ids, 2, alignment=1, topk_weights=w)
    assert torch.equal(combine(d.a, d), torch.tensor([[3.0] * 3, [7.0] * 3]))
    assert torch.equal(combine(d.a, d, torch.ones(2, 2)), torch.tensor([[2.0] * 3, [2.0] * 3]))
    bare = dispatch(hidden, ids, 2, alignment=1)
    with pytest.raises(ArgumentError, match="topk_weights"):
        combine(bare.a, bare)
    with pytest.raises(ArgumentError, match="topk_weights"):
        bare.row_weights()


def test_capacity_error_names_the_expert_and_counts():
    ids = torch.tensor([[0, 2], [2, 1], [2, 0]])
    with pytest.raises(CapacityError) as info:
        dispatch_masked(torch.ones(3, 4), ids, 3, max_m=2)
    assert info.value.argument == "expert 2" and info.value.actual == 3
    assert "max_m = 2" in str(info.value)


def test_validation_errors():
    x = torch.ones(4, 8)
    ids = torch.zeros(4, 2, dtype=torch.int64)
    with pytest.raises(LayoutError) as info:
        dispatch(x, torch.tensor([[0, 1], [1, 5], [0, 0], [0, 0]]), 5)
    assert info.value.argument == "topk_ids[1, 1]" and info.value.actual == 5
    with pytest.raises(LayoutError, match=r"topk_ids\[2, 0\]"):
        dispatch_masked(x, torch.tensor([[0, 1], [1, 1], [-2, 0], [0, 0]]), 5, max_m=8)
    with pytest.raises(DTypeError, match="topk_ids"):
        dispatch(x, ids.float(), 4)
    with pytest.raises(ShapeError, match="topk_ids"):
        dispatch(x, ids[:3], 4)
    with pytest.raises(ShapeError, match="topk_ids"):
        dispatch(x, ids.view(-1), 4)
    with pytest.raises(ShapeError, match="topk_ids"):
        dispatch(x, ids[:, :0], 4)
    with pytest.raises(ShapeError, match="hidden"):
        dispatch(x.view(-1), ids, 4)
    with pytest.raises(DTypeError, match="hidden"):
        dispatch(x.tolist(), ids, 4)
    with pytest.raises(ArgumentError, match="num_experts"):
        dispatch(x, ids, -1)
    with pytest.raises(LayoutError, match="alignment"):
        dispatch(x, ids, 4, alignment=0)
    with pytest.raises(ShapeError, match="topk_weights"):
        dispatch(x, ids, 4, topk_weights=torch.ones(4, 3))
    with pytest.raises(DTypeError, match="topk_weights"):
        dispatch(x, ids, 4, topk_weights=torch.ones(4, 2, dtype=torch.int64))
    with pytest.raises(DeviceError, match="topk_ids"):
        dispatch(x, ids.to("meta"), 4)
    with pytest.raises(DeviceError, match="topk_weights"):
        dispatch(x, ids, 4, topk_weights=torch.ones(4, 2, device="meta"))
    with pytest.raises(ArgumentError, match="overflow"):
        dispatch_masked(x, ids, 4, max_m=8, overflow="clip")
    with pytest.raises(ArgumentError, match="max_m"):
        dispatch_masked(x, ids, 4, max_m=-1)
    d = dispatch(x, ids, 4, alignment=1)
    with pytest.raises(ShapeError, match="expert_out"):
        combine(torch.ones(d.layout.num_rows + 1, 3), d, torch.ones(4, 2))
    with pytest.raises(DTypeError, match="expert_out"):
        combine(torch.ones(d.layout.num_rows, 3, dtype=torch.int32), d, torch.ones(4, 2))
    with pytest.raises(DeviceError, match="expert_out"):
        combine(torch.ones(d.layout.num_rows, 3, device="meta"), d, torch.ones(4, 2))
    with pytest.raises(ShapeError, match="topk_weights"):
        combine(d.a, d, torch.ones(2, 4))
    with pytest.raises(DTypeError, match="d"):
        combine(d.a, "not a dispatch", torch.ones(4, 2))
    md = dispatch_masked(x, ids, 4, max_m=8)
    with pytest.raises(ShapeError, match="expert_out"):
        combine_masked(torch.ones(4, 7, 3), md, torch.ones(4, 2))
    with pytest.raises(DTypeError, match="md"):
        combine_masked(torch.ones(4, 8, 3), d, torch.ones(4, 2))


@pytest.mark.parametrize("k", range(1, 9))
@pytest.mark.parametrize("tokens", [1, 3])
def test_every_k_single_token_and_all_to_one_expert(k, tokens):
    hidden = torch.arange(1, tokens * 4 + 1, dtype=torch.float32).view(tokens, 4)
    for ids in (torch.full((tokens, k), 2), torch.arange(tokens * k).view(tokens, k) % 3):
        d = dispatch(hidden, ids, 3, alignment=2)
        a, counts, row_of_slot, _ = ref_dispatch(hidden, ids, 3, 2)
        assert torch.equal(d.a, a) and d.layout.counts.tolist() == counts
        assert torch.equal(d.row_of_slot, row_of_slot)
        w = torch.rand(tokens, k)
        torch.testing.assert_close(combine(d.a, d, w).double(), ref_combine(d.a, row_of_slot, w), rtol=1e-6, atol=1e-5)
