"""Recognising an Ascend NPU for the hardware DB (the ``moe_hal_probe_device`` hook).

The SoC name comes from ``torch.npu.get_device_name`` and, where torch_npu has it, the SoC
version from ``torch_npu.npu.get_soc_version``; the hardware DB's ``recognition.npu`` rules decide
which entry they are.
"""

from __future__ import annotations

from moe_hal import hwdb


def npu_properties(index: int | None) -> tuple[str, int | None]:
    import torch
    import torch_npu  # noqa: F401 - registers torch.npu

    if index is None:
        index = torch.npu.current_device()
    name = torch.npu.get_device_name(index)
    try:
        version = int(torch_npu.npu.get_soc_version())
    except Exception:  # noqa: BLE001 - older torch_npu without get_soc_version: the name alone decides
        version = None
    return name, version


def probe(index: int | None) -> hwdb.Match:
    """The hardware-DB match of NPU ``index`` (None: the current one); never raises for a device
    that cannot be read (torch_npu missing, no device): the match then says why."""
    try:
        name, version = npu_properties(index)
    except Exception as exc:  # noqa: BLE001 - torch_npu missing or no device both read as "not recognised"
        return hwdb.Match(None, f"npu:{0 if index is None else index}", f"could not read the device properties: {exc}")
    return hwdb.match_npu(name, version)
