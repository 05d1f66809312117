"""Recognising a real device: which hardware-DB entry describes ``cuda:0``, ``npu:1`` or the CPU.

The hardware DB (:mod:`moe_hal.hwdb`) is pure data: its ``match_*`` functions apply recognition
rules to properties they are given. Reading a device's properties is the job of the plugin that
knows the device type (hook ``moe_hal_probe_device``; e.g. the CUDA plugin reads
``torch.cuda.get_device_properties``), so recognising a real device sits above both the database
and the plugin host, here.
"""

from __future__ import annotations

from typing import Any

from . import hwdb, plugins
from .errors import ArgumentError

__all__ = ["match_device"]


def _device_parts(device: Any) -> tuple[str, int | None]:
    """``(type, index)`` of a ``torch.device`` or a device string (``"cuda:0"``, ``"npu"``)."""
    if isinstance(device, str):
        kind, _, index = device.strip().partition(":")
        return kind.lower(), int(index) if index.strip().isdigit() else None
    kind = getattr(device, "type", None)
    if kind is None:
        raise ArgumentError("device", "a torch.device or a device string such as 'cuda:0'", repr(device))
    return kind, getattr(device, "index", None)


def match_device(device: Any) -> hwdb.Match:
    """Recognise ``device`` (a ``torch.device`` or a string like ``"cuda:0"``, ``"npu"``,
    ``"cpu"``). Never raises for a device it does not know: the result then has ``entry=None``,
    ``seen`` says what was observed and ``reason`` why nothing matched. A malformed database
    file still raises :class:`~moe_hal.errors.HardwareDBError`.

    Discovers the plugins first, so that their hardware-DB entries join the database (a plugin
    may describe a CPU too). The CPU is then recognised by :func:`moe_hal.hwdb.match_cpu`; any
    other device type is probed by the plugin that knows it, and a type no plugin probes gets a
    reason saying so.
    """
    kind, index = _device_parts(device)
    host = plugins.host().ensure_loaded()
    if kind == "cpu":
        return hwdb.match_cpu()
    found = host.probe_device(kind, index)
    if found is not None:
        return found
    return hwdb.Match(
        None, str(device), f"the hardware DB has no entries for device type {kind!r}: no installed plugin probes it"
    )
