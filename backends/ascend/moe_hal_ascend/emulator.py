"""A CPU emulator of the torch_npu operators the Ascend backends call.

It exposes the same names and keyword signatures as ``torch_npu`` — :func:`npu_grouped_matmul`
(the Tensor ``group_list`` overload), :func:`npu_format_cast`, :func:`get_npu_format` — so the
backends call ``ops.npu_grouped_matmul(...)`` without knowing which one they hold
(:func:`moe_hal_ascend.runtime.ops_for`). It takes CPU tensors and follows the documented
semantics of the real operator (reference/ascend.md §1 and §6; sources: torch_npu's meta
registrations and docs, the aclnnGroupedMatmulV5 kernel doc):

* ``group_list_type`` 0 (cumulative ends), 1 (per-group counts), 2 (``[E, 2]`` rows of
  ``(group index, count)``, consumed in list order, non-zero groups first); ranges are laid
  back-to-back from row 0; zero-size groups are legal and write nothing.
* ``group_type`` -1 (independent matmuls over lists), 0 (groups along M), 2 (groups along K: ``x``
  a transposed ``[K, M]`` view, ``weight`` ``[K, N]``, ``y`` ``[G, M, N]``); 1 is rejected.
* ``split_item`` 0/1 (one output per group) and 2/3 (one concatenated output).
* Transposed weights are recognised by strides as the meta kernel does
  (``stride[-2] == 1 and stride[-1] == shape[-2]``).
* **Rows of ``y`` outside every group are never written.** The real kernel leaves whatever the
  allocator returned there; the emulator fills them with NaN, so a caller that forgets to fix
  them up fails loudly. For ``group_type`` 2 the output of an empty K group is undocumented; the
  emulator leaves it NaN as well (a caller must not rely on zeros there).
* Arithmetic: fp16/bf16 operands are multiplied exactly, accumulated in fp32 and rounded once to
  the output dtype; fp32 operands are accumulated in fp32 (no HF32: ``allow_hf32`` defaults to
  False). fp8 e4m3 operands (SoCs with the ``fp8`` feature) use the G-B block-scaled mode: fp32
  scales, ``per_token_scale [M, ceil(K/128)]`` and ``scale [E, ceil(K/128), ceil(N/128)]``; each
  128-wide K block is multiplied in fp32 and scaled before it is accumulated in fp32.
* Validation mirrors the kernel's: int64 ``group_list`` of one entry per expert, at most 1024
  groups, inner dimensions below 65536, covered rows within ``x``, the dtype matrix of the
  emulated SoC (from its hardware-DB features, :mod:`moe_hal_ascend.soc`), ``output_dtype`` rules,
  ``act_type`` only with int8. Errors are :class:`AclnnError` (a ``RuntimeError`` like torch_npu's)
  carrying the aclnn error code, ``161002`` (ACLNN_ERR_PARAM_INVALID) for parameter errors.

Arguments of the real operator the backends never pass (bias, offsets, antiquantization, int8 and
int4 operands, fused activations, the Python-list ``group_list`` overload) raise
``NotImplementedError`` naming the argument: the emulator never pretends to compute what it does
not model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from . import soc as _soc

ACL_FORMAT_ND = 2
ACL_FORMAT_FRACTAL_NZ = 29
ACLNN_ERR_PARAM_NULLPTR = 161001
ACLNN_ERR_PARAM_INVALID = 161002
#: Largest number of groups with a single weight tensor.
MAX_GROUPS = 1024
#: Inner (last, in memory) dimensions must be below this ("InnerLimit").
INNER_DIM_LIMIT = 65536
#: G-B block size along K and N (gsM = 1).
GB_BLOCK = 128

_FLOATS = (torch.float16, torch.bfloat16, torch.float32)
_FP8_OUT = (torch.bfloat16, torch.float16, torch.float32)
_FORMAT_ATTR = "_moe_hal_emulated_npu_format"
_API = "aclnnGroupedMatmulV5"


class AclnnError(RuntimeError):
    """A parameter error of the emulated operator, shaped like torch_npu's: the aclnn API, the
    error code and the kernel's complaint."""

    def __init__(self, detail: str, code: int = ACLNN_ERR_PARAM_INVALID, api: str = _API):
        self.code = code
        self.detail = detail
        name = {ACLNN_ERR_PARAM_INVALID: "ACLNN_ERR_PARAM_INVALID",
                ACLNN_ERR_PARAM_NULLPTR: "ACLNN_ERR_PARAM_NULLPTR"}.get(code, "ACLNN_ERR")
        super().__init__(f"call {api} failed, error code {code} ({name}): {detail}")


