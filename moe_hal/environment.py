"""A snapshot of what moe_hal sees: versions, devices, plugins, backends and environment variables.

Used by ``moe-hal info`` and by reports (conformance, benchmarks) so that results from different
machines can be compared with what produced them.
"""

from __future__ import annotations

import importlib.metadata as metadata
import os
import platform
import sys
from typing import Any

#: Environment variables the core and the bundled plugins read.
KNOWN_ENV_VARS = {
    "MOE_HAL_BACKEND": "force one backend, or a comma list in preference order",
    "MOE_HAL_DISABLE_BACKENDS": "comma list of backends never to use",
    "MOE_HAL_PLUGINS": "unset: load every plugin; empty: none; comma list: only those entry points",
    "MOE_HAL_STRICT_PLUGINS": "1: a plugin that fails to load raises instead of being skipped",
    "MOE_HAL_TRACE_PLUGINS": "1: print plugin loading and hook calls to stderr",
    "MOE_HAL_HWDB": "extra hardware-DB YAML files or directories (os.pathsep separated)",
    "MOE_HAL_PREPARED_MAX_BYTES": "byte budget of the prepared-weight cache",
    "MOE_HAL_CUDA_INTERPRET": "1: run the CUDA backends' Triton kernels in the interpreter on the CPU",
    "MOE_HAL_ASCEND_EMULATE": "1 or a SoC name (e.g. Ascend950PR_9579): run the Ascend backends on the CPU "
                              "emulator of torch_npu (only when named)",
    "MOE_HAL_ASCEND_SOC": "SoC the Ascend emulator pretends to be",
    "MOE_HAL_ASCEND_WEIGHT_FORMAT": "nd (default) or nz: cast bf16/fp16 weights to FRACTAL_NZ once on Ascend",
}
#: Non-moe_hal variables that change how moe_hal behaves.
RELATED_ENV_VARS = ("TRITON_INTERPRET", "TORCH_DEVICE_BACKEND_AUTOLOAD", "CUDA_VISIBLE_DEVICES",
                    "ASCEND_RT_VISIBLE_DEVICES")


def env_vars() -> dict[str, dict[str, Any]]:
    """Every ``MOE_HAL_*`` variable set (flagging unknown names, likely typos) plus related ones."""
    out = {}
    for name in sorted(os.environ):
        if name.startswith("MOE_HAL_") or name in RELATED_ENV_VARS:
            known = name in KNOWN_ENV_VARS or name in RELATED_ENV_VARS
            out[name] = {"value": os.environ[name], "known": known,
                         "meaning": KNOWN_ENV_VARS.get(name, "" if known else "unknown: typo?")}
    return out


def versions() -> dict[str, str]:
    """Versions of Python, moe_hal and the libraries that decide results."""
    out = {"python": platform.python_version(), "platform": platform.platform()}
    for dist in ("moe-hal", "torch", "triton", "torch_npu", "cuda-python", "cuda-bindings", "deep_gemm", "pluggy"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    if "torch" in sys.modules or "torch" in out:
        import torch

        out["torch.version.cuda"] = str(torch.version.cuda)
    return out


def devices() -> list[dict[str, Any]]:
    """Devices torch can see (CPU, CUDA, and NPU if torch_npu is already loaded) with their
    hardware-DB match. Never imports torch_npu: doing so can break a machine without CANN."""
    import torch

    from .selection import device_info

    devs = [torch.device("cpu")]
    try:
        if torch.cuda.is_available():
            devs += [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    except Exception:  # noqa: BLE001 - a broken driver must not break info
        pass
    npu = getattr(torch, "npu", None)
    try:
        if npu is not None and npu.is_available():
            devs += [torch.device("npu", i) for i in range(npu.device_count())]
    except Exception:  # noqa: BLE001
        pass
    out = []
    for dev in devs:
        info = device_info(dev)
        out.append({"device": str(dev), "hw_id": info.hw_id, "seen": info.seen,
                    "features": sorted(info.features)})
    return out


def plugins() -> list[dict[str, Any]]:
    """Every plugin record: distribution, version, status, backends, failures with tracebacks."""
    from . import plugins as _plugins

    host = _plugins.host().ensure_loaded()
    return [host.plugins[n].as_dict() for n in sorted(host.plugins)]


def backends() -> list[dict[str, Any]]:
    """Every registered backend with, per visible device, whether it can run there and why not."""
    from . import plugins as _plugins
    from .selection import device_info

    import torch

    host = _plugins.host().ensure_loaded()
    devs = [torch.device(d["device"]) for d in devices()]
    out = []
    for name in sorted(host.specs):
        spec = host.specs[name]
        entry = {"name": name, "vendor": spec.vendor, "tier": spec.tier, "priority": spec.priority,
                 "plugin": spec.plugin, "distribution": spec.distribution, "version": spec.version,
                 "device_types": list(spec.device_types), "requires": sorted(spec.requires),
                 "description": spec.description, "deterministic": spec.deterministic,
                 "graph_capturable": spec.graph_capturable, "devices": {}}
        inst, err = (None, None) if host.spec_reasons.get(name) else host.backend(name)
        for dev in devs:
            reasons = list(host.spec_reasons.get(name, []))
            mode = ""
            if err is not None:
                reasons.append(err)
            elif inst is not None:
                info = device_info(dev)
                try:
                    reasons += inst.is_available() + inst.check_device(info)
                    if not reasons:
                        mode = inst.execution_mode(info)
                        auto = inst.auto_select_reason(info)
                        if auto is not None:
                            mode += f" (only when named: {auto.message})"
                except Exception as exc:  # noqa: BLE001
                    from .backend import Reason

                    reasons.append(Reason("probe_failed", f"{type(exc).__name__}: {exc}"))
            entry["devices"][str(dev)] = {"available": not reasons, "mode": mode,
                                          "reasons": [r.as_dict() for r in reasons]}
        out.append(entry)
    return out


def snapshot() -> dict[str, Any]:
    """Everything above in one JSON-serialisable mapping."""
    return {"versions": versions(), "devices": devices(), "plugins": plugins(), "backends": backends(),
            "env": env_vars()}
