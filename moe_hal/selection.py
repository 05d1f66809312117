"""Backend selection: which backend runs a call, and why every other one does not.

For a :class:`~moe_hal.problem.Problem` the selector resolves the device through the hardware
DB, asks *every* known backend for its reasons (plugins that failed to load and backends disabled
by the environment included), and ranks the eligible ones by the user's preference, then
priority, tier and name — never by registration order. A backend named by the caller
(``backend="name"`` or ``MOE_HAL_BACKEND=name``) that cannot run the call raises
:class:`~moe_hal.errors.BackendUnavailableError` with its reasons; a comma list
(``MOE_HAL_BACKEND=a,b``) restricts the choice to those backends, in that order. There is no
silent fallback. Decisions are cached per (device, problem signature, preference, environment).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from . import plugins
from .backend import Backend, BackendSpec, DeviceInfo, GraphCapture, Reason
from .errors import ArgumentError, BackendUnavailableError, NoBackendError
from .notices import warn_once
from .problem import Problem

_TIER_RANK = {"optimized": 0, "fallback": 1, "reference": 2}

Preference = str | Sequence[str] | None


@dataclass
class Candidate:
    """One backend as the selector saw it for a call."""

    name: str
    spec: BackendSpec | None
    reasons: list[Reason] = field(default_factory=list)
    mode: str = ""
    path: str = ""

    @property
    def eligible(self) -> bool:
        return not self.reasons


@dataclass
class Selection:
    """The outcome of selecting a backend for one problem signature."""

    backend: Backend
    device: DeviceInfo
    problem: str
    candidates: list[Candidate]
    ranked: list[str]
    how: str  # "auto", "forced" or "preference"
    op: str = ""  # the operation, for the chosen backend's graph-capture declaration

    @property
    def graph_capture(self) -> GraphCapture:
        """What the chosen backend declares about device-graph capture of this call's operation."""
        return self.chosen.spec.graph_capture(self.op)

    @property
    def name(self) -> str:
        return self.backend.name

    @property
    def chosen(self) -> Candidate:
        return next(c for c in self.candidates if c.name == self.name)

    @property
    def mode(self) -> str:
        """``native``, ``interpreted`` or ``emulated``."""
        return self.chosen.mode

    def explain(self) -> str:
        """Which backend runs the call and why each other backend does not."""
        return render(self.problem, self.device, self.candidates, self.name, self.ranked, self.how, op=self.op)

    def as_dict(self) -> dict[str, Any]:
        return {
            "selected": self.name,
            "how": self.how,
            "mode": self.mode,
            "device": self.device.label,
            "hw_id": self.device.hw_id,
            "problem": self.problem,
            "ranked": list(self.ranked),
            "graph_capture": self.graph_capture.describe(),
            "candidates": [
                {
                    "name": c.name,
                    "eligible": c.eligible,
                    "mode": c.mode,
                    "path": c.path,
                    "reasons": [r.as_dict() for r in c.reasons],
                }
                for c in self.candidates
            ],
        }

    def __repr__(self) -> str:
        return f"<Selection {self.name} ({self.how}) for {self.problem} on {self.device.label}>"


# -- devices -----------------------------------------------------------------------------------
_devices: dict[torch.device, DeviceInfo] = {}


def device_info(device: torch.device | str) -> DeviceInfo:
    """The hardware-DB view of ``device`` (cached per device)."""
    dev = torch.device(device)
    info = _devices.get(dev)
    if info is None:
        from .devices import match_device

        match = match_device(dev)
        info = DeviceInfo(dev.type, dev.index, match.id, frozenset(match.features), match.seen)
        _devices[dev] = info
    return info


