"""The public grouped-GEMM entry points."""

from __future__ import annotations

import torch

from . import ops as _ops
from . import plugins
from . import selection as _select
from .backend import Backend, BackendSpec
from .device_layout import PsumLayout
from .errors import BackendRunError, BackendUnavailableError, MoeHalError, NoBackendError
from .problem import Operand, Problem
from .quant import QuantizedTensor
from .selection import Preference, Selection

# Module-level bindings keep the per-call path to two plain calls.
_build = Problem.build
_select_backend = _select.select
_is_compiling = torch.compiler.is_compiling
_is_grad_enabled = torch.is_grad_enabled
_is_autocast_enabled = torch.is_autocast_enabled
_PsumLayout = PsumLayout


def _needs_ops(a, b, layout, c) -> bool:
    """True when the call must go through the custom ops: inside a compiled graph, with a
    device-only layout, when a gradient is needed, or under autocast."""
    if _is_compiling() or type(layout) is _PsumLayout:
        return True
    if _is_grad_enabled() and (
        getattr(a, "requires_grad", False)
        or getattr(b, "requires_grad", False)
        or getattr(c, "requires_grad", False)
        or (type(a) is QuantizedTensor and (a.data.requires_grad or a.scale.requires_grad))
    ):
        return True
    # Operands of other types are refused later, by Problem.build.
    if not isinstance(a, (torch.Tensor, QuantizedTensor)):
        return False
    device_type = a.device.type
    has_autocast = _HAS_AUTOCAST.get(device_type)
    if has_autocast is None:
        has_autocast = _HAS_AUTOCAST[device_type] = torch.amp.is_autocast_available(device_type)
    return has_autocast and _is_autocast_enabled(device_type)


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
    ``torch.ops.moe_hal.*`` (:mod:`moe_hal.ops`); other calls run the backend directly. fp8
    operands are forward only (:class:`~moe_hal.errors.GradientError`).

    Raises a :mod:`moe_hal.errors` ``ArgumentError`` subclass for invalid input (``out`` is then
    untouched), :class:`~moe_hal.errors.BackendUnavailableError` when a named backend cannot run
    the call, :class:`~moe_hal.errors.NoBackendError` when no backend can, and
    :class:`~moe_hal.errors.BackendRunError` naming the backend when it fails while running
    (the original exception chained; ``out`` may then be partially written) or returns a result
    that breaks the output contract.
    """
    if _needs_ops(a, b, layout, c):
        return _ops.call(a, b, layout, out=out, out_dtype=out_dtype, c=c, backend=backend)
    problem = _build(a, b, layout, c=c, out=out, out_dtype=out_dtype)
    return run_checked(_select_backend(problem, backend).backend, problem, out)


def run_checked(backend: Backend, problem: Problem, out: torch.Tensor | None) -> torch.Tensor:
    """``backend.run(problem, out)`` with its result checked at constant cost: ``out`` itself when
    given, else a tensor of the problem's output shape, dtype and device. Errors the library
    defines pass through; any other exception from the backend becomes a
    :class:`~moe_hal.errors.BackendRunError` naming it, with the original chained."""
    try:
        result = backend.run(problem, out)
    except MoeHalError:
        raise
    except Exception as exc:
        raise BackendRunError(
            backend.name,
            f"failed while running {problem.summary()}: {type(exc).__name__}: {exc} (out may be partially written)",
        ) from exc
    if out is not None:
        if result is not out:
            raise BackendRunError(backend.name, f"returned {_describe(result)} instead of the out tensor it was given")
        return result
    if (
        not isinstance(result, torch.Tensor)
        or result.shape != problem.out_shape()
        or result.dtype != problem.out_dtype
        or result.device != problem.device
    ):
        raise BackendRunError(
            backend.name,
            f"returned {_describe(result)}; expected a tensor of shape "
            f"{problem.out_shape()}, dtype {problem.out_dtype}, on {problem.device}",
        )
    return result


def _describe(x: object) -> str:
    if isinstance(x, torch.Tensor):
        return f"a tensor of shape {tuple(x.shape)}, dtype {x.dtype}, on {x.device}"
    return f"a {type(x).__name__}"


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

    ``sel.name`` is the backend, ``sel.explain()`` says why each other backend was not used.
    Raises like :func:`grouped_gemm` when the call is invalid or no backend can run it.
    """
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
    backend can run the call (invalid arguments still raise)."""
    try:
        return select(a, b, layout, out=out, out_dtype=out_dtype, c=c, backend=backend).explain()
    except (BackendUnavailableError, NoBackendError) as exc:
        return str(exc)


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
