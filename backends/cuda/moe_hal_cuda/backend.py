"""The ``cuda_sm90`` and ``cuda_sm100`` backends: checks, per-call plans, and runs.

A call goes through :meth:`CudaBackend.plan`, which decides

1. the **path**: our Triton kernels, or a peer library (``torch`` grouped_mm, ``deep_gemm``) where
   the measured path table (:mod:`moe_hal_cuda.paths`, keyed by a shape bucket) says it is faster and
   :func:`moe_hal_cuda.peers.blocker` finds nothing against it;
2. the **tile**: the performance model's advisor ranks the tile heights the config table offers
   for the operation (:func:`moe_hal.perf.advise_problem`) — from the host-side group counts for
   contiguous and K-grouped calls, from ``max_m``/``expected_m`` alone for masked calls (the
   decode shortcut: the histogram lives on the device and is never read) — and the config table
   supplies the rest of the launch configuration.

Plans are cached per (signature, coarse routing histogram) (:func:`histogram_bucket`;
contiguous, K-grouped) or per (signature, max_m, expected_m) (masked): the advisor runs once per
bucket, so a new routing every step costs a dictionary lookup and one packing of the group bounds
for their upload, and the launch path reads nothing from the device
(``bench/bench_cuda_host_time.py`` measures its host time).

**Interpreter mode** (``MOE_HAL_CUDA_INTERPRET=1``): the backends accept CPU tensors (and CUDA
tensors, which the interpreter copies to the host), say ``interpreted`` in ``execution_mode()``
and ``explain()``, are never picked automatically (``auto_select_reason`` returns
``interpreter_only``), skip the driver probes and the ``fp8`` device feature, and let the advisor
model the architecture's reference device (``MODEL_HW``) because the interpreter has no speed of
its own.
"""

from __future__ import annotations

from . import mode

mode.configure_triton()  # before anything below can import triton (see moe_hal_cuda.mode)

import functools  # noqa: E402 - after the environment set-up above, which must come first
import importlib.util  # noqa: E402 - after the environment set-up above, which must come first
from dataclasses import dataclass  # noqa: E402 - after the environment set-up above, which must come first

import torch  # noqa: E402 - after the environment set-up above, which must come first

from moe_hal import Backend, DeviceInfo, QuantizedTensor, Reason  # noqa: E402 - after the environment set-up above, which must come first
from moe_hal.plugin_api import Problem  # noqa: E402 - after the environment set-up above, which must come first

from . import configs, paths, peers, scales  # noqa: E402 - after the environment set-up above, which must come first
from . import device as cuda_device  # noqa: E402 - after the environment set-up above, which must come first

INTERPRETED_NOTE = "INTERPRETED (Triton interpreter on CPU)"
KERNEL_NOTES = {
    "contiguous": "triton contiguous kernel (tiles found on the device from psum; no host sync once the layout "
    "is uploaded; CUDA-graph capture replays the captured routing)",
    "masked": "triton masked kernel (persistent over the tiles masked_m has, read on the device; no host sync; "
    "CUDA-graph capture replays with new masked_m values)",
    "k_grouped": "triton K-grouped kernel (group bounds on the device; no host sync once the layout is uploaded; "
    "CUDA-graph capture replays the captured routing)",
}
_PLANS_MAX = 1024


@functools.lru_cache(maxsize=None)
def _triton_reason() -> Reason | None:
    """Whether triton is installed, found without importing it: an import here (selection asks
    every backend, on every machine) would fix TRITON_INTERPRET's effect before a later
    ``MOE_HAL_CUDA_INTERPRET=1`` could set it."""
    try:
        found = importlib.util.find_spec("triton") is not None
    except Exception:  # noqa: BLE001 - a broken meta-path finder reads as "absent"
        found = False
    if found:
        return None
    return Reason("triton_missing", "triton is not installed", "triton >= 3.3", "not installed")


@functools.cache
def _launch_module():
    """:mod:`moe_hal_cuda.launch`, imported at the first launch (it imports triton, which selection
    must not) and then held: an import statement per call costs microseconds of host time."""
    from . import launch

    return launch


@dataclass(frozen=True)
class Plan:
    """How one call runs. ``path``: ``triton``, ``torch`` or ``deep_gemm``. ``config``: the Triton
    launch configuration (None for peers). ``tile_note``: where the tile came from. ``path_note``:
    why this path."""

    path: str
    config: configs.KernelConfig | None
    tile_note: str
    path_note: str


