"""Bad input raises a typed error naming the argument, the expected and the given value — and
leaves the caller's ``out`` untouched."""

from __future__ import annotations

import pytest
import torch

import moe_hal
from moe_hal import errors
from moe_hal.quant import quantize_fp8

from .conftest import randn

SENTINEL = 3.25


def sentinel(*shape, dtype=torch.float32):
    return torch.full(shape, SENTINEL, dtype=dtype)


def assert_untouched(out):
    assert torch.all(out == SENTINEL), "out was written although the call failed"


def raises(exc_type, argument, call):
    with pytest.raises(exc_type) as info:
        call()
    err = info.value
    assert isinstance(err, errors.MoeHalError)
    if argument is not None:
        assert err.argument == argument, str(err)
        assert "expected" in str(err) and "got" in str(err)
    return err


# -- layouts ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "make,argument",
    [
        (lambda: moe_hal.ContiguousLayout.from_counts([3, -1, 2]), "counts[1]"),
        (lambda: moe_hal.ContiguousLayout.from_counts([[1, 2]]), "counts"),
        (lambda: moe_hal.ContiguousLayout.from_counts(torch.tensor([1.5, 2.0])), "counts"),
        (lambda: moe_hal.ContiguousLayout.from_counts([1, 2], alignment=0), "alignment"),
        (lambda: moe_hal.ContiguousLayout.from_counts([1, 2], alignment=0), "alignment"),
        (lambda: moe_hal.ContiguousLayout.from_counts([1, 2], alignment=-4), "alignment"),
        (lambda: moe_hal.ContiguousLayout.from_counts([1, 2], alignment=2.0), "alignment"),
        (lambda: moe_hal.ContiguousLayout.from_counts([100, 2], alignment=128, num_rows=200), "num_rows"),
        (lambda: moe_hal.ContiguousLayout.from_psum([4, 3, 9], alignment=1), "psum[1]"),
        (lambda: moe_hal.ContiguousLayout.from_psum([4, 100], alignment=128), "psum[1]"),
        (lambda: moe_hal.ContiguousLayout.from_psum([-1], alignment=1), "psum[0]"),
        (lambda: moe_hal.ContiguousLayout.from_m_indices(torch.tensor([0, 5], dtype=torch.int32), 2), "m_indices[1]"),
        (lambda: moe_hal.ContiguousLayout.from_m_indices(torch.tensor([1, 0], dtype=torch.int32), 2), "m_indices[1]"),
        (
            lambda: moe_hal.ContiguousLayout.from_m_indices(torch.tensor([0, -1, 0], dtype=torch.int32), 1),
            "m_indices[1]",
        ),
        (lambda: moe_hal.ContiguousLayout.from_m_indices(torch.tensor([0, 0.5]), 1), "m_indices"),
        (lambda: moe_hal.KGroupedLayout.from_counts([2, -3]), "counts[1]"),
        (lambda: moe_hal.MaskedLayout(torch.tensor([1, 9], dtype=torch.int32), 8), "masked_m[1]"),
        (lambda: moe_hal.MaskedLayout(torch.tensor([1, -2], dtype=torch.int32), 8), "masked_m[1]"),
        (lambda: moe_hal.MaskedLayout(torch.tensor([1, 2], dtype=torch.int64), 8), "masked_m"),
        (lambda: moe_hal.MaskedLayout(torch.tensor([[1, 2]], dtype=torch.int32), 8), "masked_m"),
        (lambda: moe_hal.MaskedLayout([1, 2], 8), "masked_m"),
        (lambda: moe_hal.MaskedLayout(torch.tensor([1], dtype=torch.int32), -1), "max_m"),
        (lambda: moe_hal.MaskedLayout(torch.tensor([1], dtype=torch.int32), 4, expected_m=0), "expected_m"),
    ],
)
def test_layout_errors_name_the_argument(make, argument):
    raises(errors.ArgumentError, argument, make)


def test_masked_m_wrong_dtype_is_a_dtype_error():
    err = raises(errors.DTypeError, "masked_m", lambda: moe_hal.MaskedLayout(torch.tensor([1], dtype=torch.int64), 4))
    assert isinstance(err, TypeError)


def test_masked_m_on_another_device(gen):
    lay = moe_hal.MaskedLayout(torch.zeros(2, dtype=torch.int32, device="meta"), 4)
    out = sentinel(2, 4, 3)
    raises(
        errors.DeviceError,
        "layout.masked_m",
        lambda: moe_hal.grouped_gemm(randn(gen, 2, 4, 5), randn(gen, 2, 3, 5), lay, out=out),
    )
    assert_untouched(out)


