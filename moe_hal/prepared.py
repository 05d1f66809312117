"""Prepared weights: convert expert weights once into a backend's physical form, reuse them per call.

A backend calls, inside ``run()``::

    from moe_hal.prepared import prepared_cache
    packed = prepared_cache.get(self.name, q_b, "sm100_ue8m0_scales", lambda q: pack_ue8m0(q.scale))

The first call runs ``build(source)`` and stores the result; later calls with the same source return
it. The cache is the generic part — backends only supply ``kind`` (a name for the form) and ``build``.

**Identity.** An entry is keyed by ``(backend, kind)`` and, for each tensor of the source (the tensor,
or ``data`` and ``scale`` of a :class:`~moe_hal.quant.QuantizedTensor`), by its storage, storage
offset, shape, strides and dtype. A fresh view with the same geometry (``w.transpose(1, 2)`` built
anew every call) therefore hits; a different view of the same storage is a different entry.

**Invalidation.** The entry remembers the tensors' version counters (``tensor._version``); an
in-place change (``w.add_(1)``, ``w.copy_(...)``, an optimizer step) bumps it, and the next ``get``
rebuilds. Writes the version counter cannot see — through ``w.data`` or on inference-mode tensors,
which have no counter — need an explicit :meth:`PreparedCache.discard` (or :meth:`clear`).

**Lifetime.** The cache holds only weak references to the sources' storages: when the last tensor
using a source storage is freed, its entries are dropped (and their memory with them). A ``build``
result must therefore not contain the source or a view of it (it would keep the source alive):
such a result is returned but not cached — silently when it only aliases the source (nothing was
converted), with a one-time :class:`~moe_hal.errors.PathWarning` when it mixes new tensors with
views of the source (the conversion then reruns on every call).

**Memory.** ``stats()`` reports entries and bytes (unique storages of the results) per backend.
A byte budget — :meth:`set_max_bytes`, else the ``MOE_HAL_PREPARED_MAX_BYTES`` environment variable
(``8000000000``, ``512MiB``, ``8GB``...), else unlimited — is enforced by evicting the least
recently used entries; a result larger than the whole budget is returned uncached, with a one-time
PathWarning.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Iterator

import torch

from . import environment
from .errors import ArgumentError, DTypeError, EnvironmentVariableError
from .notices import warn_once
from .quant import QuantizedTensor

ENV_MAX_BYTES = "MOE_HAL_PREPARED_MAX_BYTES"
Source = torch.Tensor | QuantizedTensor


def parse_bytes(text: str, argument: str = ENV_MAX_BYTES) -> int:
    """``"8000000000"``, ``"8e9"``, ``"512MiB"``, ``"8GB"``, ``"8G"`` -> bytes (case-insensitive);
    the environment's parser (:func:`moe_hal.environment.parse_bytes`)."""
    error = EnvironmentVariableError if argument == ENV_MAX_BYTES else ArgumentError
    return environment.parse_bytes(text, argument, error)


@dataclass(eq=False)
class _Entry:
    backend: str
    value: Any
    versions: tuple[int | None, ...]
    anchors: tuple[weakref.ref, ...]  # weak references to the source storages
    nbytes: int


@dataclass
class _Counters:
    hits: int = 0
    misses: int = 0
    invalidations: int = 0
    evictions: int = 0
    uncached: int = 0
    by_backend: dict[str, list[int]] = field(default_factory=dict)  # backend -> [entries, bytes]


def _source_tensors(source: object) -> tuple[torch.Tensor, ...]:
    if isinstance(source, QuantizedTensor):
        return (source.data, source.scale)
    if isinstance(source, torch.Tensor):
        return (source,)
    raise DTypeError("source", "a torch.Tensor or moe_hal.QuantizedTensor", type(source).__name__)


def _version(t: torch.Tensor) -> int | None:
    try:
        return t._version
    except RuntimeError:  # inference-mode tensors have no version counter
        return None


