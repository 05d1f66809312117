"""The ``ascend`` and ``ascend_950`` backends through moe_hal's public API, on the emulator.

Every call goes through ``moe_hal.grouped_gemm(..., backend=...)``, the backends' real code path,
which reaches ``npu_grouped_matmul`` of :mod:`moe_hal_ascend.emulator`; results are compared with
the float64 ``reference`` backend on fresh random data.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.metadata as metadata
import math
import warnings
import weakref

import pytest
import torch
from ascend_helpers import SOC_910B, SOC_910C, SOC_950, assert_close, reference
from torch.utils._python_dispatch import TorchDispatchMode

import moe_hal
from moe_hal.errors import BackendUnavailableError, DeviceError, PathWarning
from moe_hal.prepared import prepared_cache
from moe_hal.quant import quantize_fp8
from moe_hal_ascend import emulator

FLOATS = [torch.bfloat16, torch.float16, torch.float32]
#: (counts, alignment, extra tail rows): empty groups, skewed routing, odd sizes, padding and a tail.
CONTIGUOUS_CASES = [
    ([37, 0, 5, 0, 1, 90], 128, 0),
    ([3, 0, 0, 29, 1], 1, 0),
    ([0, 0, 0], 128, 0),
    ([200, 1, 0, 7], 16, 13),
    ([11], 1, 3),
]


def _contiguous(gen, counts, alignment, tail, k, n, dtype):
    lay = moe_hal.ContiguousLayout.from_counts(counts, alignment=alignment)
    if tail:
        lay = moe_hal.ContiguousLayout.from_counts(counts, alignment=alignment, num_rows=lay.num_rows + tail)
    a = torch.randn(lay.num_rows, k, generator=gen).to(dtype)
    b = torch.randn(len(counts), n, k, generator=gen).to(dtype)
    return a, b, lay


@pytest.fixture
def gmm_calls(monkeypatch):
    """Records the keyword arguments of every emulated npu_grouped_matmul call."""
    calls = []
    real = emulator.npu_grouped_matmul

    def spy(x, weight, **kwargs):
        calls.append(dict(kwargs, x_dtype_seen=x[0].dtype))
        return real(x, weight, **kwargs)

    monkeypatch.setattr(emulator, "npu_grouped_matmul", spy)
    return calls


# -- contiguous -------------------------------------------------------------------------------------
@pytest.mark.parametrize("counts, alignment, tail", CONTIGUOUS_CASES)
@pytest.mark.parametrize("dtype", FLOATS)
def test_contiguous_matches_reference(gen, gmm_calls, counts, alignment, tail, dtype):
    a, b, lay = _contiguous(gen, counts, alignment, tail, k=72, n=40, dtype=dtype)
    a[lay.m_indices() < 0] = float("nan")  # padding rows hold garbage; the output must not
    y = moe_hal.grouped_gemm(a, b, lay, backend="ascend")
    assert_close(y, reference(a, b, lay))
    assert bool((y[lay.m_indices() < 0] == 0).all())
    if sum(counts):
        assert [c["group_list_type"] for c in gmm_calls] == [0] and gmm_calls[0]["group_type"] == 0


def test_the_tail_the_op_leaves_unwritten_is_zeroed(gen, monkeypatch):
    # The emulator poisons rows the op does not write; without the backend's fix-up they stay NaN.
    a, b, lay = _contiguous(gen, [5, 3], 4, 9, k=16, n=8, dtype=torch.bfloat16)
    ends = torch.tensor([8, 11])  # aligned segment ends
    raw = emulator.npu_grouped_matmul([a], [b.transpose(1, 2)], group_list=ends, group_type=0, split_item=3)[0]
    assert torch.isnan(raw[12:]).all()  # the tail, as the op leaves it
    y = moe_hal.grouped_gemm(a, b, lay, backend="ascend")
    assert bool((y[11:] == 0).all()) and not torch.isnan(y).any()


@pytest.mark.parametrize("b_order", ["k", "n", "strided"])
def test_weight_memory_orders(gen, b_order):
    a, b, lay = _contiguous(gen, [9, 0, 20], 8, 0, k=24, n=16, dtype=torch.bfloat16)
    if b_order == "n":
        b = b.transpose(1, 2).contiguous().transpose(1, 2)
    elif b_order == "strided":
        b = torch.randn(3, 16, 48, generator=gen).bfloat16()[:, :, ::2]
    sel = moe_hal.select(a, b, lay, backend="ascend")
    assert moe_hal.grouped_gemm(a, b, lay, backend="ascend").equal(moe_hal.grouped_gemm(a, b, lay, backend="ascend"))
    assert_close(moe_hal.grouped_gemm(a, b, lay, backend="ascend"), reference(a, b.contiguous(), lay))
    assert {"k": "no copy", "n": "no copy", "strided": "copied once"}[b_order] in sel.explain()


def test_converted_weights_are_prepared_once(gen):
    a, b, lay = _contiguous(gen, [4, 4], 1, 0, k=16, n=8, dtype=torch.bfloat16)
    prepared_cache.clear("ascend")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PathWarning)
        for _ in range(3):
            moe_hal.grouped_gemm(a, b, lay, backend="ascend", out_dtype=torch.float32)
    assert prepared_cache.stats()["backends"]["ascend"]["entries"] == 1


def test_layout_group_lists_are_cached_per_layout_and_die_with_it(gen):
    from moe_hal_ascend import backend

    a, b, lay = _contiguous(gen, [5, 0, 3], 8, 0, k=16, n=8, dtype=torch.float32)
    moe_hal.grouped_gemm(a, b, lay, backend="ascend")
    cached = dict(backend._layout_tensors.get(lay))
    assert cached, "the first call caches the layout's int64 group list"
    moe_hal.grouped_gemm(a, b, lay, backend="ascend")
    assert all(backend._layout_tensors.get(lay)[key] is t for key, t in cached.items())
    key = id(lay)
    alive = weakref.ref(lay)
    del lay
    gc.collect()
    assert alive() is None and key not in backend._layout_tensors.ids()


def test_nz_weights_on_request(gen, monkeypatch):
    monkeypatch.setenv("MOE_HAL_ASCEND_WEIGHT_FORMAT", "nz")
    a, b, lay = _contiguous(gen, [6, 0, 11], 4, 0, k=32, n=24, dtype=torch.float16)
    formats = []
    real = emulator.npu_grouped_matmul

    def spy(x, weight, **kwargs):
        formats.append(emulator.get_npu_format(weight[0]))
        return real(x, weight, **kwargs)

    monkeypatch.setattr(emulator, "npu_grouped_matmul", spy)
    assert "FRACTAL_NZ" in moe_hal.select(a, b, lay, backend="ascend").explain()
    assert_close(moe_hal.grouped_gemm(a, b, lay, backend="ascend"), reference(a, b, lay))
    assert formats == [29]


# -- masked ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("masked_m, max_m", [([5, 0, 64, 1], 64), ([0, 0], 8), ([3], 17), ([17, 2, 9], 17)])
@pytest.mark.parametrize("dtype", FLOATS)
def test_masked_writes_only_valid_rows(gen, gmm_calls, masked_m, max_m, dtype):
    g, k, n = len(masked_m), 40, 24
    lay = moe_hal.MaskedLayout(torch.tensor(masked_m, dtype=torch.int32), max_m)
    a = torch.randn(g, max_m, k, generator=gen).to(dtype)
    b = torch.randn(g, n, k, generator=gen).to(dtype)
    sentinel = torch.full((g, max_m, n), -7.25, dtype=dtype)
    expected = reference(a, b, lay, out=sentinel.clone())
    out = sentinel.clone()
    assert moe_hal.grouped_gemm(a, b, lay, out=out, backend="ascend") is out
    assert_close(out, expected)
    for gi, valid in enumerate(masked_m):
        assert bool((out[gi, valid:] == -7.25).all())
    assert gmm_calls[0]["group_list_type"] == 0
    assert_close(moe_hal.grouped_gemm(a, b, lay, backend="ascend"), reference(a, b, lay))


def test_masked_never_reads_host_values(gen, monkeypatch):
    # masked_m stays on the device: the backend must not call .tolist()/.item() on it.
    lay = moe_hal.MaskedLayout(torch.tensor([3, 0, 5], dtype=torch.int32), 6)
    a = torch.randn(3, 6, 8, generator=gen).bfloat16()
    b = torch.randn(3, 4, 8, generator=gen).bfloat16()
    expected = reference(a, b, lay)

    class NoHostReads(torch.Tensor):
        def tolist(self):
            raise AssertionError("masked_m was read on the host")

        def item(self):
            raise AssertionError("masked_m was read on the host")

    real = emulator.npu_grouped_matmul

    def kernel(x, weight, group_list, **kwargs):  # the NPU kernel reads group_list on the device
        return real(x, weight, group_list=group_list.as_subclass(torch.Tensor), **kwargs)

    monkeypatch.setattr(emulator, "npu_grouped_matmul", kernel)
    lay.masked_m = lay.masked_m.as_subclass(NoHostReads)
    assert_close(moe_hal.grouped_gemm(a, b, lay, backend="ascend"), expected)


def test_masked_clamps_masked_m_past_max_m_when_unchecked(gen):
    lay = moe_hal.MaskedLayout(torch.tensor([9, 2], dtype=torch.int32), 4, check=False)
    a = torch.randn(2, 4, 8, generator=gen).half()
    b = torch.randn(2, 4, 8, generator=gen).half()
    clamped = moe_hal.MaskedLayout(torch.tensor([4, 2], dtype=torch.int32), 4)
    assert_close(moe_hal.grouped_gemm(a, b, lay, backend="ascend"), reference(a, b, clamped))


# -- K-grouped ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("counts, alignment", [([7, 0, 30, 1], 1), ([0, 64, 3], 32), ([0, 0], 1), ([128], 128)])
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("with_c", [False, True])
def test_k_grouped_matches_reference(gen, gmm_calls, counts, alignment, dtype, with_c):
    lay = moe_hal.KGroupedLayout.from_counts(counts, alignment=alignment)
    m, n = 20, 12
    x = torch.randn(lay.num_rows, m, generator=gen).to(dtype)
    dy = torch.randn(lay.num_rows, n, generator=gen).to(dtype)
    c = torch.randn(len(counts), m, n, generator=gen).to(dtype) if with_c else None
    expected = reference(x, dy, lay, c=c)
    announced = with_c and dtype != torch.float32
    with pytest.warns(PathWarning, match="rounded once") if announced else contextlib.nullcontext():
        assert_close(moe_hal.grouped_gemm(x, dy, lay, c=c, backend="ascend"), expected)
    if with_c:
        c_copy = c.clone()
        assert moe_hal.grouped_gemm(x, dy, lay, c=c_copy, out=c_copy, backend="ascend") is c_copy
        assert_close(c_copy, expected)
    if sum(counts):
        assert gmm_calls[0]["group_type"] == 2 and gmm_calls[0]["group_list_type"] == 0
        # c + a^T b is rounded once: with c and a 16-bit output the op computes in fp32
        assert gmm_calls[0]["x_dtype_seen"] == (torch.float32 if with_c else dtype)


# -- mixed precision and fp8 ------------------------------------------------------------------------
@pytest.mark.parametrize("op", ["contiguous", "masked", "k_grouped"])
def test_fp32_output_from_bf16_is_an_announced_upcast(gen, op):
    a, b, lay = _operands(gen, op, torch.bfloat16)
    with pytest.warns(PathWarning, match="upcasts bf16 operands to fp32"):
        y = moe_hal.grouped_gemm(a, b, lay, out_dtype=torch.float32, backend="ascend")
    assert_close(y, reference(a, b, lay, out_dtype=torch.float32))
    assert "upcasts bf16" in moe_hal.explain(a, b, lay, out_dtype=torch.float32, backend="ascend")


class _Fp8DeviceOps(TorchDispatchMode):
    """Records every cast and gather whose source or target is an fp8 dtype (independent of the
    emulator's own guard, so it also judges code written before that guard existed)."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        fp8 = (torch.float8_e4m3fn, torch.float8_e5m2)
        name = func.overloadpacket.__name__
        if name in ("_to_copy", "copy_"):
            pair = (args[1].dtype, args[0].dtype) if name == "copy_" else (args[0].dtype, kwargs.get("dtype"))
            if pair[0] != pair[1] and (pair[0] in fp8 or pair[1] in fp8):
                self.seen.append((name, pair))
        if name in ("index_select", "index", "gather") and args[0].dtype in fp8:
            self.seen.append((name, args[0].dtype))
        return func(*args, **kwargs)


@pytest.mark.parametrize("soc", [SOC_910B, SOC_910C])
@pytest.mark.parametrize("op", ["contiguous", "masked", "k_grouped"])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("ue8m0", [False, True])
def test_fp8_on_910_is_a_declared_dequantize_path(gen, emulate, monkeypatch, soc, op, out_dtype, ue8m0):
    emulate(soc)
    seen = []
    real = emulator.npu_grouped_matmul

    def spy(x, weight, **kwargs):
        seen.append(x[0].dtype)
        return real(x, weight, **kwargs)

    monkeypatch.setattr(emulator, "npu_grouped_matmul", spy)
    qa, qb, lay = _fp8_operands(gen, op, ue8m0=ue8m0)
    text = moe_hal.explain(qa, qb, lay, out_dtype=out_dtype, backend="ascend")
    assert "dequantizes" in text and "without fp8 hardware" in text
    prepared_cache.clear()
    with pytest.warns(PathWarning, match="dequantizes"):
        y = moe_hal.grouped_gemm(qa, qb, lay, out_dtype=out_dtype, backend="ascend")
    # fp32 only where the fp8_fp32 class needs it (and K-grouped, which holds no weights)
    assert seen == [torch.bfloat16 if op != "k_grouped" and out_dtype == torch.bfloat16 else torch.float32]
    expected = reference(qa, qb, lay, out_dtype=out_dtype)
    if ue8m0 or out_dtype == torch.float32 or op == "k_grouped":
        assert_close(y, expected)  # exact operands: one rounding of the output
    else:
        # bf16-rounded operands: within the suite's fp8_bf16 class (rtol 1.6e-2 plus 4 sqrt(K) 2^-14 sum|ab|)
        abs_product = reference(qa.dequantize().abs(), qb.dequantize().abs(), lay, out_dtype=torch.float32)
        bound = 1.6e-2 * expected.double().abs() + 4 * qa.data.shape[-1] ** 0.5 * 2**-14 * abs_product.double()
        assert bool(((y.double() - expected.double()).abs() <= bound + 1e-5).all())
    with pytest.raises(BackendUnavailableError, match="soc_unsupported"):
        moe_hal.grouped_gemm(qa, qb, lay, backend="ascend_950")


@pytest.mark.parametrize("op", ["contiguous", "masked", "k_grouped"])
def test_fp8_on_910_never_casts_or_gathers_fp8_on_the_device(gen, emulate, op):
    # aclnnCast has no FLOAT8 dtype on A2/A3 (ops-math aclnnCast.md): a dequantization by cast would
    # fail on every call there. Decoding goes through a byte table instead.
    emulate(SOC_910B)
    qa, qb, lay = _fp8_operands(gen, op)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PathWarning)
        moe_hal.grouped_gemm(qa, qb, lay, backend="ascend")  # selection and preparation first
        prepared_cache.clear()
        with _Fp8DeviceOps() as spy:
            y = moe_hal.grouped_gemm(qa, qb, lay, backend="ascend")
    assert spy.seen == []
    assert not torch.isnan(y).any()


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_fp8_weights_on_910_are_held_as_bf16(gen, emulate, out_dtype):
    # fp32-scaled fp8 weights once became fp32 weights: 4 bytes per parameter, twice a bf16 deployment.
    emulate(SOC_910B)
    qa, qb, lay = _fp8_operands(gen, "contiguous", ue8m0=True)
    prepared_cache.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PathWarning)
        moe_hal.grouped_gemm(qa, qb, lay, out_dtype=out_dtype, backend="ascend")
    params = qb.data.numel()
    assert prepared_cache.stats()["bytes"] == params * 2
    assert f"{params} fp8 parameters held as" in moe_hal.explain(qa, qb, lay, out_dtype=out_dtype, backend="ascend")


