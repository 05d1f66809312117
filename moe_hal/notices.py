"""One-time notices: the library says so, once, whenever it takes a slower or different path."""

from __future__ import annotations

import threading
import warnings
from typing import Hashable

from .errors import PathWarning

_seen: set[Hashable] = set()
_lock = threading.Lock()


def warn_once(key: Hashable, message: str, category: type[Warning] = PathWarning, stacklevel: int = 3) -> bool:
    """Emit ``message`` as a warning the first time ``key`` is seen in this process.

    Returns True when the warning was emitted. :func:`reset` forgets the keys (tests).
    """
    with _lock:
        if key in _seen:
            return False
        _seen.add(key)
    warnings.warn(message, category, stacklevel=stacklevel)
    return True


def reset() -> None:
    """Forget which notices were shown, so they show again."""
    with _lock:
        _seen.clear()
