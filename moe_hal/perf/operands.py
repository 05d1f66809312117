"""Operand sizes for the performance model: the dtype names it knows, bytes per element with
block scales, and the output dtype assumed when none is given."""

from __future__ import annotations

from types import MappingProxyType
from typing import Mapping

from ..errors import DTypeError

#: Bytes per element of each dtype the model knows.
BYTES_PER_ELEMENT: Mapping[str, float] = MappingProxyType(
    {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1, "fp4": 0.5}
)

#: Extra bytes per element for the scales of block-scaled dtypes, as ``(activations, weights)``.
#: fp8: DeepGEMM-style fp32 scales per 1x128 activation block and per 128x128 weight block.
#: fp4: one 1-byte scale per 16 elements (NVFP4-style) on both operands.
SCALE_BYTES: Mapping[str, tuple[float, float]] = MappingProxyType(
    {"fp8": (4 / 128, 4 / (128 * 128)), "fp4": (1 / 16, 1 / 16)}
)

_DTYPE_ALIASES = {
    "fp8_e4m3": "fp8",
    "float8_e4m3fn": "fp8",
    "e4m3": "fp8",
    "float32": "fp32",
    "float": "fp32",
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
}


def dtype_name(dtype: str) -> str:
    """Model dtype name (``fp32 tf32 bf16 fp16 fp8 int8 fp4``) for a name or alias such as
    ``fp8_e4m3`` or ``bfloat16``; raises :class:`~moe_hal.errors.DTypeError` otherwise."""
    if not isinstance(dtype, str):
        raise DTypeError("dtype", f"one of {sorted(BYTES_PER_ELEMENT)}", dtype)
    key = dtype.strip().lower().removeprefix("torch.")
    key = _DTYPE_ALIASES.get(key, key)
    if key not in BYTES_PER_ELEMENT:
        raise DTypeError("dtype", f"one of {sorted(BYTES_PER_ELEMENT)} (or an alias like fp8_e4m3)", dtype)
    return key


def operand_bytes(dtype: str) -> tuple[float, float]:
    """Bytes per element ``(e_a, e_b)`` of activations and weights, scale bytes included."""
    name = dtype_name(dtype)
    sa, sb = SCALE_BYTES.get(name, (0.0, 0.0))
    return BYTES_PER_ELEMENT[name] + sa, BYTES_PER_ELEMENT[name] + sb


def default_out_dtype(dtype: str, op: str = "contiguous") -> str:
    """Output dtype assumed when none is given: fp32 for K-grouped (weight-gradient
    accumulation), bf16 for 8- and 4-bit inputs, the input dtype otherwise."""
    name = dtype_name(dtype)
    if op == "k_grouped":
        return "fp32"
    return "bf16" if BYTES_PER_ELEMENT[name] < 2 else name
