"""The ``torch.library`` custom ops behind :func:`moe_hal.grouped_gemm`, in the namespace ``moe_hal``.

    moe_hal.grouped_gemm(a, b, layout)  ──(autograd / autocast / torch.compile)──►
        torch.ops.moe_hal.grouped_gemm(a, b, groups, layout, alignment, ...)   functional, all layouts
        torch.ops.moe_hal.grouped_gemm_masked_out(a, b, masked_m, out, ...)    writes out[g, :masked_m[g]]
    ──(eager kernel)──► host layout ─► Problem.build ─► select ─► Backend.run

Layouts are flattened into tensors, ints and strings: ``groups`` is the int32 psum ``[G]``
(contiguous, K-grouped) or ``masked_m`` ``[G]`` (masked), on the operands' device; ``layout`` names
the operation; ``alignment`` is the segment alignment; row counts come from the operands. fp8
operands travel as ``a``/``b`` (``float8_e4m3fn`` data) plus ``a_scale``/``b_scale`` (logical fp32
scales), ``a_block``/``b_block`` and ``scale_format``.

The fake (meta) kernels compute output shapes from operand shapes only, for every dtype the API
takes (fp32, bf16, fp16, fp8 data), so compiled graphs never read group sizes. The eager kernel
rebuilds the host layout: for a layout object the caller made it is found again through its
cached psum tensor (no sync); otherwise the psum values are read (one sync).

Gradients (fp32/bf16/fp16; fp8 operands raise :class:`~moe_hal.errors.GradientError`), with
``psum``/``alignment`` shared by every product:

* contiguous ``y = a @ b[g].T`` per segment: ``da = contiguous(dy, b.transpose(1, 2))``,
  ``db = k_grouped(dy, a)``; rows of no group get zero ``da`` and add nothing to ``db``.
* masked: ``da = masked(dy, b.transpose(1, 2), masked_m)``; ``db[g] = dy[g, :m_g].T @ a[g, :m_g]``
  as one batched product of the operands with rows ``>= masked_m[g]`` zeroed on the device.
* K-grouped ``out[g] = c[g] + a_g.T @ b_g``: ``dc = dout``, ``da = contiguous(b, dout)``,
  ``db = contiguous(a, dout.transpose(1, 2))``.

A weight ``b`` with a ``main_grad`` attribute (an fp32 tensor of ``b``'s shape, Megatron style)
gets its contiguous-layout gradient accumulated in place through the K-grouped ``c``
(``main_grad += k_grouped(dy, a)``, no bf16 rounding) and ``b.grad`` stays ``None``; this
attribute is only visible to eager autograd.

Importing this module registers the ops; :mod:`moe_hal.api` imports it, so ``import moe_hal``
alone still imports no torch.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

# api imports this module, so api is partly initialised here: its names are read at call time.
from . import api as _api
from . import selection as _selection
from .device_layout import PsumLayout
from .errors import DTypeError, GradientError, LayoutError, ShapeError
from .layouts import ContiguousLayout, KGroupedLayout, MaskedLayout, SegmentLayout
from .problem import Problem
from .quant import QuantizedTensor

NAMESPACE = "moe_hal"
LAYOUTS = ("contiguous", "masked", "k_grouped")
_FP8_OUT = torch.bfloat16

_lib = torch.library.Library(NAMESPACE, "DEF")
_OPERAND_ARGS = (
    'Tensor? a_scale=None, Tensor? b_scale=None, int[] a_block=[], int[] b_block=[], str scale_format="fp32"'
)
_lib.define(
    "grouped_gemm(Tensor a, Tensor b, Tensor groups, str layout, int alignment=1, Tensor? c=None, "
    f"ScalarType? out_dtype=None, {_OPERAND_ARGS}, int? expected_m=None, str? backend=None) -> Tensor"
)
_lib.define(
    "grouped_gemm_masked_out(Tensor a, Tensor b, Tensor masked_m, Tensor(a!) out, "
    f"{_OPERAND_ARGS}, int? expected_m=None, str? backend=None) -> ()"
)

grouped_gemm_op = torch.ops.moe_hal.grouped_gemm.default
grouped_gemm_masked_out_op = torch.ops.moe_hal.grouped_gemm_masked_out.default


# -- host layouts -------------------------------------------------------------------------------------
#: (id(psum tensor), op) -> the host layout whose cached psum tensor it is. Weak values: an entry
#: lives as long as the layout, which keeps the tensor (and so its id) alive.
_host_layouts: weakref.WeakValueDictionary[tuple[int, str], SegmentLayout] = weakref.WeakValueDictionary()
_SEGMENT_CLASSES = {"contiguous": ContiguousLayout, "k_grouped": KGroupedLayout}


def layout_args(layout, device: torch.device) -> tuple[torch.Tensor, str, int, int | None]:
    """``(groups, layout name, alignment, expected_m)`` of a layout object, groups on ``device``."""
    if isinstance(layout, MaskedLayout):
        return layout.masked_m, "masked", 0, layout.expected_m
    if isinstance(layout, PsumLayout):
        return layout.psum, layout.op, layout.alignment, None
    if isinstance(layout, SegmentLayout):
        psum = layout.psum_on(device)
        if not torch.compiler.is_compiling():
            _host_layouts[(id(psum), layout.op)] = layout
        return psum, layout.op, layout.alignment, None
    raise LayoutError("layout", "a ContiguousLayout, MaskedLayout, KGroupedLayout or PsumLayout", type(layout).__name__)


def host_layout(layout: str, groups: torch.Tensor, alignment: int, num_rows: int, expected_m: int | None):
    """The host layout object a backend takes for the op's flattened layout arguments."""
    if layout == "masked":
        return MaskedLayout(groups, num_rows, expected_m, check=False)
    if layout not in _SEGMENT_CLASSES:
        raise LayoutError("layout", f"one of {LAYOUTS}", layout)
    cls = _SEGMENT_CLASSES[layout]
    for op in _SEGMENT_CLASSES:
        known = _host_layouts.get((id(groups), op))
        if (
            known is not None
            and known.psum_on(groups.device) is groups
            and known.alignment == alignment
            and known.num_rows == num_rows
        ):
            if op == layout:
                return known
            return cls(known.counts_list, known.starts, known.alignment, known.num_rows)
    return cls.from_psum(groups, alignment=alignment, num_rows=num_rows)