# -- formats ---------------------------------------------------------------------------------------
def npu_format_cast(self: torch.Tensor, acl_format: int) -> torch.Tensor:
    """Copy of ``self`` in storage format ``acl_format`` (2 = ND, 29 = FRACTAL_NZ). The logical
    values and shape are unchanged, as on the NPU; the emulator only records the format, which
    :func:`npu_grouped_matmul` checks against what the kernel accepts."""
    _check_cpu(self, "self")
    if acl_format not in (ACL_FORMAT_ND, ACL_FORMAT_FRACTAL_NZ):
        raise AclnnError(f"acl_format {acl_format} is not emulated (only ND=2 and FRACTAL_NZ=29)",
                         api="npu_format_cast")
    if acl_format == ACL_FORMAT_FRACTAL_NZ:
        if self.dim() < 2:
            raise AclnnError(f"FRACTAL_NZ needs a tensor of rank >= 2, got shape {tuple(self.shape)}",
                             api="npu_format_cast")
        if not _soc.emulated().nz_format:
            raise AclnnError(f"SoC {_soc.emulated().label} has no FRACTAL_NZ support", api="npu_format_cast")
    out = self.clone(memory_format=torch.contiguous_format)
    setattr(out, _FORMAT_ATTR, acl_format)
    return out


def get_npu_format(self: torch.Tensor) -> int:
    """Storage format of ``self``: 29 after ``npu_format_cast(t, 29)``, else 2 (ND)."""
    return getattr(self, _FORMAT_ATTR, ACL_FORMAT_ND)


# -- group lists ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GroupRange:
    """One group as the kernel walks it: ``weight[expert]`` applies to ``count`` rows (or K
    columns for group_type 2) starting at ``start``."""

    expert: int
    start: int
    count: int


def decode_group_list(group_list: torch.Tensor, group_list_type: int, num_experts: int, limit: int,
                      *, arch35: bool, axis: str = "M") -> list[GroupRange]:
    """The back-to-back ranges a ``group_list`` describes, validated like the kernel does.

    ``num_experts``: E, the groups the weight holds; ``limit``: rows of ``x`` along the grouped
    axis (M, or K for group_type 2); ``arch35``: the 950 rules (a one-entry counts list is allowed).
    """
    if not isinstance(group_list, torch.Tensor):
        raise AclnnError(f"group_list must be a Tensor for this overload, got {type(group_list).__name__}")
    if group_list.dtype != torch.int64:
        raise AclnnError(f"group_list dtype must be INT64, got {group_list.dtype}")
    _check_cpu(group_list, "group_list")
    if group_list_type in (0, 1):
        if group_list.dim() != 1:
            raise AclnnError(f"group_list must be 1-D for group_list_type {group_list_type}, "
                             f"got shape {tuple(group_list.shape)}")
        length = group_list.numel()
    else:
        if group_list.dim() != 2 or group_list.shape[1] != 2:
            raise AclnnError(f"group_list must be [E, 2] for group_list_type 2, got shape {tuple(group_list.shape)}")
        length = group_list.shape[0]
    if length > MAX_GROUPS:
        raise AclnnError(f"group_list length {length} exceeds the maximum of {MAX_GROUPS} groups")
    if length != num_experts:
        raise AclnnError(f"group_list length {length} must equal the number of groups of weight {num_experts}")
    values = group_list.tolist()
    ranges: list[GroupRange] = []
    if group_list_type == 0:
        prev = 0
        for e, end in enumerate(values):
            if end < prev:
                raise AclnnError(f"group_list must be non-negative and non-decreasing for group_list_type 0, "
                                 f"got group_list[{e}] = {end} after {prev}")
            ranges.append(GroupRange(e, prev, end - prev))
            prev = end
    elif group_list_type == 1:
        if length == 1 and not arch35:
            raise AclnnError("group_list of length 1 is not supported for group_list_type 1 on this SoC")
        row = 0
        for e, count in enumerate(values):
            if count < 0:
                raise AclnnError(f"group_list values must be non-negative, got group_list[{e}] = {count}")
            ranges.append(GroupRange(e, row, count))
            row += count
    else:
        row, seen_zero = 0, False
        for i, (e, count) in enumerate(values):
            if not 0 <= e < num_experts:
                raise AclnnError(f"group_list[{i}][0] = {e} is not a group index in [0, {num_experts})")
            if count < 0:
                raise AclnnError(f"group_list[{i}][1] = {count} must be non-negative")
            if count and seen_zero:
                raise AclnnError("group_list_type 2 lists non-zero groups first; "
                                 f"group_list[{i}] = ({e}, {count}) follows an empty group")
            seen_zero = seen_zero or count == 0
            ranges.append(GroupRange(e, row, count))
            row += count
    covered = sum(r.count for r in ranges)
    if covered > limit:
        raise AclnnError(f"the groups cover {covered} along {axis}, more than the {limit} of x")
    return ranges


