"""The moe_hal plugin of this distribution: declares the ``ascend`` and ``ascend_950`` backends.

Registered through the entry point ``moe_hal.backends: ascend = moe_hal_ascend.plugin``. This
module imports only moe_hal and :mod:`moe_hal_ascend.emulation` (which imports only ``os``); it
never imports torch_npu. The classes named by ``impl`` (:mod:`moe_hal_ascend.backend`) are imported
when a call first considers them, and they import torch_npu only when an NPU call needs it.

Hardware requirements are hardware-DB feature flags, never SoC lists:

* ``ascend`` requires ``npu_grouped_matmul``, ``cube_unit`` and ``bf16`` — the Atlas A2/A3 parts
  (910B, 910C) and later. fp8 operands are dequantized before the op (to bf16 where that is exact,
  else fp32), a declared path that ``explain()`` names and a one-time PathWarning announces.
* ``ascend_950`` requires those and ``fp8`` (the 950 generation) and ranks higher: it multiplies
  M-grouped fp8 with DeepGEMM's 1x128 / 128x128 blocks natively in the op's G-B mode.

Both are verified only through the CPU emulator of torch_npu (no NPU was available); with
emulation on (``MOE_HAL_ASCEND_EMULATE=1``) they accept CPU tensors, run only when named, and
report the EMULATED execution mode.
"""

from __future__ import annotations

from moe_hal.plugin_api import OPS, BackendSpec, GraphCapture, Signature, hookimpl

from . import emulation

_ALL_OPS = frozenset(OPS)
_ANY_B_ORDER = frozenset({"k", "n", "strided"})
#: A single [G, ...] weight tensor takes at most 1024 groups (CANN rule ``group_list_tensor``).
MAX_GROUPS = 1024
_FP8_FORMATS = frozenset({"fp32", "ue8m0"})

FLOAT_SIGNATURE = Signature(
    ops=_ALL_OPS,
    dtypes={"fp32", "bf16", "fp16"},
    out_dtypes={"fp32", "bf16", "fp16"},
    b_majors=_ANY_B_ORDER,
    max_groups=MAX_GROUPS,
)
#: fp8 dequantized before the op: any blocks, every operation.
FP8_DEQUANTIZED = Signature(
    ops=_ALL_OPS,
    dtypes={"fp8_e4m3"},
    out_dtypes={"bf16", "fp32"},
    scale_formats=_FP8_FORMATS,
    b_majors=_ANY_B_ORDER,
    max_groups=MAX_GROUPS,
)
#: fp8 in the 950's G-B mode (gsM = 1, gsN = gsK = 128, fp32 scales): M-grouped only.
FP8_NATIVE_950 = Signature(
    ops={"contiguous", "masked"},
    dtypes={"fp8_e4m3"},
    out_dtypes={"bf16", "fp32"},
    scale_formats=_FP8_FORMATS,
    scale_blocks={((1, 128), (128, 128))},
    b_majors=_ANY_B_ORDER,
    max_groups=MAX_GROUPS,
)
#: K-grouped fp8 on the 950: the G-B scale layout along K is undocumented, so it is dequantized.
FP8_K_DEQUANTIZED_950 = Signature(
    ops={"k_grouped"},
    dtypes={"fp8_e4m3"},
    out_dtypes={"bf16", "fp32"},
    scale_formats=_FP8_FORMATS,
    max_groups=MAX_GROUPS,
)

_BASE_FEATURES = frozenset({"npu_grouped_matmul", "cube_unit", "bf16"})


def _description(text: str) -> str:
    text += "; verified only through the CPU emulator of torch_npu, never on an NPU"
    cfg = emulation.config()
    if cfg.enabled:
        text += f" [EMULATION ON: CPU tensors run on the emulator as SoC {cfg.soc}]"
    return text


#: NPU graph capture is claimed for no layout: only the CPU emulator of torch_npu has run these
#: backends, and it has no graph mode.
GRAPH_CAPTURE = {op: GraphCapture(False, note="not claimed: never captured on an NPU") for op in OPS}


def specs() -> tuple[BackendSpec, BackendSpec]:
    """The two backend declarations (built on each call so the emulation note is current)."""
    a2_a3 = BackendSpec(
        name="ascend",
        vendor="huawei",
        device_types=("npu",),
        tier="optimized",
        priority=100,
        impl="moe_hal_ascend.backend:AscendBackend",
        signatures=(FLOAT_SIGNATURE, FP8_DEQUANTIZED),
        requires=_BASE_FEATURES,
        graph_capturable=GRAPH_CAPTURE,
        description=_description(
            "torch_npu.npu_grouped_matmul on Atlas A2/A3 (910B/910C): contiguous, masked, "
            "K-grouped; fp32/bf16/fp16, fp8 dequantized"
        ),
    )
    a5 = BackendSpec(
        name="ascend_950",
        vendor="huawei",
        device_types=("npu",),
        tier="optimized",
        priority=110,
        impl="moe_hal_ascend.backend:Ascend950Backend",
        signatures=(FLOAT_SIGNATURE, FP8_NATIVE_950, FP8_K_DEQUANTIZED_950),
        requires=_BASE_FEATURES | {"fp8"},
        graph_capturable=GRAPH_CAPTURE,
        description=_description(
            "torch_npu.npu_grouped_matmul on Ascend 950: contiguous, masked, K-grouped; "
            "fp32/bf16/fp16, fp8 block-scaled natively (G-B mode) for M-grouped calls"
        ),
    )
    return a2_a3, a5


@hookimpl
def moe_hal_register_backends(register) -> None:
    for spec in specs():
        register(spec)


@hookimpl
def moe_hal_probe_device(device_type, index):
    if device_type != "npu":
        return None
    from .probe import probe  # reads the device through torch only when one is asked about

    return probe(index)


@hookimpl
def moe_hal_environment(env_var, package, fact) -> None:
    env_var(
        "MOE_HAL_ASCEND_EMULATE",
        "1 or a SoC name (e.g. Ascend950PR_9579): run the Ascend backends on the "
        "CPU emulator of torch_npu (only when named)",
    )
    env_var("MOE_HAL_ASCEND_SOC", "SoC the Ascend emulator pretends to be")
    env_var("MOE_HAL_ASCEND_WEIGHT_FORMAT", "nd (default) or nz: cast bf16/fp16 weights to FRACTAL_NZ once")
    env_var("ASCEND_RT_VISIBLE_DEVICES", "the NPUs this process sees")
    package("torch_npu")
    fact("CANN", _cann_fact)


def _cann_fact() -> str:
    """The CANN toolkit version from its install record, without importing torch_npu (which can
    break a machine whose CANN is missing)."""
    import os
    from pathlib import Path

    home = os.environ.get("ASCEND_TOOLKIT_HOME") or os.environ.get("ASCEND_HOME_PATH")
    if not home:
        return "not found (ASCEND_TOOLKIT_HOME/ASCEND_HOME_PATH unset: CANN's set_env.sh not sourced)"
    for record in [Path(home) / "version.cfg", *sorted(Path(home).glob("*/ascend_toolkit_install.info"))]:
        try:
            lines = record.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            key, _, value = line.partition("=")
            if "version" in key.lower() and value.strip():
                return f"{value.strip()} ({record})"
    return f"unknown (no version record under {home})"
