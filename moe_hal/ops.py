"""The ``torch.library`` custom ops behind :func:`moe_hal.grouped_gemm`, in the namespace ``moe_hal``.

    moe_hal.grouped_gemm(a, b, layout)  ──(autograd / autocast / torch.compile)──►
        torch.ops.moe_hal.grouped_gemm_contiguous(a, b, psum, alignment, ...)   functional, one op per
        torch.ops.moe_hal.grouped_gemm_masked(a, b, masked_m, expected_m, ...)  layout, differentiable
        torch.ops.moe_hal.grouped_gemm_k_grouped(a, b, psum, alignment, c, ...)
        torch.ops.moe_hal.grouped_gemm_fp8(a, b, groups, layout, ..., a_scale, ...)  fp8 operands, every layout
        torch.ops.moe_hal.grouped_gemm_masked_out(a, b, masked_m, out, ...)    writes out[g, :masked_m[g]]
        torch.ops.moe_hal.grouped_gemm_k_grouped_acc(a, b, psum, alignment, acc)  acc += K-grouped (main_grad)
    ──(eager kernel)──► host layout ─► moe_hal.execution.run (Problem.build ─► select ─► Backend.run)

Layouts are flattened into tensors, ints and strings: the int32 psum ``[G]`` (contiguous,
K-grouped) or ``masked_m`` ``[G]`` (masked), on the operands' device, plus the segment
alignment; row counts come from the operands. The differentiable ops are one per layout, so each
schema carries only the arguments its layout uses: the dispatcher converts every argument of a
schema at every call, given or not (bench/bench_op_overhead.py's ``floor``). fp8 operands travel as ``a``/``b``
(``float8_e4m3fn`` data) plus ``a_scale``/``b_scale`` (logical fp32 scales), ``a_block``/
``b_block`` and ``scale_format``, through an op of their own (``grouped_gemm_fp8``, forward
only, the layout named by its ``layout`` argument).

The fake (meta) kernels compute output shapes from operand shapes only, for every dtype the API
takes (fp32, bf16, fp16, fp8 data), so compiled graphs never read group sizes. The eager kernel
needs the host layout: :func:`call` hands over the layout it was given (:class:`_HandOff`); in
other calls (compiled graphs, backward products) a host layout's psum tensor tagged by
:func:`layout_args` gives it back without a read, and any other psum is read on the host once and
the rebuilt layout remembered for the tensor (see :func:`host_layout`).

Gradients (fp32/bf16/fp16; fp8 operands raise :class:`~moe_hal.errors.GradientError`), with
``psum``/``alignment`` shared by every product:

* contiguous ``y = a @ b[g].T`` per segment: ``da = contiguous(dy, b.transpose(1, 2))``,
  ``db = k_grouped(dy, a)``; rows of no group get zero ``da`` and add nothing to ``db``.
* masked: ``da = masked(dy, b.transpose(1, 2), masked_m)``; ``db[g] = dy[g, :m_g].T @ a[g, :m_g]``
  as one batched product of the operands with rows ``>= masked_m[g]`` zeroed on the device.
* K-grouped ``out[g] = c[g] + a_g.T @ b_g``: ``dc = dout``, ``da = contiguous(b, dout)``,
  ``db = contiguous(a, dout.transpose(1, 2))``.

A contiguous-layout weight ``b`` that requires grad and has a ``main_grad`` attribute (an fp32
tensor of ``b``'s shape, Megatron style) gets its gradient accumulated in place
(``main_grad += k_grouped(dy, a)`` through ``grouped_gemm_k_grouped_acc``, no bf16 rounding) and
``b.grad`` stays ``None``. :func:`call` reads the attribute and passes it as the contiguous op's
``main_grad`` argument, so compiled graphs see it too.

Importing this module registers the ops; :mod:`moe_hal.api` imports it, so ``import moe_hal``
alone still imports no torch.
"""

from __future__ import annotations

import functools
import threading
import weakref
from typing import Any

import torch

from . import execution as _execution
from .device_layout import PsumLayout
from .errors import ArgumentError, DeviceError, DTypeError, GradientError, LayoutError, ShapeError
from .identity_table import IdentityTable
from .layouts import ContiguousLayout, KGroupedLayout, MaskedLayout, SegmentLayout
from .problem import no_c
from .quant import QuantizedTensor

NAMESPACE = "moe_hal"
LAYOUTS = ("contiguous", "masked", "k_grouped")
_FP8_OUT = torch.bfloat16