# -- the operator ----------------------------------------------------------------------------------
def npu_grouped_matmul(x: Sequence[torch.Tensor], weight: Sequence[torch.Tensor], *,
                       bias: Sequence[torch.Tensor] | None = None,
                       scale: Sequence[torch.Tensor] | None = None,
                       offset: Sequence[torch.Tensor] | None = None,
                       antiquant_scale: Sequence[torch.Tensor] | None = None,
                       antiquant_offset: Sequence[torch.Tensor] | None = None,
                       per_token_scale: Sequence[torch.Tensor] | None = None,
                       group_list: torch.Tensor | None = None,
                       activation_input: Sequence[torch.Tensor] | None = None,
                       activation_quant_scale: Sequence[torch.Tensor] | None = None,
                       activation_quant_offset: Sequence[torch.Tensor] | None = None,
                       split_item: int | None = 0,
                       group_type: int | None = None,
                       group_list_type: int | None = 0,
                       act_type: int | None = 0,
                       tuning_config: Sequence[int] | None = None,
                       output_dtype: torch.dtype | None = None,
                       x_dtype: Any = None,
                       weight_dtype: Any = None,
                       scale_dtype: Any = None,
                       per_token_scale_dtype: Any = None) -> list[torch.Tensor]:
    """Emulation of ``torch_npu.npu_grouped_matmul`` (Tensor ``group_list`` overload); returns a
    list of tensors like the real operator (one tensor for ``split_item`` 2/3)."""
    _not_emulated(bias=bias, offset=offset, antiquant_scale=antiquant_scale, antiquant_offset=antiquant_offset,
                  activation_input=activation_input, activation_quant_scale=activation_quant_scale,
                  activation_quant_offset=activation_quant_offset, x_dtype=x_dtype, weight_dtype=weight_dtype,
                  scale_dtype=scale_dtype, per_token_scale_dtype=per_token_scale_dtype)
    if isinstance(group_list, (list, tuple)):
        raise NotImplementedError("the emulator implements the Tensor group_list overload; "
                                  "npu_grouped_matmul.List (a Python-list group_list) is not emulated")
    profile = _soc.emulated()
    xs, ws = _tensors(x, "x"), _tensors(weight, "weight")
    split_item = 0 if split_item is None else split_item
    group_list_type = 0 if group_list_type is None else group_list_type
    act_type = 0 if act_type is None else act_type
    if split_item not in (0, 1, 2, 3):
        raise AclnnError(f"split_item must be 0, 1, 2 or 3, got {split_item}")
    if group_type not in (-1, 0, 2):
        raise AclnnError(f"group_type only supports -1, 0 and 2, got {group_type}")
    if group_list_type not in (0, 1, 2):
        raise AclnnError(f"group_list_type must be 0, 1 or 2, got {group_list_type}")
    if act_type != 0:
        raise AclnnError(f"act_type {act_type} is only supported with int8 x and weight (A8W8), "
                         "which the emulator does not model")
    if tuning_config is not None and profile.arch35:
        raise AclnnError(f"tuning_config is not supported on SoC {profile.label}")
    quant = (scale, per_token_scale)
    if group_type == -1:
        if group_list is not None:
            raise AclnnError("group_list must be None when group_type is -1")
        return _independent(xs, ws, quant, split_item, output_dtype, profile)
    if group_list is None:
        raise AclnnError(f"group_list is required when group_type is {group_type}")
    if group_type == 0:
        return _split_m(xs, ws, quant, group_list, group_list_type, split_item, output_dtype, profile)
    return _split_k(xs, ws, quant, group_list, group_list_type, split_item, output_dtype, profile)


