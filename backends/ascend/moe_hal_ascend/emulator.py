"""A CPU emulator of the torch_npu operators the Ascend backends call, as strict as CANN's host checks.

It exposes the same names and keyword signatures as ``torch_npu`` — :func:`npu_grouped_matmul`
(the Tensor ``group_list`` overload), :func:`npu_format_cast`, :func:`get_npu_format` — so the
backends call ``ops.npu_grouped_matmul(...)`` without knowing which one they hold
(:func:`moe_hal_ascend.runtime.ops_for`).

Every call is first reduced to what the host sees — shapes, strides, dtypes, storage formats and
the scalar arguments, never device values (:class:`GmmCall`) — and checked by
:func:`check_call` against the rules of :mod:`moe_hal_ascend.cann_rules`, each taken from CANN's
host code or docs; a rejection is an :class:`AclnnError` naming the rule and its source. The
same check runs on recorded calls (:mod:`moe_hal_ascend.replay`), so a reviewer without an NPU
can audit exactly what would be sent. Only then are the values computed:

* ``group_list_type`` 0 (cumulative ends), 1 (per-group counts), 2 (``[E, 2]`` rows of
  ``(group index, count)``, consumed in list order); ranges are laid back to back from row 0.
* ``group_type`` 0 (groups along M) and 2 (along K: ``x`` a transposed ``[K, M]`` view, ``weight``
  ``[K, N]``, ``y [G, M, N]``); -1 (independent matmuls over lists) for 2-D tensors.
* **Rows of ``y`` outside every group are never written**: the emulator fills them with NaN, so a
  caller that forgets them fails loudly. The group list's values are device data the host never
  checks; values the kernel cannot make sense of (decreasing ends, negative counts, more rows than
  ``x`` has, unknown group indices) leave the *whole* output NaN — undefined, never an error.
* Arithmetic: fp16/bf16 products are exact in fp32, accumulated in fp32 and rounded once; fp32
  operands accumulate in fp32 (no HF32). fp8 e4m3 (the 950's G-B mode): each 128-wide K block in
  fp32, scaled by ``per_token_scale [M, ceil(K/128)]`` and ``scale [E, ceil(K/128), ceil(N/128)]``.

:func:`soc_guard` extends the same strictness to the plain tensor operations a backend runs on
the device around the grouped matmul: FLOAT8 casts on SoCs without fp8 (aclnnCast) and FLOAT8
gathers anywhere (aclnnIndexSelect) are refused.

Arguments the backends never pass (bias, offsets, antiquantization, int8/int4 operands, fused
activations, the Python-list ``group_list`` overload) raise ``NotImplementedError`` naming the
argument: the emulator never pretends to compute what it does not model.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from . import cann_rules
from . import soc as _soc

ACL_FORMAT_ND = 2
ACL_FORMAT_FRACTAL_NZ = 29
ACLNN_ERR_PARAM_NULLPTR = 161001
ACLNN_ERR_PARAM_INVALID = 161002
#: Largest group list of the Tensor overload (MAX_GROUP_LIST_SIZE_TENSOR).
MAX_GROUPS = 1024
#: Inner (last, in memory) axes must stay at or below this (MAX_INNER_AXIS).
MAX_INNER_AXIS = 65535
#: G-B block size along K and N (gsM = 1).
GB_BLOCK = 128

_FLOATS = ("float16", "bfloat16", "float32")
_FP8 = ("float8_e4m3fn", "float8_e5m2")
_FP8_OUT = ("bfloat16", "float16", "float32")
_FORMAT_ATTR = "_moe_hal_emulated_npu_format"
_API = "aclnnGroupedMatmulV5"


class AclnnError(RuntimeError):
    """A host-side rejection of the emulated operator, shaped like torch_npu's: the aclnn API, the
    error code, the complaint, and the :mod:`~moe_hal_ascend.cann_rules` rule with its source."""

    def __init__(self, rule: str, detail: str, code: int = ACLNN_ERR_PARAM_INVALID, api: str = _API):
        self.rule = rule
        self.code = code
        self.detail = detail
        name = {
            ACLNN_ERR_PARAM_INVALID: "ACLNN_ERR_PARAM_INVALID",
            ACLNN_ERR_PARAM_NULLPTR: "ACLNN_ERR_PARAM_NULLPTR",
        }.get(code, "ACLNN_ERR")
        super().__init__(f"call {api} failed, error code {code} ({name}): {detail} -- {cann_rules.source_of(rule)}")


# -- what the host sees ------------------------------------------------------------------------------
@dataclass(frozen=True)
class TensorSpec:
    """A tensor as the aclnn host code sees it: view shape, view strides, dtype, storage format."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: str
    npu_format: int = ACL_FORMAT_ND

    @classmethod
    def of(cls, t: torch.Tensor) -> TensorSpec:
        return cls(tuple(t.shape), tuple(t.stride()), str(t.dtype).removeprefix("torch."), get_npu_format(t))

    @classmethod
    def from_dict(cls, d: dict) -> TensorSpec:
        return cls(tuple(d["shape"]), tuple(d["stride"]), d["dtype"], d.get("npu_format", ACL_FORMAT_ND))

    @property
    def dim(self) -> int:
        return len(self.shape)