def _tensors_in(value: Any) -> Iterator[torch.Tensor]:
    """Tensors held by a build result: tensors, QuantizedTensors and (nested) lists/tuples/dicts."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, QuantizedTensor):
        yield value.data
        yield value.scale
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors_in(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors_in(item)


class PreparedCache:
    """Process-wide cache of backend-specific forms of weight tensors (see the module docs)."""

    def __init__(self) -> None:
        self._entries: OrderedDict[Hashable, _Entry] = OrderedDict()  # LRU order, oldest first
        self._by_storage: dict[int, set[Hashable]] = {}  # id(storage) -> keys
        self._dead: list[int] = []  # freed storages to purge
        self._lock = threading.Lock()
        self._max_bytes: int | None = None
        self._max_bytes_set = False
        self._bytes = 0
        self._counters = _Counters()

    # -- public API -------------------------------------------------------------------------
    def get(self, backend: str, source: Source, kind: str, build: Callable[[Source], Any]) -> Any:
        """The ``kind`` form of ``source`` for ``backend``: cached, or ``build(source)`` once.

        ``backend``: the backend's name; ``kind``: a name for the physical form (one backend may
        keep several forms of a weight); ``build``: a pure function of ``source`` returning new
        tensors (or a tuple/list/dict/QuantizedTensor of them, or any object, counted 0 bytes).
        """
        if not isinstance(backend, str) or not backend:
            raise ArgumentError("backend", "a non-empty backend name", backend)
        if not isinstance(kind, str) or not kind:
            raise ArgumentError("kind", "a non-empty name for the prepared form", kind)
        if not callable(build):
            raise ArgumentError("build", "a callable build(source) -> prepared form", type(build).__name__)
        tensors = _source_tensors(source)
        try:
            storages = tuple(t.untyped_storage() for t in tensors)
        except (RuntimeError, NotImplementedError):  # sparse / storage-less tensor subclasses
            warn_once(
                ("prepared-nostorage", backend, kind),
                f"moe_hal prepared cache: the source of {backend}/{kind} has no plain storage; "
                "it is converted on every call",
                stacklevel=3,
            )
            return build(source)
        key = (backend, kind) + tuple(
            (id(s), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype) for s, t in zip(storages, tensors)
        )
        versions = tuple(_version(t) for t in tensors)
        with self._lock:
            self._purge_dead()
            entry = self._entries.get(key)
            if entry is not None:
                if entry.versions == versions and all(a() is s for a, s in zip(entry.anchors, storages)):
                    self._entries.move_to_end(key)
                    self._counters.hits += 1
                    return entry.value
                self._remove(key)
                self._counters.invalidations += 1
            self._counters.misses += 1

        value = build(source)  # outside the lock: a build may itself use the cache
        nbytes, aliased, fresh = self._measure(value, storages)
        if aliased:
            if fresh:
                warn_once(
                    ("prepared-alias", backend, kind),
                    f"moe_hal prepared cache: build() for {backend}/{kind} returned views of its source "
                    "together with new tensors; it is not cached (it would keep the source alive) and "
                    "reruns on every call. Return only the new tensors.",
                    stacklevel=3,
                )
            with self._lock:
                self._counters.uncached += 1
            return value
        with self._lock:
            self._purge_dead()
            budget = self.max_bytes
            if budget is not None and nbytes > budget:
                self._counters.uncached += 1
                warn_once(
                    ("prepared-budget", backend, kind),
                    f"moe_hal prepared cache: {backend}/{kind} needs {nbytes} bytes, more than the budget "
                    f"of {budget} ({ENV_MAX_BYTES}); it is converted on every call",
                    stacklevel=3,
                )
                return value
            if key in self._entries:  # another thread built it meanwhile
                self._remove(key)
            anchors = tuple(weakref.ref(s, functools.partial(self._on_storage_freed, id(s))) for s in storages)
            self._entries[key] = _Entry(backend, value, versions, anchors, nbytes)
            for s in storages:
                self._by_storage.setdefault(id(s), set()).add(key)
            self._bytes += nbytes
            count = self._counters.by_backend.setdefault(backend, [0, 0])
            count[0] += 1
            count[1] += nbytes
            if budget is not None:
                self._evict_to(budget, keep=key)
        return value

    def discard(self, source: Source) -> int:
        """Drop every entry (all backends and kinds) built from ``source``'s storages; returns how many.
        Use it after writes the version counter cannot see (``w.data.copy_(...)``, inference mode)."""
        storages = {id(t.untyped_storage()) for t in _source_tensors(source)}
        with self._lock:
            self._purge_dead()
            keys = set().union(*(self._by_storage.get(s, set()) for s in storages))
            for key in keys:
                self._remove(key)
            return len(keys)

    def clear(self, backend: str | None = None) -> None:
        """Drop every entry, or only ``backend``'s. Counters are kept."""
        with self._lock:
            self._purge_dead()
            for key in [k for k, e in self._entries.items() if backend is None or e.backend == backend]:
                self._remove(key)

    def set_max_bytes(self, max_bytes: int | str | None) -> None:
        """Byte budget for all entries together (an int, a string like ``"2GiB"``, or None for no
        limit); overrides ``MOE_HAL_PREPARED_MAX_BYTES``. Evicts least recently used entries now."""
        if isinstance(max_bytes, str):
            max_bytes = parse_bytes(max_bytes, "max_bytes")
        if max_bytes is not None and (isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0):
            raise ArgumentError("max_bytes", "None or a non-negative int (bytes)", max_bytes)
        with self._lock:
            self._max_bytes, self._max_bytes_set = max_bytes, True
            if max_bytes is not None:
                self._evict_to(max_bytes, keep=None)

    def reset_max_bytes(self) -> None:
        """Forget :meth:`set_max_bytes`: the budget comes from the environment again."""
        with self._lock:
            self._max_bytes, self._max_bytes_set = None, False

    @property
    def max_bytes(self) -> int | None:
        """The budget in bytes (None: unlimited): :meth:`set_max_bytes`, else the environment."""
        if self._max_bytes_set:
            return self._max_bytes
        return environment.size(ENV_MAX_BYTES)

    def stats(self) -> dict[str, Any]:
        """``{"entries", "bytes", "max_bytes", "hits", "misses", "invalidations", "evictions",
        "uncached", "backends": {name: {"entries", "bytes"}}}`` — a snapshot (plain ints)."""
        with self._lock:
            self._purge_dead()
            c = self._counters
            return {
                "entries": len(self._entries),
                "bytes": self._bytes,
                "max_bytes": self.max_bytes,
                "hits": c.hits,
                "misses": c.misses,
                "invalidations": c.invalidations,
                "evictions": c.evictions,
                "uncached": c.uncached,
                "backends": {name: {"entries": n, "bytes": b} for name, (n, b) in sorted(c.by_backend.items()) if n},
            }

    def __len__(self) -> int:
        with self._lock:
            self._purge_dead()
            return len(self._entries)

    # -- internals (called with the lock held) ------------------------------------------------
    def _on_storage_freed(self, storage_id: int, _ref: weakref.ref) -> None:
        # Runs inside whatever code dropped the last reference, possibly while this thread holds
        # the lock (the cyclic GC can run anywhere): record it, and purge now only if the lock is free.
        self._dead.append(storage_id)
        if self._lock.acquire(blocking=False):
            try:
                self._purge_dead()
            finally:
                self._lock.release()

    def _purge_dead(self) -> None:
        while self._dead:
            for key in list(self._by_storage.get(self._dead.pop(), ())):
                self._remove(key)

    def _remove(self, key: Hashable) -> None:
        entry = self._entries.pop(key, None)
        if entry is None:
            return
        self._bytes -= entry.nbytes
        count = self._counters.by_backend[entry.backend]
        count[0] -= 1
        count[1] -= entry.nbytes
        for storage_id, *_ in key[2:]:
            keys = self._by_storage.get(storage_id)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._by_storage[storage_id]

    def _evict_to(self, budget: int, keep: Hashable | None) -> None:
        for key in list(self._entries):
            if self._bytes <= budget:
                break
            if key != keep:
                self._remove(key)
                self._counters.evictions += 1

    @staticmethod
    def _measure(value: Any, source_storages: tuple[Any, ...]) -> tuple[int, bool, bool]:
        """(bytes of the result's own storages, whether it aliases the source, whether it has new ones)."""
        source_ptrs = {(s.device, s.data_ptr()) for s in source_storages if s.nbytes()}
        seen: set[tuple[torch.device, int]] = set()
        nbytes, aliased, fresh = 0, False, False
        for t in _tensors_in(value):
            storage = t.untyped_storage()
            ptr = (storage.device, storage.data_ptr())
            if storage.nbytes() and ptr in source_ptrs:
                aliased = True
                continue
            fresh = True
            if ptr not in seen:
                seen.add(ptr)
                nbytes += storage.nbytes()
        return nbytes, aliased, fresh


#: The process-wide cache every backend uses.
prepared_cache = PreparedCache()

__all__ = ["ENV_MAX_BYTES", "PreparedCache", "parse_bytes", "prepared_cache"]