_lib = torch.library.Library(NAMESPACE, "DEF")
#: layout name -> the schema of its differentiable op ``grouped_gemm_<layout>`` after the name
#: (bench/bench_op_overhead.py times no-op ops with them). Only what the layout uses: ``c`` on
#: K-grouped, ``expected_m`` on masked, ``main_grad`` on contiguous; no fp8 arguments. Tensors
#: come before ints, so a call with ``alignment=1`` leaves it out even when it gives ``c``.
SCHEMAS = {
    "contiguous": "(Tensor a, Tensor b, Tensor psum, int alignment=1, ScalarType? out_dtype=None, "
    "str? backend=None, Tensor? main_grad=None) -> Tensor",
    "masked": "(Tensor a, Tensor b, Tensor masked_m, int? expected_m=None, ScalarType? out_dtype=None, "
    "str? backend=None) -> Tensor",
    "k_grouped": "(Tensor a, Tensor b, Tensor psum, Tensor? c=None, int alignment=1, ScalarType? out_dtype=None, "
    "str? backend=None) -> Tensor",
}
for _layout, _schema in SCHEMAS.items():
    _lib.define(f"grouped_gemm_{_layout}{_schema}")
_OPERAND_ARGS = (
    'Tensor? a_scale=None, Tensor? b_scale=None, int[] a_block=[], int[] b_block=[], str scale_format="fp32"'
)
_lib.define(
    "grouped_gemm_fp8(Tensor a, Tensor b, Tensor groups, str layout, int alignment=1, Tensor? c=None, "
    f"ScalarType? out_dtype=None, int? expected_m=None, str? backend=None, {_OPERAND_ARGS}) -> Tensor"
)
_lib.define(
    "grouped_gemm_masked_out(Tensor a, Tensor b, Tensor masked_m, Tensor(a!) out, "
    f"{_OPERAND_ARGS}, int? expected_m=None, str? backend=None) -> ()"
)
_lib.define(
    "grouped_gemm_k_grouped_acc(Tensor a, Tensor b, Tensor psum, int alignment, Tensor(a!) acc, "
    "str? backend=None) -> ()"
)

grouped_gemm_contiguous_op = torch.ops.moe_hal.grouped_gemm_contiguous.default
grouped_gemm_masked_op = torch.ops.moe_hal.grouped_gemm_masked.default
grouped_gemm_k_grouped_op = torch.ops.moe_hal.grouped_gemm_k_grouped.default
#: layout name -> its differentiable op
OPS = {
    "contiguous": grouped_gemm_contiguous_op,
    "masked": grouped_gemm_masked_op,
    "k_grouped": grouped_gemm_k_grouped_op,
}
grouped_gemm_fp8_op = torch.ops.moe_hal.grouped_gemm_fp8.default
grouped_gemm_masked_out_op = torch.ops.moe_hal.grouped_gemm_masked_out.default
grouped_gemm_k_grouped_acc_op = torch.ops.moe_hal.grouped_gemm_k_grouped_acc.default

# Module-level bindings: the per-call path reads no module attribute chains.
_Tensor = torch.Tensor
_dtype = torch.dtype
_is_compiling = torch.compiler.is_compiling
_is_grad_enabled = torch.is_grad_enabled
_below_autograd = torch._C._AutoDispatchBelowAutograd
_AFTER_AUTOGRAD = torch._C._after_autograd_keyset
_run = _execution.run


def eager_entry(op: torch._ops.OpOverload) -> functools.partial:
    """``op``'s cheapest entry from Python for eager calls: the dispatcher's boxed call on the
    operator handle, without ``OpOverload.__call__``'s Python frame (and cheaper than
    ``OpOverload._op``). Dynamo traces the OpOverloads themselves."""
    return functools.partial(torch._C._dispatch_call_boxed, op._handle)


_contiguous_eager = eager_entry(grouped_gemm_contiguous_op)
_masked_eager = eager_entry(grouped_gemm_masked_op)
_k_grouped_eager = eager_entry(grouped_gemm_k_grouped_op)


# -- host layouts -------------------------------------------------------------------------------------
#: groups tensor -> memo (an :class:`~moe_hal.identity_table.IdentityTable`: dropped with the
#: tensor, never stored on it, so ``torch.save`` / ``torch.load(weights_only=True)`` of the tensor
#: never meet it): the host layouts known for the tensor's values, so the eager kernel reads a psum
#: on the host at most once per tensor (never for a host layout's own cached psum). Memo entries:
#: ``(op, alignment, num_rows) -> (tensor version, layout)`` for segment layouts — a host layout
#: held weakly (its device cache holds the tensor), layouts derived or rebuilt here strongly (they
#: do not reference the tensor); an in-place write bumps the version and voids them — and
#: ``"masked" -> weak reference`` to the MaskedLayout last flattened with the tensor (it holds no
#: values of the tensor, so no version check).
_memos = IdentityTable()