def _split_m(xs, ws, quant, group_list, group_list_type, split_item, output_dtype, profile) -> list[torch.Tensor]:
    """group_type 0: single x ``[M, K]``, single weight ``[E, K, N]`` (or its transposed view)."""
    if len(xs) != 1 or len(ws) != 1:
        raise NotImplementedError("the emulator models group_type 0 with a single x and a single weight "
                                  f"tensor; got {len(xs)} x and {len(ws)} weight tensors")
    x, w = xs[0], ws[0]
    if x.dim() != 2:
        raise AclnnError(f"x must be 2-D for group_type 0 with split_item {split_item}, got shape {tuple(x.shape)}")
    if w.dim() != 3:
        raise AclnnError(f"weight must be 3-D [E, K, N] for a single weight tensor, got shape {tuple(w.shape)}")
    if x.numel() and x.stride(-1) != 1:
        raise AclnnError("x must not be transposed for group_type 0")
    m, k = x.shape
    e, kw, n = w.shape
    if kw != k:
        raise AclnnError(f"k dim value of x and weight is not matched: dim 1 value of x[0] is {k}, "
                         f"dim 1 value of weight[0] (K of [E, K, N]) is {kw}")
    transposed = _is_transposed(w)
    out_dtype = _check_dtypes(x, w, quant, output_dtype, profile, transposed)
    _check_inner(x, "x", transposed=False)
    _check_inner(w, "weight", transposed=transposed)
    if group_list_type == 2 and not (x.dtype == torch.float8_e4m3fn and profile.arch35):
        raise AclnnError(f"group_list_type 2 is only supported with quantized (int8, or full-quant on arch35) "
                         f"x and weight, got {x.dtype} on SoC {profile.label}")
    ranges = decode_group_list(group_list, group_list_type, e, m, arch35=profile.arch35, axis="M")
    y = _poisoned((m, n), out_dtype)
    for r in ranges:
        if r.count:
            rows = slice(r.start, r.start + r.count)
            y[rows] = _product(x[rows], w[r.expert], quant, r.expert, rows, out_dtype)
    if split_item in (2, 3):
        return [y]
    return [y[r.start:r.start + r.count] for r in sorted(ranges, key=lambda r: r.expert)]


def _split_k(xs, ws, quant, group_list, group_list_type, split_item, output_dtype, profile) -> list[torch.Tensor]:
    """group_type 2: x ``[M, K]`` given as a transposed view of ``[K, M]``, weight ``[K, N]``;
    group g multiplies the columns of x / rows of weight of its K range: ``y [G, M, N]``."""
    if len(xs) != 1 or len(ws) != 1:
        raise AclnnError(f"group_type 2 needs a single x and a single weight, got {len(xs)} and {len(ws)}")
    x, w = xs[0], ws[0]
    if x.dim() != 2 or w.dim() != 2:
        raise AclnnError(f"group_type 2 needs 2-D x [M, K] and weight [K, N], got {tuple(x.shape)} "
                         f"and {tuple(w.shape)}")
    if any(q is not None for q in quant):
        raise NotImplementedError("quantized group_type 2 (950 full quantization along K) is not emulated")
    m, k = x.shape
    kw, n = w.shape
    if kw != k:
        raise AclnnError(f"k dim value of x and weight is not matched: dim 1 value of x[0] is {k}, "
                         f"dim 0 value of weight[0] is {kw}")
    if x.numel() and not _is_transposed(x):
        raise AclnnError("x must be transposed (a [M, K] view of a contiguous [K, M] tensor) for group_type 2")
    if w.numel() and _is_transposed(w) and not w.is_contiguous():
        raise AclnnError("weight must not be transposed for group_type 2")
    out_dtype = _check_dtypes(x, w, quant, output_dtype, profile, False)
    _check_inner(x, "x", transposed=True)
    _check_inner(w, "weight", transposed=False)
    if group_list_type == 2:
        raise AclnnError("group_list_type 2 is only supported with group_type 0")
    groups = group_list.shape[0] if group_list.dim() else 0
    ranges = decode_group_list(group_list, group_list_type, groups, k, arch35=profile.arch35, axis="K")
    y = _poisoned((groups, m, n), out_dtype)
    for r in ranges:
        if r.count:
            cols = slice(r.start, r.start + r.count)
            y[r.expert] = (x[:, cols].float() @ w[cols].float()).to(out_dtype)
    return [y] if split_item in (2, 3) else list(y.unbind(0))


