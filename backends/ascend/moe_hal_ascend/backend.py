"""The Ascend backends: ``torch_npu.npu_grouped_matmul`` behind moe_hal's three grouped GEMMs.

``ascend`` (Atlas A2/A3, 910B/910C) and ``ascend_950`` (the 950 generation) share this code; they
differ in one decision, taken from the hardware DB's ``fp8`` feature through the backend spec: the
950 multiplies block-scaled fp8 natively (G-B mode), ``ascend`` dequantizes fp8 first (to bf16
where that is exact) and says so. Every call goes through ``ops = runtime.ops_for(device)``:
torch_npu on an NPU, the CPU emulator (same functions) in emulation mode.

Layout translation (the op groups rows back to back from row 0 and never writes rows outside its
groups, as ``cann_rules.V5_DOC`` states):

==============  ==============================================================================
contiguous      ``group_type=0``, ``group_list_type=0`` with the *aligned* segment ends, so each
                group's alignment padding is computed with that group (padding rows sit between
                groups, and the op cannot skip rows); then every row of no group — padding, and
                the tail the op leaves unwritten — is zeroed, as the contract says.
masked          no native masked form. The valid rows are packed on the device (an index gather
                computed from ``masked_m`` with ``cumsum``/``searchsorted``: no host sync),
                ``group_list = cumsum(clamp(masked_m, 0, max_m))`` (type 0), and the results go
                back with ``masked_scatter_``, which writes exactly the rows ``r < masked_m[g]``.
k_grouped       ``group_type=2``: ``x = a.T`` as the transposed view the op expects, ``weight = b``,
                ``group_list`` = token-group ends (type 0; the tokens of groups are gathered first
                when the layout has gaps, since padding tokens must not contribute). Empty groups
                are zeroed (the op's output for an empty K group is undocumented), then ``c`` is
                added in fp32 (for a 16-bit output the op computes in fp32, so the sum rounds once).
==============  ==============================================================================

Weights ``b[G, N, K]`` reach the op as ``b.transpose(1, 2)`` — the transposed-weight view it
recognises by strides, no copy — or, for a transposed view of ``[G, K, N]``, as that tensor.
Other strides, fp32 upcasts, dequantized fp8, the 950's ``[G, K, N]`` fp8 layout with
``[G, K/128, N/128]`` scales and opt-in FRACTAL_NZ weights are built once through
:data:`moe_hal.plugin_api.prepared_cache`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable

import torch

from moe_hal.plugin_api import (
    Backend,
    DeviceInfo,
    IdentityTable,
    Problem,
    QuantizedTensor,
    Reason,
    dtypes,
    environment,
    errors,
    warn_once,
)

from . import emulation, runtime, soc

#: Inner (last, in memory) dimensions of x and weight must stay below this (CANN rule ``inner_axis``).
INNER_DIM_LIMIT = 65536
#: The 950 G-B mode: activations 1x128 per token, weights 128x128 blocks, fp32 scales.
GB_SCALE_BLOCKS = ((1, 128), (128, 128))
#: ``nd`` (default) or ``nz``: cast bf16/fp16 weights to FRACTAL_NZ once, where the SoC has it.
ENV_WEIGHT_FORMAT = "MOE_HAL_ASCEND_WEIGHT_FORMAT"
ACL_FORMAT_FRACTAL_NZ = 29


@dataclass(frozen=True)
class Plan:
    """How one problem signature is computed. ``compute``: ``native`` (operands as given),
    ``upcast_fp32`` (fp32 output from bf16/fp16 operands, or K-grouped with ``c`` into a 16-bit
    output), ``dequantize`` (fp8 dequantized to
    ``op_dtype``) or ``fp8_gb`` (the 950's native block-scaled fp8). ``notes``: the precision
    changes, announced once per process."""

    compute: str
    op_dtype: torch.dtype
    notes: tuple[str, ...] = ()


class AscendBackend(Backend):
    """``npu_grouped_matmul`` on Atlas A2/A3 (910B/910C): fp32/bf16/fp16, fp8 dequantized before the op."""

    #: Whether fp8 e4m3 block-scaled operands are multiplied natively (G-B mode).
    native_fp8 = False

    # -- availability and devices ----------------------------------------------------------------
    def is_available(self) -> list[Reason]:
        # Cheap on purpose: selection asks this for every call, CPU and CUDA ones included, and
        # importing torch_npu applies its global patches. The import waits for an npu device
        # (check_device).
        if emulation.config().enabled:
            return []
        return runtime.installed()

    def check_device(self, device: DeviceInfo) -> list[Reason]:
        if device.type == "cpu":
            cfg = emulation.config()
            if not cfg.enabled:
                return [
                    Reason(
                        "device_type_unsupported",
                        f"Ascend backends run on NPUs; CPU tensors only in emulation mode ({emulation.ENV_EMULATE}=1)",
                        {"npu"},
                        "cpu",
                    )
                ]
            prof = soc.profile(cfg.soc)
            return self._soc_reasons(prof.hw_id, prof.features, f"emulated SoC {cfg.soc}", prof.reason)
        if device.type != "npu":
            return [Reason("device_type_unsupported", "Ascend backends run on NPUs", {"npu"}, device.type)]
        return runtime.availability() or self._soc_reasons(device.hw_id, device.features, device.seen, None)

    def _soc_reasons(self, hw_id: str | None, features: frozenset[str], seen: str, why: str | None) -> list[Reason]:
        required = set(self.spec.requires)
        if hw_id is None:
            return [
                Reason(
                    "soc_unsupported",
                    "the hardware DB does not recognise this SoC, so its features "
                    f"are unknown{': ' + why if why else ''}",
                    required,
                    seen,
                )
            ]
        missing = self.spec.requires - features
        if missing:
            return [
                Reason(
                    "soc_unsupported",
                    f"{hw_id} (seen as {seen}) lacks the hardware-DB features {sorted(missing)} this backend requires",
                    required,
                    sorted(features & self.spec.requires),
                )
            ]
        return []

    def auto_select_reason(self, device: DeviceInfo) -> Reason | None:
        if device.type == "cpu":
            return Reason(
                "emulator_only",
                "on the CPU this backend is the torch_npu emulator; it runs only when "
                f"named (backend={self.name!r} or MOE_HAL_BACKEND={self.name})",
            )
        return None

    def execution_mode(self, device: DeviceInfo) -> str:
        return self.EMULATED if device.type == "cpu" else self.NATIVE

    def unsupported(self, p: Problem) -> list[Reason]:
        if p.op == "k_grouped":
            # x is a^T, a transposed view of [T, M] (inner dim M); the weight is b[T, N] (inner N).
            limits = (("M", p.m), ("N", p.n))
        else:
            # x is [rows, K]; the weight is always passed K-inner when N would be too large.
            limits = (("K", p.k),)
        return [
            Reason(
                "shape_constraint",
                f"npu_grouped_matmul needs {name} < {INNER_DIM_LIMIT} (the inner dimension of x and weight)",
                f"{name} < {INNER_DIM_LIMIT}",
                value,
            )
            for name, value in limits
            if value >= INNER_DIM_LIMIT
        ]

    # -- the plan and its explanation ------------------------------------------------------------
    def plan(self, p: Problem) -> Plan:
        """The computation this backend uses for ``p`` (depends only on its signature)."""
        if p.quantized:
            if self.native_fp8 and p.op != "k_grouped" and p.scale_blocks == GB_SCALE_BLOCKS:
                return Plan("fp8_gb", torch.float8_e4m3fn)
            why = (
                "this backend serves SoCs without fp8 hardware, Atlas A2/A3; on a 950 ascend_950 runs fp8 natively"
                if not self.native_fp8
                else "the 950 G-B mode covers M-grouped calls with 1x128 / 128x128 blocks only"
            )
            decode = (
                "fp8 bytes decoded through a 256-entry table on a uint8 view (exact; no fp8 cast, which "
                "aclnnCast lacks on A2/A3)"
            )
            if p.op == "k_grouped":
                return Plan(
                    "dequantize",
                    torch.float32,
                    (f"dequantizes both fp8 operands to fp32 on every call ({decode}) and multiplies in fp32 ({why})",),
                )
            if p.out_dtype == torch.bfloat16:
                return Plan(
                    "dequantize",
                    torch.bfloat16,
                    (
                        f"dequantizes fp8 to bf16 ({decode}) before a bf16 npu_grouped_matmul ({why}); weights once, "
                        "held as bf16 (2 bytes per parameter): exact for ue8m0 scales, otherwise each weight rounded "
                        "once to bf16 (relative error <= 2^-9, within the fp8_bf16 conformance class)",
                    ),
                )
            return Plan(
                "dequantize",
                torch.float32,
                (
                    f"dequantizes fp8 to fp32 ({decode}) before an fp32 npu_grouped_matmul ({why}): an fp32 output "
                    "keeps the fp8_fp32 accuracy class; weights held as bf16 (2 bytes per parameter) when every "
                    "dequantized weight is exact in bf16 (always for ue8m0 scales) and widened to fp32 per call, "
                    "otherwise held as fp32 (4 bytes per parameter)",
                ),
            )
        if p.out_dtype != p.a.dtype:
            return Plan(
                "upcast_fp32",
                torch.float32,
                (
                    f"upcasts {p.in_dtype} operands to fp32 (npu_grouped_matmul writes the input dtype for "
                    "non-quantized operands); weights once, through the prepared-weight cache",
                ),
            )
        if _sums_c(p):
            return Plan(
                "upcast_fp32",
                torch.float32,
                (
                    f"upcasts K-grouped {p.in_dtype} operands to fp32 when c is given, so that c + a^T b is rounded "
                    "once (npu_grouped_matmul cannot accumulate into c)",
                ),
            )
        return Plan("native", p.a.dtype)

    def describe_path(self, p: Problem) -> str:
        plan = self.plan(p)
        parts = []
        if p.device.type == "cpu":
            parts.append(f"EMULATED (CPU emulator of torch_npu, SoC {emulation.config().soc}; not run on an NPU)")
        mode = (
            " in G-B mode (fp32 scales, per_token_scale [M, K/128], scale [G, K/128, N/128])"
            if plan.compute == "fp8_gb"
            else ""
        )
        if p.op == "contiguous":
            parts.append(
                f"torch_npu.npu_grouped_matmul{mode} group_type=0, split_item=3, group_list_type=0 over the "
                "aligned segment ends; rows of no group (padding, and the tail the op leaves unwritten) "
                "zeroed"
            )
        elif p.op == "masked":
            parts.append(
                f"torch_npu.npu_grouped_matmul{mode} group_type=0, split_item=3, group_list_type=0 = "
                "cumsum(masked_m) over the valid rows packed on the device (no host sync); results "
                "written back with masked_scatter_, so rows >= masked_m[g] are never written"
            )
        else:
            parts.append(
                "torch_npu.npu_grouped_matmul group_type=2 (K axis), split_item=3, group_list_type=0 over "
                "the token-group ends (tokens of no group, if any, gathered out first), x = a.T as a "
                "transposed view; empty groups zeroed; c, when given, added in fp32 after the op"
            )
            return "; ".join(parts + list(plan.notes))
        parts.append(self._weight_text(p, plan))
        if plan.compute == "dequantize":
            params = p.num_groups * p.n * p.k
            parts.append(
                f"weight memory: {params} fp8 parameters held as {_mib(params * 2)} MiB of bf16"
                + (
                    ""
                    if plan.op_dtype == torch.bfloat16
                    else f" (or {_mib(params * 4)} MiB of fp32 if some dequantized weight is not exact in bf16)"
                )
            )
        return "; ".join(parts + list(plan.notes))

    def _weight_text(self, p: Problem, plan: Plan) -> str:
        if plan.compute == "fp8_gb":
            return "fp8 weights laid out once as [G, K, N] with scales [G, K/128, N/128] (prepared)"
        if self._use_nz(p, plan):
            return "weights cast once to FRACTAL_NZ [G, K, N] (prepared; MOE_HAL_ASCEND_WEIGHT_FORMAT=nz)"
        if plan.compute != "native":
            return "weights converted once to a contiguous [G, N, K] tensor (prepared), passed as its transposed view"
        return {
            "k": "weights b[G, N, K] passed as their transposed view (no copy)",
            "n": "weights passed as the [G, K, N] tensor b is a view of (no copy; copied once to K-inner "
            "if N >= 65536)",
            "strided": "weights copied once to a contiguous [G, N, K] tensor (prepared), passed as its transposed view",
        }.get(p.b_major, "weights passed as the op expects")

    # -- execution -------------------------------------------------------------------------------
    def run(self, p: Problem, out: torch.Tensor | None) -> torch.Tensor:
        if p.device.type == "cpu" and not emulation.config().enabled:
            # Called directly (not through selection): never emulate without being asked to.
            raise errors.DeviceError(
                "a", f"tensors on an NPU (CPU tensors only in emulation mode, {emulation.ENV_EMULATE}=1)", p.device
            )
        plan = self.plan(p)
        for note in plan.notes:
            warn_once((self.name, note), f"moe_hal {self.name} backend {note}", stacklevel=4)
        if p.is_empty:
            return p.empty_product(out)
        ops = runtime.ops_for(p.device)
        guard = ops.soc_guard() if p.device.type == "cpu" else contextlib.nullcontext()
        with guard:
            if p.op == "contiguous":
                return self._contiguous(p, plan, ops, out)
            if p.op == "masked":
                return self._masked(p, plan, ops, out)
            return self._k_grouped(p, plan, ops, out)

    def _contiguous(self, p: Problem, plan: Plan, ops: Any, out: torch.Tensor | None) -> torch.Tensor:
        lay = p.layout
        if lay.num_valid_rows == 0:
            return p.empty_product(out)
        x, per_token_scale = _activation(p.a, plan)
        y = self._gmm_m(p, plan, ops, x, per_token_scale, _aligned_ends(lay, p.device))
        if lay.has_gaps():
            y.index_fill_(0, lay.gap_rows_on(p.device), 0)
        return _deliver(y, out, p.out_dtype)

    def _masked(self, p: Problem, plan: Plan, ops: Any, out: torch.Tensor | None) -> torch.Tensor:
        groups, max_m, rows = p.num_groups, p.m, p.num_groups * p.m
        x, per_token_scale = _activation(p.a, plan)
        valid_m = p.layout.masked_m.clamp(0, max_m).to(torch.int64)
        ends = torch.cumsum(valid_m, 0)
        # Packed row i holds row (i - start[g]) of group g, the group whose range contains i.
        # Rows past the last end are never read by the op; any in-range source will do.
        packed = torch.arange(rows, device=p.device)
        group = torch.searchsorted(ends, packed, right=True).clamp_(max=groups - 1)
        source = (group * max_m + packed - (ends - valid_m)[group]).clamp_(0, rows - 1)
        x = _gather_rows(x.reshape(rows, p.k), source)
        if per_token_scale is not None:
            per_token_scale = per_token_scale.reshape(rows, -1).index_select(0, source)
        y = self._gmm_m(p, plan, ops, x, per_token_scale, ends)
        out = p.new_out() if out is None else out
        valid = torch.arange(max_m, device=p.device)[None, :] < valid_m[:, None]
        out.masked_scatter_(valid[..., None], y.to(out.dtype))
        return out

    def _gmm_m(
        self,
        p: Problem,
        plan: Plan,
        ops: Any,
        x: torch.Tensor,
        per_token_scale: torch.Tensor | None,
        group_list: torch.Tensor,
    ) -> torch.Tensor:
        """One M-grouped ``npu_grouped_matmul`` over ``x [rows, K]``: ``y [rows, N]``, in the output
        dtype, or fp32 on the fp32 paths (rows outside the group list left as the op leaves them)."""
        weight, weight_scale = self._m_weight(p, plan, ops)
        kwargs: dict[str, Any] = dict(group_list=group_list, group_type=0, group_list_type=0, split_item=3)
        if plan.compute == "fp8_gb":
            kwargs.update(scale=[weight_scale], per_token_scale=[_row_major(per_token_scale)], output_dtype=p.out_dtype)
        return ops.npu_grouped_matmul([_row_major(x)], [weight], **kwargs)[0]

    def _k_grouped(self, p: Problem, plan: Plan, ops: Any, out: torch.Tensor | None) -> torch.Tensor:
        lay = p.layout
        if lay.num_valid_rows == 0:
            return p.empty_product(out)
        a, _ = _activation(p.a, plan)
        b, _ = _activation(p.b, plan)
        if lay.has_gaps():
            rows = lay.valid_rows_on(p.device)
            a, b = a.index_select(0, rows), b.index_select(0, rows)
            ends = _cached(lay, "packed_ends_i64", p.device, lambda: lay.packed_ends_on("cpu").to(torch.int64))
        else:
            ends = _cached(lay, "ends_i64", p.device, lambda: lay.psum.to(torch.int64))
        # CANN reads transposition from strides, size-1 dims included: a column-major a with T = 1
        # or M = 1 is "contiguous" to torch yet reaches the op with strides it reads wrongly.
        a, b = _row_major(a), _row_major(b)
        y = ops.npu_grouped_matmul([a.t()], [b], group_list=ends, group_type=2, group_list_type=0, split_item=3)[0]
        empty = [g for g, count in enumerate(lay.counts_list) if count == 0]
        if empty:
            y.index_fill_(0, _cached(lay, "empty_groups", p.device, lambda: torch.tensor(empty, dtype=torch.int64)), 0)
        if p.c is not None:
            y.add_(p.c)
        return _deliver(y, out, p.out_dtype)

    # -- weights ---------------------------------------------------------------------------------
    def _m_weight(self, p: Problem, plan: Plan, ops: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The weight (and G-B scale) in a form ``npu_grouped_matmul`` accepts, prepared once
        where a conversion is needed."""
        from moe_hal.plugin_api import prepared_cache

        b = p.b
        if plan.compute == "fp8_gb":
            # The weight [G, K, N] row-major reads as "not transposed"; the G-B checker wants the same of
            # its scale, by strides (size-1 dims included), so both are laid out row-major exactly.
            data = prepared_cache.get(
                self.name,
                b,
                "npu_fp8_weight_kn",
                lambda q: _row_major(q.data.view(torch.uint8).transpose(1, 2)).view(q.data.dtype),
            )
            scale = prepared_cache.get(self.name, b, "npu_fp8_scale_kn", lambda q: _row_major(q.scale.transpose(1, 2)))
            return data, scale
        if plan.compute == "native":
            w = b
        elif plan.compute == "dequantize":
            w = self._dequantized_weight(b, plan)
        else:
            name = dtypes.name_of(plan.op_dtype)
            w = prepared_cache.get(self.name, b, f"npu_weight_{name}", _converter(plan))
        if self._use_nz(p, plan):

            def to_nz(_: Any) -> torch.Tensor:
                return ops.npu_format_cast(w.transpose(1, 2).contiguous(), ACL_FORMAT_FRACTAL_NZ)

            nz = prepared_cache.get(self.name, b, f"npu_weight_nz_{dtypes.name_of(plan.op_dtype)}", to_nz)
            return nz, None
        kn = w.transpose(1, 2)
        if w.is_contiguous():
            return kn, None  # the transposed view, K inner
        if kn.is_contiguous() and p.n < INNER_DIM_LIMIT:
            return kn, None  # b is a view of a contiguous [G, K, N]: N inner
        w = prepared_cache.get(self.name, b, "npu_weight_k_inner", lambda t: t.contiguous())
        return w.transpose(1, 2), None

    def _dequantized_weight(self, b: QuantizedTensor, plan: Plan) -> torch.Tensor:
        """fp8 weights dequantized once and held as bf16 where that is exact or the output is bf16
        (else fp32), returned in the op's dtype (a bf16 copy is widened per call for an fp32 op)."""
        from moe_hal.plugin_api import prepared_cache

        bf16 = prepared_cache.get(self.name, b, "npu_weight_bf16", lambda q: decode_fp8(q, torch.bfloat16))
        if plan.op_dtype == torch.bfloat16:
            return bf16
        exact = prepared_cache.get(
            self.name,
            b,
            "npu_weight_bf16_is_exact",
            lambda q: bool(torch.equal(bf16.float(), decode_fp8(q, torch.float32))),
        )
        if exact:
            return bf16.float()
        return prepared_cache.get(self.name, b, "npu_weight_fp32", lambda q: decode_fp8(q, torch.float32))

    def _use_nz(self, p: Problem, plan: Plan) -> bool:
        if environment.choice(ENV_WEIGHT_FORMAT, ("nd", "nz"), "nd") != "nz":
            return False
        features = soc.emulated().features if p.device.type == "cpu" else _device_features(p.device)
        aligned = "ascend_a5" not in features or (p.k * 2 % 32 == 0 and p.n * 2 % 32 == 0)
        return (
            "nz_format" in features
            and plan.op_dtype in (torch.bfloat16, torch.float16)
            and p.k > 1
            and p.n > 1
            and aligned
        )


class Ascend950Backend(AscendBackend):
    """``npu_grouped_matmul`` on the Ascend 950 generation: also fp8 e4m3 natively (G-B mode)."""

    native_fp8 = True


# -- helpers ---------------------------------------------------------------------------------------
def _sums_c(p: Problem) -> bool:
    """A K-grouped call adding ``c`` into a 16-bit output: the op must compute in fp32 so that
    ``c + a^T b`` is rounded once (a 16-bit op result plus c would round twice)."""
    return p.op == "k_grouped" and p.c is not None and p.out_dtype != torch.float32


def _activation(x: torch.Tensor | QuantizedTensor, plan: Plan) -> tuple[torch.Tensor, torch.Tensor | None]:
    """An activation operand in the dtype the op gets, and its per-token scales in G-B mode."""
    if plan.compute == "fp8_gb":
        return x.data, x.scale
    if plan.compute == "dequantize":
        return decode_fp8(x, plan.op_dtype), None
    if plan.compute == "upcast_fp32":
        return x.to(torch.float32), None
    return x, None


def _converter(plan: Plan) -> Callable[[Any], torch.Tensor]:
    return lambda t: t.to(plan.op_dtype, memory_format=torch.contiguous_format)


#: fp32 value of every fp8 e4m3 byte (built on the host once; it is 1 KiB).
_E4M3_TABLE = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).to(torch.float32)
_tables: dict[torch.device, torch.Tensor] = {}