@pytest.mark.parametrize("op", ["contiguous", "masked"])
@pytest.mark.parametrize("ue8m0", [False, True])
def test_fp8_is_native_on_950(gen, emulate, gmm_calls, op, ue8m0):
    emulate(SOC_950)
    qa, qb, lay = _fp8_operands(gen, op, ue8m0=ue8m0)
    sel = moe_hal.select(qa, qb, lay, backend="ascend_950")
    assert "G-B mode" in sel.explain() and "dequantizes" not in sel.explain()
    with warnings.catch_warnings():
        warnings.simplefilter("error", PathWarning)  # the native path announces nothing
        y = moe_hal.grouped_gemm(qa, qb, lay, backend="ascend_950")
    expected = reference(qa, qb, lay)
    assert calc_like_native(y, expected)
    kwargs = gmm_calls[-1]
    assert kwargs["output_dtype"] == torch.bfloat16 and kwargs["per_token_scale"][0].dtype == torch.float32


def test_fp8_k_grouped_on_950_is_dequantized(gen, emulate):
    emulate(SOC_950)
    qa, qb, lay = _fp8_operands(gen, "k_grouped")
    with pytest.warns(PathWarning, match="dequantizes"):
        y = moe_hal.grouped_gemm(qa, qb, lay, backend="ascend_950")
    assert_close(y, reference(qa, qb, lay))