@dataclass(frozen=True)
class GmmCall:
    """Everything the host knows about one ``npu_grouped_matmul`` call (recorded and replayed)."""

    soc: str
    x: tuple[TensorSpec, ...]
    weight: tuple[TensorSpec, ...]
    scale: tuple[TensorSpec, ...] | None
    per_token_scale: tuple[TensorSpec, ...] | None
    group_list: TensorSpec | None
    split_item: int
    group_type: int | None
    group_list_type: int
    act_type: int
    tuning_config: tuple[int, ...] | None
    output_dtype: str | None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> GmmCall:
        def specs(value):
            return None if value is None else tuple(TensorSpec.from_dict(s) for s in value)

        return cls(
            d["soc"],
            specs(d["x"]),
            specs(d["weight"]),
            specs(d["scale"]),
            specs(d["per_token_scale"]),
            None if d["group_list"] is None else TensorSpec.from_dict(d["group_list"]),
            d["split_item"],
            d["group_type"],
            d["group_list_type"],
            d["act_type"],
            None if d["tuning_config"] is None else tuple(d["tuning_config"]),
            d["output_dtype"],
        )


def is_transposed(t: TensorSpec) -> bool:
    """CANN's IsTransposeLastTwoDims: ``stride[-2] == 1``, ``stride[-1] == shape[-2]`` and every
    batch stride equal to the product of the dims after it — size-1 dims included."""
    if t.dim < 2 or t.stride[-2] != 1 or t.stride[-1] != t.shape[-2]:
        return False
    expected = t.shape[-1] * t.shape[-2]
    for d in range(t.dim - 3, -1, -1):
        if t.stride[d] != expected:
            return False
        expected *= t.shape[d]
    return True


def _last_two_are_one(t: TensorSpec) -> bool:
    return t.dim >= 2 and t.shape[-1] == 1 and t.shape[-2] == 1


def _special_transposed(t: TensorSpec) -> bool:
    """CANN's CheckSpecialTranspose: transposed by the rule, unless the last two dims hold one element."""
    return is_transposed(t) and t.shape[-1] * (t.shape[-2] if t.dim > 1 else 1) != 1


# -- the recorder --------------------------------------------------------------------------------------
_recordings: list[list[dict]] = []
_record_lock = threading.Lock()


@contextlib.contextmanager
def recording() -> Iterator[list[dict]]:
    """Record every :func:`npu_grouped_matmul` call made inside the block (``GmmCall.to_dict()``
    plus ``accepted`` and, when refused, ``rule``) into the yielded list."""
    calls: list[dict] = []
    with _record_lock:
        _recordings.append(calls)
    try:
        yield calls
    finally:
        with _record_lock:
            _recordings.remove(calls)


def _record(call: GmmCall, error: AclnnError | None) -> None:
    if not _recordings:
        return
    entry = dict(call.to_dict(), accepted=error is None, rule=None if error is None else error.rule)
    with _record_lock:
        for calls in _recordings:
            calls.append(entry)


# -- the guard around the backends' own device operations ------------------------------------------------
_aten = torch.ops.aten
_GATHERS = {_aten.index_select, _aten.index, _aten.gather, _aten.take, _aten.embedding}
_CASTS = {_aten._to_copy, _aten.copy_}


