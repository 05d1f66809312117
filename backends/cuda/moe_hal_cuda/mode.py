"""Native or interpreted: the one switch of this package, read from the environment.

``MOE_HAL_CUDA_INTERPRET=1`` makes the ``cuda_sm90``/``cuda_sm100`` backends run their Triton
kernels under the Triton interpreter (numpy on the CPU), so that CI without a GPU runs every
kernel. Triton reads ``TRITON_INTERPRET`` when a ``@triton.jit`` function is *decorated*, and
``triton.language`` decorates its own helpers (``tl.zeros``, ``tl.max``, ...) when ``triton`` is
first imported (seen with triton 3.9: setting the variable after ``import triton`` leaves those
helpers compiled-only, and a kernel calling them fails in the interpreter). So
:func:`configure_triton` must run before anything imports ``triton``; :mod:`moe_hal_cuda.backend`
and :mod:`moe_hal_cuda.kernels` call it first thing, and :func:`interpreter_broken` tells when
someone imported triton too early. This module imports nothing but ``os``, ``sys`` and
:mod:`moe_hal.environment` (standard library only).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading

from moe_hal import environment

ENV_VAR = "MOE_HAL_CUDA_INTERPRET"


def interpreter_requested() -> bool:
    """True when ``MOE_HAL_CUDA_INTERPRET`` is a true boolean (``1``, ``true``, ``yes``, ``on``);
    a value that is no boolean raises :class:`moe_hal.errors.EnvironmentVariableError`."""
    return environment.flag(ENV_VAR)


def configure_triton() -> bool:
    """Set ``TRITON_INTERPRET=1`` when interpretation is requested; return whether Triton will
    interpret the kernels decorated from now on (also true when the user set ``TRITON_INTERPRET``
    directly)."""
    if interpreter_requested():
        os.environ["TRITON_INTERPRET"] = "1"
    return os.environ.get("TRITON_INTERPRET", "").strip() == "1"


def interpreter_broken() -> str | None:
    """Why the interpreter cannot run our kernels in this process, or None when it can.

    Checked only in interpreter mode: when ``triton`` was imported before ``TRITON_INTERPRET``
    was set, ``triton.language``'s own jit helpers are compiled-only functions.
    """
    if "triton" not in sys.modules:
        return None
    try:
        import triton.language as tl
        from triton.runtime.interpreter import InterpretedFunction
    except Exception as exc:  # noqa: BLE001 - any import failure means the interpreter is unusable
        return f"triton's interpreter cannot be imported: {type(exc).__name__}: {exc}"
    if not isinstance(tl.zeros, InterpretedFunction):
        return (
            "triton was imported before TRITON_INTERPRET=1 was set, so triton.language's helpers are not "
            "interpreted; set MOE_HAL_CUDA_INTERPRET=1 before anything imports triton"
        )
    return None


_interpreter_lock = threading.RLock()
_no_lock = contextlib.nullcontext()  # reusable: one object, not one per call


def exclusive_in_interpreter() -> contextlib.AbstractContextManager:
    """A context in which to launch kernels: in interpreter mode it holds a process-wide lock,
    because the Triton interpreter runs a launch by patching ``triton.language`` module globals and
    a global grid index (triton 3.9 ``runtime/interpreter.py``), so two threads launching at once
    corrupt each other (``InterpreterError``) — first use included. Natively it holds nothing."""
    kernels = sys.modules.get("moe_hal_cuda.kernels")  # once imported, its mode is fixed (and cheap to read)
    interpreted = kernels.INTERPRET if kernels is not None else configure_triton()
    return _interpreter_lock if interpreted else _no_lock
