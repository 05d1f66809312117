"""Block-scaled FP8 operands: the :class:`QuantizedTensor` value type.

The API carries quantized operands with **logical** fp32 scales in natural row-major shape: one
scale per ``block`` of the last two dimensions of ``data``. Backends convert those to the physical
layout their hardware needs (see the scale-layout functions in this module).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import dtypes
from .errors import DeviceError, DTypeError, ShapeError

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


__all__ = ["QuantizedTensor", "SCALE_FORMATS", "is_quantized", "operand_dtype_name"]