def _independent(xs, ws, quant, split_item, output_dtype, profile) -> list[torch.Tensor]:
    """group_type -1: ``y[i] = x[i] @ weight[i]`` for lists of 2-D tensors."""
    if len(xs) != len(ws):
        raise AclnnError(f"group_type -1 needs as many x as weight tensors, got {len(xs)} and {len(ws)}")
    if len(ws) > MAX_GROUPS:
        raise AclnnError(f"at most {MAX_GROUPS} weight tensors, got {len(ws)}")
    if any(q is not None for q in quant):
        raise NotImplementedError("quantized group_type -1 is not emulated")
    ys = []
    for i, (x, w) in enumerate(zip(xs, ws)):
        if x.dim() != 2 or w.dim() != 2:
            raise NotImplementedError("the emulator models group_type -1 with 2-D x and weight tensors")
        if x.shape[1] != w.shape[0]:
            raise AclnnError(f"k dim value of x and weight is not matched: dim 1 value of x[{i}] is {x.shape[1]}, "
                             f"dim 0 value of weight[{i}] is {w.shape[0]}")
        out_dtype = _check_dtypes(x, w, quant, output_dtype, profile, _is_transposed(w))
        _check_inner(x, f"x[{i}]", transposed=False)
        _check_inner(w, f"weight[{i}]", transposed=_is_transposed(w))
        ys.append((x.float() @ w.float()).to(out_dtype))
    if split_item in (2, 3):
        if len({y.shape[1] for y in ys}) > 1:
            raise AclnnError("split_item 2/3 concatenates along M and needs one N for every weight")
        return [torch.cat(ys, 0)]
    return ys


# -- arithmetic --------------------------------------------------------------------------------------
def _product(xr: torch.Tensor, w: torch.Tensor, quant, expert: int, rows: slice,
             out_dtype: torch.dtype) -> torch.Tensor:
    """One group: ``xr [m, K] @ w [K, N]`` with fp32 accumulation, rounded once to ``out_dtype``."""
    scale, per_token_scale = quant
    if scale is None:
        return (xr.float() @ w.float()).to(out_dtype)
    xs = per_token_scale[0][rows]              # [m, ceil(K/128)]
    ws = scale[0][expert]                      # [ceil(K/128), ceil(N/128)]
    m, k = xr.shape
    n = w.shape[1]
    kb = xs.shape[1]
    pad = kb * GB_BLOCK - k
    xf = torch.nn.functional.pad(xr.float(), (0, pad)).view(m, kb, GB_BLOCK)
    wf = torch.nn.functional.pad(w.float(), (0, 0, 0, pad)).view(kb, GB_BLOCK, n)
    partial = torch.einsum("mjk,jkn->jmn", xf, wf)                         # fp32 per K block
    ws_n = ws.repeat_interleave(GB_BLOCK, dim=1)[:, :n]                     # [kb, N]
    acc = (partial * xs.t()[:, :, None] * ws_n[:, None, :]).sum(0)          # fp32 accumulation
    return acc.to(out_dtype)