def test_950_ranks_above_ascend_and_both_accept_bf16(gen, emulate):
    emulate(SOC_950)
    a, b, lay = _operands(gen, "contiguous", torch.bfloat16)
    sel = moe_hal.select(a, b, lay, backend=["ascend_950", "ascend"])
    assert sel.name == "ascend_950" and sel.ranked == ["ascend_950", "ascend"]
    assert_close(moe_hal.grouped_gemm(a, b, lay, backend="ascend_950"), reference(a, b, lay))


# -- selection, explanation, limits ------------------------------------------------------------------
def test_explain_says_emulated_and_cpu_never_picks_ascend_automatically(gen):
    a, b, lay = _operands(gen, "contiguous", torch.bfloat16)
    auto = moe_hal.select(a, b, lay)
    assert auto.name not in ("ascend", "ascend_950")
    reasons = {c.name: [r.code for r in c.reasons] for c in auto.candidates}
    assert reasons["ascend"] == ["emulator_only"]
    forced = moe_hal.select(a, b, lay, backend="ascend")
    assert forced.mode == "emulated"
    assert "EMULATED" in forced.explain() and "CPU emulator of torch_npu" in forced.explain()


def test_emulation_off_rejects_cpu_tensors(gen):
    from moe_hal_ascend import disable_emulation

    a, b, lay = _operands(gen, "contiguous", torch.bfloat16)
    disable_emulation()
    with pytest.raises(BackendUnavailableError) as info:
        moe_hal.select(a, b, lay, backend="ascend")
    codes = {r.code for r in info.value.reasons}
    assert codes & {"torch_npu_missing", "cann_missing", "torch_npu_broken", "npu_device_missing"}
    with pytest.raises(DeviceError, match="emulation mode"):  # called directly, bypassing selection
        moe_hal.get_backend("ascend").run(moe_hal.Problem.build(a, b, lay), None)