def histogram_bucket(layout) -> tuple[int, int, int]:
    """Coarse key of a segment layout's routing histogram, so the tile advisor runs once per
    bucket, not once per routing (every MoE step has a new one): the bit lengths of the rows per
    group and of the rows that belong to a group, and the share of rows in groups in eighths (the
    M-occupancy at the layout's alignment; the group count is in the plan's key already). The
    first also fixes the rows-per-group range of :func:`moe_hal_cuda.paths.shape_bucket`, so one
    plan never spans two path-table buckets.

    O(1): numbers the layout holds, so a fresh layout costs the same at 8 or 256 experts. What it
    cannot see is how the rows spread over the groups: two routings with the same totals share
    the plan the first of them got."""
    rows, valid = layout.num_rows, layout.num_valid_rows
    per_group = rows // max(layout.num_groups, 1)
    return (per_group.bit_length(), valid.bit_length(), 8 * valid // rows if rows else 0)


class CudaBackend(Backend):
    """Shared implementation of the two architectures; subclasses set the constants below."""

    #: ``sm90`` or ``sm100``: picks the physical scale format and the config-table rows.
    ARCH = ""
    #: Whether the fp8 MMA reads MN-major operands from shared memory (tcgen05 does, wgmma does not).
    MN_MAJOR_FP8 = False
    #: Hardware-DB id the advisor models when the kernels are interpreted.
    MODEL_HW = ""
    #: How explain() names the scale format of fp8 calls.
    SCALE_NOTE = ""

    def __init__(self, spec):
        super().__init__(spec)
        self._plans: dict[tuple, Plan] = {}
        self._hardware: dict[torch.device, tuple[object, str]] = {}

    # -- modes ------------------------------------------------------------------------------------
    @staticmethod
    def interpreter_mode() -> bool:
        """True when ``MOE_HAL_CUDA_INTERPRET`` asks for the Triton interpreter."""
        return mode.interpreter_requested()

    def execution_mode(self, device: DeviceInfo) -> str:
        return self.INTERPRETED if mode.configure_triton() else self.NATIVE

    # -- eligibility -------------------------------------------------------------------------------
    def is_available(self) -> list[Reason]:
        triton_reason = _triton_reason()
        if triton_reason is not None:
            return [triton_reason]
        if self.interpreter_mode():
            broken = mode.interpreter_broken()
            return [Reason("interpreter_unusable", broken)] if broken else []
        return cuda_device.driver_reasons()

    def check_device(self, device: DeviceInfo) -> list[Reason]:
        if self.interpreter_mode():
            if device.type in ("cpu", "cuda"):
                return []
            return [
                Reason(
                    "device_type_unsupported",
                    "the Triton interpreter runs on CPU (or CUDA) tensors",
                    {"cpu", "cuda"},
                    device.type,
                )
            ]
        return super().check_device(device)

    def auto_select_reason(self, device: DeviceInfo) -> Reason | None:
        if self.interpreter_mode():
            return Reason(
                "interpreter_only",
                f"runs under the Triton interpreter (MOE_HAL_CUDA_INTERPRET=1), "
                f"so it is used only when named (backend={self.name!r})",
            )
        return None

    def unsupported(self, problem: Problem) -> list[Reason]:
        if problem.quantized and not self.interpreter_mode() and problem.device.type == "cuda":
            from moe_hal.plugin_api import device_info

            features = device_info(problem.device).features
            if "fp8" not in features:
                return [
                    Reason(
                        "hw_feature_missing", "fp8 operands need the hardware-DB feature 'fp8'", {"fp8"}, set(features)
                    )
                ]
        return []

    # -- planning ----------------------------------------------------------------------------------
    def plan(self, p: Problem) -> Plan:
        """The path and tile for ``p`` (cached; see the module docstring)."""
        if p.op == "masked":
            key = (p.signature, p.layout.max_m, p.layout.expected_m)
        elif p.op == "contiguous":
            key = (p.signature, histogram_bucket(p.layout))
        else:  # not p.signature: it holds K-grouped calls' token count, new every step
            key = (
                p.op,
                p.in_dtype,
                p.out_dtype_name,
                p.scale_format,
                p.scale_blocks,
                p.num_groups,
                p.n,
                p.m,
                p.layout.alignment,
                p.device,
                p.c is not None,
                histogram_bucket(p.layout),
            )
        hit = self._plans.get(key)
        if hit is None:
            if len(self._plans) >= _PLANS_MAX:
                self._plans.clear()
            hit = self._plans[key] = self._make_plan(p)
        return hit

    def _make_plan(self, p: Problem) -> Plan:
        path, path_note = self._choose_path(p)
        if path != "triton":
            return Plan(path, None, "", path_note)
        config, tile_note = self._choose_tile(p)
        return Plan("triton", config, tile_note, path_note)

    def _choose_path(self, p: Problem) -> tuple[str, str]:
        if self.interpreter_mode():
            return "triton", "peer libraries need a GPU"
        pref = paths.lookup(self.ARCH, p)
        if pref is None:
            return "triton", (
                "peer choice unmeasured: the path table (moe_hal_cuda/path_table.json, entries only from "
                f"committed GPU runs) has no entry for {p.op} {p.in_dtype}, "
                f"{paths.describe_bucket(paths.shape_bucket(p))}"
            )
        where = f"{paths.describe_bucket(pref.bucket)}, on {pref.device or 'an unnamed device'} ({pref.source})"
        blocked = peers.blocker(pref.path, p)
        if blocked:
            return "triton", f"{pref.path} was measured {pref.speedup:.2f}x faster for {where}, but {blocked}"
        return pref.path, f"measured {pref.speedup:.2f}x faster than our Triton kernel for {where}"

    def _model_hardware(self, device: torch.device):
        """(perf.Hardware, note) the advisor models for ``device``."""
        hit = self._hardware.get(device)
        if hit is not None:
            return hit
        from moe_hal import perf
        from moe_hal.plugin_api import device_info

        if self.interpreter_mode() or device.type != "cuda":
            hit = (perf.resolve_hardware(self.MODEL_HW), f"{self.MODEL_HW}, modelled: the interpreter has no speed")
        else:
            info = device_info(device)
            hw = perf.resolve_hardware(info.hw_id)
            facts = cuda_device.device_facts(device.index or 0)
            if isinstance(facts, cuda_device.DeviceFacts):
                hw = hw.replace(num_cores=facts.sm_count, l2_bytes=facts.l2_bytes)
            hit = (hw, f"{info.hw_id}, {hw.num_cores} SMs")
        self._hardware[device] = hit
        return hit

    def _choose_tile(self, p: Problem) -> tuple[configs.KernelConfig, str]:
        from moe_hal import perf

        tiles = configs.candidates(self.ARCH, p.in_dtype, p.op)
        by_tile = {c.tile: c for c in tiles}
        try:
            hw, hw_note = self._model_hardware(p.device)
            advice = perf.advise_problem(p, hw, list(by_tile), **self.spec.perf_model.estimate_options())
        except Exception as exc:  # noqa: BLE001 - a degenerate call (N = 0, ...) or a DB gap: keep a fixed tile
            config = configs.default(self.ARCH, p.in_dtype, p.op)
            return config, f"table default (advisor unavailable: {type(exc).__name__}: {exc})"
        return by_tile[advice.tile], f"advisor on {hw_note}: {advice.reason}"

    # -- explanation ---------------------------------------------------------------------------------
    def describe_path(self, problem: Problem) -> str:
        plan = self.plan(problem)
        if plan.path != "triton":
            return f"{plan.path} ({plan.path_note})"
        parts = [f"{KERNEL_NOTES[problem.op]}, {plan.config.label()} ({plan.tile_note})"]
        from . import launch

        a, b, _, _ = self._operands(problem)
        k_major = problem.quantized and not self.MN_MAJOR_FP8
        parts.append(launch.tma_note(problem.op, a, b, plan.config, k_major))
        if problem.quantized:
            parts.append(f"fp8 scales: {self.SCALE_NOTE}")
        parts.append(f"triton because {plan.path_note}")
        if mode.configure_triton():
            parts.append(INTERPRETED_NOTE)
        return "; ".join(parts)

    # -- execution -------------------------------------------------------------------------------------
    def run(self, problem: Problem, out: torch.Tensor | None) -> torch.Tensor:
        with mode.exclusive_in_interpreter():
            return self._run(problem, out)

    def _run(self, problem: Problem, out: torch.Tensor | None) -> torch.Tensor:
        p = problem
        out = p.new_out() if out is None else out
        plan = self.plan(p)
        if plan.path != "triton":
            return peers.run(plan.path, p, out)
        return self.launch(p, plan.config, out)

    def launch(self, p: Problem, config: configs.KernelConfig, out: torch.Tensor) -> torch.Tensor:
        """Run ``p`` on the Triton kernels with ``config`` (the plan's, or any table entry: the
        compiled-target check drives every entry through here)."""
        launch = _launch_module()
        a, b, sa, sb = self._operands(p)
        if p.op == "contiguous":
            return launch.contiguous(a, b, out, p.layout, config, sa=sa, sb=sb)
        if p.op == "masked":
            return launch.masked(a, b, out, p.layout.masked_m, config, sa=sa, sb=sb)
        c = p.c if p.c is None or p.c.stride(-1) == 1 else p.c.contiguous()
        # SM90 fp8: wgmma reads fp8 only K-major, so the K-grouped kernel reads token-major copies.
        k_major = p.quantized and not self.MN_MAJOR_FP8
        return launch.k_grouped(a, b, out, p.layout, config, c=c, sa=sa, sb=sb, k_major=k_major)

    def _operands(self, p: Problem):
        """(a, b, a scales, b scales) as the kernels take them: data tensors with unit inner stride
        (so every operand load is a vectorised async copy) and physical scales (None for 16-bit).

        M-grouped weights that are not K-major are made K-major once per weight through the
        prepared cache when fp8 (fp8 MMAs read K-major operands) or neither K- nor N-major (no
        unit stride to vectorise along); 16-bit N-major weights are read as they are (wgmma and
        tcgen05 take MN-major 16-bit operands). Activations and K-grouped operands without a unit
        inner stride are copied per call (rare: the API's own tensors are row-major).
        """
        a = p.a.data if p.quantized else p.a
        b = p.b.data if p.quantized else p.b
        a = a if a.stride(-1) == 1 else a.contiguous()
        if p.op == "k_grouped":
            b = b if b.stride(-1) == 1 else b.contiguous()
        elif p.b_major == "strided" or (p.quantized and p.b_major != "k"):
            b = self.prepared_k_major(p.b).data if p.quantized else self.prepared_k_major(p.b)
        if not p.quantized:
            return a, b, None, None
        sa = scales.activation(p.a, self.ARCH)
        sb = scales.activation(p.b, self.ARCH) if p.op == "k_grouped" else self.prepared_weight_scales(p.b)
        return a, b, sa, sb

    def prepared_k_major(self, weight):
        """``weight`` (a tensor or QuantizedTensor ``[G, N, K]``) with K-major data, copied once per
        weight (:data:`moe_hal.prepared.prepared_cache`)."""
        from moe_hal.plugin_api import prepared_cache

        def build(w):
            if isinstance(w, QuantizedTensor):
                return w.data.contiguous()
            return w.contiguous()

        data = prepared_cache.get(self.name, weight, "k_major", build)
        return (
            QuantizedTensor(data, weight.scale, weight.block, weight.scale_format)
            if isinstance(weight, QuantizedTensor)
            else data
        )

    def prepared_weight_scales(self, q: QuantizedTensor) -> scales.Physical:
        """Weight scales in this architecture's physical format, converted once per weight
        (:data:`moe_hal.prepared.prepared_cache`; an in-place change of the weight rebuilds them)."""
        from moe_hal.plugin_api import prepared_cache

        tensor = prepared_cache.get(
            self.name, q, f"{self.ARCH}_weight_scales", lambda w: scales.weight(w, self.ARCH).tensor
        )
        rows = q.block[0] if self.ARCH == "sm90" else 1
        return scales.Physical(tensor, scales.kind_for(self.ARCH), rows)

    def physical_scales(self, q: QuantizedTensor, role: str) -> torch.Tensor:
        """The scale tensor this backend's kernels read for operand ``role`` (``"a"`` or ``"b"``) —
        for byte-level conformance checks. See :mod:`moe_hal_cuda.scales` for the layouts."""
        return scales.physical_scales(q, role, self.ARCH)


class CudaSM90Backend(CudaBackend):
    """Hopper: fp8 scales as fp32, activation side MN-major with TMA-aligned stride."""

    ARCH = "sm90"
    MN_MAJOR_FP8 = False
    MODEL_HW = "nvidia-h200-sxm"
    SCALE_NOTE = "SM90 fp32, activations MN-major TMA-aligned (tma_align_mn_major), weights as given"


class CudaSM100Backend(CudaBackend):
    """Datacenter Blackwell: fp8 scales as packed UE8M0 (four exponents per int32)."""

    ARCH = "sm100"
    MN_MAJOR_FP8 = True
    MODEL_HW = "nvidia-b200"
    SCALE_NOTE = "SM100 packed UE8M0 int32 (pack_ue8m0), weights broadcast per row, decoded in-kernel"
