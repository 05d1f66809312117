"""Recognising a CUDA device for the hardware DB (the ``moe_hal_probe_device`` hook).

The properties come from torch, else from cuda-python (a torch build without CUDA on a machine
with a driver); the hardware DB's ``recognition.cuda`` rules decide which entry they are.
"""

from __future__ import annotations

from moe_hal import hwdb


def cuda_properties(index: int | None) -> tuple[str, int, int, int | None]:
    """(name, major, minor, SM count) of a CUDA device: from torch, else from cuda-python (a torch
    build without CUDA on a machine with a driver). Raises when neither can answer."""
    try:
        import torch

        if index is None:
            index = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        return props.name, props.major, props.minor, props.multi_processor_count
    except Exception as torch_error:  # noqa: BLE001 - no CUDA build, no driver, bad index: try the driver API
        try:
            from cuda.bindings import driver

            def check(result):
                err, *values = result
                if err != driver.CUresult.CUDA_SUCCESS:
                    raise RuntimeError(f"CUDA driver error {err}")
                return values[0] if len(values) == 1 else values

            check(driver.cuInit(0))
            device = check(driver.cuDeviceGet(index or 0))
            raw_name = check(driver.cuDeviceGetName(64, device))
            attr = driver.CUdevice_attribute
            major = check(driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device))
            minor = check(driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device))
            sms = check(driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device))
            name = raw_name.split(b"\0", 1)[0].decode()
            return name, int(major), int(minor), int(sms)
        except Exception:  # noqa: BLE001 - the driver API cannot answer either: torch's reason is the clearer one
            raise torch_error from None


def probe(index: int | None) -> hwdb.Match:
    """The hardware-DB match of CUDA device ``index`` (None: the current one); never raises for
    a device that cannot be read: the match then says why."""
    try:
        name, major, minor, sms = cuda_properties(index)
    except Exception as exc:  # noqa: BLE001 - no CUDA, no driver or a bad index all read as "not recognised"
        return hwdb.Match(None, f"cuda:{0 if index is None else index}", f"could not read the device properties: {exc}")
    return hwdb.match_cuda(name, major, minor, sms)