class _SocGuard(TorchDispatchMode):
    """Refuses, on CPU tensors, the tensor operations the emulated SoC's aclnn kernels reject."""

    def __init__(self, profile: _soc.SocProfile):
        super().__init__()
        self.profile = profile
        self.bypass = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self.bypass:
            packet = func.overloadpacket
            if packet in _GATHERS and isinstance(args[0], torch.Tensor) and _is_fp8(args[0].dtype):
                raise AclnnError(
                    "index_select_fp8",
                    f"{packet.__name__} of a {args[0].dtype} tensor: aclnnIndexSelect "
                    "has no FLOAT8 dtype (gather a uint8 view instead)",
                    api="aclnnIndexSelect",
                )
            if packet in _CASTS and not self.profile.native_fp8:
                source, target = _cast_dtypes(packet, args, kwargs)
                if source != target and (_is_fp8(source) or _is_fp8(target)):
                    raise AclnnError(
                        "cast_fp8",
                        f"cast {source} -> {target} on SoC {self.profile.label}, which has "
                        "no fp8 (aclnnCast lists FLOAT8 dtypes for the 950 only)",
                        api="aclnnCast",
                    )
        return func(*args, **kwargs)


def _is_fp8(dtype: torch.dtype | None) -> bool:
    return dtype in (torch.float8_e4m3fn, torch.float8_e5m2)


def _cast_dtypes(packet, args, kwargs) -> tuple[torch.dtype | None, torch.dtype | None]:
    if packet is _aten.copy_:
        return args[1].dtype, args[0].dtype
    return args[0].dtype, kwargs.get("dtype") or args[0].dtype


_guard_state = threading.local()


@contextlib.contextmanager
def soc_guard() -> Iterator[None]:
    """Within the block, tensor operations on CPU tensors are held to the emulated SoC's aclnn
    dtype tables (:data:`cann_rules.RULES` ``cast_fp8``, ``index_select_fp8``)."""
    guard = _SocGuard(_soc.emulated())
    previous = getattr(_guard_state, "guard", None)
    _guard_state.guard = guard
    try:
        with guard:
            yield
    finally:
        _guard_state.guard = previous


@contextlib.contextmanager
def _unguarded() -> Iterator[None]:
    """The emulator's own arithmetic is not a device op of the backend: let it pass the guard."""
    guard = getattr(_guard_state, "guard", None)
    if guard is None:
        yield
        return
    guard.bypass += 1
    try:
        yield
    finally:
        guard.bypass -= 1


# -- formats ---------------------------------------------------------------------------------------
def npu_format_cast(self: torch.Tensor, acl_format: int) -> torch.Tensor:
    """Copy of ``self`` in storage format ``acl_format`` (2 = ND, 29 = FRACTAL_NZ). The logical
    values and shape are unchanged, as on the NPU; the emulator only records the format, which
    :func:`npu_grouped_matmul` checks against what the kernel accepts."""
    _check_cpu(self, "self")
    if acl_format not in (ACL_FORMAT_ND, ACL_FORMAT_FRACTAL_NZ):
        raise NotImplementedError(f"acl_format {acl_format} is not emulated (only ND=2 and FRACTAL_NZ=29)")
    if acl_format == ACL_FORMAT_FRACTAL_NZ and not _soc.emulated().nz_format:
        raise AclnnError("nz_format", f"SoC {_soc.emulated().label} has no FRACTAL_NZ support", api="npu_format_cast")
    with _unguarded():
        out = self.clone(memory_format=torch.contiguous_format)
    setattr(out, _FORMAT_ATTR, acl_format)
    return out


def get_npu_format(self: torch.Tensor) -> int:
    """Storage format of ``self``: 29 after ``npu_format_cast(t, 29)``, else 2 (ND)."""
    return getattr(self, _FORMAT_ATTR, ACL_FORMAT_ND)


