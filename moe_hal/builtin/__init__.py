"""The built-in backends, registered through the same hook a vendor plugin implements.

* ``reference`` — float64 per-group products on any device; the oracle every backend is checked
  against. Slow by design. The only backend that takes fp64 operands (float64 gradient checks).
* ``torch`` — ``torch.nn.functional.grouped_mm`` with the fix-ups our contracts need; the default
  on the CPU.

It also registers the built-in expert-parallel transport, ``all_to_all_single``
(:data:`moe_hal.ep.spec.BUILTIN`), through the ``moe_hal_ep_transports`` hook.
"""

from __future__ import annotations

from ..backend import OPS, BackendSpec, GraphCapture, PerfModel, Signature
from ..hookspecs import hookimpl

_ALL_OPS = frozenset(OPS)
_FLOATS = frozenset({"fp32", "bf16", "fp16"})
_FP8_OUT = frozenset({"bf16", "fp32"})
_ANY_B_ORDER = frozenset({"k", "n", "strided"})
#: Both built-ins take every operation, float dtype, fp8 scale format and memory order of b.
_EVERYTHING = (
    Signature(ops=_ALL_OPS, dtypes=_FLOATS, out_dtypes=_FLOATS, b_majors=_ANY_B_ORDER),
    Signature(
        ops=_ALL_OPS, dtypes={"fp8_e4m3"}, out_dtypes=_FP8_OUT, scale_formats={"fp32", "ue8m0"}, b_majors=_ANY_B_ORDER
    ),
)

#: The reference backend reads the group bounds and ``masked_m`` on the host (float64 loops).
_REFERENCE_CAPTURE = {op: GraphCapture(False, note="reads the layout on the host") for op in _ALL_OPS}
#: The torch backend uploads a layout's offsets with a blocking copy on first use, and
#: grouped_mm's fallback (any dtype but bf16, or a GPU other than SM90/SM100) copies the offsets
#: to the host on every call (pytorch/pytorch, torch 2.13.0,
#: ``aten/src/ATen/native/cuda/GroupedBlas.cpp``, ``_grouped_mm_fallback``); its masked path has
#: no such read but has never been captured on a GPU, so nothing is claimed.
_TORCH_CAPTURE = {
    "contiguous": GraphCapture(False, note="offsets uploaded with a blocking copy; grouped_mm's fallback reads them"),
    "k_grouped": GraphCapture(False, note="offsets uploaded with a blocking copy; grouped_mm's fallback reads them"),
    "masked": GraphCapture(False, note="not claimed: never captured on a GPU"),
}

REFERENCE = BackendSpec(
    name="reference",
    vendor="moe_hal",
    device_types=("*",),
    tier="reference",
    priority=-1000,
    impl="moe_hal.builtin.reference:ReferenceBackend",
    signatures=(*_EVERYTHING, Signature(ops=_ALL_OPS, dtypes={"fp64"}, out_dtypes={"fp64"})),
    deterministic=True,
    graph_capturable=_REFERENCE_CAPTURE,
    description="float64 per-group products; the oracle (slow)",
)

TORCH = BackendSpec(
    name="torch",
    vendor="pytorch",
    device_types=("cpu", "cuda"),
    tier="fallback",
    priority=0,
    impl="moe_hal.builtin.torch_grouped_mm:TorchBackend",
    signatures=_EVERYTHING,
    deterministic=True,
    graph_capturable=_TORCH_CAPTURE,
    description="torch.nn.functional.grouped_mm with padding, stride and dtype fix-ups",
    # Its masked path multiplies all max_m rows (moe_hal.perf reads this hint).
    perf_model=PerfModel(masked_computes_max_m=True),
)


@hookimpl
def moe_hal_register_backends(register):
    register(REFERENCE)
    register(TORCH)


@hookimpl
def moe_hal_ep_transports(register):
    from ..ep.spec import BUILTIN as EP_ALL_TO_ALL_SINGLE

    register(EP_ALL_TO_ALL_SINGLE)
