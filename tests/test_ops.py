"""The torch.library custom ops behind moe_hal.grouped_gemm: registration checks (opcheck), fake
kernels for every operand dtype, the mutating masked op, autocast, and torch.compile of each layout."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

import moe_hal
from moe_hal import ops
from moe_hal.errors import DTypeError, LayoutError, ShapeError
from moe_hal.quant import quantize_fp8

from .conftest import randn

pytestmark = pytest.mark.filterwarnings("ignore::moe_hal.errors.PathWarning")

HISTOGRAMS = ([3, 0, 5], [1, 1, 1], [0, 9, 2])


def _contiguous(gen, counts, alignment=4, dtype=torch.float32, k=8, n=6, requires_grad=False):
    lay = moe_hal.ContiguousLayout.from_counts(counts, alignment=alignment)
    a = randn(gen, lay.num_rows, k, dtype=dtype).requires_grad_(requires_grad)
    b = randn(gen, len(counts), n, k, dtype=dtype).requires_grad_(requires_grad)
    return a, b, lay


# -- opcheck ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_opcheck_contiguous(gen, dtype):
    a, b, lay = _contiguous(gen, [3, 0, 5], dtype=dtype, requires_grad=True)
    torch.library.opcheck(ops.grouped_gemm_contiguous_op, (a, b, lay.psum_on("cpu"), 4))


def test_opcheck_masked_functional_and_out(gen):
    masked_m = torch.tensor([2, 0, 4], dtype=torch.int32)
    a = randn(gen, 3, 4, 8).requires_grad_()
    b = randn(gen, 3, 6, 8).requires_grad_()
    torch.library.opcheck(ops.grouped_gemm_masked_op, (a, b, masked_m))
    out = torch.full((3, 4, 6), 7.0)
    torch.library.opcheck(ops.grouped_gemm_masked_out_op, (a.detach(), b.detach(), masked_m, out))


def test_opcheck_k_grouped_with_c(gen):
    lay = moe_hal.KGroupedLayout.from_counts([3, 0, 5], alignment=4)
    x, dy = randn(gen, lay.num_rows, 5).requires_grad_(), randn(gen, lay.num_rows, 6).requires_grad_()
    c = randn(gen, 3, 5, 6).requires_grad_()
    torch.library.opcheck(ops.grouped_gemm_k_grouped_op, (x, dy, lay.psum_on("cpu"), c, 4))


def test_opcheck_k_grouped_accumulate(gen):
    lay = moe_hal.KGroupedLayout.from_counts([3, 0, 5], alignment=4)
    x, dy = randn(gen, lay.num_rows, 5), randn(gen, lay.num_rows, 6)
    acc = randn(gen, 3, 5, 6)
    expected = acc + moe_hal.grouped_gemm(x, dy, lay, backend="reference")
    torch.library.opcheck(ops.grouped_gemm_k_grouped_acc_op, (x, dy, lay.psum_on("cpu"), 4, acc.clone()))
    ops.grouped_gemm_k_grouped_acc_op(x, dy, lay.psum_on("cpu"), 4, acc)
    torch.testing.assert_close(acc, expected)


def test_opcheck_fp8(gen):
    a, b, lay = _contiguous(gen, [3, 0, 5], k=128)
    qa, qb = quantize_fp8(a, (1, 128)), quantize_fp8(b, (128, 128))
    ta, tb, fp8 = ops.operand_args(qa, qb)
    # torch's schema checker compares inputs with a multiply that fp8 lacks: the fp8 case checks
    # "no input mutated" itself, on the bytes; the schema is the one test_schema passes above.
    before = [t.view(torch.uint8).clone() for t in (ta, tb)] + [fp8["a_scale"].clone(), fp8["b_scale"].clone()]
    torch.library.opcheck(
        ops.grouped_gemm_fp8_op,
        (ta, tb, lay.psum_on("cpu"), "contiguous", 4),
        fp8,
        test_utils=("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"),
    )
    ops.grouped_gemm_fp8_op(ta, tb, lay.psum_on("cpu"), "contiguous", 4, **fp8)
    after = [t.view(torch.uint8) for t in (ta, tb)] + [fp8["a_scale"], fp8["b_scale"]]
    assert all(torch.equal(x, y) for x, y in zip(before, after))


# -- fake kernels -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "dtype,out_dtype,expected",
    [
        (torch.float32, None, torch.float32),
        (torch.bfloat16, None, torch.bfloat16),
        (torch.float16, torch.float32, torch.float32),
        ("fp8", None, torch.bfloat16),
        ("fp8", torch.float32, torch.float32),
    ],
)
@pytest.mark.parametrize("layout", ["contiguous", "masked", "k_grouped"])
def test_fake_kernel_shapes_and_dtypes_match_eager(gen, layout, dtype, out_dtype, expected):
    from torch._subclasses.fake_tensor import FakeTensorMode

    k = 128
    if layout == "contiguous":
        lay = moe_hal.ContiguousLayout.from_counts([3, 0, 5], alignment=4)
        a, b, blocks = randn(gen, lay.num_rows, k), randn(gen, 3, 6, k), ((1, 128), (128, 128))
    elif layout == "masked":
        lay = moe_hal.MaskedLayout(torch.tensor([2, 0, 4], dtype=torch.int32), 4)
        a, b, blocks = randn(gen, 3, 4, k), randn(gen, 3, 6, k), ((1, 128), (128, 128))
    else:
        lay = moe_hal.KGroupedLayout.from_counts([3, 0, 5], alignment=4)
        a, b, blocks = randn(gen, lay.num_rows, k), randn(gen, lay.num_rows, 128), ((128, 1), (128, 1))
    if dtype == "fp8":
        a, b = quantize_fp8(a, blocks[0]), quantize_fp8(b, blocks[1])
    else:
        a, b = a.to(dtype), b.to(dtype)
    eager = moe_hal.grouped_gemm(a, b, lay, out_dtype=out_dtype)
    groups, name, alignment, _ = ops.layout_args(lay, torch.device("cpu"))
    ta, tb, fp8 = ops.operand_args(a, b)
    with FakeTensorMode() as mode:
        fake_args = [mode.from_tensor(t) for t in (ta, tb, groups)]
        fp8 = {key: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for key, v in fp8.items()}
        if fp8:
            fake = ops.grouped_gemm_fp8_op(*fake_args, name, alignment, None, out_dtype, **fp8)
        elif name == "masked":
            fake = ops.grouped_gemm_masked_op(*fake_args, out_dtype=out_dtype)
        else:
            fake = ops.OPS[name](*fake_args, alignment=alignment, out_dtype=out_dtype)
    assert eager.dtype == fake.dtype == expected
    assert eager.shape == fake.shape
    assert eager.stride() == fake.stride()


# -- eager op path ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("counts", HISTOGRAMS)
def test_psum_layout_equals_host_layout(gen, counts):
    a, b, lay = _contiguous(gen, counts)
    device_lay = moe_hal.PsumLayout(lay.psum, "contiguous", alignment=4)
    assert torch.equal(moe_hal.grouped_gemm(a, b, device_lay), moe_hal.grouped_gemm(a, b, lay))


def test_op_path_equals_plain_path_for_every_layout(gen):
    a, b, lay = _contiguous(gen, [3, 0, 5])
    plain = moe_hal.grouped_gemm(a, b, lay)
    assert torch.equal(ops.call(a, b, lay), plain)
    x, dy = randn(gen, 12, 5), randn(gen, 12, 6)
    klay = moe_hal.KGroupedLayout.from_counts([3, 0, 5], alignment=4)
    c = randn(gen, 3, 5, 6)
    assert torch.equal(ops.call(x, dy, klay, c=c), moe_hal.grouped_gemm(x, dy, klay, c=c))
    mlay = moe_hal.MaskedLayout(torch.tensor([2, 0, 4], dtype=torch.int32), 4)
    a3 = randn(gen, 3, 4, 8)
    assert torch.equal(ops.call(a3, b, mlay), moe_hal.grouped_gemm(a3, b, mlay))


def test_psum_layout_rejects_bad_arguments():
    with pytest.raises(DTypeError, match="psum"):
        moe_hal.PsumLayout(torch.tensor([1, 2]), "contiguous")
    with pytest.raises(LayoutError, match="op"):
        moe_hal.PsumLayout(torch.tensor([1, 2], dtype=torch.int32), "masked")
    with pytest.raises(ShapeError, match="psum"):
        moe_hal.PsumLayout(torch.tensor([[1]], dtype=torch.int32))


def test_psum_layout_with_bad_values_raises_a_layout_error(gen):
    a, b = randn(gen, 8, 4), randn(gen, 2, 3, 4)
    lay = moe_hal.PsumLayout(torch.tensor([5, 3], dtype=torch.int32))  # decreasing ends
    with pytest.raises(LayoutError, match="psum"):
        moe_hal.grouped_gemm(a, b, lay)


def test_op_path_out_is_checked_before_it_is_written(gen):
    a, b, lay = _contiguous(gen, [3, 0, 5], requires_grad=True)
    out = torch.full((lay.num_rows, 5), 3.0)
    with pytest.raises(ShapeError, match="out"):
        moe_hal.grouped_gemm(a, b, lay, out=out)
    assert bool((out == 3.0).all())


def test_masked_out_op_leaves_rows_past_masked_m_untouched_also_under_compile(gen):
    masked_m = torch.tensor([2, 0, 4], dtype=torch.int32)
    lay = moe_hal.MaskedLayout(masked_m, 4)
    a, b = randn(gen, 3, 4, 8), randn(gen, 3, 6, 8)
    expected = moe_hal.grouped_gemm(a, b, lay, backend="reference")

    def fn(a, b, lay, out):
        moe_hal.grouped_gemm(a, b, lay, out=out)
        return out

    for run in (fn, torch.compile(fn, backend="aot_eager", fullgraph=True)):
        out = torch.full((3, 4, 6), -7.0)
        run(a, b, lay, out)
        keep = (torch.arange(4)[None, :] < masked_m[:, None])[..., None].expand_as(out)
        assert bool((out[~keep] == -7.0).all())
        torch.testing.assert_close(out[keep], expected[keep])


def test_autocast_runs_the_op_in_the_autocast_dtype(gen):
    a, b, lay = _contiguous(gen, [3, 0, 5])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = moe_hal.grouped_gemm(a, b, lay)
    assert y.dtype == torch.bfloat16
    assert torch.equal(y, moe_hal.grouped_gemm(a.bfloat16(), b.bfloat16(), lay))


def test_import_moe_hal_registers_nothing_and_imports_no_torch():
    code = (
        "import sys, moe_hal; assert 'torch' not in sys.modules, 'torch imported'; "
        "import torch; assert not hasattr(torch.ops.moe_hal, 'grouped_gemm'); "
        "moe_hal.grouped_gemm; assert hasattr(torch.ops.moe_hal, 'grouped_gemm_contiguous')"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# -- torch.compile ---------------------------------------------------------------------------------------
def _compiled(fn):
    counter = CompileCounterWithBackend("aot_eager")
    return torch.compile(fn, backend=counter, fullgraph=True, dynamic=True), counter


def _double(a, b, lay):
    return moe_hal.grouped_gemm(a, b, lay) * 2


@pytest.mark.parametrize("host", [False, True], ids=["psum_layout", "host_layout"])
def test_compile_contiguous_three_histograms_one_graph_equal_to_eager(gen, host):
    run, counter = _compiled(_double)
    for counts in HISTOGRAMS:
        a, b, lay = _contiguous(gen, counts, requires_grad=True)
        arg = lay if host else moe_hal.PsumLayout(lay.psum, "contiguous", alignment=4)
        y = run(a, b, arg)
        assert torch.equal(y, _double(a, b, lay))
        grads = torch.autograd.grad(y.square().sum(), (a, b))
        expected = torch.autograd.grad(_double(a, b, lay).square().sum(), (a, b))
        for got, want in zip(grads, expected):
            assert torch.equal(got, want)
    assert counter.frame_count <= 2


def test_compile_masked_three_histograms_one_graph_equal_to_eager(gen):
    run, counter = _compiled(_double)
    b = randn(gen, 3, 6, 8).requires_grad_()
    for counts in ([3, 0, 4], [1, 1, 1], [0, 4, 2]):
        lay = moe_hal.MaskedLayout(torch.tensor(counts, dtype=torch.int32), 4)
        a = randn(gen, 3, 4, 8).requires_grad_()
        y = run(a, b, lay)
        assert torch.equal(y, _double(a, b, lay))
        got = torch.autograd.grad(y.sum(), (a, b))
        want = torch.autograd.grad(_double(a, b, lay).sum(), (a, b))
        assert all(torch.equal(g, w) for g, w in zip(got, want))
    assert counter.frame_count <= 2


def test_compile_k_grouped_with_c_three_histograms_one_graph_equal_to_eager(gen):
    def fn(x, dy, lay, c):
        return moe_hal.grouped_gemm(x, dy, lay, c=c)

    run, counter = _compiled(fn)
    for counts in HISTOGRAMS:
        host = moe_hal.KGroupedLayout.from_counts(counts, alignment=4)
        x, dy, c = randn(gen, host.num_rows, 5), randn(gen, host.num_rows, 6), randn(gen, 3, 5, 6)
        lay = moe_hal.PsumLayout(host.psum, "k_grouped", alignment=4)
        assert torch.equal(run(x, dy, lay, c), fn(x, dy, host, c))
    assert counter.frame_count <= 2


def test_compile_fp8_forward(gen):
    run, counter = _compiled(_double)
    for counts in HISTOGRAMS[:2]:
        a, b, lay = _contiguous(gen, counts, k=128)
        qa, qb = quantize_fp8(a, (1, 128)), quantize_fp8(b, (128, 128))
        assert torch.equal(run(qa, qb, moe_hal.PsumLayout(lay.psum, "contiguous", 4)), _double(qa, qb, lay))
    assert counter.frame_count <= 2


# -- which path runs, and host reads of the group bounds ----------------------------------------------------
def test_explain_names_the_call_path(gen):
    a, b, lay = _contiguous(gen, [3, 0, 5])
    assert "call path: direct call" in moe_hal.explain(a, b, lay)
    assert "custom op torch.ops.moe_hal.grouped_gemm_contiguous (an operand requires grad" in moe_hal.explain(
        a, b.requires_grad_(), lay
    )
    with torch.no_grad():
        assert "call path: direct call" in moe_hal.explain(a, b, lay)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert "autocast is enabled for cpu" in moe_hal.explain(a.detach(), b.detach(), lay)
    assert "PsumLayout" in moe_hal.explain(a, b.detach(), moe_hal.PsumLayout(lay.psum, "contiguous", 4))


def test_a_recorded_gradient_goes_through_the_op_and_equals_the_direct_call(gen):
    a, b, lay = _contiguous(gen, [3, 0, 5])
    direct = moe_hal.grouped_gemm(a, b, lay)
    assert direct.grad_fn is None
    y = moe_hal.grouped_gemm(a, b.clone().requires_grad_(), lay)
    assert type(y.grad_fn).__name__ == "_GroupedGemmFunctionBackward"
    assert torch.equal(y, direct)


def test_the_op_path_refuses_bad_operands_with_typed_errors(gen):
    a, b, lay = _contiguous(gen, [3, 0, 5], requires_grad=True)
    with pytest.raises(moe_hal.errors.ArgumentError, match="^b: "):
        moe_hal.grouped_gemm(a, [1, 2], lay)
    with pytest.raises(DTypeError, match="out_dtype"):
        moe_hal.grouped_gemm(a, b, lay, out_dtype="bf16")


def test_the_op_path_refuses_c_outside_k_grouped_like_the_direct_call(gen):
    # only the K-grouped op has a c argument: the others refuse it before any op runs
    a, b, lay = _contiguous(gen, [3, 0, 5], requires_grad=True)
    c = randn(gen, 3, 12, 6)
    masked = moe_hal.MaskedLayout(torch.tensor([2, 0, 4], dtype=torch.int32), 4)
    am = randn(gen, 3, 4, 8).requires_grad_()
    out = torch.full((3, 4, 6), 7.0)
    for args, kwargs in (
        ((a, b, lay), {}),
        ((a, b, moe_hal.PsumLayout(lay.psum, "contiguous", 4)), {}),
        ((am, b, masked), {}),
        ((am.detach(), b.detach(), masked), {"out": out}),  # ops.call: the mutating masked op
    ):
        with pytest.raises(moe_hal.errors.ArgumentError, match="^c: .*only used by K-grouped"):
            ops.call(*args, c=c, **kwargs)
    assert torch.equal(out, torch.full((3, 4, 6), 7.0))


def test_the_op_path_refuses_a_host_layout_that_does_not_fit_a_like_the_direct_call(gen):
    # the op sizes a layout from the operand; a host layout of another size must not be re-sized
    lay = moe_hal.ContiguousLayout.from_counts([3, 0, 5], alignment=4)
    klay = moe_hal.KGroupedLayout.from_counts([3, 0, 5], alignment=4)
    mlay = moe_hal.MaskedLayout(torch.tensor([2, 0, 4], dtype=torch.int32), 4)
    b = randn(gen, 3, 6, 8)
    calls = [
        (randn(gen, lay.num_rows + 4, 8), b, lay, "a.shape\\[0\\]: expected 12 rows"),
        (randn(gen, klay.num_rows + 4, 8), randn(gen, klay.num_rows + 4, 6), klay, "a.shape\\[0\\]: expected 12"),
        (randn(gen, 3, 5, 8), b, mlay, "a.shape\\[1\\]: expected max_m = 4"),
    ]
    for a, w, layout, message in calls:
        for grad in (False, True):
            out = torch.full((1,), 7.0)
            with pytest.raises(ShapeError, match=message):
                moe_hal.grouped_gemm(a, w.clone().requires_grad_(grad), layout)
            with pytest.raises(ShapeError, match=message):
                ops.call(a, w, layout, out=out)
            assert out.item() == 7.0


def test_a_layout_is_flattened_once_per_device_and_its_memos_go_with_it(gen, monkeypatch):
    a, b, lay = _contiguous(gen, [3, 0, 5])
    flattened = []
    original = type(lay).psum_on

    def counting(self, device):
        flattened.append(device)
        return original(self, device)

    monkeypatch.setattr(type(lay), "psum_on", counting)
    for _ in range(3):
        assert torch.equal(ops.call(a, b, lay), moe_hal.grouped_gemm(a, b, lay))
    assert len(flattened) == 1
    assert ops._flat.get(lay) and ops._memos.get(lay.psum_on("cpu"))
    key = id(lay)
    del lay
    assert key not in ops._flat.ids()


def test_a_new_masked_layout_over_the_same_masked_m_is_found_again(gen, monkeypatch):
    masked_m = torch.tensor([2, 0, 4], dtype=torch.int32)
    a, b = randn(gen, 3, 4, 8), randn(gen, 3, 6, 8)
    ops.call(a, b, moe_hal.MaskedLayout(masked_m, 4))
    built = []
    original = moe_hal.MaskedLayout.__init__

    def counting(self, *args, **kwargs):
        built.append(args)
        original(self, *args, **kwargs)

    lay = moe_hal.MaskedLayout(masked_m, 4, expected_m=2)  # a decode step's new layout, same buffer
    monkeypatch.setattr(moe_hal.MaskedLayout, "__init__", counting)
    assert torch.equal(ops.call(a, b, lay), moe_hal.grouped_gemm(a, b, lay))
    assert built == []  # the eager kernel took lay itself, not a rebuilt copy


def test_call_hands_its_layout_to_the_eager_kernel_and_nothing_stays_behind(gen, monkeypatch):
    looked_up = []
    original = ops.host_layout

    def counting(*args):
        looked_up.append(args[0])
        return original(*args)

    monkeypatch.setattr(ops, "host_layout", counting)
    a, b, lay = _contiguous(gen, [3, 0, 5], requires_grad=True)
    y = ops.call(a, b, lay)
    assert looked_up == [] and ops._handoff.pending is None  # the forward took lay itself
    y.sum().backward()
    assert sorted(looked_up) == ["contiguous", "k_grouped"]  # backward products: found by psum
    with pytest.raises(ShapeError):
        ops.call(randn(gen, 20, 8), b, lay)
    assert ops._handoff.pending is None


def test_the_op_path_under_eager_functionalization_redispatches_and_equals_the_direct_call(gen):
    # the Autograd kernel sees the Functionalize key and redispatches; the eager kernel then gets
    # unwrapped operands and the caller's own psum, so the handed-over layout still applies
    a, b, lay = _contiguous(gen, [3, 0, 5])
    x, dy = randn(gen, 12, 5), randn(gen, 12, 6)
    klay = moe_hal.KGroupedLayout.from_counts([3, 0, 5], alignment=4)
    c = randn(gen, 3, 5, 6)
    got = torch.func.functionalize(lambda p, q: ops.call(p, q, lay))(a, b)
    assert torch.equal(got, moe_hal.grouped_gemm(a, b, lay))
    got = torch.func.functionalize(lambda p, q, r: ops.call(p, q, klay, c=r))(x, dy, c)
    assert torch.equal(got, moe_hal.grouped_gemm(x, dy, klay, c=c))
    assert ops._handoff.pending is None


def _count_host_reads(monkeypatch) -> list[int]:
    """Counts the rebuilds of a host layout from a psum tensor (each one reads it on the host)."""
    from moe_hal.layouts import SegmentLayout

    reads, original = [0], SegmentLayout.from_psum.__func__

    def counting(cls, *args, **kwargs):
        reads[0] += 1
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(SegmentLayout, "from_psum", classmethod(counting))
    return reads


def test_compiled_host_layout_reads_no_group_bounds_on_the_host(gen, monkeypatch):
    reads = _count_host_reads(monkeypatch)
    run, counter = _compiled(_double)
    for counts in HISTOGRAMS:
        a, b, lay = _contiguous(gen, counts, requires_grad=True)
        ops.layout_args(lay, a.device)  # outside the graph: tags the layout's psum tensor
        reads[0] = 0
        torch.autograd.grad(run(a, b, lay).sum(), (a, b))
        assert reads[0] == 0
    assert counter.frame_count <= 2
    a, b, lay = _contiguous(gen, [2, 2, 2], requires_grad=True)
    reads[0] = 0
    torch.autograd.grad(run(a, b, lay).sum(), (a, b))
    assert reads[0] == 1  # untagged: the forward reads it once, the backward finds it again


def test_a_device_psum_is_read_once_per_tensor_forward_and_backward(gen, monkeypatch):
    reads = _count_host_reads(monkeypatch)
    run, _ = _compiled(_double)
    for fn in (_double, run):
        a, b, lay = _contiguous(gen, [3, 0, 5], requires_grad=True)
        reads[0] = 0
        torch.autograd.grad(fn(a, b, moe_hal.PsumLayout(lay.psum, "contiguous", 4)).sum(), (a, b))
        assert reads[0] == 1  # the forward; the two backward products find it again


def test_an_in_place_write_to_a_psum_voids_what_was_remembered_for_it(gen):
    a, b, _ = _contiguous(gen, [3, 0, 5])
    buf = moe_hal.ContiguousLayout.from_counts([3, 0, 5], alignment=4).psum
    first = moe_hal.grouped_gemm(a, b, moe_hal.PsumLayout(buf, "contiguous", 4))
    buf.copy_(moe_hal.ContiguousLayout.from_counts([1, 6, 0], alignment=4, num_rows=12).psum)
    again = moe_hal.grouped_gemm(a, b, moe_hal.PsumLayout(buf, "contiguous", 4))
    host = moe_hal.ContiguousLayout.from_counts([1, 6, 0], alignment=4, num_rows=12)
    assert torch.equal(again, moe_hal.grouped_gemm(a, b, host))
    assert not torch.equal(again, first)


def test_inference_mode_tensors_have_no_version_and_are_never_remembered(gen):
    a, b, lay = _contiguous(gen, [3, 0, 5])
    with torch.inference_mode():
        buf = lay.psum
        y = ops.call(a, b, moe_hal.PsumLayout(buf, "contiguous", 4))
        fresh = moe_hal.ContiguousLayout.from_counts([3, 0, 5], alignment=4)
        assert torch.equal(ops.call(a, b, fresh), y)
    assert ops._memos.get(buf) is None
    assert torch.equal(y, moe_hal.grouped_gemm(a, b, lay))


def test_tagged_group_tensors_still_save_and_copy(gen):
    import copy
    import io

    a, b, lay = _contiguous(gen, [3, 0, 5], requires_grad=True)
    mlay = moe_hal.MaskedLayout(torch.tensor([2, 0, 4], dtype=torch.int32), 4)
    moe_hal.grouped_gemm(a, b, lay).sum().backward()
    moe_hal.grouped_gemm(randn(gen, 3, 4, 8).requires_grad_(), b, mlay).sum().backward()
    for tensor in (lay.psum_on("cpu"), mlay.masked_m):
        assert ops._memos.get(tensor)
        buf = io.BytesIO()
        torch.save(tensor, buf)
        buf.seek(0)
        loaded = torch.load(buf)  # weights_only: nothing but the tensor was saved
        assert torch.equal(loaded, tensor) and ops._memos.get(loaded) is None
        assert torch.equal(copy.deepcopy(tensor), tensor)


def test_the_memo_of_a_tensor_goes_with_the_tensor(gen):
    a, b, lay = _contiguous(gen, [3, 0, 5])
    psum = lay.psum.clone()
    moe_hal.grouped_gemm(a, b, moe_hal.PsumLayout(psum, "contiguous", 4))
    key = id(psum)
    assert key in ops._memos.ids()
    del psum
    assert key not in ops._memos.ids()