# -- the host check ---------------------------------------------------------------------------------
def check_call(call: GmmCall, profile: _soc.SocProfile | None = None) -> str:
    """Apply CANN's host-side rules to ``call``; returns y's dtype name or raises :class:`AclnnError`
    (or ``NotImplementedError`` for a form the emulator does not model)."""
    profile = _soc.profile(call.soc) if profile is None else profile
    if call.group_type not in (-1, 0, 2):
        raise AclnnError("group_type", f"group_type only supports -1, 0 and 2, got {call.group_type}")
    if call.act_type != 0:
        raise AclnnError(
            "act_type",
            f"act_type {call.act_type}: activations are fused only for int8 x and weight, "
            "which the emulator does not model",
        )
    if call.tuning_config is not None and profile.arch35:
        raise AclnnError("tuning_config_950", f"tuning_config is not supported on SoC {profile.label}")
    if call.group_type == -1:
        return _check_no_split(call, profile)
    if call.group_list is None:
        raise AclnnError(
            "group_list_tensor",
            f"group_list is required when group_type is {call.group_type}",
            code=ACLNN_ERR_PARAM_NULLPTR,
        )
    if len(call.x) != 1 or len(call.weight) != 1:
        raise NotImplementedError(
            "the emulator models group_type 0 and 2 with a single x and a single weight; "
            f"got {len(call.x)} x and {len(call.weight)} weight tensors"
        )
    if call.group_type == 0:
        return _check_split_m(call, profile)
    return _check_split_k(call, profile)


def _check_split_m(call: GmmCall, profile: _soc.SocProfile) -> str:
    x, w = call.x[0], call.weight[0]
    if w.dim == 3 and call.split_item not in (2, 3):
        raise AclnnError("split_item_single_weight", f"split_item {call.split_item} with a single 3-D weight")
    if call.split_item not in (2, 3):
        raise NotImplementedError("the emulator models group_type 0 with one 3-D weight only")
    if x.dim != 2 or w.dim != 3:
        raise AclnnError(
            "dims",
            f"group_type 0 needs x 2-D and the single weight 3-D, got x {list(x.shape)} and weight {list(w.shape)}",
        )
    if _special_transposed(x):
        raise AclnnError(
            "x_not_transposed",
            f"x (shape {list(x.shape)}, strides {list(x.stride)}) is transposed by "
            "CANN's stride rule; x must not be transposed for group_type 0",
        )
    transposed_w = is_transposed(w)
    if x.shape[1] != w.shape[1]:
        raise AclnnError(
            "k_match", f"k dim value of x and weight is not matched: x {list(x.shape)}, weight {list(w.shape)}"
        )
    _check_inner(x.shape[1], "x (K)")
    if not transposed_w:
        _check_inner(w.shape[2], "weight (N)")
    _check_group_list(call, groups=w.shape[0])
    _check_group_list_type(call, profile, quantized=x.dtype in _FP8)
    return _check_dtypes(call, profile, transposed_x=False, transposed_w=transposed_w)


def _check_split_k(call: GmmCall, profile: _soc.SocProfile) -> str:
    x, w = call.x[0], call.weight[0]
    if call.split_item not in (2, 3):
        raise AclnnError("split_item_split_k", f"split_item {call.split_item} with group_type 2")
    if x.dim != 2 or w.dim != 2:
        raise AclnnError(
            "dims", f"group_type 2 needs 2-D x [M, K] and weight [K, N], got {list(x.shape)} and {list(w.shape)}"
        )
    if not is_transposed(x):
        raise AclnnError(
            "split_k_transposes",
            f"x (shape {list(x.shape)}, strides {list(x.stride)}) must be "
            "transposed (a [M, K] view of a row-major [K, M] tensor) for group_type 2",
        )
    if _special_transposed(w):
        raise AclnnError(
            "split_k_transposes",
            f"weight (shape {list(w.shape)}, strides {list(w.stride)}) must not be transposed for group_type 2",
        )
    if x.shape[1] != w.shape[0]:
        raise AclnnError(
            "k_match", f"k dim value of x and weight is not matched: x {list(x.shape)}, weight {list(w.shape)}"
        )
    _check_inner(x.shape[0], "x (M, transposed)")
    _check_inner(w.shape[1], "weight (N)")
    _check_group_list(call, groups=None)
    _check_group_list_type(call, profile, quantized=False)
    if call.scale is not None or call.per_token_scale is not None or x.dtype in _FP8:
        raise NotImplementedError("quantized group_type 2 (950 full quantization along K) is not emulated")
    return _check_dtypes(call, profile, transposed_x=True, transposed_w=False)