#: host layout object -> {device: flattened arguments} (see :func:`_flat_args`): layouts are
#: immutable, so a layout is flattened (and its group tensor tagged in :data:`_memos`) once per
#: device, not at every call. Dropped with the layout.
_flat = IdentityTable()
_flat_get = _flat.get


class _HandOff(threading.local):
    """``(groups, host layout)`` of the op call :func:`call` is making on this thread (None
    between calls): its eager kernel takes the caller's host layout from here when its ``groups``
    is that call's tensor, rather than looking the tensor up in :data:`_memos` — and so validates
    the operands against the very layout the caller passed. Calls the op receives from elsewhere
    (compiled graphs, backward products, direct op calls) find nothing here."""

    pending: tuple | None = None


_handoff = _HandOff()

_SEGMENT_CLASSES = {"contiguous": ContiguousLayout, "k_grouped": KGroupedLayout}
_OTHER_OP = {"contiguous": "k_grouped", "k_grouped": "contiguous"}


def _version(t: torch.Tensor) -> int:
    """``t``'s in-place version counter; -1 for an inference tensor, which has none."""
    try:
        return t._version
    except RuntimeError:  # "Inference tensors do not track version counter"
        return -1


def layout_args(layout, device: torch.device) -> tuple[torch.Tensor, str, int, int | None]:
    """``(groups, layout name, alignment, expected_m)`` of a layout object, groups on ``device``.

    Outside compiled graphs a host layout's group tensor is tagged with the layout, so the op's
    eager kernel recovers the host bounds without reading the tensor, also when the tensor later
    enters a compiled graph as an input."""
    return _flat_args(layout, device, _is_compiling())[:4]


def _flat_args(layout, device: torch.device, compiling: bool) -> tuple:
    """:func:`layout_args` plus whether ``layout`` is a host layout (False for a
    :class:`PsumLayout`). Cached per host layout and device outside compiled graphs
    (:data:`_flat`; the cached tuple must not hold the layout, which would keep it alive)."""
    if not compiling:
        per_device = _flat.get(layout)
        if per_device is not None:
            hit = per_device.get(device)
            if hit is not None:
                return hit
    if isinstance(layout, SegmentLayout):
        psum = layout.psum_on(device)
        flat = (psum, layout.op, layout.alignment, None, True)
        if not compiling:
            _memos.slot(psum)[(layout.op, layout.alignment, layout.num_rows)] = (_version(psum), weakref.ref(layout))
    elif isinstance(layout, MaskedLayout):
        flat = (layout.masked_m, "masked", 0, layout.expected_m, True)
        if not compiling:
            _memos.slot(layout.masked_m)["masked"] = weakref.ref(layout)
    elif isinstance(layout, PsumLayout):  # not cached: it is the flattened form already
        return layout.psum, layout.op, layout.alignment, None, False
    else:
        raise LayoutError(
            "layout", "a ContiguousLayout, MaskedLayout, KGroupedLayout or PsumLayout", type(layout).__name__
        )
    if not compiling:
        _flat.slot(layout)[device] = flat
    return flat


def host_layout(layout: str, groups: torch.Tensor, alignment: int, num_rows: int, expected_m: int | None):
    """The host layout object a backend takes for the op's flattened layout arguments: one known
    for ``groups`` (see :data:`_memos`) or derived from the one known for the other segment op, else
    one built from ``groups`` read on the host (one device sync), then remembered."""
    tags = _memos.get(groups)
    if layout == "masked":
        ref = tags.get("masked") if tags is not None else None
        known = ref() if ref is not None else None
        if known is not None and known.max_m == num_rows and known.expected_m == expected_m:
            return known
        return MaskedLayout(groups, num_rows, expected_m, check=False)
    cls = _SEGMENT_CLASSES.get(layout)
    if cls is None:
        raise LayoutError("layout", f"one of {LAYOUTS}", layout)
    version = _version(groups)
    lay = None
    if tags is not None:
        lay = _known(tags, (layout, alignment, num_rows), version)
        if lay is not None:
            return lay
        other = _known(tags, (_OTHER_OP[layout], alignment, num_rows), version)
        if other is not None:
            lay = cls(other.counts_list, other.starts, alignment, num_rows)
    if lay is None:
        lay = cls.from_psum(groups, alignment=alignment, num_rows=num_rows)
    if version >= 0:  # an inference tensor may change unseen: nothing is remembered for it
        (tags if tags is not None else _memos.new(groups))[(layout, alignment, num_rows)] = (version, lay)
    return lay