# -- preferences ---------------------------------------------------------------------------------
def _preference(backend: Preference) -> tuple[str, tuple[str, ...]]:
    """``("auto"|"forced"|"preference", names)`` from the argument, else ``MOE_HAL_BACKEND``."""
    source = "backend"
    if backend is None:
        backend = os.environ.get("MOE_HAL_BACKEND", "")
        source = "MOE_HAL_BACKEND"
    if isinstance(backend, str):
        names = tuple(n.strip() for n in backend.split(",") if n.strip())
    elif isinstance(backend, Sequence):
        names = tuple(str(n).strip() for n in backend)
    else:
        raise ArgumentError("backend", "None, a backend name or a sequence of names", type(backend).__name__)
    if not names:
        return "auto", ()
    if len(set(names)) != len(names):
        raise ArgumentError(source, "distinct backend names", ",".join(names))
    return ("forced" if len(names) == 1 else "preference"), names


def _disabled() -> frozenset[str]:
    return frozenset(n.strip() for n in os.environ.get("MOE_HAL_DISABLE_BACKENDS", "").split(",") if n.strip())


# -- selection -------------------------------------------------------------------------------------
_cache: dict[tuple, Selection] = {}
_cache_lock = threading.Lock()


@plugins.on_reload
def clear_cache() -> None:
    """Forget cached selections and device lookups."""
    with _cache_lock:
        _cache.clear()
    _devices.clear()
    _availability.clear()


def select(problem: Problem, backend: Preference = None) -> Selection:
    """Select the backend for ``problem`` (see the module docstring); raises when none can run it."""
    if backend is not None and not isinstance(backend, str):
        if not isinstance(backend, Sequence):
            raise ArgumentError("backend", "None, a backend name or a sequence of names", type(backend).__name__)
        backend = tuple(backend)
    environ = os.environ
    # The raw inputs key the cache, so a hit costs two environment reads and one dict lookup.
    key = (problem.signature, backend, environ.get("MOE_HAL_BACKEND"), environ.get("MOE_HAL_DISABLE_BACKENDS"))
    hit = _cache.get(key)
    if hit is not None:
        return hit
    how, names = _preference(backend)
    disabled = _disabled()
    host = plugins.host().ensure_loaded()
    device = device_info(problem.device)
    candidates = evaluate(problem, device, host, disabled, named=set(names))
    by_name = {c.name: c for c in candidates}
    if how == "forced":
        name = names[0]
        cand = by_name.get(name)
        if cand is None:
            known = sorted(n for n, c in by_name.items() if c.spec is not None)
            raise BackendUnavailableError(
                name,
                [Reason("unknown_backend", "no installed plugin provides this backend", set(known), name)],
                render(problem.summary(), device, candidates, None, [], how),
            )
        if not cand.eligible:
            raise BackendUnavailableError(
                name, cand.reasons, render(problem.summary(), device, candidates, None, [], how)
            )
        ranked = [name]
    elif how == "preference":
        unknown = [n for n in names if n not in by_name]
        for n in unknown:
            cand = Candidate(n, None, [Reason("unknown_backend", "no installed plugin provides this backend")])
            candidates.append(cand)
            by_name[n] = cand
        ranked = [n for n in names if by_name[n].eligible]
    else:
        ranked = [c.name for c in sorted((c for c in candidates if c.eligible), key=_rank)]
    if not ranked:
        raise NoBackendError(
            render(
                problem.summary(),
                device,
                candidates,
                None,
                [],
                how,
                considered=list(names) if how == "preference" else None,
            )
        )
    chosen, err = host.backend(ranked[0])
    assert chosen is not None, err  # eligible backends were instantiated during evaluation
    selection = Selection(chosen, device, problem.summary(), candidates, ranked, how, problem.op)
    if how == "auto":
        _warn_if_slow(selection)
    with _cache_lock:
        _cache[key] = selection
    return selection