# -- operands -----------------------------------------------------------------------------------------
def operand_args(a, b) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """``(a, b, fp8 keyword arguments)``: tensors as they are; QuantizedTensors flattened."""
    if isinstance(a, QuantizedTensor) and isinstance(b, QuantizedTensor):
        fmt = "ue8m0" if a.scale_format == b.scale_format == "ue8m0" else "fp32"
        return (
            a.data,
            b.data,
            {
                "a_scale": a.scale,
                "b_scale": b.scale,
                "a_block": list(a.block),
                "b_block": list(b.block),
                "scale_format": fmt,
            },
        )
    return a, b, {}


def _operand(x: torch.Tensor, scale: torch.Tensor | None, block: list[int], fmt: str):
    if scale is None:
        return x
    return QuantizedTensor(x, scale, tuple(block), fmt)


def _backend(backend: str | None):
    if backend is None or "," not in backend:
        return backend
    return tuple(backend.split(","))


def run_plain(a, b, layout, *, c=None, out=None, out_dtype=None, backend=None) -> torch.Tensor:
    """Validate and run one call on the selected backend, its result checked (the path without
    custom ops)."""
    problem = Problem.build(a, b, layout, c=c, out=out, out_dtype=out_dtype)
    return _api.run_checked(_selection.select(problem, backend).backend, problem, out)


# -- eager kernels --------------------------------------------------------------------------------------
def _grouped_gemm_kernel(
    a,
    b,
    groups,
    layout,
    alignment=1,
    c=None,
    out_dtype=None,
    a_scale=None,
    b_scale=None,
    a_block=(),
    b_block=(),
    scale_format="fp32",
    expected_m=None,
    backend=None,
):
    num_rows = a.shape[1] if layout == "masked" else a.shape[0]
    lay = host_layout(layout, groups, alignment, num_rows, expected_m)
    return run_plain(
        _operand(a, a_scale, a_block, scale_format),
        _operand(b, b_scale, b_block, scale_format),
        lay,
        c=c,
        out_dtype=out_dtype,
        backend=_backend(backend),
    )