def _known(tags: dict, key: tuple, version: int):
    """The layout remembered under ``key`` while ``groups`` is at ``version``, else None."""
    hit = tags.get(key)
    if hit is None or hit[0] != version:
        return None
    return hit[1]() if type(hit[1]) is weakref.ref else hit[1]


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
    """``x`` as the API operand: a QuantizedTensor when it comes with a scale."""
    if scale is None:
        return x
    return QuantizedTensor(x, scale, tuple(block), fmt)


def _backend_arg(backend) -> str | None:
    """A backend preference (a name or names in order) as the ops' ``str? backend`` argument:
    names joined by commas (:func:`_backend` splits them again)."""
    return backend if backend is None or isinstance(backend, str) else ",".join(backend)


def _backend(backend: str | None):
    if backend is None or "," not in backend:
        return backend
    return tuple(backend.split(","))


# -- eager kernels --------------------------------------------------------------------------------------
# The differentiable ops' eager kernels; every eager call of them comes through here, so each
# has _host_layout_for inlined (one frame less per call) and _backend's None test too.
def _contiguous_kernel(a, b, psum, alignment=1, out_dtype=None, backend=None, main_grad=None):
    handed = _handoff.pending
    if handed is not None and handed[0] is psum:
        lay = handed[1]
    else:
        lay = host_layout("contiguous", psum, alignment, a.shape[0], None)
    return _run(a, b, lay, out_dtype=out_dtype, backend=None if backend is None else _backend(backend))


def _masked_kernel(a, b, masked_m, expected_m=None, out_dtype=None, backend=None):
    handed = _handoff.pending
    if handed is not None and handed[0] is masked_m:
        lay = handed[1]
    else:
        lay = host_layout("masked", masked_m, 0, a.shape[1], expected_m)
    return _run(a, b, lay, out_dtype=out_dtype, backend=None if backend is None else _backend(backend))


def _k_grouped_kernel(a, b, psum, c=None, alignment=1, out_dtype=None, backend=None):
    handed = _handoff.pending
    if handed is not None and handed[0] is psum:
        lay = handed[1]
    else:
        lay = host_layout("k_grouped", psum, alignment, a.shape[0], None)
    return _run(a, b, lay, c=c, out_dtype=out_dtype, backend=None if backend is None else _backend(backend))


#: layout name -> the eager kernel of its differentiable op
_KERNELS = {"contiguous": _contiguous_kernel, "masked": _masked_kernel, "k_grouped": _k_grouped_kernel}


def _grouped_gemm_fp8_kernel(
    a,
    b,
    groups,
    layout,
    alignment=1,
    c=None,
    out_dtype=None,
    expected_m=None,
    backend=None,
    a_scale=None,
    b_scale=None,
    a_block=(),
    b_block=(),
    scale_format="fp32",
):
    lay = _host_layout_for(layout, groups, alignment, a, expected_m)
    qa = _operand(a, a_scale, a_block, scale_format)
    return _run(
        qa, _operand(b, b_scale, b_block, scale_format), lay, c=c, out_dtype=out_dtype, backend=_backend(backend)
    )


def _host_layout_for(layout: str, groups: torch.Tensor, alignment: int, a: torch.Tensor, expected_m: int | None):
    """The host layout :func:`call` handed over for ``groups`` (see :class:`_HandOff`), else
    :func:`host_layout`'s for operand ``a``."""
    handed = _handoff.pending
    if handed is not None and handed[0] is groups:
        return handed[1]
    return host_layout(layout, groups, alignment, a.shape[1] if layout == "masked" else a.shape[0], expected_m)


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
    lay = _host_layout_for("masked", masked_m, 0, a, expected_m)
    if a_scale is not None:
        a, b = _operand(a, a_scale, a_block, scale_format), _operand(b, b_scale, b_block, scale_format)
    _run(a, b, lay, out=out, backend=_backend(backend))


def _k_grouped_acc_kernel(a, b, psum, alignment, acc, backend=None):
    lay = host_layout("k_grouped", psum, alignment, a.shape[0], None)
    _run(a, b, lay, c=acc, out=acc, backend=_backend(backend))


for _layout, _kernel in _KERNELS.items():
    _lib.impl(f"grouped_gemm_{_layout}", _kernel, "CompositeExplicitAutograd")
