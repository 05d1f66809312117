"""What moe_hal reads from the environment: the one parser of environment variables and the
table of the variables the core reads.

:func:`flag` (booleans), :func:`size` (byte counts), :func:`choice` (one of a fixed set). The core
and the bundled plugins read their variables through it, so ``MOE_HAL_STRICT_PLUGINS=false`` means
off everywhere, and a value that cannot be parsed raises
:class:`~moe_hal.errors.EnvironmentVariableError` naming the variable, what was expected and what
was given. Plugins declare their own variables (hook ``moe_hal_environment``); the snapshot of
what moe_hal sees is :mod:`moe_hal.sysinfo`.
"""

from __future__ import annotations

import math
import os
import re
from typing import Iterable

from .errors import ArgumentError, EnvironmentVariableError

# -- parsing ---------------------------------------------------------------------------------------
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"", "0", "false", "no", "off"})
_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?(?:e[0-9]+)?)\s*([kmgt]i?)?b?\s*")
#: Largest byte count a size may give (16 EiB): beyond it a value is a typo, not a budget.
MAX_SIZE = 2**64


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


# -- the variables ---------------------------------------------------------------------------------

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
