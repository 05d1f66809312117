"""Side data attached to objects by identity, dropped when the object dies.

``weakref.WeakKeyDictionary`` keys by value: a layout's hash walks its G group counts (several
microseconds at 256 experts, on every look-up of a hot path), and a tensor's ``==`` is elementwise.
:class:`IdentityTable` keys by ``id`` instead and holds each object through a weak reference whose
callback removes the entry when the object dies, before its ``id`` can be reused. Nothing is
stored on the object itself, so ``torch.save`` / ``copy.deepcopy`` of a tensor never meet it.
"""

from __future__ import annotations

import weakref
from collections.abc import KeysView
from typing import Any


class IdentityTable:
    """A dict of side data per live object. ``get(obj)``: its dict or None; ``slot(obj)``: its dict,
    created empty on first use; ``new(obj)``: a fresh empty dict replacing any earlier one."""

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: dict[int, tuple[weakref.ref, dict]] = {}

    def get(self, obj: Any) -> dict | None:
        entry = self._entries.get(id(obj))
        return entry[1] if entry is not None and entry[0]() is obj else None

    def slot(self, obj: Any) -> dict:
        found = self.get(obj)
        return found if found is not None else self.new(obj)

    def new(self, obj: Any) -> dict:
        key = id(obj)
        data: dict = {}
        self._entries[key] = (weakref.ref(obj, lambda _ref, key=key: self._entries.pop(key, None)), data)
        return data

    def __contains__(self, obj: Any) -> bool:
        return self.get(obj) is not None

    def ids(self) -> KeysView[int]:
        """The ``id`` of every object that has an entry (live objects only)."""
        return self._entries.keys()
