"""The plugin host: discovers backend plugins lazily and isolates their failures.

Discovery happens on first use (a call, ``select``, ``moe-hal info``), never at ``import moe_hal``.
Entry points of the group ``moe_hal.backends`` are loaded one by one, each inside its own
try/except; hook implementations are also called one plugin at a time. A failure is recorded as a
:class:`PluginFailure` with its traceback, warned about once, and never stops the other plugins —
unless ``MOE_HAL_STRICT_PLUGINS=1``, which turns failures into a :class:`~moe_hal.errors.PluginError`.

``MOE_HAL_PLUGINS``: unset loads every installed plugin; an empty value loads none (built-ins
only); a comma list loads only the entry points with those names. ``MOE_HAL_DISABLE_PLUGINS``: a
comma list of entry points never to load (applied after ``MOE_HAL_PLUGINS``). The variables are
read when discovery runs; :func:`reload` discovers again.
"""

from __future__ import annotations

import importlib
import importlib.metadata as metadata
import os
import sys
import threading
import traceback
import warnings
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import pluggy

from . import environment, hookspecs
from .backend import API_VERSION, Backend, BackendSpec, Reason
from .errors import PluginError, PluginWarning

#: Backend names only the core may register.
RESERVED_BACKEND_NAMES = frozenset({"reference", "torch"})
#: Plugin name under which the core registers its built-in backends.
BUILTIN_PLUGIN = "moe_hal"


@dataclass(frozen=True)
class PluginFailure:
    """Why a plugin (or one of its hooks) failed. ``phase``: ``load``, ``validate``,
    ``register_backends``, ``hardware_db``, ``environment``, ``conformance_manifest``,
    ``probe_device``, ``conflict``, ``not_installed``, or ``probe <backend>.<method>`` when a
    backend's probe raised or returned a value of the wrong type."""

    plugin: str
    phase: str
    exc_type: str
    message: str
    traceback: str = ""
    distribution: str = ""
    version: str = ""

    def __str__(self) -> str:
        who = self.plugin + (f" ({self.distribution} {self.version})" if self.distribution else "")
        return f"plugin {who} failed during {self.phase}: {self.exc_type}: {self.message}"

    def as_dict(self) -> dict[str, str]:
        return dict(self.__dict__)


@dataclass
class PluginRecord:
    """One plugin as ``moe-hal info`` shows it."""

    name: str
    value: str
    distribution: str = ""
    version: str = ""
    status: str = "loaded"  # loaded | failed | conflict | disabled | not_installed | builtin
    backends: list[str] = field(default_factory=list)
    failures: list[PluginFailure] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "value": self.value,
            "distribution": self.distribution,
            "version": self.version,
            "status": self.status,
            "backends": list(self.backends),
            "failures": [f.as_dict() for f in self.failures],
        }