# -- operands ----------------------------------------------------------------------------------------
LAY = moe_hal.ContiguousLayout.from_counts([3, 1], alignment=1)


@pytest.mark.parametrize(
    "exc,argument,kwargs",
    [
        (errors.ShapeError, "a.shape[0]", dict(a=(5, 8))),  # counts do not cover the rows
        (errors.ShapeError, "b.shape[2]", dict(b=(2, 6, 9))),  # K mismatch
        (errors.ShapeError, "b.shape[0]", dict(b=(3, 6, 8))),  # G mismatch
        (errors.ShapeError, "a", dict(a=(4, 8, 1))),  # wrong rank
        (errors.ShapeError, "b", dict(b=(6, 8))),
        (
            errors.DTypeError,
            "a",
            dict(dtype=torch.float8_e5m2),
        ),  # unsupported dtype (fp64 goes to the reference backend)
        (errors.DTypeError, "a", dict(dtype=torch.int32)),
        (errors.DTypeError, "b", dict(b_dtype=torch.float16)),  # mixed dtypes
        (errors.DTypeError, "out_dtype", dict(out_dtype=torch.float16)),  # fp16 out of fp32 inputs
        (errors.DeviceError, "b", dict(b_device="meta")),  # mixed devices
    ],
)
def test_operand_errors_leave_out_untouched(exc, argument, kwargs, gen):
    a_shape, b_shape = kwargs.get("a", (4, 8)), kwargs.get("b", (2, 6, 8))
    dtype = kwargs.get("dtype", torch.float32)
    if dtype.is_floating_point:
        a = randn(gen, *a_shape).to(dtype)
    else:
        a = torch.ones(a_shape, dtype=dtype)
    b = randn(gen, *b_shape).to(kwargs.get("b_dtype", dtype if dtype.is_floating_point else torch.float32))
    if "b_device" in kwargs:
        b = b.to(kwargs["b_device"])
    out = sentinel(4, 6)
    raises(exc, argument, lambda: moe_hal.grouped_gemm(a, b, LAY, out=out, out_dtype=kwargs.get("out_dtype")))
    assert_untouched(out)


@pytest.mark.parametrize(
    "make_out,exc",
    [
        (lambda: sentinel(4, 7), errors.ShapeError),
        (lambda: sentinel(4, 6, dtype=torch.float16), errors.DTypeError),
        (lambda: sentinel(6, 4).T, errors.ShapeError),  # not row-major
        (lambda: sentinel(4, 1).expand(4, 6), errors.ShapeError),  # stride 0 along N
        (lambda: sentinel(1, 6).expand(4, 6), errors.AliasError),  # rows overlap each other
    ],
)
def test_bad_out_is_rejected_and_untouched(make_out, exc, gen):
    out = make_out()
    before = out.clone()
    raises(exc, "out", lambda: moe_hal.grouped_gemm(randn(gen, 4, 8), randn(gen, 2, 6, 8), LAY, out=out))
    assert torch.equal(out, before)


def test_out_on_another_device(gen):
    out = torch.empty(4, 6, device="meta")
    raises(errors.DeviceError, "out", lambda: moe_hal.grouped_gemm(randn(gen, 4, 8), randn(gen, 2, 6, 8), LAY, out=out))


def test_out_overlapping_an_input_is_rejected(gen):
    buf = sentinel(4, 14)
    a = buf[:, :8]
    b = randn(gen, 2, 6, 8)
    a.copy_(randn(gen, 4, 8))
    before = buf.clone()
    raises(errors.AliasError, "out", lambda: moe_hal.grouped_gemm(a, b, LAY, out=buf[:, 8:]))
    assert torch.equal(buf, before)
    w = randn(gen, 2, 6, 8)
    raises(errors.AliasError, "out", lambda: moe_hal.grouped_gemm(randn(gen, 4, 8), w, LAY, out=w[0, :4, :6]))


def test_out_under_eager_functionalization_is_checked_on_the_wrapped_memory(gen):
    # functionalize's wrappers all report data_ptr() 0: comparing those refused every out=
    a, b = randn(gen, 3, 8, 16), randn(gen, 3, 5, 16)
    lay = moe_hal.MaskedLayout(torch.tensor([3, 0, 8], dtype=torch.int32), 8)

    def into(a, b, out):
        moe_hal.grouped_gemm(a, b, lay, out=out)
        return out

    got = torch.func.functionalize(into)(a, b, sentinel(3, 8, 5))
    want = into(a, b, sentinel(3, 8, 5))
    assert torch.equal(got, want) and (got[0, 3:] == SENTINEL).all() and (got[1] == SENTINEL).all()

    def overlapping(buf, b):
        moe_hal.grouped_gemm(buf[:, :, :16], b, lay, out=buf[:, :, :5])

    raises(errors.AliasError, "out", lambda: torch.func.functionalize(overlapping)(randn(gen, 3, 8, 16), b))


