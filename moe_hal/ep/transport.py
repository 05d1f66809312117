"""Expert-parallel transports: what moves the rows between ranks, and how one is chosen.

A transport is declared by a :class:`~moe_hal.ep.spec.TransportSpec` (its own module, cheap to
import) registered through the ``moe_hal_ep_transports`` hook — the built-in one by
:mod:`moe_hal.builtin`, others (DeepEP, NVSHMEM / symmetric memory, Ascend MC2) by plugins, without
changes to the core. Its implementation (:class:`Transport`, named lazily by ``spec.impl``)
provides two collectives (each optionally non-blocking): a variable-split all-to-all
of byte rows (called once per direction of dispatch and of combine, often on row slices of larger
contiguous buffers; in exact mode a rank's own split is 0, its rows for its own experts never pass
through it) and an all-gather of small int64 rows
(dispatch's count matrix, combine's status flags).

Each spec declares the promises selection relies on:

* ``needs_host_sync`` — the transport itself reads row counts on the host before moving data
  (DeepEP's normal mode does). Capacity mode promises no host sync, so such a transport cannot
  serve it; exact mode has the counts on the host anyway.
* ``graph_safe`` — the transport can be captured in a CUDA graph (static shapes, no host reads,
  no allocation it does not own). Required when the call is being captured.

:func:`select` collects every transport's reasons, ranks the eligible by priority then name (never
by registration order) and returns a :class:`TransportSelection` whose ``explain()`` says which
transport runs and why each other one does not.
"""

from __future__ import annotations

import functools
import importlib
import traceback
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ..backend import Reason
from ..errors import ArgumentError, TransportUnavailableError
from .spec import BUILTIN, MODES, TransportSpec


class Pending:
    """A collective in flight: ``wait()`` returns once it is complete on this rank."""

    def wait(self) -> None:
        pass


_DONE = Pending()


class Transport:
    """Runtime side of a transport. The all-to-all moves 2-D ``uint8`` byte rows (every payload —
    bf16, fp32, fp8 data and its fp32 scales — travels as a byte view, which every engine
    accepts); the all-gather moves 1-D int64 rows."""

    def __init__(self, spec: TransportSpec):
        self.spec = spec

    # implemented by the transport
    def all_to_all(
        self,
        out: torch.Tensor,
        inp: torch.Tensor,
        out_splits: list[int],
        in_splits: list[int],
        group: dist.ProcessGroup,
    ) -> None:
        """Send ``inp`` rows ``[sum(in_splits), B]`` (``in_splits[r]`` rows to rank ``r``, in rank
        order) and receive ``out`` ``[sum(out_splits), B]`` (``out_splits[r]`` rows from rank r).
        Both are contiguous, often row slices of larger buffers (``out`` may be part of the tensor
        returned to the caller): write exactly ``out``'s rows."""
        raise NotImplementedError("need all_to_all")

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor, group: dist.ProcessGroup) -> None:
        """``out`` 1-D ``[world * n]`` receives every rank's 1-D ``inp`` ``[n]`` in rank order."""
        raise NotImplementedError("need all_gather")

    # optional
    def start_all_to_all(
        self,
        out: torch.Tensor,
        inp: torch.Tensor,
        out_splits: list[int],
        in_splits: list[int],
        group: dist.ProcessGroup,
    ) -> Pending:
        """:meth:`all_to_all`, begun: ``out`` is valid (and ``inp`` may be reused) once ``wait()`` of
        the result has returned; the caller copies a rank's rows for its own experts in between.
        Default: the blocking :meth:`all_to_all`, already done."""
        self.all_to_all(out, inp, out_splits, in_splits, group)
        return _DONE

    def start_all_gather(self, out: torch.Tensor, inp: torch.Tensor, group: dist.ProcessGroup) -> Pending:
        """:meth:`all_gather`, begun: ``out`` is valid once ``wait()`` of the result has returned, and
        the caller may work in between (combine copies rows while its status flags travel).
        Default: the blocking :meth:`all_gather`, already done."""
        self.all_gather(out, inp, group)
        return _DONE


class AllToAllSingle(Transport):
    """The built-in transport: ``torch.distributed.all_to_all_single`` (gloo, NCCL, HCCL alike)."""

    def all_to_all(self, out, inp, out_splits, in_splits, group) -> None:
        dist.all_to_all_single(out, inp, out_splits, in_splits, group=group)

    def start_all_to_all(self, out, inp, out_splits, in_splits, group) -> Pending:
        return dist.all_to_all_single(out, inp, out_splits, in_splits, group=group, async_op=True)

    def all_gather(self, out, inp, group) -> None:
        _all_gather_single(out, inp, group=group)

    def start_all_gather(self, out, inp, group) -> Pending:
        return _all_gather_single(out, inp, group=group, async_op=True)


