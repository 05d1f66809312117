"""Facts about a CUDA device (SM count, L2 size, compute capability), read through cuda-python.

cuda-python (``cuda.bindings.driver``) is optional: when it is not installed the same facts come
from ``torch.cuda``. Without a driver, cuda-python imports fine but every driver call raises a
Python exception (seen with ``cuda-bindings`` 13.5.0 on a machine without a driver: a
``cuda.pathfinder`` ``DynamicLibNotFoundError``, not a ``CUresult``), so every call here is guarded and a
failure becomes a :class:`~moe_hal.Reason` with a stable code:

* ``cuda_driver_missing`` — no NVIDIA driver could be loaded or initialised;
* ``cuda_device_missing`` — the driver works but reports no device (or not this index);
* ``torch_cuda_missing``  — cuda-python is absent and torch was built without CUDA.

Nothing here is imported by the plugin module; the backends import it when first considered.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from moe_hal import Reason


@dataclass(frozen=True)
class DeviceFacts:
    """What the kernels' launch decisions need from one CUDA device.

    ``compute_capability``: ``(major, minor)``. ``l2_bytes``: L2 cache size in bytes.
    ``smem_optin_bytes``: largest shared memory one block may opt in to. ``driver_version``:
    the driver API version as an int (e.g. 13000), None when unknown. ``source``: ``"cuda-python"``
    or ``"torch"``.
    """

    index: int
    name: str
    compute_capability: tuple[int, int]
    sm_count: int
    l2_bytes: int
    smem_optin_bytes: int | None
    driver_version: int | None
    source: str

    @property
    def arch(self) -> str:
        """``"sm_90"``, ``"sm_100"``, ... from the compute capability."""
        major, minor = self.compute_capability
        return f"sm_{major}{minor}"

    def as_dict(self) -> dict:
        return {
            "index": self.index,
            "name": self.name,
            "compute_capability": list(self.compute_capability),
            "arch": self.arch,
            "sm_count": self.sm_count,
            "l2_bytes": self.l2_bytes,
            "smem_optin_bytes": self.smem_optin_bytes,
            "driver_version": self.driver_version,
            "source": self.source,
        }


def _driver_module():
    """``cuda.bindings.driver`` or None when cuda-python is not installed (any import failure)."""
    try:
        from cuda.bindings import driver
    except Exception:  # noqa: BLE001 - a half-installed cuda-python must read as "absent"
        return None
    return driver


def _from_cuda_python(driver, index: int) -> DeviceFacts | Reason:
    def call(fn, *args):
        result = fn(*args)
        err, *values = result if isinstance(result, tuple) else (result,)
        if err != driver.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"{fn.__name__} returned {err}")
        return values[0] if len(values) == 1 else values

    try:
        call(driver.cuInit, 0)
        version = int(call(driver.cuDriverGetVersion))
    except Exception as exc:  # noqa: BLE001 - DynamicLibNotFoundError, CUresult errors, ...
        return Reason(
            "cuda_driver_missing",
            f"the CUDA driver could not be initialised through cuda-python: {type(exc).__name__}: {exc}",
            "an NVIDIA driver",
            "none usable",
        )
    try:
        count = int(call(driver.cuDeviceGetCount))
        if index >= count:
            return Reason("cuda_device_missing", "the CUDA driver reports no such device", f"index < {count}", index)
        dev = call(driver.cuDeviceGet, index)
        name = call(driver.cuDeviceGetName, 256, dev).split(b"\0", 1)[0].decode(errors="replace")
        attr = driver.CUdevice_attribute

        def get(a) -> int:
            return int(call(driver.cuDeviceGetAttribute, a, dev))

        return DeviceFacts(
            index=index,
            name=name,
            compute_capability=(
                get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
                get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR),
            ),
            sm_count=get(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
            l2_bytes=get(attr.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE),
            smem_optin_bytes=get(attr.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN),
            driver_version=version,
            source="cuda-python",
        )
    except Exception as exc:  # noqa: BLE001 - every driver failure becomes a reason (module docstring)
        return Reason(
            "cuda_device_missing",
            f"reading device {index} through cuda-python failed: {type(exc).__name__}: {exc}",
            "a readable CUDA device",
            index,
        )


def _from_torch(index: int) -> DeviceFacts | Reason:
    try:
        import torch

        if not torch.backends.cuda.is_built():
            return Reason(
                "torch_cuda_missing",
                "cuda-python is not installed and this torch has no CUDA support",
                "cuda-python, or a torch built with CUDA",
                f"torch {torch.__version__}",
            )
        if not torch.cuda.is_available():
            return Reason(
                "cuda_driver_missing",
                "torch.cuda reports no usable CUDA driver or device",
                "an NVIDIA driver and device",
                "none",
            )
        count = torch.cuda.device_count()
        if index >= count:
            return Reason("cuda_device_missing", "torch.cuda reports no such device", f"index < {count}", index)
        p = torch.cuda.get_device_properties(index)
        smem = getattr(p, "shared_memory_per_block_optin", None)
        return DeviceFacts(
            index=index,
            name=p.name,
            compute_capability=(p.major, p.minor),
            sm_count=p.multi_processor_count,
            l2_bytes=int(p.L2_cache_size),
            smem_optin_bytes=int(smem) if smem else None,
            driver_version=None,
            source="torch",
        )
    except Exception as exc:  # noqa: BLE001 - every torch.cuda failure becomes a reason
        return Reason(
            "cuda_driver_missing",
            f"torch.cuda failed: {type(exc).__name__}: {exc}",
            "an NVIDIA driver and device",
            "none usable",
        )


@functools.lru_cache(maxsize=None)
def device_facts(index: int = 0) -> DeviceFacts | Reason:
    """Facts of CUDA device ``index``, or the :class:`~moe_hal.Reason` they cannot be read.

    cuda-python is asked first; when it is not installed or cannot read the device (a
    cuda-bindings release newer than the driver, say), ``torch.cuda``. When both fail the
    cuda-python reason is returned (it names the driver problem). Never raises. Cached per index
    for the life of the process (call ``device_facts.cache_clear()`` to re-probe).
    """
    driver = _driver_module()
    if driver is None:
        return _from_torch(index)
    facts = _from_cuda_python(driver, index)
    if isinstance(facts, Reason):
        fallback = _from_torch(index)
        return fallback if isinstance(fallback, DeviceFacts) else facts
    return facts


def driver_reasons() -> list[Reason]:
    """Empty when device 0 can be read, else the one reason it cannot (see module docstring)."""
    facts = device_facts(0)
    return [facts] if isinstance(facts, Reason) else []