def _masked_out_kernel(
    a,
    b,
    masked_m,
    out,
    a_scale=None,
    b_scale=None,
    a_block=(),
    b_block=(),
    scale_format="fp32",
    expected_m=None,
    backend=None,
):
    lay = MaskedLayout(masked_m, a.shape[1], expected_m, check=False)
    run_plain(
        _operand(a, a_scale, a_block, scale_format),
        _operand(b, b_scale, b_block, scale_format),
        lay,
        out=out,
        backend=_backend(backend),
    )


_lib.impl("grouped_gemm", _grouped_gemm_kernel, "CompositeExplicitAutograd")
_lib.impl("grouped_gemm_masked_out", _masked_out_kernel, "CompositeExplicitAutograd")


# -- fake kernels ---------------------------------------------------------------------------------------
def result_dtype(a: torch.Tensor, a_scale, c, out_dtype) -> torch.dtype:
    """The output dtype of a call: ``out_dtype``, else ``c``'s, else bf16 for fp8, else ``a``'s."""
    if out_dtype is not None:
        return out_dtype
    if c is not None:
        return c.dtype
    return _FP8_OUT if a_scale is not None else a.dtype


@torch.library.register_fake("moe_hal::grouped_gemm", lib=_lib)
def _grouped_gemm_fake(
    a,
    b,
    groups,
    layout,
    alignment=1,
    c=None,
    out_dtype=None,
    a_scale=None,
    b_scale=None,
    a_block=(),
    b_block=(),
    scale_format="fp32",
    expected_m=None,
    backend=None,
):
    dtype = result_dtype(a, a_scale, c, out_dtype)
    if layout == "contiguous":
        shape = (a.shape[0], b.shape[1])
    elif layout == "masked":
        shape = (a.shape[0], a.shape[1], b.shape[1])
    elif layout == "k_grouped":
        shape = (groups.shape[0], a.shape[1], b.shape[1])
    else:
        raise LayoutError("layout", f"one of {LAYOUTS}", layout)
    return a.new_empty(shape, dtype=dtype)


@torch.library.register_fake("moe_hal::grouped_gemm_masked_out", lib=_lib)
def _masked_out_fake(
    a,
    b,
    masked_m,
    out,
    a_scale=None,
    b_scale=None,
    a_block=(),
    b_block=(),
    scale_format="fp32",
    expected_m=None,
    backend=None,
):
    return None


# -- autograd -------------------------------------------------------------------------------------------
def _setup_context(ctx, inputs, output):
    a, b, groups, layout, alignment, c, _out_dtype, a_scale, *_rest = inputs
    ctx.layout, ctx.alignment, ctx.fp8 = layout, alignment, a_scale is not None
    ctx.has_c = c is not None
    ctx.backend = inputs[-1]  # the gradient products run where the forward did
    ctx.main_grad = None
    if layout == "contiguous" and isinstance(getattr(b, "main_grad", None), torch.Tensor):
        ctx.main_grad = b.main_grad
    ctx.save_for_backward(a, b, groups)