def _check_no_split(call: GmmCall, profile: _soc.SocProfile) -> str:
    if call.split_item not in (0, 1):
        raise AclnnError("split_item_no_split", f"split_item {call.split_item} with group_type -1")
    if call.group_list is not None:
        raise AclnnError("group_list_tensor", "group_list must be None when group_type is -1")
    if len(call.x) != len(call.weight) or len(call.weight) > MAX_GROUPS:
        raise AclnnError(
            "dims",
            f"group_type -1 needs as many x as weight tensors (at most {MAX_GROUPS}), got "
            f"{len(call.x)} and {len(call.weight)}",
        )
    if call.scale is not None or call.per_token_scale is not None:
        raise NotImplementedError("quantized group_type -1 is not emulated")
    out = None
    for i, (x, w) in enumerate(zip(call.x, call.weight)):
        if x.dim != 2 or w.dim != 2:
            raise NotImplementedError("the emulator models group_type -1 with 2-D x and weight tensors")
        if _special_transposed(x):
            raise AclnnError("x_not_transposed", f"x[{i}] must not be transposed")
        if x.shape[1] != w.shape[0]:
            raise AclnnError("k_match", f"x[{i}] {list(x.shape)} and weight[{i}] {list(w.shape)}")
        _check_inner(x.shape[1], f"x[{i}] (K)")
        if not is_transposed(w):
            _check_inner(w.shape[1], f"weight[{i}] (N)")
        one = GmmCall(call.soc, (x,), (w,), None, None, None, call.split_item, -1, 0, 0, None, call.output_dtype)
        out = _check_dtypes(one, profile, transposed_x=False, transposed_w=is_transposed(w), single=False)
    return out


def _check_inner(value: int, name: str) -> None:
    if value > MAX_INNER_AXIS:
        raise AclnnError("inner_axis", f"the inner axis of {name} is {value}; it must be at most {MAX_INNER_AXIS}")


def _check_group_list(call: GmmCall, groups: int | None) -> None:
    gl = call.group_list
    if gl.dtype != "int64":
        raise AclnnError("group_list_tensor", f"group_list dtype must be INT64, got {gl.dtype}")
    expected_dims = 2 if call.group_list_type == 2 else 1
    if gl.dim != expected_dims or (expected_dims == 2 and gl.shape[1] != 2):
        raise AclnnError(
            "group_list_tensor",
            f"group_list must be {'[E, 2]' if expected_dims == 2 else '1-D'} for "
            f"group_list_type {call.group_list_type}, got shape {list(gl.shape)}",
        )
    length = gl.shape[0]
    if length > MAX_GROUPS:
        raise AclnnError("group_list_tensor", f"group_list has {length} entries, more than {MAX_GROUPS}")
    if groups is not None and groups > 1 and length != groups:
        raise AclnnError("group_list_tensor", f"group_list has {length} entries; the weight holds {groups} groups")


def _check_group_list_type(call: GmmCall, profile: _soc.SocProfile, quantized: bool) -> None:
    glt = call.group_list_type
    if glt in (0, 1):
        if glt == 1 and call.group_list.shape[0] == 1 and not profile.arch35:
            raise AclnnError(
                "group_list_len1_a2a3", f"a one-entry counts list (group_list_type 1) on SoC {profile.label}"
            )
        return
    if glt != 2:
        raise AclnnError("group_list_type", f"group_list_type must be 0, 1 or 2, got {glt}")
    if call.group_type != 0 or not quantized or not profile.arch35:
        raise AclnnError(
            "group_list_type",
            "group_list_type 2 needs group_type 0 and quantized x and weight "
            f"(int8 on A2/A3, full quantization on the 950); got group_type {call.group_type}, "
            f"x {call.x[0].dtype} on SoC {profile.label}",
        )