# -- checks -----------------------------------------------------------------------------------------
def _check_dtypes(x: torch.Tensor, w: torch.Tensor, quant, output_dtype, profile, transposed: bool) -> torch.dtype:
    """The output dtype, after the dtype matrix of the emulated SoC has admitted the call."""
    scale, per_token_scale = quant
    if x.dtype != w.dtype:
        raise AclnnError(f"x dtype {x.dtype} and weight dtype {w.dtype} must be the same for this scenario")
    fmt = get_npu_format(w)
    if x.dtype in _FLOATS:
        if scale is not None or per_token_scale is not None:
            raise AclnnError(f"scale / per_token_scale must be None for non-quantized {x.dtype} x")
        if output_dtype is not None and output_dtype != x.dtype:
            raise AclnnError(f"output_dtype must be None or {x.dtype} for non-quantized {x.dtype} x, "
                             f"got {output_dtype}")
        if fmt == ACL_FORMAT_FRACTAL_NZ:
            if x.dtype == torch.float32:
                raise AclnnError("FRACTAL_NZ weight is not supported for float32")
            if transposed or w.dim() != 3:
                raise AclnnError("a FRACTAL_NZ weight must be a 3-D [E, K, N] tensor, not a transposed view")
            if min(w.shape[-2:]) <= 1:
                raise AclnnError(f"FRACTAL_NZ weight needs K > 1 and N > 1, got [K, N] = {list(w.shape[-2:])}",
                                 api="aclnnGroupedMatmulWeightNz")
        return x.dtype
    if x.dtype == torch.float8_e4m3fn:
        if not profile.native_fp8:
            raise AclnnError(f"x dtype FLOAT8_E4M3FN is not supported on SoC {profile.label} "
                             "(the hardware DB lists no fp8 feature)")
        if fmt != ACL_FORMAT_ND:
            raise AclnnError("fp8 weights must be ND in the emulated G-B mode")
        if scale is None or per_token_scale is None:
            raise AclnnError("fp8 x and weight need scale and per_token_scale (G-B mode)")
        if output_dtype not in _FP8_OUT:
            raise AclnnError(f"output_dtype must be bfloat16, float16 or float32 for fp8 x, got {output_dtype}")
        _check_gb_scales(x, w, _tensors(scale, "scale"), _tensors(per_token_scale, "per_token_scale"))
        return output_dtype
    raise NotImplementedError(f"x dtype {x.dtype} is not emulated (the emulator models fp16, bf16, fp32 "
                              "and fp8 e4m3 in G-B mode)")


def _check_gb_scales(x, w, scale, per_token_scale) -> None:
    m, k = x.shape
    e, _, n = w.shape
    kb, nb = math.ceil(k / GB_BLOCK), math.ceil(n / GB_BLOCK)
    if len(scale) != 1 or len(per_token_scale) != 1:
        raise AclnnError("G-B mode takes one scale and one per_token_scale tensor")
    s, p = scale[0], per_token_scale[0]
    if s.dtype != torch.float32 or p.dtype != torch.float32:
        raise AclnnError(f"G-B scales must be float32, got scale {s.dtype} and per_token_scale {p.dtype}")
    if tuple(s.shape) != (e, kb, nb):
        raise AclnnError(f"scale shape must be (g, ceil(K/128), ceil(N/128)) = {(e, kb, nb)}, got {tuple(s.shape)}")
    if tuple(p.shape) != (m, kb):
        raise AclnnError(f"per_token_scale shape must be (M, ceil(K/128)) = {(m, kb)}, got {tuple(p.shape)}")


def _check_inner(t: torch.Tensor, name: str, *, transposed: bool) -> None:
    inner = t.shape[-2] if transposed else t.shape[-1]
    if inner >= INNER_DIM_LIMIT:
        raise AclnnError(f"the last dimension in memory of {name} is {inner}; it must be less than {INNER_DIM_LIMIT}")


def _is_transposed(t: torch.Tensor) -> bool:
    """The meta kernel's rule: ``stride[-2] == 1 and stride[-1] == shape[-2]``."""
    return t.dim() >= 2 and t.stride(-2) == 1 and t.stride(-1) == t.shape[-2]


def _poisoned(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A fresh output whose never-written elements read as NaN (the NPU leaves garbage there)."""
    return torch.full(shape, float("nan"), dtype=dtype)


def _tensors(value, name: str) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor) or not isinstance(value, (list, tuple)):
        raise AclnnError(f"{name} must be a list of tensors, got {type(value).__name__}")
    if not value:
        raise AclnnError(f"{name} must not be empty", code=ACLNN_ERR_PARAM_NULLPTR)
    for i, t in enumerate(value):
        if not isinstance(t, torch.Tensor):
            raise AclnnError(f"{name}[{i}] must be a tensor, got {type(t).__name__}", code=ACLNN_ERR_PARAM_NULLPTR)
        _check_cpu(t, f"{name}[{i}]")
    return list(value)


def _check_cpu(t: torch.Tensor, name: str) -> None:
    if t.device.type != "cpu":
        raise RuntimeError(f"the torch_npu emulator runs on CPU tensors; {name} is on {t.device}")


def _not_emulated(**arguments: Any) -> None:
    given = sorted(name for name, value in arguments.items() if value is not None)
    if given:
        raise NotImplementedError(f"npu_grouped_matmul arguments not emulated: {', '.join(given)}")