class PluginHost:
    """Holds the pluggy manager, the plugin records and the registered backend specs."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._loaded = False
        self.pm: pluggy.PluginManager | None = None
        self.plugins: dict[str, PluginRecord] = {}
        self.specs: dict[str, BackendSpec] = {}
        #: backend name -> reasons that make it unusable whatever the call (conflicts, api version)
        self.spec_reasons: dict[str, list[Reason]] = {}
        self._instances: dict[str, Backend] = {}
        self._instance_errors: dict[str, Reason] = {}
        self._discovering = False
        #: (path, plugin) hardware-DB overlays contributed through ``moe_hal_hardware_db``.
        self.hw_overlays: list[tuple[str, str]] = []
        #: What plugins declare through ``moe_hal_environment``: variable -> (meaning, plugin),
        #: distribution -> plugin, and (fact name, reader, plugin).
        self.env_vars: dict[str, tuple[str, str]] = {}
        self.packages: dict[str, str] = {}
        self.facts: list[tuple[str, Callable[[], str], str]] = []

    # -- discovery ---------------------------------------------------------------------------
    @property
    def loaded(self) -> bool:
        """True once discovery has completed."""
        return self._loaded

    def ensure_loaded(self, strict: bool | None = None) -> "PluginHost":
        """Discover plugins once. Re-entrant: a plugin's hook that calls back into the host while
        discovery runs (e.g. ``match_device`` from a probe) sees what is registered so far.
        ``strict`` overrides ``MOE_HAL_STRICT_PLUGINS`` (``moe-hal info`` loads with ``False``, so
        that it can show the failures strict mode would raise for)."""
        if self._loaded:
            return self
        with self._lock:
            if self._loaded or self._discovering:
                return self
            self._discovering = True
            try:
                self._discover(environment.flag("MOE_HAL_STRICT_PLUGINS") if strict is None else strict)
                self._loaded = True
            finally:
                self._discovering = False
        return self

    def _discover(self, strict: bool) -> None:
        pm = pluggy.PluginManager(hookspecs.PROJECT)
        pm.add_hookspecs(hookspecs)
        self.pm = pm
        from . import builtin

        pm.register(builtin, name=BUILTIN_PLUGIN)
        self.plugins[BUILTIN_PLUGIN] = PluginRecord(
            BUILTIN_PLUGIN, "moe_hal.builtin", "moe-hal", _version("moe-hal"), "builtin"
        )
        for ep, record in self._entry_points():
            self.plugins[record.name] = record
            if record.status != "loaded":
                continue
            _trace(f"loading entry point {record.name} = {record.value} ({record.distribution} {record.version})")
            try:
                module = ep.load()
                pm.register(module, name=record.name)
            except BaseException as exc:  # noqa: BLE001 - a plugin may raise anything, even SystemExit
                if isinstance(exc, KeyboardInterrupt):
                    raise
                self._fail(record, "load", exc)
                continue
            try:
                _check_hook_names(module)
            except Exception as exc:  # noqa: BLE001 - a malformed plugin module fails only that plugin
                pm.unregister(name=record.name)
                self._fail(record, "validate", exc)
        self._collect_backends()
        self._register_hw_overlays()
        self._collect_environment()
        failures = [f for r in self.plugins.values() for f in r.failures]
        if failures and strict:
            raise PluginError(failures)
        for f in failures:
            warnings.warn(f"{f} (it is skipped; `moe-hal info` shows the traceback)", PluginWarning, stacklevel=4)

    def _entry_points(self):
        """Entry points to load as (entry point, record); de-duplicated, conflicts and
        ``MOE_HAL_PLUGINS`` applied."""
        found: dict[str, list[metadata.EntryPoint]] = {}
        for ep in metadata.entry_points(group=hookspecs.ENTRY_POINT_GROUP):
            same = found.setdefault(ep.name, [])
            if all(e.value != ep.value for e in same):  # identical duplicates (e.g. lib64 symlinks) are one
                same.append(ep)
        wanted = os.environ.get("MOE_HAL_PLUGINS")
        allow = None if wanted is None else {n.strip() for n in wanted.split(",") if n.strip()}
        deny = {n.strip() for n in os.environ.get("MOE_HAL_DISABLE_PLUGINS", "").split(",") if n.strip()}
        out = []
        for name in sorted(found):
            eps = found[name]
            dist = getattr(eps[0], "dist", None)
            record = PluginRecord(name, eps[0].value, dist.name if dist else "", dist.version if dist else "")
            if name == BUILTIN_PLUGIN:
                record.name = f"{name}:{eps[0].value}"  # keep the core's own record intact
                record.status = "conflict"
                record.failures.append(
                    PluginFailure(name, "conflict", "NameError", f"plugin name {name!r} is reserved for the core")
                )
            elif len(eps) > 1:
                record.status = "conflict"
                values = ", ".join(sorted(e.value for e in eps))
                record.failures.append(
                    PluginFailure(
                        name,
                        "conflict",
                        "NameError",
                        f"several distributions provide the entry point {name!r} ({values}); none is loaded",
                    )
                )
            elif (allow is not None and name not in allow) or name in deny:
                record.status = "disabled"
            out.append((eps[0], record))
        for name in sorted((allow or set()) - set(found)):
            record = PluginRecord(name, "", status="not_installed")
            record.failures.append(
                PluginFailure(
                    name,
                    "not_installed",
                    "LookupError",
                    f"MOE_HAL_PLUGINS names {name!r}, but no installed "
                    f"distribution provides that {hookspecs.ENTRY_POINT_GROUP} entry point",
                )
            )
            out.append((None, record))
        return out

    def _collect_backends(self) -> None:
        assert self.pm is not None
        owners: dict[str, list[str]] = {}
        for impl in self.pm.hook.moe_hal_register_backends.get_hookimpls():
            record = self.plugins[impl.plugin_name]
            registered: list[BackendSpec] = []
            _trace(f"calling moe_hal_register_backends of {impl.plugin_name}")

            def register(spec: BackendSpec, _acc=registered) -> None:
                if not isinstance(spec, BackendSpec):
                    raise TypeError(f"register() expects a moe_hal.BackendSpec, got {type(spec).__name__}")
                _acc.append(spec)

            try:
                impl.function(register=register)
                stamped_specs = []
                for spec in registered:
                    if record.name != BUILTIN_PLUGIN and spec.name in RESERVED_BACKEND_NAMES:
                        raise ValueError(f"backend name {spec.name!r} is reserved for the built-in backend")
                    stamped_specs.append(_stamp(spec, record))  # rebuilding it checks every field again
            except Exception as exc:  # noqa: BLE001 - whatever a plugin's hook raises fails only that plugin
                self._fail(record, "register_backends", exc)
                self.pm.unregister(name=impl.plugin_name)
                continue
            for spec, stamped in zip(registered, stamped_specs):
                owners.setdefault(spec.name, []).append(record.name)
                self.specs.setdefault(spec.name, stamped)
                record.backends.append(spec.name)
        for name, plugin_names in owners.items():
            reasons = self.spec_reasons.setdefault(name, [])
            if len(plugin_names) > 1:
                reasons.append(
                    Reason(
                        "name_conflict",
                        f"several plugins register a backend named {name!r}; none of them is used",
                        "one plugin per backend name",
                        sorted(plugin_names),
                    )
                )
            spec = self.specs[name]
            if spec.api_version.split(".")[0] != API_VERSION.split(".")[0]:
                reasons.append(
                    Reason(
                        "api_version_mismatch",
                        "backend API major version differs from the core's",
                        API_VERSION,
                        spec.api_version,
                    )
                )

    def _fail(self, record: PluginRecord, phase: str, exc: BaseException) -> None:
        record.status = "failed"
        record.failures.append(
            PluginFailure(
                record.name,
                phase,
                type(exc).__name__,
                str(exc),
                "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
                record.distribution,
                record.version,
            )
        )

    # -- hardware-DB overlays ------------------------------------------------------------------
    def _register_hw_overlays(self) -> None:
        """Hand the paths plugins register through ``moe_hal_hardware_db`` to the hardware DB,
        which validates them at once; a failing hook or a malformed file fails only that plugin."""
        from . import hwdb

        for impl in self.pm.hook.moe_hal_hardware_db.get_hookimpls():
            record = self.plugins[impl.plugin_name]
            paths: list[str] = []
            _trace(f"calling moe_hal_hardware_db of {impl.plugin_name}")
            try:
                impl.function(register=lambda p, _acc=paths: _acc.append(os.fspath(p)))
                for path in paths:
                    hwdb.add_overlay(path, origin=impl.plugin_name)
                    self.hw_overlays.append((path, impl.plugin_name))
            except Exception as exc:  # noqa: BLE001 - whatever a plugin's hook raises fails only that plugin
                self._fail(record, "hardware_db", exc)

    def probe_device(self, device_type: str, index: int | None) -> Any:
        """The first :class:`moe_hal.hwdb.Match` a plugin's ``moe_hal_probe_device`` returns for
        this device, or None when no plugin handles ``device_type``. A probe that raises fails
        only its plugin (phase ``probe_device``) and the next plugin is asked."""
        self.ensure_loaded()
        for impl in self.pm.hook.moe_hal_probe_device.get_hookimpls():
            _trace(f"calling moe_hal_probe_device of {impl.plugin_name}")
            try:
                found = impl.function(device_type=device_type, index=index)
            except Exception as exc:  # noqa: BLE001 - one plugin's probe must not hide the others
                self._fail(self.plugins[impl.plugin_name], "probe_device", exc)
                continue
            if found is not None:
                return found
        return None

    def _collect_environment(self) -> None:
        """What each plugin declares through ``moe_hal_environment``; a failing hook fails only
        that plugin and keeps none of its declarations."""
        for impl in self.pm.hook.moe_hal_environment.get_hookimpls():
            plugin = impl.plugin_name
            env_vars: dict[str, tuple[str, str]] = {}
            packages: dict[str, str] = {}
            facts: list[tuple[str, Callable[[], str], str]] = []

            def env_var(name: str, meaning: str, _plugin: str = plugin, _acc=env_vars) -> None:
                if not isinstance(name, str) or not name or not isinstance(meaning, str):
                    raise TypeError(f"env_var(name, meaning) expects two strings, got {name!r}, {meaning!r}")
                _acc[name] = (meaning, _plugin)

            def package(distribution: str, _plugin: str = plugin, _acc=packages) -> None:
                if not isinstance(distribution, str) or not distribution:
                    raise TypeError(f"package(distribution) expects a distribution name, got {distribution!r}")
                _acc[distribution] = _plugin

            def fact(name: str, read: Callable[[], str], _plugin: str = plugin, _acc=facts) -> None:
                if not isinstance(name, str) or not callable(read):
                    raise TypeError(f"fact(name, read) expects a string and a callable, got {name!r}, {read!r}")
                _acc.append((name, read, _plugin))

            _trace(f"calling moe_hal_environment of {plugin}")
            try:
                impl.function(env_var=env_var, package=package, fact=fact)
            except Exception as exc:  # noqa: BLE001 - one plugin's declaration must not hide the others
                self._fail(self.plugins[plugin], "environment", exc)
                continue
            self.env_vars.update(env_vars)
            self.packages.update(packages)
            self.facts.extend(facts)

    def conformance_manifests(self, backend_name: str) -> list[tuple[str, str]]:
        """``(path, plugin)`` expected-failure manifests plugins ship for ``backend_name``."""
        self.ensure_loaded()
        out = []
        for impl in self.pm.hook.moe_hal_conformance_manifest.get_hookimpls():
            try:
                path = impl.function(backend_name=backend_name)
            except Exception as exc:  # noqa: BLE001 - whatever a plugin's hook raises fails only that plugin
                self._fail(self.plugins[impl.plugin_name], "conformance_manifest", exc)
                continue
            if path is not None:
                out.append((os.fspath(path), impl.plugin_name))
        return out

    # -- backends ------------------------------------------------------------------------------
    def backend(self, name: str) -> tuple[Backend | None, Reason | None]:
        """The backend instance for ``name`` (imported on first use) or the reason it failed."""
        self.ensure_loaded()
        inst = self._instances.get(name)
        if inst is not None:
            return inst, None
        if name in self._instance_errors:
            return None, self._instance_errors[name]
        with self._lock:
            spec = self.specs[name]
            try:
                module_name, _, class_name = spec.impl.partition(":")
                cls = getattr(importlib.import_module(module_name), class_name)
                inst = cls(spec)
                if not isinstance(inst, Backend):
                    raise TypeError(f"{spec.impl} is not a moe_hal.Backend subclass")
            except Exception as exc:  # noqa: BLE001 - any import or constructor failure becomes the backend's reason
                err = Reason("backend_import_failed", f"importing {spec.impl} failed: {type(exc).__name__}: {exc}")
                self._instance_errors[name] = err
                return None, err
            self._instances[name] = inst
            return inst, None

    def probe_failed(self, spec: BackendSpec, what: str, exc: BaseException) -> None:
        """Record that probe ``what`` of backend ``spec.name`` raised or returned a bad value
        (once per backend and probe), so ``moe-hal info`` shows it; selection skips the backend."""
        record = self.plugins.get(spec.plugin)
        if record is None:
            return
        phase = f"probe {spec.name}.{what}"
        with self._lock:
            if any(f.phase == phase for f in record.failures):
                return
            self._fail(record, phase, exc)
        warnings.warn(
            f"{record.failures[-1]} (the backend is skipped; `moe-hal info` shows the traceback)",
            PluginWarning,
            stacklevel=4,
        )

    def failures(self) -> list[PluginFailure]:
        self.ensure_loaded()
        return [f for r in self.plugins.values() for f in r.failures]


def _stamp(spec: BackendSpec, record: PluginRecord) -> BackendSpec:
    """``spec`` stamped with its plugin; built anew through ``BackendSpec.__post_init__``, so a
    spec whose fields were changed after construction is checked too."""
    return replace(spec, plugin=record.name, distribution=record.distribution, version=record.version)


def _check_hook_names(module: Any) -> None:
    """Reject hook implementations whose name is not a hookspec (a typo would silently never run)."""
    known = {n for n in dir(hookspecs) if n.startswith("moe_hal_")}
    marker = f"{hookspecs.PROJECT}_impl"
    for attr in dir(module):
        if hasattr(getattr(module, attr, None), marker) and attr not in known:
            raise AttributeError(
                f"{module.__name__}.{attr} is marked as a moe_hal hook, but no such hook "
                f"exists (known: {sorted(known)})"
            )


def _trace(message: str) -> None:
    """Print plugin activity to stderr when ``MOE_HAL_TRACE_PLUGINS=1``."""
    if environment.flag("MOE_HAL_TRACE_PLUGINS"):
        sys.stderr.write(f"moe_hal plugins: {message}\n")


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return ""


_host = PluginHost()
_host_lock = threading.Lock()


def host() -> PluginHost:
    """The process-wide plugin host (discovery runs on its first :meth:`~PluginHost.ensure_loaded`)."""
    return _host


def reload() -> PluginHost:
    """Forget every plugin, backend and cached selection and discover again on next use
    (after changing ``MOE_HAL_PLUGINS`` or installing a plugin)."""
    global _host
    with _host_lock:
        _host = PluginHost()
    from . import hwdb

    hwdb.reload(forget_overlays=True)
    for hook in _reload_hooks:
        hook()
    return _host


_reload_hooks: list[Callable[[], None]] = []


def on_reload(fn: Callable[[], None]) -> Callable[[], None]:
    """Register ``fn`` to run after :func:`reload` (caches that depend on the plugin set)."""
    _reload_hooks.append(fn)
    return fn