# torch 2.13 renamed all_gather_into_tensor to all_gather_single (the old name warns).
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

# -- registry ----------------------------------------------------------------------------------


@dataclass
class _Registry:
    specs: dict[str, TransportSpec]
    conflicts: dict[str, list[str]]
    failures: list[str]  # one line per plugin whose hook raised
    instances: dict[str, Transport | Reason] = field(default_factory=dict)


@functools.lru_cache(maxsize=1)
def _registry() -> _Registry:
    """Call every ``moe_hal_ep_transports`` implementation once, each in its own try/except."""
    from .. import plugins

    host = plugins.host().ensure_loaded()
    specs: dict[str, TransportSpec] = {}
    owners: dict[str, list[str]] = {}
    failures: list[str] = []
    for impl in host.pm.hook.moe_hal_ep_transports.get_hookimpls():
        found: list[TransportSpec] = []
        try:
            impl.function(register=found.append)
            for spec in found:
                if not isinstance(spec, TransportSpec):
                    raise TypeError(f"register() expects a moe_hal.ep.TransportSpec, got {type(spec).__name__}")
        except Exception as exc:  # noqa: BLE001 - one broken plugin must not hide the others
            failures.append(
                f"{impl.plugin_name}: moe_hal_ep_transports raised {type(exc).__name__}: {exc}\n"
                + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            )
            continue
        for spec in found:
            owners.setdefault(spec.name, []).append(impl.plugin_name)
            specs.setdefault(spec.name, TransportSpec(**{**spec.__dict__, "plugin": impl.plugin_name}))
    conflicts = {name: sorted(p) for name, p in owners.items() if len(p) > 1}
    return _Registry(specs, conflicts, failures)


def _reset() -> None:
    _registry.cache_clear()
    _select_cached.cache_clear()


def _register_reload_hook() -> None:
    from .. import plugins

    plugins.on_reload(_reset)


_register_reload_hook()


def transport_specs() -> dict[str, TransportSpec]:
    """Every registered transport spec by name."""
    return dict(_registry().specs)


def _instance(spec: TransportSpec) -> Transport | Reason:
    reg = _registry()
    got = reg.instances.get(spec.name)
    if got is None:
        try:
            module, _, cls = spec.impl.partition(":")
            got = getattr(importlib.import_module(module), cls)(spec)
            if not isinstance(got, Transport):
                raise TypeError(f"{spec.impl} is not a moe_hal.ep.Transport subclass")
        except Exception as exc:  # noqa: BLE001 - any import or constructor failure becomes the transport's reason
            got = Reason("import_failed", f"importing {spec.impl} failed: {type(exc).__name__}: {exc}")
        reg.instances[spec.name] = got
    return got


# -- selection ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    name: str
    reasons: tuple[Reason, ...]

    @property
    def eligible(self) -> bool:
        return not self.reasons


@dataclass(frozen=True, eq=False)
class TransportSelection:
    """The transport chosen for (process-group backend, device type, mode, graph capture) and why.
    ``pg_backend``: the backend that serves ``device_type`` tensors (not the group's device map)."""

    transport: Transport
    pg_backend: str
    device_type: str
    mode: str
    graph: bool
    forced: str | None
    candidates: tuple[Candidate, ...]
    plugin_failures: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.transport.spec.name

    @property
    def spec(self) -> TransportSpec:
        return self.transport.spec

    def explain(self) -> str:
        """Which transport runs, what it promises, and why each other transport does not."""
        return _render(self)


def _reasons(spec: TransportSpec, reg: _Registry, pg_backend: str, mode: str, graph: bool) -> list[Reason]:
    out = []
    if spec.name in reg.conflicts:
        out.append(
            Reason(
                "name_conflict",
                f"several plugins register a transport named {spec.name!r}; none is used",
                "one plugin per name",
                reg.conflicts[spec.name],
            )
        )
    if "*" not in spec.process_group_backends and pg_backend not in spec.process_group_backends:
        out.append(
            Reason(
                "process_group_backend",
                "runs on other torch.distributed backends",
                set(spec.process_group_backends),
                pg_backend,
            )
        )
    if mode not in spec.modes:
        out.append(Reason("mode", "does not implement this dispatch mode", set(spec.modes), mode))
    if mode == "capacity" and spec.needs_host_sync:
        out.append(Reason("needs_host_sync", "reads row counts on the host; capacity mode promises no host sync"))
    if graph and not spec.graph_safe:
        out.append(Reason("not_graph_safe", "not declared safe for CUDA-graph capture, and the call is captured"))
    if not out:
        inst = _instance(spec)
        if isinstance(inst, Reason):
            out.append(inst)
    return out