def decode_fp8(q: QuantizedTensor, dtype: torch.dtype) -> torch.Tensor:
    """``q.data * scale`` per block in ``dtype`` without an fp8 cast on the device: the bytes index
    a 256-entry fp32 table (exact), then the block scales multiply in fp32 and the result rounds once."""
    table = _tables.get(q.data.device)
    if table is None:
        table = _tables[q.data.device] = _E4M3_TABLE.to(q.data.device)
    values = table[q.data.view(torch.uint8).to(torch.int32)]
    return (values * q.expanded_scale().float()).to(dtype)


def _row_major(t: torch.Tensor) -> torch.Tensor:
    """``t`` with exactly row-major strides (size-1 dims included), copied only when they differ:
    ``contiguous()`` ignores size-1 dims, CANN's transposition test does not."""
    expected, step = [], 1
    for size in reversed(t.shape):
        expected.append(step)
        step *= size
    if tuple(reversed(expected)) == t.stride():
        return t
    return t.new_empty(t.shape).copy_(t)


def _gather_rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``x.index_select(0, index)``; fp8 rows are gathered as uint8 (aclnnIndexSelect has no FLOAT8)."""
    if x.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return x.view(torch.uint8).index_select(0, index).view(x.dtype)
    return x.index_select(0, index)


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f}"


def _device_features(device: torch.device) -> frozenset[str]:
    from moe_hal.plugin_api import device_info

    return device_info(device).features


def _deliver(y: torch.Tensor, out: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """``y`` in ``dtype`` (one rounding when the op computed in fp32), written into ``out`` if given."""
    if out is None:
        return y.to(dtype)
    out.copy_(y)
    return out


# Keyed by identity: a WeakKeyDictionary would hash the layout's G counts on every look-up.
_layout_tensors = IdentityTable()


def _cached(layout: Any, kind: str, device: torch.device, build: Callable[[], torch.Tensor]) -> torch.Tensor:
    """int64 group lists of a layout on ``device``, built once (the op wants int64, the layout
    caches int32)."""
    per_layout = _layout_tensors.slot(layout)
    key = (kind, device)
    hit = per_layout.get(key)
    if hit is None:
        hit = per_layout[key] = build().to(device)
    return hit


def _aligned_ends(layout: Any, device: torch.device) -> torch.Tensor:
    return _cached(
        layout,
        "aligned_ends_i64",
        device,
        lambda: torch.tensor(
            [-(-end // layout.alignment) * layout.alignment for end in layout.ends], dtype=torch.int64
        ),
    )
