"""The public grouped-GEMM entry points."""

from __future__ import annotations

import torch

from . import execution as _execution
from . import ops as _ops
from . import plugins
from . import selection as _select
from .backend import Backend, BackendSpec
from .device_layout import PsumLayout
from .errors import BackendUnavailableError, NoBackendError
from .problem import Operand, Problem
from .quant import QuantizedTensor
from .selection import Preference, Selection

# Module-level bindings keep the per-call path to plain calls.
_run = _execution.run
_is_compiling = torch.compiler.is_compiling
_is_grad_enabled = torch.is_grad_enabled
_is_autocast_enabled = torch.is_autocast_enabled
_is_any_autocast_enabled = torch._C._is_any_autocast_enabled
_PsumLayout = PsumLayout


def _op_reason(a, b, layout, c) -> str | None:
    """Why the call goes through the custom ops ``torch.ops.moe_hal.*``, or None when it runs the
    checked path directly: inside a compiled graph, with a device-only layout, when a gradient is
    recorded, or under autocast. Both paths run the same validation, selection and backend call
    (:func:`moe_hal.execution.run`), so they give equal results."""
    if _is_compiling():
        return "inside a compiled graph"
    if type(layout) is _PsumLayout:
        return "a PsumLayout (device-only group bounds)"
    if _is_grad_enabled() and (
        getattr(a, "requires_grad", False)
        or getattr(b, "requires_grad", False)
        or getattr(c, "requires_grad", False)
        or (type(a) is QuantizedTensor and (a.data.requires_grad or a.scale.requires_grad))
        or (type(b) is QuantizedTensor and (b.data.requires_grad or b.scale.requires_grad))
    ):
        return "an operand requires grad (the gradient is recorded)"
    # Operands of other types are refused later, by Problem.build.
    if not _is_any_autocast_enabled() or not isinstance(a, (torch.Tensor, QuantizedTensor)):
        return None
    device_type = a.device.type
    has_autocast = _HAS_AUTOCAST.get(device_type)
    if has_autocast is None:
        has_autocast = _HAS_AUTOCAST[device_type] = torch.amp.is_autocast_available(device_type)
    if has_autocast and _is_autocast_enabled(device_type):
        return f"autocast is enabled for {device_type}"
    return None


def call_path(a: Operand, b: Operand, layout, *, c: torch.Tensor | None = None) -> str:
    """Which path :func:`grouped_gemm` takes for these arguments in the current state (grad mode,
    autocast, compiling), in words: the custom op and why, or the direct checked call."""
    reason = _op_reason(a, b, layout, c)
    if reason is None:
        return "direct call of the selected backend (no gradient recorded, no autocast, not compiling)"
    kind = "fp8" if type(a) is QuantizedTensor else getattr(layout, "op", "<layout>")
    return f"custom op torch.ops.moe_hal.grouped_gemm_{kind} ({reason})"


#: device type -> whether torch has autocast for it (asking a type without raises, e.g. "meta")
_HAS_AUTOCAST: dict[str, bool] = {}


