"""Calling the real DeepGEMM when it can run the call itself (``passthrough`` setting).

``"auto"`` (default): when a genuine ``deep_gemm`` package is importable and the call's tensors
live on a CUDA device of compute capability 9.x or 10.x, the shim hands the call, arguments
untouched, to DeepGEMM's function of the same name: no layout work is added. ``"never"``: always
run through moe_hal. ``"always"``: require DeepGEMM (a DeepGEMMError when it cannot run the call).

The real package is found on ``sys.path`` even after :func:`~moe_hal.compat.deep_gemm.install` has
pointed ``import deep_gemm`` at the shim.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import threading
from types import ModuleType

import torch

_lock = threading.Lock()
_real: list[ModuleType | None] = []  # [] not looked up yet; [None] not importable


def _is_shim(module: object) -> bool:
    return getattr(module, "__moe_hal_shim__", False)


def real_module() -> ModuleType | None:
    """The genuine ``deep_gemm`` module, imported on first use; None when it is not installed or
    fails to import (for instance without a CUDA toolkit)."""
    with _lock:
        if _real:
            return _real[0]
        found = None
        loaded = sys.modules.get("deep_gemm")
        if loaded is not None and not _is_shim(loaded):
            found = loaded
        else:
            spec = importlib.machinery.PathFinder.find_spec("deep_gemm")
            if spec is not None and spec.loader is not None:
                saved = {n: m for n, m in sys.modules.items() if n == "deep_gemm" or n.startswith("deep_gemm.")}
                for name in saved:
                    del sys.modules[name]
                try:
                    module = importlib.util.module_from_spec(spec)
                    sys.modules["deep_gemm"] = module
                    spec.loader.exec_module(module)
                    found = module
                except Exception:  # noqa: BLE001 - a broken or CUDA-less install: the shim runs the call instead
                    found = None
                finally:
                    for name in [n for n in sys.modules if n == "deep_gemm" or n.startswith("deep_gemm.")]:
                        del sys.modules[name]
                    sys.modules.update(saved)
        _real.append(found)
        return found


def forget() -> None:
    """Look the real package up again on next use (tests, or after installing it)."""
    with _lock:
        _real.clear()


def first_tensor(args: tuple, kwargs: dict) -> torch.Tensor | None:
    for value in list(args) + list(kwargs.values()):
        if isinstance(value, torch.Tensor):
            return value
        if isinstance(value, (tuple, list)) and value and isinstance(value[0], torch.Tensor):
            return value[0]
    return None


def device_arch_major(tensor: torch.Tensor | None) -> int | None:
    """Compute-capability major of the CUDA device ``tensor`` lives on when it is 9 or 10, else None."""
    if tensor is None or tensor.device.type != "cuda":
        return None
    major = torch.cuda.get_device_capability(tensor.device)[0]
    return major if major in (9, 10) else None