_lib.impl("grouped_gemm_fp8", _grouped_gemm_fp8_kernel, "CompositeExplicitAutograd")
_lib.impl("grouped_gemm_masked_out", _masked_out_kernel, "CompositeExplicitAutograd")
_lib.impl("grouped_gemm_k_grouped_acc", _k_grouped_acc_kernel, "CompositeExplicitAutograd")


# -- fake kernels ---------------------------------------------------------------------------------------
def _empty_result(a, b, groups, layout: str, dtype: torch.dtype) -> torch.Tensor:
    """An empty tensor of the op's output shape (from operand shapes alone) and ``dtype``."""
    if layout == "contiguous":
        shape = (a.shape[0], b.shape[1])
    elif layout == "masked":
        shape = (a.shape[0], a.shape[1], b.shape[1])
    elif layout == "k_grouped":
        shape = (groups.shape[0], a.shape[1], b.shape[1])
    else:
        raise LayoutError("layout", f"one of {LAYOUTS}", layout)
    return a.new_empty(shape, dtype=dtype)


@torch.library.register_fake("moe_hal::grouped_gemm_contiguous", lib=_lib)
def _contiguous_fake(a, b, psum, alignment=1, out_dtype=None, backend=None, main_grad=None):
    return _empty_result(a, b, psum, "contiguous", a.dtype if out_dtype is None else out_dtype)


@torch.library.register_fake("moe_hal::grouped_gemm_masked", lib=_lib)
def _masked_fake(a, b, masked_m, expected_m=None, out_dtype=None, backend=None):
    return _empty_result(a, b, masked_m, "masked", a.dtype if out_dtype is None else out_dtype)


@torch.library.register_fake("moe_hal::grouped_gemm_k_grouped", lib=_lib)
def _k_grouped_fake(a, b, psum, c=None, alignment=1, out_dtype=None, backend=None):
    # out_dtype, else c's, else the operands'
    dtype = out_dtype if out_dtype is not None else c.dtype if c is not None else a.dtype
    return _empty_result(a, b, psum, "k_grouped", dtype)


@torch.library.register_fake("moe_hal::grouped_gemm_fp8", lib=_lib)
def _grouped_gemm_fp8_fake(
    a,
    b,
    groups,
    layout,
    alignment=1,
    c=None,
    out_dtype=None,
    expected_m=None,
    backend=None,
    a_scale=None,
    b_scale=None,
    a_block=(),
    b_block=(),
    scale_format="fp32",
):
    # out_dtype, else c's, else bf16
    dtype = out_dtype if out_dtype is not None else c.dtype if c is not None else _FP8_OUT
    return _empty_result(a, b, groups, layout, dtype)


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


@torch.library.register_fake("moe_hal::grouped_gemm_k_grouped_acc", lib=_lib)
def _k_grouped_acc_fake(a, b, psum, alignment, acc, backend=None):
    return None


# -- autograd -------------------------------------------------------------------------------------------
# A hand-written Autograd kernel rather than torch.library.register_autograd's generic one, which
# flattens, re-fills and redispatches every argument per call. Where the next dispatch key is a
# plain device (eager tensors, no tracing mode or subclass) it calls the eager kernel the
# dispatcher would pick (CompositeExplicitAutograd) directly instead of redispatching — the same
# function, one Python crossing less; anything else (fake/functional tensors, dispatch modes)
# redispatches.
_EAGER_KEYS = frozenset(
    getattr(torch._C.DispatchKey, k) for k in ("CPU", "CUDA", "PrivateUse1", "XPU") if hasattr(torch._C.DispatchKey, k)
)
#: keyset.raw_repr() -> whether the next key below autograd is in _EAGER_KEYS (a DispatchKey hashes
#: slowly through pybind11; a keyset's raw int is a plain dict key).
_eager_keysets: dict[int, bool] = {}


def _below(keyset, layout: str, args: tuple) -> torch.Tensor:
    """The op of ``layout`` below autograd for ``args``: its eager kernel directly on plain
    devices, else a redispatch. Callers hold no gradient-recording state (autograd.Function.forward,
    or nothing requires grad)."""
    raw = keyset.raw_repr()
    eager = _eager_keysets.get(raw)
    if eager is None:
        eager = _eager_keysets[raw] = (keyset & _AFTER_AUTOGRAD).highestPriorityTypeId() in _EAGER_KEYS
    if eager:
        return _KERNELS[layout](*args)
    with _below_autograd():
        return OPS[layout].redispatch(keyset & _AFTER_AUTOGRAD, *args)