def test_masked_shape_errors(gen):
    lay = moe_hal.MaskedLayout(torch.tensor([1, 2], dtype=torch.int32), 4)
    out = sentinel(2, 4, 3)
    raises(
        errors.ShapeError,
        "a.shape[1]",
        lambda: moe_hal.grouped_gemm(randn(gen, 2, 5, 6), randn(gen, 2, 3, 6), lay, out=out),
    )
    raises(
        errors.ShapeError,
        "a.shape[0]",
        lambda: moe_hal.grouped_gemm(randn(gen, 3, 4, 6), randn(gen, 3, 3, 6), lay, out=out),
    )
    raises(
        errors.ShapeError,
        "b.shape[0]",
        lambda: moe_hal.grouped_gemm(randn(gen, 2, 4, 6), randn(gen, 3, 3, 6), lay, out=out),
    )
    raises(
        errors.ShapeError,
        "b.shape[2]",
        lambda: moe_hal.grouped_gemm(randn(gen, 2, 4, 6), randn(gen, 2, 3, 7), lay, out=out),
    )
    raises(
        errors.ArgumentError,
        "c",
        lambda: moe_hal.grouped_gemm(randn(gen, 2, 4, 6), randn(gen, 2, 3, 6), lay, c=randn(gen, 2, 4, 3), out=out),
    )
    assert_untouched(out)


def test_k_grouped_errors(gen):
    lay = moe_hal.KGroupedLayout.from_counts([2, 3])
    x, dy = randn(gen, 5, 4), randn(gen, 5, 3)
    out = sentinel(2, 4, 3)
    raises(
        errors.ShapeError, "a.shape[0]", lambda: moe_hal.grouped_gemm(randn(gen, 6, 4), randn(gen, 6, 3), lay, out=out)
    )
    raises(errors.ShapeError, "b.shape[0]", lambda: moe_hal.grouped_gemm(x, randn(gen, 4, 3), lay, out=out))
    raises(errors.ShapeError, "c", lambda: moe_hal.grouped_gemm(x, dy, lay, c=randn(gen, 2, 3, 4), out=out))
    raises(
        errors.DTypeError,
        "c",
        lambda: moe_hal.grouped_gemm(x, dy, lay, c=torch.zeros(2, 4, 3, dtype=torch.float16), out=out),
    )
    buf = randn(gen, 25)
    c, shifted = buf[:24].view(2, 4, 3), buf[1:25].view(2, 4, 3)
    raises(errors.AliasError, "out", lambda: moe_hal.grouped_gemm(x, dy, lay, c=c, out=shifted))
    assert_untouched(out)


def test_quantized_operand_errors(gen):
    q = quantize_fp8(randn(gen, 4, 128))
    out = sentinel(4, 6, dtype=torch.bfloat16)
    raises(errors.DTypeError, "b", lambda: moe_hal.grouped_gemm(q, randn(gen, 2, 6, 128), LAY, out=out))
    raises(
        errors.DTypeError,
        "QuantizedTensor.data",
        lambda: moe_hal.QuantizedTensor(randn(gen, 4, 8), torch.ones(4, 1), (1, 128)),
    )
    raises(
        errors.ShapeError, "QuantizedTensor.scale", lambda: moe_hal.QuantizedTensor(q.data, torch.ones(4, 2), (1, 128))
    )
    assert_untouched(out)


def test_layout_type_and_operand_type_errors(gen):
    raises(errors.LayoutError, "layout", lambda: moe_hal.grouped_gemm(randn(gen, 4, 8), randn(gen, 2, 6, 8), [3, 1]))
    raises(errors.ArgumentError, "a", lambda: moe_hal.grouped_gemm([[1.0]], randn(gen, 2, 6, 8), LAY))


def test_errors_are_also_builtin_exceptions():
    assert issubclass(errors.ShapeError, ValueError)
    assert issubclass(errors.DTypeError, TypeError)
    assert issubclass(errors.BackendUnavailableError, RuntimeError)
    for name in (
        "LayoutError",
        "ShapeError",
        "DTypeError",
        "DeviceError",
        "AliasError",
        "BackendUnavailableError",
        "NoBackendError",
        "PluginError",
        "HardwareDBError",
    ):
        assert issubclass(getattr(errors, name), errors.MoeHalError)
