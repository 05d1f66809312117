"""The moe_hal plugin of this distribution: declares ``cuda_sm90`` and ``cuda_sm100``.

Registered through the entry point ``moe_hal.backends: cuda = moe_hal_cuda.plugin``. This module
imports only moe_hal and two light modules of this package (:mod:`~moe_hal_cuda.mode`,
:mod:`~moe_hal_cuda.configs`: standard library only); the backend
classes named by ``impl`` live in :mod:`moe_hal_cuda.backend` and are imported when a call first
considers them.

Hardware requirements are hardware-DB feature flags, never architecture lists:

* ``cuda_sm90`` requires ``wgmma`` and ``tma`` (Hopper-class devices). Its fp8 path takes scales in
  either API format (``fp32`` or ``ue8m0``) and converts them to SM90's physical layout, fp32
  MN-major with a TMA-aligned stride.
* ``cuda_sm100`` requires ``tcgen05``, ``tma`` and ``ue8m0_scales`` (datacenter Blackwell). Its
  fp8 path takes only ``ue8m0`` scales (powers of two) and its kernels read them packed four per
  int32, as SM100 hardware does.
* fp8 operands additionally need the device feature ``fp8``; that is checked per call in
  ``unsupported()`` because bf16/fp16 calls do not need it.
"""

from __future__ import annotations

from moe_hal.plugin_api import OPS, BackendSpec, GraphCapture, PerfModel, Signature, hookimpl

from . import configs, mode

_ALL_OPS = frozenset(OPS)
_M_GROUPED = frozenset({"contiguous", "masked"})
_ANY_B_ORDER = frozenset({"k", "n", "strided"})

#: bf16 / fp16 operands; the output is the operand dtype or fp32 (Problem enforces the pairing).
FLOAT_SIGNATURE = Signature(
    ops=_ALL_OPS, dtypes={"bf16", "fp16"}, out_dtypes={"bf16", "fp16", "fp32"}, b_majors=_ANY_B_ORDER
)
#: DeepGEMM's M-grouped recipe: activations 1x128 per token, weights 128x128 (or per-row 1x128).
FP8_M_BLOCKS = frozenset({((1, 128), (128, 128)), ((1, 128), (1, 128))})
#: K-grouped recipe: both operands blocked 128 tokens x 1 column along the reduction axis T.
FP8_K_BLOCKS = frozenset({((128, 1), (128, 1))})


def _fp8_signatures(scale_formats: set[str]) -> tuple[Signature, Signature]:
    return (
        Signature(
            ops=_M_GROUPED,
            dtypes={"fp8_e4m3"},
            out_dtypes={"bf16", "fp32"},
            scale_formats=scale_formats,
            scale_blocks=FP8_M_BLOCKS,
            b_majors=_ANY_B_ORDER,
        ),
        Signature(
            ops={"k_grouped"},
            dtypes={"fp8_e4m3"},
            out_dtypes={"bf16", "fp32"},
            scale_formats=scale_formats,
            scale_blocks=FP8_K_BLOCKS,
        ),
    )


#: The name the hardware DB keeps these kernels' achieved efficiency under (``achieved.<impl>``,
#: fitted from ``backends/cuda/scripts/gpu_check.py`` runs through bench/own_measurements/).
IMPL = "moe_hal_triton"


def _perf_model(arch: str) -> PerfModel:
    """What the performance model must assume about the kernels: the tiles of contiguous 16-bit
    calls (the advisor picks among them per call), no weight traffic for empty experts, no reads
    of padding rows, masked tiles past ``masked_m`` skipped."""
    tiles = tuple((bm, configs.TABLE[(arch, "16bit", bm)].block_n) for bm in configs.HEIGHTS["contiguous"])
    return PerfModel(
        tiles=tiles,
        streams_all_experts=False,
        reads_padding_rows=False,
        masked_computes_max_m=False,
        impl=IMPL,
    )