# The Autograd kernels, one per op: the dispatcher leaves trailing arguments equal to their
# defaults out of the call, the signatures fill them in. requires_grad is read as an attribute of
# each operand (cheaper than torch._C._any_requires_grad); the last two lines are _below's eager
# test inlined, as every call that records no gradient takes them.
def _contiguous_autograd(keyset, a, b, psum, alignment=1, out_dtype=None, backend=None, main_grad=None):
    if _is_grad_enabled() and (a.requires_grad or b.requires_grad):
        return _GroupedGemmFunction.apply(keyset, "contiguous", a, b, psum, alignment, out_dtype, backend, main_grad)
    if _eager_keysets.get(keyset.raw_repr()):
        return _contiguous_kernel(a, b, psum, alignment, out_dtype, backend)
    return _below(keyset, "contiguous", (a, b, psum, alignment, out_dtype, backend, main_grad))


def _masked_autograd(keyset, a, b, masked_m, expected_m=None, out_dtype=None, backend=None):
    if _is_grad_enabled() and (a.requires_grad or b.requires_grad):
        return _GroupedGemmFunction.apply(keyset, "masked", a, b, masked_m, expected_m, out_dtype, backend)
    if _eager_keysets.get(keyset.raw_repr()):
        return _masked_kernel(a, b, masked_m, expected_m, out_dtype, backend)
    return _below(keyset, "masked", (a, b, masked_m, expected_m, out_dtype, backend))


def _k_grouped_autograd(keyset, a, b, psum, c=None, alignment=1, out_dtype=None, backend=None):
    if _is_grad_enabled() and (a.requires_grad or b.requires_grad or (c is not None and c.requires_grad)):
        return _GroupedGemmFunction.apply(keyset, "k_grouped", a, b, psum, c, alignment, out_dtype, backend)
    if _eager_keysets.get(keyset.raw_repr()):
        return _k_grouped_kernel(a, b, psum, c, alignment, out_dtype, backend)
    return _below(keyset, "k_grouped", (a, b, psum, c, alignment, out_dtype, backend))


class _GroupedGemmFunction(torch.autograd.Function):
    """The gradient of ``torch.ops.moe_hal.grouped_gemm_<layout>`` (formulas in the module
    docstring). Inputs: the keyset, the layout name, then the op's arguments in schema order,
    every one given (``a``, ``b``, ``groups`` first)."""

    @staticmethod
    def forward(ctx, keyset, layout, *args):
        result = _below(keyset, layout, args)
        a, b, groups = args[:3]
        main_grad = None
        if layout == "contiguous":
            alignment, _, backend, main_grad = args[3:]
        elif layout == "masked":
            alignment, backend = 0, args[5]
        else:
            alignment, backend = args[4], args[6]
        ctx.layout, ctx.alignment, ctx.num_args = layout, alignment, len(args)
        ctx.backend = backend  # the gradient products run where the forward did
        ctx.has_main_grad = main_grad is not None
        ctx.save_for_backward(a, b, groups, main_grad)
        return result

    @staticmethod
    def backward(ctx, grad):
        return (None, None, *_backward(ctx, grad))