def _check_dtypes(
    call: GmmCall, profile: _soc.SocProfile, *, transposed_x: bool, transposed_w: bool, single: bool = True
) -> str:
    x, w = call.x[0], call.weight[0]
    if x.dtype != w.dtype:
        raise AclnnError(
            "dtype_a2a3" if not profile.arch35 else "output_dtype_nonquant",
            f"x dtype {x.dtype} and weight dtype {w.dtype} must be the same for this scenario",
        )
    if x.dtype in _FLOATS:
        if call.scale is not None or call.per_token_scale is not None:
            raise AclnnError("output_dtype_nonquant", f"scale / per_token_scale must be None for {x.dtype} x")
        if call.output_dtype is not None and call.output_dtype != x.dtype:
            raise AclnnError(
                "output_dtype_nonquant",
                f"output_dtype must be None or {x.dtype} for non-quantized {x.dtype} x, got {call.output_dtype}",
            )
        if x.dtype == "float32" and not profile.arch35 and (not single or w.npu_format != ACL_FORMAT_ND):
            raise AclnnError(
                "dtype_a2a3",
                f"float32 x and weight need single x, weight and y tensors and ND weights on SoC {profile.label}",
            )
        if w.npu_format == ACL_FORMAT_FRACTAL_NZ:
            _check_nz(w, profile, transposed_w)
        return x.dtype
    if x.dtype in _FP8:
        if not profile.native_fp8:
            raise AclnnError(
                "dtype_a2a3",
                f"x dtype {x.dtype.upper()} on SoC {profile.label}: the A2/A3 dtype table has no FLOAT8 operand",
            )
        return _check_gb(call, transposed_x, transposed_w)
    raise NotImplementedError(
        f"x dtype {x.dtype} is not emulated (the emulator models fp16, bf16, fp32 and fp8 e4m3 in G-B mode)"
    )


def _check_nz(w: TensorSpec, profile: _soc.SocProfile, transposed: bool) -> None:
    if w.dtype == "float32":
        raise AclnnError("nz_format", "a FRACTAL_NZ weight is not supported for float32")
    if transposed or w.dim != 3:
        raise AclnnError("nz_format", "a FRACTAL_NZ weight must be a 3-D [E, K, N] tensor, not a transposed view")
    if min(w.shape[-2:]) <= 1:
        raise AclnnError(
            "nz_k_n_one", f"FRACTAL_NZ weight with [K, N] = {list(w.shape[-2:])}", api="aclnnGroupedMatmulWeightNz"
        )
    if profile.arch35:
        itemsize = torch.empty((), dtype=getattr(torch, w.dtype)).element_size()
        k, n = w.shape[-2:]
        if (k * itemsize) % 32 or (n * itemsize) % 32:
            raise AclnnError(
                "nz_align_950",
                f"FRACTAL_NZ weight [K, N] = [{k}, {n}] of {w.dtype}: K and N must be 32-byte aligned on the 950",
                api="aclnnGroupedMatmulWeightNz",
            )


def _check_gb(call: GmmCall, transposed_x: bool, transposed_w: bool) -> str:
    x, w = call.x[0], call.weight[0]
    if w.npu_format != ACL_FORMAT_ND:
        raise AclnnError("gb_scales", "fp8 weights must be ND in G-B mode")
    if call.scale is None or call.per_token_scale is None or len(call.scale) != 1 or len(call.per_token_scale) != 1:
        raise AclnnError("gb_scales", "fp8 x and weight need one scale and one per_token_scale tensor (G-B mode)")
    if call.output_dtype not in _FP8_OUT:
        raise AclnnError(
            "gb_scales", f"output_dtype must be bfloat16, float16 or float32 for fp8 x, got {call.output_dtype}"
        )
    m, k = x.shape
    e, _, n = w.shape
    if k <= 0 or n <= 0:
        raise AclnnError("gb_k_positive", f"fp8 with K = {k}, N = {n}")
    kb, nb = math.ceil(k / GB_BLOCK), math.ceil(n / GB_BLOCK)
    s, p = call.scale[0], call.per_token_scale[0]
    if s.dtype != "float32" or p.dtype != "float32":
        raise AclnnError("gb_scales", f"G-B scales must be float32, got scale {s.dtype} and per_token_scale {p.dtype}")
    if tuple(s.shape) != (e, kb, nb):
        raise AclnnError(
            "gb_scales", f"scale shape must be (g, ceil(K/128), ceil(N/128)) = {(e, kb, nb)}, got {tuple(s.shape)}"
        )
    if tuple(p.shape) != (m, kb):
        raise AclnnError(
            "gb_scales", f"per_token_scale shape must be (M, ceil(K/128)) = {(m, kb)}, got {tuple(p.shape)}"
        )
    if is_transposed(s) != transposed_w and not _last_two_are_one(s):
        raise AclnnError(
            "gb_transpose",
            f"scale strides {list(s.stride)} read as transposed={is_transposed(s)}, "
            f"weight strides {list(w.stride)} as transposed={transposed_w}",
        )
    if is_transposed(p) != transposed_x and not _last_two_are_one(p):
        raise AclnnError(
            "gb_transpose",
            f"per_token_scale strides {list(p.stride)} read as "
            f"transposed={is_transposed(p)}, x as transposed={transposed_x}",
        )
    return call.output_dtype