def test_limits_are_reasons(gen):
    lay = moe_hal.ContiguousLayout.from_counts([1], alignment=1)
    wide = torch.zeros(1, 65536).bfloat16(), torch.zeros(1, 1, 65536).bfloat16()
    with pytest.raises(BackendUnavailableError, match="shape_constraint"):
        moe_hal.select(*wide, lay, backend="ascend")
    many = moe_hal.ContiguousLayout.from_counts([0] * 1025, alignment=1)
    with pytest.raises(BackendUnavailableError, match="at most 1024 groups"):
        moe_hal.select(torch.zeros(0, 8).half(), torch.zeros(1025, 4, 8).half(), many, backend="ascend")


def test_plugin_is_discovered_through_its_entry_point():
    eps = [ep for ep in metadata.entry_points(group="moe_hal.backends") if ep.name == "ascend"]
    assert [ep.value for ep in eps] == ["moe_hal_ascend.plugin"]
    specs = {s.name: s for s in moe_hal.backends()}
    assert specs["ascend"].distribution == "moe-hal-ascend" and specs["ascend_950"].plugin == "ascend"
    assert specs["ascend"].requires == {"npu_grouped_matmul", "cube_unit", "bf16"}
    assert specs["ascend_950"].requires == {"npu_grouped_matmul", "cube_unit", "bf16", "fp8"}
    assert "emulator" in specs["ascend"].description


