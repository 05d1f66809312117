"""The one indirection between the backends and torch_npu, and why torch_npu may be unusable.

:func:`ops_for` returns the object the backends call ``npu_grouped_matmul`` / ``npu_format_cast``
on: the real ``torch_npu`` module for NPU tensors, :mod:`moe_hal_ascend.emulator` (same names,
same signatures) for CPU tensors in emulation mode. The backend code after that point is the same,
so tests through the emulator run exactly the code that would run on an NPU.

torch_npu is imported here, lazily, on first need — never when the plugin is discovered. Its
import can fail in several distinct ways (the plugin's README, "The autoload trap"), each reported by
:func:`availability` with its own stable code:

=====================  =====================================================================
``torch_npu_missing``  torch_npu is not installed.
``cann_missing``       torch_npu is installed but the CANN toolkit is not (its import fails to
                       load ``libhccl.so``, ``libascendcl.so``, ...; ``source set_env.sh``).
``torch_npu_broken``   any other import failure (version mismatch with torch, a second
                       accelerator in the process, a broken install).
``npu_op_missing``     torch_npu imports but lacks ``npu_grouped_matmul`` (too old).
``npu_device_missing`` torch_npu and CANN work but no NPU is visible (driver, container,
                       ``ASCEND_RT_VISIBLE_DEVICES``).
=====================  =====================================================================

The answer is cached per process (an import is attempted once); :func:`forget` drops it (tests).
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
import threading
from types import ModuleType
from typing import Any

from moe_hal.plugin_api import Reason

#: Shared libraries of the CANN toolkit whose absence means "CANN is not installed / not sourced".
_CANN_LIBRARY = re.compile(
    r"lib(hccl|ascendcl|acl_[a-z_]+|ge_runner|graph|runtime|opapi|nnopbase|msprof\w*|tsdclient|"
    r"c_sec|ascend_hal|platform|register|error_manager|ascend_protobuf)\.so",
    re.IGNORECASE,
)
_CANN_HINTS = ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME", "set_env.sh", "ascend-toolkit")

_lock = threading.Lock()
_state: dict[str, Any] = {}


def forget() -> None:
    """Drop the cached import result so the next query imports torch_npu again (tests)."""
    with _lock:
        _state.clear()


def _chain(exc: BaseException) -> str:
    """The messages of ``exc`` and of the exceptions it was raised from."""
    parts, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        parts.append(f"{type(exc).__name__}: {exc}")
        exc = exc.__cause__ or exc.__context__
    return " <- ".join(parts)


def classify_import_error(exc: BaseException) -> Reason:
    """The :class:`~moe_hal.Reason` for a failed ``import torch_npu``."""
    text = _chain(exc)
    if isinstance(exc, ModuleNotFoundError) and (exc.name or "").split(".")[0] == "torch_npu":
        return Reason(
            "torch_npu_missing",
            "torch_npu is not installed; install it with "
            "`pip install moe-hal-ascend[npu]` or the wheel matching your torch and CANN",
            "an importable torch_npu",
            text,
        )
    if _CANN_LIBRARY.search(text) or any(h in text for h in _CANN_HINTS):
        return Reason(
            "cann_missing",
            "torch_npu is installed but the CANN toolkit is not found "
            "(install CANN and `source <ascend-toolkit>/set_env.sh`; on machines without "
            "CANN set TORCH_DEVICE_BACKEND_AUTOLOAD=0 so that `import torch` keeps working)",
            "CANN shared libraries (libhccl.so, libascendcl.so) on the loader path",
            text,
        )
    return Reason("torch_npu_broken", "importing torch_npu failed", "an importable torch_npu", text)


def _import() -> tuple[ModuleType | None, Reason | None]:
    with _lock:
        if "module" not in _state:
            try:
                module, err = importlib.import_module("torch_npu"), None
            except BaseException as exc:  # noqa: BLE001 - torch_npu raises OSError, RuntimeError, ...
                if isinstance(exc, KeyboardInterrupt):
                    raise
                module, err = None, classify_import_error(exc)
            _state["module"], _state["error"] = module, err
        return _state["module"], _state["error"]


def torch_npu() -> ModuleType:
    """The imported torch_npu module; raises RuntimeError with the reason when it cannot be used."""
    module, err = _import()
    if module is None:
        raise RuntimeError(f"torch_npu is unusable: {err}")
    return module


def installed() -> list[Reason]:
    """Whether torch_npu is installed at all, found without importing it (``find_spec``)."""
    if sys.modules.get("torch_npu") is not None:
        return []
    try:
        spec = importlib.util.find_spec("torch_npu")
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return [
            Reason(
                "torch_npu_missing",
                "torch_npu is not installed; install it with "
                "`pip install moe-hal-ascend[npu]` or the wheel matching your torch and CANN",
                "an importable torch_npu",
                "no torch_npu module on sys.path",
            )
        ]
    return []


def availability() -> list[Reason]:
    """Why the real torch_npu stack cannot run grouped matmuls here (empty: it can)."""
    module, err = _import()
    if module is None:
        return [err]
    if not callable(getattr(module, "npu_grouped_matmul", None)):
        return [
            Reason(
                "npu_op_missing",
                "this torch_npu has no npu_grouped_matmul",
                "torch_npu with npu_grouped_matmul (2.1 or newer)",
                getattr(module, "__version__", "?"),
            )
        ]
    try:
        import torch

        count = int(torch.npu.device_count()) if torch.npu.is_available() else 0
    except Exception as exc:  # noqa: BLE001 - a broken driver raises from inside the probe
        return [Reason("npu_device_missing", "torch_npu cannot query NPU devices", "at least one NPU", _chain(exc))]
    if count == 0:
        return [
            Reason(
                "npu_device_missing",
                "torch_npu imports but sees no NPU (driver, container device mapping or ASCEND_RT_VISIBLE_DEVICES)",
                "at least one NPU",
                0,
            )
        ]
    return []


def ops_for(device: Any) -> ModuleType:
    """The torch_npu-shaped operator namespace for tensors on ``device``: the emulator for
    ``cpu`` (emulation mode), the real torch_npu for ``npu``."""
    if getattr(device, "type", device) == "cpu":
        from . import emulator

        return emulator
    return torch_npu()