def grouped_gemm(
    a: Operand,
    b: Operand,
    layout,
    *,
    out: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    c: torch.Tensor | None = None,
    backend: Preference = None,
) -> torch.Tensor:
    """Grouped GEMM for MoE layers: ``a @ b[g].T`` per group, on the best backend for the call.

    Layouts and shapes (``b`` follows nn.Linear: ``[G, N, K]``; a transposed view of ``[G, K, N]``
    works too — strides decide memory order):

    * :class:`~moe_hal.ContiguousLayout`: ``a[num_rows, K]`` -> ``out[num_rows, N]``. Every row of
      ``out`` is written; rows that belong to no group are zeros.
    * :class:`~moe_hal.MaskedLayout`: ``a[G, max_m, K]`` -> ``out[G, max_m, N]``. Rows
      ``r >= masked_m[g]`` of ``out[g]`` are never written (zeros when ``out`` is allocated here).
    * :class:`~moe_hal.KGroupedLayout`: ``a[T, M]``, ``b[T, N]`` -> ``out[G, M, N]`` with
      ``out[g] = c[g] + a[rows_g].T @ b[rows_g]`` (``c`` optional; ``out`` may be ``c`` itself).

    Operands are fp32, bf16 or fp16 tensors of one dtype, or two :class:`~moe_hal.QuantizedTensor`
    (fp8 e4m3 with logical fp32 block scales). ``out_dtype`` defaults to the operand dtype (bf16
    for fp8; ``c.dtype`` when ``c`` is given); fp32 is always accepted. ``backend`` forces a
    backend by name, or restricts the choice to a list in preference order (overrides
    ``MOE_HAL_BACKEND``). NaN and Inf are computed through, never rejected.

    Differentiable for fp32/bf16/fp16 operands, autocast-aware and ``torch.compile(fullgraph=True)``
    safe: those calls (and a :class:`~moe_hal.device_layout.PsumLayout`) go through the custom ops
    ``torch.ops.moe_hal.*`` (:mod:`moe_hal.ops`); other calls run the same checked path
    (:func:`moe_hal.execution.run`) directly, without the dispatcher. :func:`explain` ends with
    the path a call takes and why. fp8 operands are forward only
    (:class:`~moe_hal.errors.GradientError`). A contiguous-layout weight ``b`` with an fp32
    ``main_grad`` attribute gets its gradient accumulated there instead of ``b.grad``.

    Raises a :mod:`moe_hal.errors` ``ArgumentError`` subclass for invalid input (``out`` is then
    untouched), :class:`~moe_hal.errors.BackendUnavailableError` when a named backend cannot run
    the call, :class:`~moe_hal.errors.NoBackendError` when no backend can, and
    :class:`~moe_hal.errors.BackendRunError` naming the backend when it fails while running
    (the original exception chained; ``out`` may then be partially written) or returns a result
    that breaks the output contract.
    """
    if _op_reason(a, b, layout, c) is not None:
        return _ops.call(a, b, layout, out=out, out_dtype=out_dtype, c=c, backend=backend)
    return _run(a, b, layout, c=c, out=out, out_dtype=out_dtype, backend=backend)


def select(
    a: Operand,
    b: Operand,
    layout,
    *,
    out: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    c: torch.Tensor | None = None,
    backend: Preference = None,
) -> Selection:
    """The :class:`~moe_hal.selection.Selection` :func:`grouped_gemm` would use for these arguments.

    ``sel.name`` is the backend, ``sel.explain()`` says why each other backend was not used. A
    :class:`~moe_hal.PsumLayout` is read on the host here (one sync).
    Raises like :func:`grouped_gemm` when the call is invalid or no backend can run it.
    """
    if type(layout) is _PsumLayout:  # what the op's eager kernel rebuilds (reads the psum: one sync)
        layout = layout.to_host((a.data if isinstance(a, QuantizedTensor) else a).shape[0])
    return _select.select(Problem.build(a, b, layout, c=c, out=out, out_dtype=out_dtype), backend)


def explain(
    a: Operand,
    b: Operand,
    layout,
    *,
    out: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    c: torch.Tensor | None = None,
    backend: Preference = None,
) -> str:
    """Like ``select(...).explain()``, but returns the explanation instead of raising when no
    backend can run the call (invalid arguments still raise). Ends with the call path
    (:func:`call_path`: the custom op or the direct call, and why)."""
    path = f"\ncall path: {call_path(a, b, layout, c=c)}"
    try:
        return select(a, b, layout, out=out, out_dtype=out_dtype, c=c, backend=backend).explain() + path
    except (BackendUnavailableError, NoBackendError) as exc:
        return str(exc) + path


def backends() -> list[BackendSpec]:
    """Every registered backend spec (built-ins and plugins), sorted by name."""
    host = plugins.host().ensure_loaded()
    return [host.specs[n] for n in sorted(host.specs)]


def get_backend(name: str) -> Backend:
    """The backend instance registered as ``name``, to call directly (e.g. in conformance runs).

    Raises :class:`~moe_hal.errors.BackendUnavailableError` when it is unknown or fails to import.
    """
    host = plugins.host().ensure_loaded()
    if name not in host.specs:
        from .backend import Reason

        raise BackendUnavailableError(
            name, [Reason("unknown_backend", "no installed plugin provides this backend", set(host.specs), name)]
        )
    inst, err = host.backend(name)
    if inst is None:
        raise BackendUnavailableError(name, [err])
    return inst
