"""Block-scaled FP8 operands: the :class:`QuantizedTensor` value type.

The API carries quantized operands with **logical** fp32 scales in natural row-major shape: one
scale per ``block`` of the last two dimensions of ``data``. Backends convert those to the physical
layout their hardware needs (see the scale-layout functions in this module).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import dtypes
from .errors import ArgumentError, DeviceError, DTypeError, ShapeError

#: Scale formats at the API level. ``fp32``: any positive fp32 scale. ``ue8m0``: every scale is an
#: exact power of two, so it packs losslessly into an 8-bit exponent (SM100, Ascend 950).
SCALE_FORMATS = ("fp32", "ue8m0")


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True, eq=False)
class QuantizedTensor:
    """An fp8 e4m3 tensor with block scales.

    ``data``: ``float8_e4m3fn`` of any rank >= 2 (strides are free: a transposed view is fine).
    ``scale``: ``float32`` of shape ``data.shape[:-2] + (ceil(R / block[0]), ceil(C / block[1]))``
    where ``(R, C) = data.shape[-2:]``; the logical value is ``data * scale`` broadcast per block.
    ``block``: ``(rows, cols)`` covered by one scale, e.g. ``(1, 128)`` for activations,
    ``(128, 128)`` for weights, ``(128, 1)`` for K-grouped operands blocked along the token axis.
    ``scale_format``: ``"fp32"`` or ``"ue8m0"`` (all scales are powers of two).
    """

    data: torch.Tensor
    scale: torch.Tensor
    block: tuple[int, int]
    scale_format: str = "fp32"

    def __post_init__(self) -> None:
        if not isinstance(self.data, torch.Tensor) or self.data.dtype != torch.float8_e4m3fn:
            got = self.data.dtype if isinstance(self.data, torch.Tensor) else type(self.data).__name__
            raise DTypeError("QuantizedTensor.data", "torch.float8_e4m3fn", got)
        if not isinstance(self.scale, torch.Tensor) or self.scale.dtype != torch.float32:
            got = self.scale.dtype if isinstance(self.scale, torch.Tensor) else type(self.scale).__name__
            raise DTypeError("QuantizedTensor.scale", "torch.float32", got)
        if self.data.dim() < 2:
            raise ShapeError("QuantizedTensor.data", "a tensor of rank >= 2", tuple(self.data.shape))
        block = tuple(int(x) for x in self.block)
        if len(block) != 2 or min(block) < 1:
            raise ShapeError("QuantizedTensor.block", "two positive ints (rows, cols)", self.block)
        object.__setattr__(self, "block", block)
        if self.scale_format not in SCALE_FORMATS:
            raise ShapeError("QuantizedTensor.scale_format", f"one of {SCALE_FORMATS}", self.scale_format)
        expected = self.scale_shape(tuple(self.data.shape), block)
        if tuple(self.scale.shape) != expected:
            raise ShapeError("QuantizedTensor.scale", f"shape {expected} for data {tuple(self.data.shape)} "
                             f"and block {block}", tuple(self.scale.shape))
        if self.scale.device != self.data.device:
            raise DeviceError("QuantizedTensor.scale", f"device {self.data.device} (that of data)",
                              self.scale.device)

    @staticmethod
    def scale_shape(data_shape: tuple[int, ...], block: tuple[int, int]) -> tuple[int, ...]:
        """Logical scale shape for ``data_shape`` blocked by ``block`` over its last two dims."""
        *lead, rows, cols = data_shape
        return (*lead, _ceil_div(rows, block[0]), _ceil_div(cols, block[1]))

    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    @property
    def dtype(self) -> torch.dtype:
        return self.data.dtype

    @property
    def device(self) -> torch.device:
        return self.data.device

    def dim(self) -> int:
        return self.data.dim()

    def expanded_scale(self) -> torch.Tensor:
        """Scales broadcast to ``data.shape`` (fp32), one value per element."""
        rows, cols = self.data.shape[-2:]
        s = self.scale.repeat_interleave(self.block[0], dim=-2)[..., :rows, :]
        return s.repeat_interleave(self.block[1], dim=-1)[..., :cols]

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """``data * scale`` per block, computed in float32 (float64 if asked) and cast to ``dtype``."""
        work = torch.float64 if dtype == torch.float64 else torch.float32
        return (self.data.to(work) * self.expanded_scale().to(work)).to(dtype)


def is_quantized(x: object) -> bool:
    """True for a :class:`QuantizedTensor`."""
    return isinstance(x, QuantizedTensor)


def operand_dtype_name(x: torch.Tensor | QuantizedTensor) -> str:
    """Canonical dtype name of an operand (``fp8_e4m3`` for quantized ones)."""
    return dtypes.name_of(x.dtype)


# -- quantization ------------------------------------------------------------------------------

#: Floor applied to a block's amax before dividing by 448 (DeepGEMM's value): an all-zero block gets
#: scale ``1e-4 / 448`` instead of 0, so dequantization never divides by zero and a later
#: ``ceil_to_ue8m0`` sees a normal positive number.
AMAX_FLOOR = 1e-4

_QUANTIZABLE = (torch.float32, torch.bfloat16, torch.float16)


def _check_block(block: object) -> tuple[int, int]:
    try:
        rows, cols = (int(b) for b in block)  # type: ignore[union-attr]
    except (TypeError, ValueError):
        raise ShapeError("block", "two positive ints (rows, cols)", block) from None
    if rows < 1 or cols < 1 or any(isinstance(b, bool) for b in block):  # type: ignore[union-attr]
        raise ShapeError("block", "two positive ints (rows, cols)", block)
    return rows, cols


def quantize_fp8(x: torch.Tensor, block: tuple[int, int] = (1, 128), ue8m0: bool = False) -> QuantizedTensor:
    """Block-scaled fp8 e4m3 quantization of ``x`` over its last two dimensions.

    ``x``: float32 / bfloat16 / float16 of rank >= 2, any strides, any device.
    ``block``: ``(rows, cols)`` covered by one scale: ``(1, 128)`` per-token groups for activations
    ``[M, K]``, ``(128, 128)`` for weights ``[G, N, K]`` (blocks never straddle experts: leading
    dimensions are independent), ``(128, 1)`` for K-grouped operands blocked along the token axis.

    Per block: ``scale = max(amax, 1e-4) / 448`` (:data:`AMAX_FLOOR`, DeepGEMM's floor; an all-zero
    block gets ``1e-4 / 448``), rounded up to a power of two when ``ue8m0`` (:func:`ceil_to_ue8m0`;
    then ``scale_format == "ue8m0"``), and ``data = fp8(x / scale)`` (round to nearest even,
    clamped to +-448). Edge blocks (a dimension not a multiple of the block) are partial: they are
    computed as if ``x`` were zero-padded up to the next multiple, and the padding is not stored,
    so ``data.shape == x.shape`` and ``scale.shape == (..., ceil(R / rows), ceil(C / cols))``.
    Non-finite inputs are not checked (that would cost a host sync); they give NaN in their block.

    Returns a :class:`QuantizedTensor` with contiguous ``data`` and fp32 ``scale``.
    """
    if not isinstance(x, torch.Tensor):
        raise DTypeError("x", "a float32/bfloat16/float16 tensor", type(x).__name__)
    if x.dtype not in _QUANTIZABLE:
        raise DTypeError("x", "torch.float32, torch.bfloat16 or torch.float16", x.dtype)
    if x.dim() < 2:
        raise ShapeError("x", "a tensor of rank >= 2", tuple(x.shape))
    br, bc = _check_block(block)
    *lead, rows, cols = x.shape
    sr, sc = _ceil_div(rows, br), _ceil_div(cols, bc)
    work = x.to(torch.float32)
    pad_r, pad_c = sr * br - rows, sc * bc - cols
    if pad_r or pad_c:
        work = torch.nn.functional.pad(work, (0, pad_c, 0, pad_r))
    blocks = work.reshape(*lead, sr, br, sc, bc)
    amax = blocks.abs().amax(dim=(-3, -1))
    scale = amax.clamp(min=AMAX_FLOOR) / dtypes.FP8_E4M3_MAX
    if ue8m0:
        scale = ceil_to_ue8m0(scale)
    q = (blocks / scale[..., :, None, :, None]).clamp_(-dtypes.FP8_E4M3_MAX, dtypes.FP8_E4M3_MAX)
    data = q.reshape(*lead, sr * br, sc * bc)[..., :rows, :cols].to(torch.float8_e4m3fn).contiguous()
    return QuantizedTensor(data, scale.contiguous(), (br, bc), "ue8m0" if ue8m0 else "fp32")


def dequantize(q: QuantizedTensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``q.data * q.scale`` per block, cast to ``dtype`` (same math as :meth:`QuantizedTensor.dequantize`)."""
    if not isinstance(q, QuantizedTensor):
        raise DTypeError("q", "a moe_hal.QuantizedTensor", type(q).__name__)
    return q.dequantize(dtype)