def _grad_input(grad: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The incoming gradient as a dense operand of the forward's operand dtype (a zero-stride
    gradient, as from ``y.sum().backward()``, is materialised)."""
    return grad.to(dtype).contiguous()


def _backward(ctx, grad) -> tuple:
    """Gradients for the op's arguments (``a``, ``b`` and K-grouped's ``c`` only)."""
    a, b, groups, main_grad = ctx.saved_tensors
    need_a, need_b = ctx.needs_input_grad[2], ctx.needs_input_grad[3]
    da = db = None
    grads = [None] * ctx.num_args
    op, align, backend = ctx.layout, ctx.alignment, ctx.backend
    if op == "contiguous":
        dy = _grad_input(grad, a.dtype)
        if need_a:
            da = grouped_gemm_contiguous_op(dy, b.transpose(1, 2), groups, align, None, backend)
        if need_b and ctx.has_main_grad:  # b's gradient goes into main_grad, in fp32; b.grad stays None
            grouped_gemm_k_grouped_acc_op(dy, a, groups, align, main_grad, backend)
        elif need_b:
            db = grouped_gemm_k_grouped_op(dy, a, groups, None, align, None, backend)
    elif op == "masked":
        dy = _grad_input(grad, a.dtype)
        if need_a:
            da = grouped_gemm_masked_op(dy, b.transpose(1, 2), groups, None, None, backend)
        if need_b:
            rows = torch.arange(a.shape[1], device=a.device)
            valid = (rows[None, :] < groups[:, None])[..., None]  # [G, max_m, 1], no sync
            zero = a.new_zeros(())
            db = torch.bmm(torch.where(valid, dy, zero).transpose(1, 2), torch.where(valid, a, zero))
    else:
        dout = _grad_input(grad, a.dtype)
        if need_a:
            da = grouped_gemm_contiguous_op(b, dout, groups, align, None, backend)
        if need_b:
            db = grouped_gemm_contiguous_op(a, dout.transpose(1, 2), groups, align, None, backend)
        if ctx.needs_input_grad[5]:  # c (None when not given: no gradient asked)
            grads[3] = grad
    grads[0], grads[1] = da, db
    return tuple(grads)


_lib.impl("grouped_gemm_contiguous", _contiguous_autograd, "Autograd", with_keyset=True)
_lib.impl("grouped_gemm_masked", _masked_autograd, "Autograd", with_keyset=True)
_lib.impl("grouped_gemm_k_grouped", _k_grouped_autograd, "Autograd", with_keyset=True)


# fp8 is forward only: a gradient requested through grouped_gemm_fp8 (its scales, or c) raises in
# backward. The generic kernel is fine here: moe_hal.grouped_gemm refuses fp8 operands that
# require grad before the op, so it only ever records through direct op calls.
def _fp8_setup_context(ctx, inputs, output) -> None:
    """Nothing to save: the backward only raises."""


def _fp8_backward(ctx, grad):
    raise GradientError("a, b", "fp32/bf16/fp16 operands for a gradient", "fp8 QuantizedTensor operands (forward only)")


torch.library.register_autograd("moe_hal::grouped_gemm_fp8", _fp8_backward, setup_context=_fp8_setup_context, lib=_lib)


# -- autocast -------------------------------------------------------------------------------------------
# fp32/fp16 operands are cast to the autocast dtype; c and the fp8 op (no autocast kernel: the key
# falls through) are left alone.
def _autocast_kernel(device_type: str, op):
    def kernel(a, b, *args):
        dtype = torch.get_autocast_dtype(device_type)
        with torch.autocast(device_type, enabled=False):
            return op(a.to(dtype), b.to(dtype), *args)

    return kernel


for _layout, _op in OPS.items():
    _lib.impl(f"grouped_gemm_{_layout}", _autocast_kernel("cpu", _op), "AutocastCPU")
    _lib.impl(f"grouped_gemm_{_layout}", _autocast_kernel("cuda", _op), "AutocastCUDA")


# -- the user API's op path -------------------------------------------------------------------------------
def call(a, b, layout, *, out=None, out_dtype=None, c=None, backend=None) -> torch.Tensor:
    """:func:`moe_hal.grouped_gemm` through the custom ops (autograd, autocast, compiled graphs).

    A contiguous-layout weight ``b`` that requires grad and has a ``main_grad`` attribute passes
    it to the op, which accumulates ``b``'s gradient there (eager and compiled)."""
    # plain tensors first: the QuantizedTensor test runs only for operands that are not tensors
    if not (
        isinstance(a, _Tensor)
        and isinstance(b, _Tensor)
        and (c is None or isinstance(c, _Tensor))
        and (out_dtype is None or isinstance(out_dtype, _dtype))
    ):
        if isinstance(a, QuantizedTensor) and isinstance(b, QuantizedTensor):
            return _call_fp8(a, b, layout, out, out_dtype, c, _backend_arg(backend))
        # the op's schema would refuse these untyped: the checked path names the argument
        return _run(a, b, layout, c=c, out=out, out_dtype=out_dtype, backend=backend)
    if backend is not None:
        backend = _backend_arg(backend)
    compiling = _is_compiling()
    if compiling:
        groups, name, alignment, expected_m, _ = _flat_args(layout, a.device, True)
        hand_off = False
    else:  # _flat_args's cache hit inlined (one frame less per call)
        device = a.device
        per_device = _flat_get(layout)
        flat = None if per_device is None else per_device.get(device)
        if flat is None:
            flat = _flat_args(layout, device, False)
        groups, name, alignment, expected_m, hand_off = flat  # hand a host layout over
    if out is not None and name == "masked":
        return _masked_out(layout, hand_off, a, b, groups, out, c, expected_m, backend, {})
    # each op's arguments with trailing defaults left out: every argument given costs the
    # dispatcher a conversion
    if name == "contiguous":
        if c is not None:  # only K-grouped's op takes c
            no_c(c, name)
        op = grouped_gemm_contiguous_op if compiling else _contiguous_eager
        main_grad = None
        if b.requires_grad:  # main_grad matters only to a recorded gradient
            main_grad = getattr(b, "main_grad", None)
            if main_grad is not None:
                _check_main_grad(main_grad, b)
        if out_dtype is None and backend is None and main_grad is None:
            args = (a, b, groups) if alignment == 1 else (a, b, groups, alignment)
        else:
            args = (a, b, groups, alignment, out_dtype, backend, main_grad)
    elif name == "masked":
        if c is not None:
            no_c(c, name)
        op = grouped_gemm_masked_op if compiling else _masked_eager
        if expected_m is None and out_dtype is None and backend is None:
            args = (a, b, groups)
        else:
            args = (a, b, groups, expected_m, out_dtype, backend)
    else:
        op = grouped_gemm_k_grouped_op if compiling else _k_grouped_eager
        if out_dtype is None and backend is None and alignment == 1:
            args = (a, b, groups) if c is None else (a, b, groups, c)
        else:
            args = (a, b, groups, c, alignment, out_dtype, backend)
    if not hand_off:
        result = op(*args)
    else:  # _handing_off inlined: its frame and argument packing would add to every call
        _handoff.pending = (groups, layout)
        try:
            result = op(*args)
        finally:
            _handoff.pending = None
    return result if out is None else _into_out(result, out)


