"""moe_hal: one grouped-GEMM API for Mixture-of-Experts layers across NVIDIA SM90/SM100,
Huawei Ascend NPUs and the CPU.

>>> import torch, moe_hal
>>> lay = moe_hal.ContiguousLayout.from_counts([3, 0, 5], alignment=4)
>>> a = torch.randn(lay.num_rows, 64); b = torch.randn(3, 32, 64)
>>> moe_hal.grouped_gemm(a, b, lay).shape
torch.Size([12, 32])

Importing this package loads no plugin and imports no vendor stack (torch_npu, triton,
cuda-python); plugins are discovered on first use.
"""

from . import errors, quant
from .api import backends, explain, get_backend, grouped_gemm, select
from .backend import Backend, BackendSpec, DeviceInfo, Reason, Signature
from .hookspecs import hookimpl
from .layouts import ContiguousLayout, KGroupedLayout, MaskedLayout
from .problem import Problem
from .quant import QuantizedTensor
from .select import Selection

__version__ = "0.1.0"

__all__ = [
    "Backend", "BackendSpec", "ContiguousLayout", "DeviceInfo", "KGroupedLayout", "MaskedLayout",
    "Problem", "QuantizedTensor", "Reason", "Selection", "Signature", "backends", "errors", "explain",
    "get_backend", "grouped_gemm", "hookimpl", "quant", "select", "__version__",
]


def __getattr__(name: str):
    # Submodules with heavier imports load on first access: moe_hal.routing, .hwdb, .perf, ...
    import importlib

    if name in ("routing", "hwdb", "perf", "prepared", "conformance", "layouts", "plugins", "dtypes"):
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