def _grad_input(grad: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The incoming gradient as a dense operand of the forward's operand dtype (a zero-stride
    gradient, as from ``y.sum().backward()``, is materialised)."""
    return grad.to(dtype).contiguous()


def _backward(ctx, grad):
    if ctx.fp8:
        raise GradientError(
            "a, b", "fp32/bf16/fp16 operands for a gradient", "fp8 QuantizedTensor operands (forward only)"
        )
    a, b, groups = ctx.saved_tensors
    need_a, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    da = db = dc = None
    op, align, backend = ctx.layout, ctx.alignment, ctx.backend
    if op == "contiguous":
        dy = _grad_input(grad, a.dtype)
        if need_a:
            da = grouped_gemm_op(dy, b.transpose(1, 2), groups, "contiguous", align, backend=backend)
        if ctx.main_grad is not None:
            lay = host_layout("k_grouped", groups, align, dy.shape[0], None)
            run_plain(dy, a, lay, c=ctx.main_grad, out=ctx.main_grad, backend=_backend(backend))
        elif need_b:
            db = grouped_gemm_op(dy, a, groups, "k_grouped", align, backend=backend)
    elif op == "masked":
        dy = _grad_input(grad, a.dtype)
        if need_a:
            da = grouped_gemm_op(dy, b.transpose(1, 2), groups, "masked", 0, backend=backend)
        if need_b:
            rows = torch.arange(a.shape[1], device=a.device)
            valid = (rows[None, :] < groups[:, None])[..., None]  # [G, max_m, 1], no sync
            zero = a.new_zeros(())
            db = torch.bmm(torch.where(valid, dy, zero).transpose(1, 2), torch.where(valid, a, zero))
    else:
        dout = _grad_input(grad, a.dtype)
        if need_a:
            da = grouped_gemm_op(b, dout, groups, "contiguous", align, backend=backend)
        if need_b:
            db = grouped_gemm_op(a, dout.transpose(1, 2), groups, "contiguous", align, backend=backend)
        if ctx.has_c and ctx.needs_input_grad[5]:
            dc = grad
    return (da, db, None, None, None, dc) + (None,) * 8


torch.library.register_autograd("moe_hal::grouped_gemm", _backward, setup_context=_setup_context, lib=_lib)


# -- autocast -------------------------------------------------------------------------------------------
def _autocast_kernel(device_type: str):
    def kernel(
        a,
        b,
        groups,
        layout,
        alignment=1,
        c=None,
        out_dtype=None,
        a_scale=None,
        b_scale=None,
        a_block=(),
        b_block=(),
        scale_format="fp32",
        expected_m=None,
        backend=None,
    ):
        if a_scale is None:
            dtype = torch.get_autocast_dtype(device_type)
            a, b = a.to(dtype), b.to(dtype)
        with torch.autocast(device_type, enabled=False):
            return grouped_gemm_op(
                a,
                b,
                groups,
                layout,
                alignment,
                c,
                out_dtype,
                a_scale,
                b_scale,
                a_block,
                b_block,
                scale_format,
                expected_m,
                backend,
            )

    return kernel


_lib.impl("grouped_gemm", _autocast_kernel("cpu"), "AutocastCPU")
_lib.impl("grouped_gemm", _autocast_kernel("cuda"), "AutocastCUDA")


# -- the user API's op path -------------------------------------------------------------------------------
def call(a, b, layout, *, out=None, out_dtype=None, c=None, backend=None) -> torch.Tensor:
    """:func:`moe_hal.grouped_gemm` through the custom ops (autograd, autocast, compiled graphs)."""
    if (
        isinstance(a, QuantizedTensor)
        and torch.is_grad_enabled()
        and any(t.requires_grad for t in (a.data, a.scale, getattr(b, "data", b), getattr(b, "scale", b)))
    ):
        raise GradientError(
            "a, b",
            "fp32/bf16/fp16 operands for a gradient",
            "fp8 QuantizedTensor operands that require grad (fp8 is forward only)",
        )
    data_a = a.data if isinstance(a, QuantizedTensor) else a
    groups, name, alignment, expected_m = layout_args(layout, data_a.device)
    ta, tb, fp8 = operand_args(a, b)
    if backend is not None and not isinstance(backend, str):
        backend = ",".join(backend)
    if name == "masked" and out is not None:
        if c is not None:
            raise LayoutError("c", "None (c is only used by K-grouped calls, not masked)", type(c).__name__)
        grouped_gemm_masked_out_op(ta, tb, groups, out, expected_m=expected_m, backend=backend, **fp8)
        return out
    result = grouped_gemm_op(
        ta, tb, groups, name, alignment, c, out_dtype, expected_m=expected_m, backend=backend, **fp8
    )
    if out is not None:
        if out.shape != result.shape:
            raise ShapeError("out", f"shape {tuple(result.shape)}", tuple(out.shape))
        if out.dtype != result.dtype:
            raise DTypeError("out", f"{result.dtype} (out_dtype)", out.dtype)
        return out.copy_(result)
    return result