def evaluate(
    problem: Problem, device: DeviceInfo, host: plugins.PluginHost, disabled: frozenset[str], named: set[str]
) -> list[Candidate]:
    """Every known backend and failed plugin with the full list of reasons it cannot run ``problem``."""
    out = []
    for name in sorted(host.specs):
        spec = host.specs[name]
        cand = Candidate(name, spec)
        out.append(cand)
        if name in disabled:
            cand.reasons.append(Reason("disabled_by_env", "listed in MOE_HAL_DISABLE_BACKENDS"))
        cand.reasons.extend(host.spec_reasons.get(name, []))
        if cand.reasons:
            continue
        inst, err = host.backend(name)
        if inst is None:
            cand.reasons.append(err)
            continue
        try:
            _probe_candidate(cand, inst, problem, device, host, named)
        except ProbeFailed as failed:
            cand.reasons.append(failed.reason)
    for record in host.plugins.values():
        for failure in record.failures:
            if failure.phase in ("load", "validate", "register_backends", "conflict"):
                cand = Candidate(
                    f"plugin:{record.name}",
                    None,
                    [Reason("plugin_failed" if failure.phase != "conflict" else "plugin_conflict", str(failure))],
                )
                out.append(cand)
    return out


def _probe_candidate(
    cand: Candidate, inst: Backend, problem: Problem, device: DeviceInfo, host: plugins.PluginHost, named: set[str]
) -> None:
    cand.reasons.extend(device_reasons(inst, device, host, always_probe=cand.name in named))
    if cand.reasons:
        return
    cand.mode = probe(host, inst, "execution_mode", device)
    cand.reasons.extend(cand.spec.signature_reasons(problem))
    if not cand.reasons:
        cand.reasons.extend(probe(host, inst, "unsupported", problem))
    if not cand.reasons and cand.name not in named:
        reason = probe(host, inst, "auto_select_reason", device)
        if reason is not None:
            cand.reasons.append(reason)
    if not cand.reasons:
        cand.path = probe(host, inst, "describe_path", problem)


# -- probes ------------------------------------------------------------------------------------------
class ProbeFailed(Exception):
    """A backend probe raised or returned a value of the wrong type; ``reason`` says which."""

    def __init__(self, reason: Reason):
        super().__init__(str(reason))
        self.reason = reason


def _reason_list(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and all(isinstance(r, Reason) for r in value)


_REASON_LIST = (_reason_list, "a list of moe_hal.Reason")
#: probe -> (check of its return value, what it must return).
_PROBES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "is_available": _REASON_LIST,
    "check_device": _REASON_LIST,
    "unsupported": _REASON_LIST,
    "execution_mode": (
        lambda v: v in (Backend.NATIVE, Backend.INTERPRETED, Backend.EMULATED),
        f"one of {Backend.NATIVE!r}, {Backend.INTERPRETED!r}, {Backend.EMULATED!r}",
    ),
    "auto_select_reason": (lambda v: v is None or isinstance(v, Reason), "None or a moe_hal.Reason"),
    "describe_path": (lambda v: isinstance(v, str), "a string"),
}


def probe(host: plugins.PluginHost, inst: Backend, what: str, *args: Any) -> Any:
    """``inst.<what>(*args)`` inside the isolation guard, its return value checked (a reason list
    comes back as a new list).

    A probe that raises or returns a value of the wrong type never breaks a call: the failure is
    recorded on the backend's plugin (``moe-hal info`` shows it, naming the probe) and
    :class:`ProbeFailed` carries a ``probe_failed`` reason, which makes the backend ineligible."""
    valid, expected = _PROBES[what]
    try:
        value = getattr(inst, what)(*args)
    except Exception as exc:  # noqa: BLE001 - a probe must never break selection
        host.probe_failed(inst.spec, what, exc)
        raise ProbeFailed(Reason("probe_failed", f"{inst.name}.{what}() raised {type(exc).__name__}: {exc}")) from None
    if not valid(value):
        message = f"{inst.name}.{what}() returned {_shown(value)}; expected {expected}"
        host.probe_failed(inst.spec, what, TypeError(message))
        raise ProbeFailed(Reason("probe_failed", message, expected, _shown(value)))
    return list(value) if valid is _reason_list else value