# -- group lists ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GroupRange:
    """One group as the kernel walks it: ``weight[expert]`` applies to ``count`` rows (or K
    columns for group_type 2) starting at ``start``."""

    expert: int
    start: int
    count: int


def decode_group_list(values: list, group_list_type: int, num_experts: int, limit: int) -> list[GroupRange] | None:
    """The back-to-back ranges the group list's *values* describe, or None when the kernel's
    behaviour on them is undefined (the host never looks at them: rule ``group_list_values``)."""
    ranges: list[GroupRange] = []
    row = 0
    if group_list_type == 0:
        for e, end in enumerate(values):
            if end < row:
                return None
            ranges.append(GroupRange(e, row, end - row))
            row = end
    elif group_list_type == 1:
        for e, count in enumerate(values):
            if count < 0:
                return None
            ranges.append(GroupRange(e, row, count))
            row += count
    else:
        seen_zero = False
        for e, count in values:
            if not 0 <= e < num_experts or count < 0 or (count and seen_zero):
                return None
            seen_zero = seen_zero or count == 0
            ranges.append(GroupRange(e, row, count))
            row += count
    return ranges if row <= limit else None


# -- the operator ----------------------------------------------------------------------------------
def npu_grouped_matmul(
    x: Sequence[torch.Tensor],
    weight: Sequence[torch.Tensor],
    *,
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
    per_token_scale_dtype: Any = None,
) -> list[torch.Tensor]:
    """Emulation of ``torch_npu.npu_grouped_matmul`` (Tensor ``group_list`` overload); returns a
    list of tensors like the real operator (one tensor for ``split_item`` 2/3)."""
    _not_emulated(
        bias=bias,
        offset=offset,
        antiquant_scale=antiquant_scale,
        antiquant_offset=antiquant_offset,
        activation_input=activation_input,
        activation_quant_scale=activation_quant_scale,
        activation_quant_offset=activation_quant_offset,
        x_dtype=x_dtype,
        weight_dtype=weight_dtype,
        scale_dtype=scale_dtype,
        per_token_scale_dtype=per_token_scale_dtype,
    )
    if isinstance(group_list, (list, tuple)):
        raise NotImplementedError(
            "the emulator implements the Tensor group_list overload; "
            "npu_grouped_matmul.List (a Python-list group_list) is not emulated"
        )
    profile = _soc.emulated()
    xs, ws = _tensors(x, "x"), _tensors(weight, "weight")
    scales = None if scale is None else _tensors(scale, "scale")
    pts = None if per_token_scale is None else _tensors(per_token_scale, "per_token_scale")
    if group_list is not None:
        _check_cpu(group_list, "group_list")
    call = GmmCall(
        soc=profile.soc,
        x=tuple(map(TensorSpec.of, xs)),
        weight=tuple(map(TensorSpec.of, ws)),
        scale=None if scales is None else tuple(map(TensorSpec.of, scales)),
        per_token_scale=None if pts is None else tuple(map(TensorSpec.of, pts)),
        group_list=None if group_list is None else TensorSpec.of(group_list),
        split_item=0 if split_item is None else int(split_item),
        group_type=group_type,
        group_list_type=0 if group_list_type is None else int(group_list_type),
        act_type=0 if act_type is None else int(act_type),
        tuning_config=None if tuning_config is None else tuple(int(v) for v in tuning_config),
        output_dtype=None if output_dtype is None else str(output_dtype).removeprefix("torch."),
    )
    try:
        out_name = check_call(call, profile)
    except AclnnError as exc:
        _record(call, exc)
        raise
    _record(call, None)
    out_dtype = getattr(torch, out_name)
    with _unguarded():
        if call.group_type == -1:
            return _independent(xs, ws, out_dtype)
        values = group_list.tolist()
        if call.group_type == 0:
            return [_split_m(xs[0], ws[0], scales, pts, values, call.group_list_type, out_dtype)]
        return [_split_k(xs[0], ws[0], values, call.group_list_type, out_dtype)]