#: CUDA-graph capture per layout. Masked calls read ``masked_m`` on the device, so a replay takes
#: new values; contiguous and K-grouped calls read group bounds uploaded from the host layout
#: object once (a copy cannot be recorded), so a replay repeats the captured routing. From the
#: launch path's code and its no-host-sync test (``tests/test_no_host_sync.py``); capture itself
#: runs only in ``scripts/gpu_check.py`` on a GPU.
GRAPH_CAPTURE = {
    "masked": GraphCapture(True, replay_reads_layout=True, note="masked_m is read on the device"),
    "contiguous": GraphCapture(
        True, note="once the layout object has been used outside capture, which uploads its group ends"
    ),
    "k_grouped": GraphCapture(
        True, note="once the layout object has been used outside capture, which uploads its group bounds"
    ),
}


def _description(text: str) -> str:
    if mode.interpreter_requested():
        return text + " [INTERPRETED: Triton interpreter on the CPU (MOE_HAL_CUDA_INTERPRET=1)]"
    return text


def specs() -> tuple[BackendSpec, BackendSpec]:
    """The two backend declarations (built on each call so the interpreter note is current)."""
    sm90 = BackendSpec(
        name="cuda_sm90",
        vendor="nvidia",
        device_types=("cuda",),
        tier="optimized",
        priority=100,
        impl="moe_hal_cuda.backend:CudaSM90Backend",
        signatures=(FLOAT_SIGNATURE, *_fp8_signatures({"fp32", "ue8m0"})),
        requires=frozenset({"wgmma", "tma"}),
        deterministic=True,
        graph_capturable=GRAPH_CAPTURE,
        perf_model=_perf_model("sm90"),
        description=_description(
            "Triton grouped GEMM for Hopper: contiguous, masked, K-grouped; "
            "bf16/fp16 and fp8 with fp32 MN-major TMA-aligned scales"
        ),
    )
    sm100 = BackendSpec(
        name="cuda_sm100",
        vendor="nvidia",
        device_types=("cuda",),
        tier="optimized",
        priority=100,
        impl="moe_hal_cuda.backend:CudaSM100Backend",
        signatures=(FLOAT_SIGNATURE, *_fp8_signatures({"ue8m0"})),
        requires=frozenset({"tcgen05", "tma", "ue8m0_scales"}),
        deterministic=True,
        graph_capturable=GRAPH_CAPTURE,
        perf_model=_perf_model("sm100"),
        description=_description(
            "Triton grouped GEMM for datacenter Blackwell: contiguous, masked, K-grouped; "
            "bf16/fp16 and fp8 with packed UE8M0 scales (never run on SM100 hardware)"
        ),
    )
    return sm90, sm100


@hookimpl
def moe_hal_register_backends(register) -> None:
    for spec in specs():
        register(spec)


@hookimpl
def moe_hal_probe_device(device_type, index):
    if device_type != "cuda":
        return None
    from .probe import probe  # reads the device through torch only when one is asked about

    return probe(index)


@hookimpl
def moe_hal_environment(env_var, package, fact) -> None:
    env_var("MOE_HAL_CUDA_INTERPRET", "1: run the CUDA backends' Triton kernels in the interpreter on the CPU")
    env_var("TRITON_INTERPRET", "Triton's interpreter switch (set by MOE_HAL_CUDA_INTERPRET=1)")
    env_var("CUDA_VISIBLE_DEVICES", "the CUDA devices this process sees")
    for distribution in ("triton", "cuda-python", "cuda-bindings", "deep_gemm"):
        package(distribution)
    fact("CUDA driver", _driver_fact)
    fact("torch CUDA build", _torch_cuda_fact)


def _torch_cuda_fact() -> str:
    import torch

    return f"CUDA {torch.version.cuda}" if torch.version.cuda else "none (a CPU-only torch build)"


def _driver_fact() -> str:
    """The driver API version and device 0 as cuda-python or torch read them, or why they cannot."""
    from .device import DeviceFacts, device_facts

    facts = device_facts(0)
    if not isinstance(facts, DeviceFacts):
        return str(facts)
    version = f"driver API {facts.driver_version}" if facts.driver_version else "driver version unknown"
    return f"{version}; device 0: {facts.name}, {facts.arch}, {facts.sm_count} SMs (read by {facts.source})"
