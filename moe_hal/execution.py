"""The checked path of one grouped-GEMM call: validate, select a backend, run it, check the result.

Both entry points run it: :func:`moe_hal.grouped_gemm` directly (no gradient, autocast or compiled
graph involved) and the eager kernels of the custom ops (:mod:`moe_hal.ops`), so the two paths
validate, select and check in exactly one place.
"""

from __future__ import annotations

import torch

from . import selection as _selection
from .backend import Backend
from .errors import BackendRunError, MoeHalError
from .problem import Problem

# Module-level bindings keep the per-call path to plain calls.
_build = Problem.build
_select = _selection.select


def run(a, b, layout, *, c=None, out=None, out_dtype=None, backend=None) -> torch.Tensor:
    """Validate one call (:meth:`Problem.build`), select its backend and run it, result checked.

    Raises what :func:`moe_hal.grouped_gemm` documents; ``out`` is untouched when validation or
    selection fails.
    """
    problem = _build(a, b, layout, c=c, out=out, out_dtype=out_dtype)
    return run_checked(_select(problem, backend).backend, problem, out)


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