def _split_m(x, w, scales, pts, values, group_list_type, out_dtype) -> torch.Tensor:
    """group_type 0: ``y [M, N]``, row range r multiplied by ``w[expert_r]``."""
    m, e, n = x.shape[0], w.shape[0], w.shape[2]
    y = _poisoned((m, n), out_dtype)
    ranges = decode_group_list(values, group_list_type, e, m)
    for r in ranges or ():
        if r.count:
            rows = slice(r.start, r.start + r.count)
            y[rows] = _product(x[rows], w[r.expert], scales, pts, r.expert, rows, out_dtype)
    return y


def _split_k(x, w, values, group_list_type, out_dtype) -> torch.Tensor:
    """group_type 2: ``y [G, M, N]``, group g multiplies its K range of x's columns / w's rows."""
    groups, (m, k), n = len(values), x.shape, w.shape[1]
    y = _poisoned((groups, m, n), out_dtype)
    ranges = decode_group_list(values, group_list_type, groups, k)
    for r in ranges or ():
        if r.count:
            cols = slice(r.start, r.start + r.count)
            y[r.expert] = (x[:, cols].float() @ w[cols].float()).to(out_dtype)
    return y


def _independent(xs, ws, out_dtype) -> list[torch.Tensor]:
    """group_type -1: ``y[i] = x[i] @ weight[i]``."""
    return [(x.float() @ w.float()).to(out_dtype) for x, w in zip(xs, ws)]


# -- arithmetic --------------------------------------------------------------------------------------
def _product(
    xr: torch.Tensor, w: torch.Tensor, scales, pts, expert: int, rows: slice, out_dtype: torch.dtype
) -> torch.Tensor:
    """One group: ``xr [m, K] @ w [K, N]`` with fp32 accumulation, rounded once to ``out_dtype``."""
    if scales is None:
        return (xr.float() @ w.float()).to(out_dtype)
    xs = pts[0][rows].float()  # [m, ceil(K/128)]
    ws = scales[0][expert].float()  # [ceil(K/128), ceil(N/128)]
    m, k = xr.shape
    n = w.shape[1]
    kb = xs.shape[1]
    pad = kb * GB_BLOCK - k
    xf = torch.nn.functional.pad(xr.float(), (0, pad)).view(m, kb, GB_BLOCK)
    wf = torch.nn.functional.pad(w.float(), (0, 0, 0, pad)).view(kb, GB_BLOCK, n)
    partial = torch.einsum("mjk,jkn->jmn", xf, wf)  # fp32 per K block
    ws_n = ws.repeat_interleave(GB_BLOCK, dim=1)[:, :n]  # [kb, N]
    acc = (partial * xs.t()[:, :, None] * ws_n[:, None, :]).sum(0)  # fp32 accumulation
    return acc.to(out_dtype)


def _poisoned(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A fresh output whose never-written elements read as NaN (the NPU leaves garbage there)."""
    return torch.full(shape, float("nan"), dtype=dtype)


def _tensors(value, name: str) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor) or not isinstance(value, (list, tuple)):
        raise TypeError(
            f"npu_grouped_matmul(): argument '{name}' must be a list of tensors, not {type(value).__name__}"
        )
    if not value:
        raise AclnnError("dims", f"{name} must not be an empty tensor list")
    for i, t in enumerate(value):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"npu_grouped_matmul(): {name}[{i}] must be a tensor, not {type(t).__name__}")
        _check_cpu(t, f"{name}[{i}]")
    return list(value)


def _check_cpu(t: torch.Tensor, name: str) -> None:
    if t.device.type != "cpu":
        raise RuntimeError(f"the torch_npu emulator runs on CPU tensors; {name} is on {t.device}")


def _not_emulated(**arguments: Any) -> None:
    given = sorted(name for name, value in arguments.items() if value is not None)
    if given:
        raise NotImplementedError(f"npu_grouped_matmul arguments not emulated: {', '.join(given)}")
