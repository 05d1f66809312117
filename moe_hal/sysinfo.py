"""A snapshot of what moe_hal sees — versions, the machine, plugin-declared facts, devices,
plugins, backends and environment variables — for ``moe-hal info`` and for reports (conformance,
benchmarks), so that results from different machines can be compared with what produced them.
"""

from __future__ import annotations

import importlib.metadata as metadata
import os
import platform
from typing import Any

from .environment import KNOWN_ENV_VARS, RELATED_ENV_VARS, flag, size
from .errors import EnvironmentVariableError, HardwareDBError, MoeHalError

#: Distributions whose versions decide the core's results (plugins declare theirs).
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
    the plugins declare, when the plugins could be discovered)."""
    try:
        _, packages = plugin_declarations()
    except MoeHalError:  # reported by problems(); the core's versions still matter
        packages = {}
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

    return {
        "cpu": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
        "MKL_NUM_THREADS": os.environ.get("MKL_NUM_THREADS"),
        "mkl": bool(torch.backends.mkl.is_available()),
        "openmp": bool(torch.backends.openmp.is_available()),
    }


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


def visible_devices() -> list[Any]:
    """The CPU, then every device of each type a registered backend runs on whose torch module is
    already loaded and reports devices (``torch.<type>.is_available()``, ``device_count()``). No
    device extension is imported here: importing one can break a machine without its toolkit."""
    import torch

    from . import plugins as _plugins

    host = _plugins.host().ensure_loaded()
    kinds = sorted({t for spec in host.specs.values() for t in spec.device_types} - {"*", "cpu"})
    devs = [torch.device("cpu")]
    for kind in kinds:
        module = getattr(torch, kind, None)
        try:
            if module is not None and module.is_available():
                devs += [torch.device(kind, i) for i in range(module.device_count())]
        except Exception:  # noqa: BLE001 - a broken driver or extension must not break the listing
            pass
    return devs


def devices() -> list[dict[str, Any]]:
    """:func:`visible_devices` with their hardware-DB match."""
    from .selection import device_info

    out = []
    for dev in visible_devices():
        try:
            info = device_info(dev)
        except MoeHalError as exc:  # a malformed MOE_HAL_HWDB file, a bad variable: show the device anyway
            out.append({"device": str(dev), "hw_id": None, "seen": f"(not recognised: {exc})", "features": []})
            continue
        out.append({"device": str(dev), "hw_id": info.hw_id, "seen": info.seen, "features": sorted(info.features)})
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
    from .backend import Reason
    from .selection import ProbeFailed, device_info, device_reasons, probe

    host = _plugins.host().ensure_loaded()
    devs = [torch.device(d["device"]) for d in devices()]
    out = []
    for name in sorted(host.specs):
        spec = host.specs[name]
        entry = {
            "name": name,
            "vendor": spec.vendor,
            "tier": spec.tier,
            "priority": spec.priority,
            "plugin": spec.plugin,
            "distribution": spec.distribution,
            "version": spec.version,
            "device_types": list(spec.device_types),
            "requires": sorted(spec.requires),
            "description": spec.description,
            "deterministic": spec.deterministic,
            "graph_capturable": spec.graph_capture_report(),
            "devices": {},
        }
        inst, err = (None, None) if host.spec_reasons.get(name) else host.backend(name)
        for dev in devs:
            reasons = list(host.spec_reasons.get(name, []))
            mode = ""
            if err is not None:
                reasons.append(err)
            elif inst is not None:
                try:
                    info = device_info(dev)
                    reasons += device_reasons(inst, info, host)
                    if not reasons:
                        mode = probe(host, inst, "execution_mode", info)
                        auto = probe(host, inst, "auto_select_reason", info)
                        if auto is not None:
                            mode += f" (only when named: {auto.message})"
                except ProbeFailed as failed:
                    reasons.append(failed.reason)
                except HardwareDBError as exc:
                    reasons.append(Reason("hardware_db_error", str(exc)))
            entry["devices"][str(dev)] = {
                "available": not reasons,
                "mode": mode,
                "reasons": [r.as_dict() for r in reasons],
            }
        out.append(entry)
    return out


#: Boolean variables of the core (checked by :func:`problems`).
_FLAG_VARS = ("MOE_HAL_STRICT_PLUGINS", "MOE_HAL_TRACE_PLUGINS")


def problems() -> list[str]:
    """What makes this installation misbehave, in words: an environment variable that cannot be
    parsed, a malformed hardware-DB file, plugin failures while ``MOE_HAL_STRICT_PLUGINS`` asks
    for them to be fatal. ``moe-hal info`` prints them and exits with status 3."""
    from . import hwdb
    from . import plugins as _plugins

    found = []
    for name in _FLAG_VARS:
        try:
            flag(name)
        except EnvironmentVariableError as exc:
            found.append(str(exc))
    try:
        size("MOE_HAL_PREPARED_MAX_BYTES")
    except EnvironmentVariableError as exc:
        found.append(str(exc))
    try:
        hwdb.all()
    except HardwareDBError as exc:
        found.append(f"hardware DB: {exc}")
    try:
        strict = flag("MOE_HAL_STRICT_PLUGINS")
    except EnvironmentVariableError:
        strict = False
    host = _plugins.host()
    failures = host.failures() if host.loaded else []
    if strict and failures:
        found.append(
            f"{len(failures)} plugin failure(s) while MOE_HAL_STRICT_PLUGINS is set (every call "
            "raises PluginError): " + "; ".join(map(str, failures))
        )
    return found


def snapshot() -> dict[str, Any]:
    """Everything above in one JSON-serialisable mapping, plus ``problems``. Never raises for a
    broken plugin, a malformed hardware-DB file or a bad variable: it reports them."""
    from . import plugins as _plugins

    try:
        _plugins.host().ensure_loaded(strict=False)  # show the failures strict mode would raise for
    except MoeHalError:
        pass  # e.g. MOE_HAL_TRACE_PLUGINS unparsable: in problems()

    def guarded(section, default):
        try:
            return section()
        except MoeHalError:  # reported by problems()
            return default

    backend_rows = guarded(backends, [])  # first: probing backends may record plugin failures
    return {
        "versions": versions(),
        "machine": machine(),
        "facts": guarded(facts, {}),
        "devices": guarded(devices, []),
        "plugins": guarded(plugins, []),
        "backends": backend_rows,
        "env": guarded(env_vars, {}),
        "problems": problems(),
    }