# -- helpers -----------------------------------------------------------------------------------------
def calc_like_native(y: torch.Tensor, expected: torch.Tensor) -> bool:
    """A native fp8 path rounds once to bf16 after fp32 accumulation: within 1 bf16 ulp, plus
    the fp32 accumulation error of a few K blocks."""
    err = (y.double() - expected.double()).abs()
    return bool((err <= 2**-8 * expected.double().abs() + 1e-3 * expected.double().abs().max()).all())


def _operands(gen, op, dtype):
    if op == "contiguous":
        return _contiguous(gen, [13, 0, 40, 2], 32, 5, k=48, n=24, dtype=dtype)
    if op == "masked":
        lay = moe_hal.MaskedLayout(torch.tensor([4, 0, 16], dtype=torch.int32), 16)
        return (torch.randn(3, 16, 48, generator=gen).to(dtype), torch.randn(3, 24, 48, generator=gen).to(dtype), lay)
    lay = moe_hal.KGroupedLayout.from_counts([9, 0, 31], alignment=8)
    x = torch.randn(lay.num_rows, 24, generator=gen).to(dtype)
    return x, torch.randn(lay.num_rows, 16, generator=gen).to(dtype), lay


def _fp8_operands(gen, op, ue8m0=False):
    k, n = 320, 136  # partial 128-blocks along K and N
    if op == "k_grouped":
        lay = moe_hal.KGroupedLayout.from_counts([130, 0, 60], alignment=128)
        x = quantize_fp8(torch.randn(lay.num_rows, 24, generator=gen), block=(128, 1), ue8m0=ue8m0)
        dy = quantize_fp8(torch.randn(lay.num_rows, 16, generator=gen), block=(128, 1), ue8m0=ue8m0)
        return x, dy, lay
    b = quantize_fp8(torch.randn(3, n, k, generator=gen), block=(128, 128), ue8m0=ue8m0)
    if op == "contiguous":
        lay = moe_hal.ContiguousLayout.from_counts([70, 0, 9], alignment=128)
        return quantize_fp8(torch.randn(lay.num_rows, k, generator=gen), block=(1, 128), ue8m0=ue8m0), b, lay
    lay = moe_hal.MaskedLayout(torch.tensor([5, 0, 12], dtype=torch.int32), 12)
    return quantize_fp8(torch.randn(3, 12, k, generator=gen), block=(1, 128), ue8m0=ue8m0), b, lay