def _shown(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:80]}{'...' if len(text) > 80 else ''}"


_availability: dict[str, list[Reason]] = {}


def device_reasons(
    inst: Backend, device: DeviceInfo, host: plugins.PluginHost, always_probe: bool = False
) -> list[Reason]:
    """Why ``inst`` cannot run on ``device`` at all: the device check first (so a backend for
    another device type is not asked whether its software stack loads, which may be slow, unless
    ``always_probe``: the caller named it and wants every reason), then
    :meth:`~Backend.is_available`, asked once per backend until :func:`clear_cache`. Raises
    :class:`ProbeFailed` like :func:`probe`."""
    reasons = probe(host, inst, "check_device", device)
    if not always_probe and any(r.code == "device_type_unsupported" for r in reasons):
        return reasons
    available = _availability.get(inst.name)
    if available is None:
        try:
            available = probe(host, inst, "is_available")
        except ProbeFailed as failed:
            available = [failed.reason]
        _availability[inst.name] = available
    return available + reasons


def _rank(c: Candidate) -> tuple:
    return (-c.spec.priority, _TIER_RANK[c.spec.tier], c.name)


def _warn_if_slow(selection: Selection) -> None:
    """Warn when the automatic choice is the reference backend, or a fallback while optimized
    backends declared for this device type cannot run the call (those are named). An optimized
    backend that can run it but ranks lower by its priority is the plugins' own declaration, not a
    path change: ``explain()`` shows it with its priority, and there is no warning."""
    spec = selection.backend.spec
    dev = selection.device.type
    optimized = [
        c
        for c in selection.candidates
        if c.spec is not None and c.spec.tier == "optimized" and dev in c.spec.device_types
    ]
    if spec.tier == "fallback" and any(c.eligible for c in optimized):
        return
    unable = sorted(c.name for c in optimized if not c.eligible)
    if spec.tier == "reference" or (spec.tier == "fallback" and unable):
        why = f"; optimized backends for {dev} ({', '.join(unable)}) cannot run it" if unable else ""
        warn_once(
            ("selected", spec.name, selection.problem, dev),
            f"moe_hal selected the {spec.tier} backend {spec.name!r} for {selection.problem} "
            f"on {selection.device.label}{why}. Call moe_hal.select(...).explain() for the reasons.",
        )


# -- rendering ---------------------------------------------------------------------------------------
def render(
    problem: str,
    device: DeviceInfo,
    candidates: list[Candidate],
    chosen: str | None,
    ranked: list[str],
    how: str,
    considered: list[str] | None = None,
    op: str = "",
) -> str:
    """Plain-text explanation used by ``explain()`` and by selection errors."""
    lines = [f"call: {problem}", f"device: {device.label}"]
    by_name = {c.name: c for c in candidates}
    if chosen is not None:
        c = by_name[chosen]
        spec = c.spec
        mode = "" if c.mode in ("", Backend.NATIVE) else f", {c.mode.upper()}"
        lines.append(f"selected: {chosen} ({spec.tier}, priority {spec.priority}{mode}; {how})")
        if c.path:
            lines.append(f"  path: {c.path}")
        if op:
            lines.append(f"  graph capture ({op}): {spec.graph_capture(op).describe()}")
        others = ranked[1:]
        if others:
            lines.append(
                "also eligible, ranked lower: "
                + ", ".join(
                    f"{name} ({by_name[name].spec.tier}, priority {by_name[name].spec.priority})" for name in others
                )
            )
    elif considered:
        lines.append("considered (MOE_HAL_BACKEND / backend= preference): " + ", ".join(considered))
    rejected = [c for c in candidates if not c.eligible]
    if rejected:
        lines.append("not used:")
        for c in rejected:
            lines.append(f"  {c.name}:")
            lines.extend(f"    - {r}" for r in c.reasons)
    return "\n".join(lines)