_EXP_MASK, _MANT_MASK = 0xFF, 0x7FFFFF


def _check_fp32(scale: object, argument: str = "scale") -> torch.Tensor:
    if not isinstance(scale, torch.Tensor):
        raise DTypeError(argument, "a torch.float32 tensor", type(scale).__name__)
    if scale.dtype != torch.float32:
        raise DTypeError(argument, "torch.float32", scale.dtype)
    return scale


def ceil_to_ue8m0(scale: torch.Tensor) -> torch.Tensor:
    """Round fp32 scales **up** to powers of two, so that they pack losslessly into UE8M0.

    Returns a new fp32 tensor of the shape of ``scale``: ``2 ** e`` with ``e`` the biased exponent of
    ``scale`` plus one if its mantissa is non-zero, clamped to ``[1, 254]`` like DeepGEMM — results
    lie in ``[2**-126, 2**127]``. For positive finite inputs in that range the result is the smallest
    power of two ``>= scale``; zero and subnormals give ``2**-126``, the sign is ignored, values
    above ``2**127`` (inf, NaN included) give ``2**127``. Rounding up keeps ``|x / scale| <= 448``.
    """
    bits = _check_fp32(scale).contiguous().view(torch.int32)
    exponent = (bits >> 23) & _EXP_MASK
    exponent = exponent + ((bits & _MANT_MASK) != 0).to(torch.int32)
    return (exponent.clamp(1, 254) << 23).view(torch.float32)


__all__ = ["AMAX_FLOOR", "QuantizedTensor", "SCALE_FORMATS", "ceil_to_ue8m0", "dequantize", "is_quantized",
           "operand_dtype_name", "quantize_fp8"]
