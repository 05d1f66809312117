"""What moe_hal reads from the environment, and a snapshot of what it sees.

* The one parser of environment variables: :func:`flag` (booleans), :func:`size` (byte counts),
  :func:`choice` (one of a fixed set). The core and the bundled plugins read their variables
  through it, so ``MOE_HAL_STRICT_PLUGINS=false`` means off everywhere, and a value that cannot be
  parsed raises :class:`~moe_hal.errors.EnvironmentVariableError` naming the variable, what was
  expected and what was given.
* The snapshot — versions, devices, plugins, backends and environment variables — used by
  ``moe-hal info`` and by reports (conformance, benchmarks) so that results from different
  machines can be compared with what produced them.
"""

from __future__ import annotations

import importlib.metadata as metadata
import math
import os
import platform
import re
from typing import Any, Iterable

from .errors import ArgumentError, EnvironmentVariableError

# -- parsing ---------------------------------------------------------------------------------------
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"", "0", "false", "no", "off"})
_UNITS = {"": 1, "k": 10 ** 3, "m": 10 ** 6, "g": 10 ** 9, "t": 10 ** 12,
          "ki": 2 ** 10, "mi": 2 ** 20, "gi": 2 ** 30, "ti": 2 ** 40}
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?(?:e[0-9]+)?)\s*([kmgt]i?)?b?\s*")
#: Largest byte count a size may give (16 EiB): beyond it a value is a typo, not a budget.
MAX_SIZE = 2 ** 64


def parse_flag(text: str, name: str) -> bool:
    """``1/true/yes/on`` -> True, ``""/0/false/no/off`` -> False (case-insensitive)."""
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise EnvironmentVariableError(name, "a boolean: 1, true, yes, on or 0, false, no, off (or empty)", repr(text))


def parse_bytes(text: str, name: str, error: type[ArgumentError] = EnvironmentVariableError) -> int:
    """``"8000000000"``, ``"8e9"``, ``"512MiB"``, ``"8GB"``, ``"8G"`` -> bytes (case-insensitive);
    at most :data:`MAX_SIZE`. ``name`` is the variable (or, with ``error=ArgumentError``, the
    argument) the text came from."""
    expected = "a byte count such as 8000000000, 512MiB or 8GB"
    match = _SIZE.fullmatch(text.lower()) if isinstance(text, str) else None
    if not match:
        raise error(name, expected, repr(text))
    number = float(match.group(1))
    if not math.isfinite(number) or number * _UNITS[match.group(2) or ""] > MAX_SIZE:
        raise error(name, f"{expected}, at most 2**64", repr(text))
    return int(number * _UNITS[match.group(2) or ""])


def flag(name: str, default: bool = False) -> bool:
    """The boolean environment variable ``name`` (``default`` when unset)."""
    text = os.environ.get(name)
    return default if text is None else parse_flag(text, name)


def size(name: str) -> int | None:
    """The byte-count environment variable ``name`` (None when unset or empty)."""
    text = os.environ.get(name, "")
    return parse_bytes(text, name) if text.strip() else None


def choice(name: str, choices: Iterable[str], default: str) -> str:
    """The environment variable ``name``, lower-cased, which must be one of ``choices``
    (``default`` when unset or empty)."""
    allowed = tuple(choices)
    value = os.environ.get(name, "").strip().lower()
    if not value:
        return default
    if value not in allowed:
        raise EnvironmentVariableError(name, f"one of {', '.join(allowed)}", repr(os.environ[name]))
    return value


# -- snapshot --------------------------------------------------------------------------------------

#: Environment variables the core reads (plugins declare theirs through ``moe_hal_environment``).
KNOWN_ENV_VARS = {
    "MOE_HAL_BACKEND": "force one backend, or a comma list in preference order",
    "MOE_HAL_DISABLE_BACKENDS": "comma list of backends never to use",
    "MOE_HAL_PLUGINS": "unset: load every plugin; empty: none; comma list: only those entry points",
    "MOE_HAL_DISABLE_PLUGINS": "comma list of plugin entry points never to load",
    "MOE_HAL_STRICT_PLUGINS": "1: a plugin that fails to load raises instead of being skipped",
    "MOE_HAL_TRACE_PLUGINS": "1: print plugin loading and hook calls to stderr",
    "MOE_HAL_HWDB": "extra hardware-DB YAML files or directories (os.pathsep separated)",
    "MOE_HAL_PREPARED_MAX_BYTES": "byte budget of the prepared-weight cache",
}
#: Non-moe_hal variables that change how the core behaves.
RELATED_ENV_VARS = ("TORCH_DEVICE_BACKEND_AUTOLOAD",)
#: Distributions whose versions decide the core's results.
CORE_PACKAGES = ("moe-hal", "torch", "numpy", "pluggy", "safetensors", "jsonschema", "pyyaml")