def test_calls_with_nothing_to_multiply(gen):
    lay = moe_hal.ContiguousLayout.from_counts([3, 0, 2], alignment=4)
    a, b = torch.randn(lay.num_rows, 0).bfloat16(), torch.randn(3, 5, 0).bfloat16()
    out = torch.full((lay.num_rows, 5), 3.0).bfloat16()
    assert bool((moe_hal.grouped_gemm(a, b, lay, out=out, backend="ascend") == 0).all())
    mlay = moe_hal.MaskedLayout(torch.tensor([2, 0], dtype=torch.int32), 3)
    out = torch.full((2, 3, 4), 3.0).half()
    moe_hal.grouped_gemm(torch.zeros(2, 3, 0).half(), torch.zeros(2, 4, 0).half(), mlay, out=out, backend="ascend")
    assert_close(
        out,
        reference(
            torch.zeros(2, 3, 0).half(), torch.zeros(2, 4, 0).half(), mlay, out=torch.full((2, 3, 4), 3.0).half()
        ),
    )
    klay = moe_hal.KGroupedLayout.from_counts([0, 0], alignment=1)
    c = torch.randn(2, 4, 6, generator=gen)
    y = moe_hal.grouped_gemm(torch.zeros(0, 4), torch.zeros(0, 6), klay, c=c, backend="ascend")
    assert torch.equal(y, c)