def _call_fp8(a: QuantizedTensor, b: QuantizedTensor, layout, out, out_dtype, c, backend) -> torch.Tensor:
    """:func:`call` for fp8 operands (forward only)."""
    parts = (a.data, a.scale, b.data, b.scale)
    if _is_grad_enabled() and any(t.requires_grad for t in parts):
        raise GradientError(
            "a, b",
            "fp32/bf16/fp16 operands for a gradient",
            "fp8 QuantizedTensor operands that require grad (fp8 is forward only)",
        )
    compiling = _is_compiling()
    groups, name, alignment, expected_m, host = _flat_args(layout, a.data.device, compiling)
    hand_off = host and not compiling
    ta, tb, fp8 = operand_args(a, b)
    if name == "masked" and out is not None:
        return _masked_out(layout, hand_off, ta, tb, groups, out, c, expected_m, backend, fp8)
    result = _handing_off(
        hand_off,
        groups,
        layout,
        grouped_gemm_fp8_op,
        ta,
        tb,
        groups,
        name,
        alignment,
        c,
        out_dtype,
        expected_m,
        backend,
        **fp8,
    )
    return _into_out(result, out)


def _masked_out(layout, hand_off: bool, a, b, masked_m, out, c, expected_m, backend, fp8: dict) -> torch.Tensor:
    """The masked op writing ``out``; with ``hand_off``, ``layout`` is handed to its kernel as in
    :func:`call`."""
    no_c(c, "masked")
    _handing_off(
        hand_off,
        masked_m,
        layout,
        grouped_gemm_masked_out_op,
        a,
        b,
        masked_m,
        out,
        expected_m=expected_m,
        backend=backend,
        **fp8,
    )
    return out


def _handing_off(hand_off: bool, groups: torch.Tensor, layout, op, *args, **kwargs):
    """``op(*args, **kwargs)``, with ``layout`` handed to its eager kernel for ``groups`` during the
    call when ``hand_off`` (see :class:`_HandOff`)."""
    if not hand_off:
        return op(*args, **kwargs)
    _handoff.pending = (groups, layout)
    try:
        return op(*args, **kwargs)
    finally:
        _handoff.pending = None


def _into_out(result: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """``result``, or ``out`` holding it (checked first: ``out`` is untouched when it does not fit)."""
    if out is None:
        return result
    if out.shape != result.shape:
        raise ShapeError("out", f"shape {tuple(result.shape)}", tuple(out.shape))
    if out.dtype != result.dtype:
        raise DTypeError("out", f"{result.dtype} (out_dtype)", out.dtype)
    return out.copy_(result)


def _check_main_grad(main_grad, b) -> None:
    """``main_grad`` must be an fp32 tensor of ``b``'s shape on ``b``'s device."""
    if not isinstance(main_grad, torch.Tensor):
        raise ArgumentError("b.main_grad", "None or an fp32 tensor of b's shape", type(main_grad).__name__)
    if main_grad.dtype != torch.float32:
        raise DTypeError("b.main_grad", "torch.float32", main_grad.dtype)
    if main_grad.shape != b.shape:
        raise ShapeError("b.main_grad", f"shape {tuple(b.shape)} (that of b)", tuple(main_grad.shape))
    if main_grad.device != b.device:
        raise DeviceError("b.main_grad", f"device {b.device} (that of b)", main_grad.device)