@functools.lru_cache(maxsize=256)
def _select_cached(pg_backend: str, device_type: str, mode: str, graph: bool, forced: str | None) -> TransportSelection:
    reg = _registry()
    specs = sorted(reg.specs.values(), key=lambda s: (-s.priority, s.name))
    candidates = tuple(Candidate(s.name, tuple(_reasons(s, reg, pg_backend, mode, graph))) for s in specs)
    if forced is not None:
        if forced not in reg.specs:
            raise ArgumentError("transport", f"one of {sorted(reg.specs)}", forced)
        pool = [c for c in candidates if c.name == forced]
    else:
        pool = list(candidates)
    chosen = next((c for c in pool if c.eligible), None)
    if chosen is None:
        lines = [f"  {c.name}: " + "; ".join(map(str, c.reasons)) for c in candidates]
        lines += [f"  plugin failure: {f.splitlines()[0]}" for f in reg.failures]
        head = f"transport {forced!r} was named" if forced else "no transport is eligible"
        raise TransportUnavailableError(
            f"{head} (process group backend {pg_backend!r} for {device_type} tensors, mode {mode!r}, "
            f"graph capture {graph}):\n" + "\n".join(lines)
        )
    inst = _instance(reg.specs[chosen.name])
    return TransportSelection(inst, pg_backend, device_type, mode, graph, forced, candidates, tuple(reg.failures))


def select(
    group,
    mode: str = "exact",
    *,
    graph: bool = False,
    transport: str | None = None,
    device: torch.device | str | None = None,
) -> TransportSelection:
    """The transport :func:`moe_hal.ep.dispatch` uses for ``group`` (an :class:`~moe_hal.ep.EPGroup`)
    in ``mode`` on tensors of ``device``; ``graph=True`` asks for one safe under CUDA-graph capture;
    ``transport`` forces one by name. Transports are matched against the backend that serves
    ``device`` (:meth:`~moe_hal.ep.EPGroup.backend_for`: ``"nccl"`` for CUDA tensors of a
    ``"cpu:gloo,cuda:nccl"`` group); ``device`` None: the current accelerator when the group
    serves it, else the CPU. Raises :class:`~moe_hal.errors.TransportUnavailableError` when none
    (or not the named one) is eligible. Cached per (backend, device type, mode, graph, transport)."""
    if mode not in MODES:
        raise ArgumentError("mode", f"one of {MODES}", mode)
    if transport is not None and not isinstance(transport, str):
        raise ArgumentError("transport", "None or a transport name", transport)
    if device is None:
        device = _default_device(group)
    backend = group.backend_for(device)  # refuses what is not a device, or a device the group does not serve
    return _select_cached(backend, torch.device(device).type, mode, bool(graph), transport)


def _default_device(group) -> torch.device:
    """The current accelerator when ``group`` serves it, else the CPU."""
    accelerator = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    if accelerator is not None:
        try:
            group.backend_for(accelerator)
            return accelerator
        except ArgumentError:  # the group's device map leaves the accelerator out
            pass
    return torch.device("cpu")


def _render(sel: TransportSelection) -> str:
    spec = sel.spec
    how = f"forced by transport={sel.forced!r}" if sel.forced else "highest priority among the eligible"
    lines = [
        f"expert-parallel transport: {spec.name} ({how})",
        (
            f"  call: process group backend {sel.pg_backend!r} for {sel.device_type} tensors, mode {sel.mode!r}, "
            f"graph capture {sel.graph}"
        ),
        (
            f"  promises: needs_host_sync={spec.needs_host_sync}, graph_safe={spec.graph_safe}, "
            f"modes={sorted(spec.modes)}, process group backends={list(spec.process_group_backends)}"
        ),
        f"  from: {spec.plugin or '?'} — {spec.description}",
    ]
    others = [c for c in sel.candidates if c.name != spec.name]
    if others:
        lines.append("other transports:")
    for c in others:
        if c.eligible:
            lines.append(f"  {c.name}: eligible, not chosen ({'not the one named' if sel.forced else 'lower rank'})")
        else:
            lines.append(f"  {c.name}: " + "; ".join(map(str, c.reasons)))
    for f in sel.plugin_failures:
        lines.append(f"  plugin failure: {f.splitlines()[0]}")
    return "\n".join(lines)


__all__ = [
    "BUILTIN",
    "MODES",
    "AllToAllSingle",
    "Candidate",
    "Pending",
    "Transport",
    "TransportSelection",
    "TransportSpec",
    "select",
    "transport_specs",
]