def plugin_declarations() -> tuple[dict[str, tuple[str, str]], dict[str, str]]:
    """(variable -> (meaning, plugin), distribution -> plugin) the plugins declared."""
    from . import plugins as _plugins

    host = _plugins.host().ensure_loaded()
    return dict(host.env_vars), dict(host.packages)


def env_vars() -> dict[str, dict[str, Any]]:
    """Every ``MOE_HAL_*`` variable set (flagging unknown names, likely typos) plus the related
    ones the core and the plugins declare, with their meaning and who reads them."""
    declared, _ = plugin_declarations()
    meanings = {name: (meaning, "moe_hal") for name, meaning in KNOWN_ENV_VARS.items()}
    meanings.update({name: ("", "moe_hal") for name in RELATED_ENV_VARS})
    meanings.update(declared)
    out = {}
    for name in sorted(os.environ):
        if name.startswith("MOE_HAL_") or name in meanings:
            meaning, owner = meanings.get(name, ("unknown: typo?", ""))
            out[name] = {"value": os.environ[name], "known": name in meanings, "meaning": meaning, "read_by": owner}
    return out


def versions() -> dict[str, str]:
    """Versions of Python, moe_hal and the libraries that decide results (the core's and those
    the plugins declare)."""
    _, packages = plugin_declarations()
    out = {"python": platform.python_version(), "platform": platform.platform()}
    for dist in (*CORE_PACKAGES, *sorted(packages)):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return out


def machine() -> dict[str, Any]:
    """The CPU and the threads torch computes with (thread counts decide CPU timings)."""
    import torch

    from .hwdb.matching import cpu_model

    return {"cpu": cpu_model(), "logical_cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "torch_interop_threads": torch.get_num_interop_threads(),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"), "MKL_NUM_THREADS": os.environ.get("MKL_NUM_THREADS"),
            "mkl": bool(torch.backends.mkl.is_available()), "openmp": bool(torch.backends.openmp.is_available())}


def facts() -> dict[str, str]:
    """The machine facts plugins declare (driver and toolkit versions), each read once; a reader
    that fails shows its error instead."""
    from . import plugins as _plugins

    host = _plugins.host().ensure_loaded()
    out = {}
    for name, read, plugin in host.facts:
        try:
            value = str(read())
        except Exception as exc:  # noqa: BLE001 - a bug report must still be printed
            value = f"could not be read: {type(exc).__name__}: {exc}"
        out[f"{name} ({plugin})"] = value
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
    """Every plugin record: distribution, version, status, backends, the hooks it implements, the
    hardware-DB entries and overlays it contributes, and failures with tracebacks."""
    from . import hwdb
    from . import plugins as _plugins

    host = _plugins.host().ensure_loaded()
    hooks: dict[str, list[str]] = {}
    if host.pm is not None:
        for name in dir(host.pm.hook):
            if name.startswith("moe_hal_"):
                for impl in getattr(host.pm.hook, name).get_hookimpls():
                    hooks.setdefault(impl.plugin_name, []).append(name.removeprefix("moe_hal_"))
    contributed: dict[str, list[str]] = {}
    try:
        for entry in hwdb.all():
            for path in (entry.path, *entry.measured_paths):
                for plugin in {p for _, p in host.hw_overlays}:
                    if path.endswith(f"[plugin {plugin}]"):
                        contributed.setdefault(plugin, []).append(entry.id)
    except Exception:  # noqa: BLE001 - a broken database is reported by `moe-hal hw`; info goes on
        pass
    out = []
    for name in sorted(host.plugins):
        record = host.plugins[name].as_dict()
        record["hooks"] = sorted(hooks.get(name, []))
        record["hwdb_entries"] = sorted(set(contributed.get(name, [])))
        out.append(record)
    return out


def backends() -> list[dict[str, Any]]:
    """Every registered backend with, per visible device, whether it can run there and why not."""
    import torch

    from . import plugins as _plugins
    from .selection import ProbeFailed, device_info, device_reasons, probe

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
                    reasons += device_reasons(inst, info, host)
                    if not reasons:
                        mode = probe(host, inst, "execution_mode", info)
                        auto = probe(host, inst, "auto_select_reason", info)
                        if auto is not None:
                            mode += f" (only when named: {auto.message})"
                except ProbeFailed as failed:
                    reasons.append(failed.reason)
            entry["devices"][str(dev)] = {"available": not reasons, "mode": mode,
                                          "reasons": [r.as_dict() for r in reasons]}
        out.append(entry)
    return out


def snapshot() -> dict[str, Any]:
    """Everything above in one JSON-serialisable mapping."""
    backend_rows = backends()  # first: probing backends may record plugin failures
    return {"versions": versions(), "machine": machine(), "facts": facts(), "devices": devices(),
            "plugins": plugins(), "backends": backend_rows, "env": env_vars()}