@pytest.mark.parametrize("t, m", [(1, 5), (7, 1), (1, 1)])
def test_k_grouped_column_major_a_with_one_token_or_one_row(gen, t, m):
    # Issue 15: a column-major a [T, M] with T = 1 or M = 1 is "contiguous" to torch, so it reached
    # the op with strides CANN reads as not transposed (an untyped AclnnError). It is normalised now.
    lay = moe_hal.KGroupedLayout.from_counts([t, 0], alignment=1)
    a = torch.randn(m, t, generator=gen).bfloat16().t()  # column-major [T, M]
    b = torch.randn(t, 3, generator=gen).bfloat16()
    assert a.is_contiguous() or t > 1 and m > 1
    y = moe_hal.grouped_gemm(a, b, lay, backend="ascend")
    assert_close(y, reference(a, b, lay))


@pytest.mark.parametrize("n, k", [(128, 320), (320, 128), (96, 96)])
def test_950_g_b_scales_keep_the_weights_transposition(gen, emulate, monkeypatch, n, k):
    # N <= 128 xor K <= 128: the scale [G, K/128, N/128] had a size-1 dim whose stride made CANN's
    # stride rule read it as transposed while the weight was not, and the G-B checker refused it.
    emulate(SOC_950)
    seen = []
    real = emulator.npu_grouped_matmul

    def spy(x, weight, **kwargs):
        seen.append((weight[0], kwargs["scale"][0], kwargs["per_token_scale"][0], x[0]))
        return real(x, weight, **kwargs)

    monkeypatch.setattr(emulator, "npu_grouped_matmul", spy)
    lay = moe_hal.ContiguousLayout.from_counts([5, 3], alignment=1)
    qa = quantize_fp8(torch.randn(lay.num_rows, k, generator=gen), block=(1, 128))
    qb = quantize_fp8(torch.randn(2, n, k, generator=gen), block=(128, 128))
    prepared_cache.clear()
    y = moe_hal.grouped_gemm(qa, qb, lay, backend="ascend_950")
    assert calc_like_native(y, reference(qa, qb, lay))
    ((weight, scale, per_token, x),) = seen

    # CANN's IsTransposeLastTwoDims, written out here (ops-transformer aclnn_grouped_matmul_util.cpp)
    def transposed(t):
        shape, stride = t.shape, t.stride()
        if stride[-2] != 1 or stride[-1] != shape[-2]:
            return False
        return all(stride[d] == math.prod(shape[d + 1 :]) for d in range(t.dim() - 2))

    assert transposed(scale) == transposed(weight) or tuple(scale.shape[-2:]) == (1, 1)
    assert transposed(per_token) == transposed(x) or tuple(per_token.shape[-2:]) == (1, 1)


def test_950_masked_fp8_gathers_bytes_not_fp8(gen, emulate):
    # aclnnIndexSelect has no FLOAT8 dtype: the masked path packs fp8 rows through a uint8 view.
    emulate(SOC_950)
    qa, qb, lay = _fp8_operands(gen, "masked")
    moe_hal.grouped_gemm(qa, qb, lay, backend="ascend_950")
    with _Fp8DeviceOps() as spy:
        y = moe_hal.grouped_gemm(qa, qb, lay, backend="ascend_950")
    assert [op for op in spy.seen if op[0] != "_to_copy"] == []
    assert calc_like_native(y[0, :5], reference(qa, qb, lay)[0, :5])
