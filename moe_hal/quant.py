"""Block-scaled FP8 operands: the :class:`QuantizedTensor` value type.

The API carries quantized operands with **logical** fp32 scales in natural row-major shape: one
scale per ``block`` of the last two dimensions of ``data``. Backends convert those to the physical
layout their hardware needs (see the scale-layout functions in this module).
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass

import torch

from . import dtypes
from .errors import DeviceError, DTypeError, ScaleFormatError, ShapeError

#: Scale formats at the API level. ``fp32``: any positive fp32 scale. ``ue8m0``: every scale is an
#: exact power of two, so it packs losslessly into an 8-bit exponent (SM100, Ascend 950).
SCALE_FORMATS = dtypes.SCALE_FORMATS


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


RowGroups = tuple[tuple[int, int], ...]


def _check_row_groups(
    row_groups: object, data: torch.Tensor, argument: str = "QuantizedTensor.row_groups"
) -> RowGroups:
    """Checked ``((start, end), ...)``: sorted, disjoint ranges inside the rows of 2-D ``data``."""
    if data.dim() != 2:
        raise ShapeError(argument, "None for data of rank > 2 (row groups apply to 2-D data)", tuple(data.shape))
    rows = data.shape[0]
    try:
        groups = tuple((s, e) for s, e in row_groups)  # type: ignore[union-attr]
    except (TypeError, ValueError):
        raise ShapeError(argument, "a sequence of (start, end) int pairs", row_groups) from None
    previous_end = 0
    for i, (start, end) in enumerate(groups):
        ints = all(isinstance(v, int) and not isinstance(v, bool) for v in (start, end))
        if not ints or not previous_end <= start <= end <= rows:
            raise ShapeError(
                f"{argument}[{i}]",
                f"ints {previous_end} <= start <= end <= {rows} (sorted, disjoint ranges inside the rows of data)",
                (start, end),
            )
        previous_end = end
    return groups


@dataclass(frozen=True, eq=False)
class QuantizedTensor:
    """An fp8 e4m3 tensor with block scales.

    ``data``: ``float8_e4m3fn`` of any rank >= 2 (strides are free: a transposed view is fine).
    ``scale``: ``float32`` of shape ``data.shape[:-2] + (ceil(R / block[0]), ceil(C / block[1]))``
    where ``(R, C) = data.shape[-2:]``; the logical value is ``data * scale`` broadcast per block.
    ``block``: ``(rows, cols)`` covered by one scale, e.g. ``(1, 128)`` for activations,
    ``(128, 128)`` for weights, ``(128, 1)`` for K-grouped operands blocked along the token axis.
    ``scale_format``: ``"fp32"`` or ``"ue8m0"`` (all scales are powers of two).

    ``row_groups``: where row blocks start (the *block origin*; 2-D ``data`` only).

    * ``None`` (default): blocks of ``block[0]`` rows counted from row 0 of ``data``.
    * ``((start, end), ...)``: the rows are in groups (sorted, disjoint ``[start, end)`` ranges)
      and row blocks restart at each group's start, DeepGEMM's K-grouped scale layout: group ``i``
      has ``ceil((end - start) / block[0])`` scale rows, stored one group after another, so
      ``scale.shape[-2] == sum(ceil((end - start) / block[0]))``. Rows outside every group have no
      scale (their values are 0). ``((0, R),)`` states the row-0 origin explicitly.

    A K-grouped call checks the origin against its layout: per-group blocks must name exactly the
    layout's groups, and scales that fit both origins with different meanings must say which they
    use (see :func:`to_group_origin`, :func:`to_tensor_origin` to convert).
    """

    data: torch.Tensor
    scale: torch.Tensor
    block: tuple[int, int]
    scale_format: str = "fp32"
    row_groups: tuple[tuple[int, int], ...] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.data, torch.Tensor) or self.data.dtype != torch.float8_e4m3fn:
            got = self.data.dtype if isinstance(self.data, torch.Tensor) else type(self.data).__name__
            raise DTypeError("QuantizedTensor.data", "torch.float8_e4m3fn", got)
        if not isinstance(self.scale, torch.Tensor) or self.scale.dtype != torch.float32:
            got = self.scale.dtype if isinstance(self.scale, torch.Tensor) else type(self.scale).__name__
            raise DTypeError("QuantizedTensor.scale", "torch.float32", got)
        if self.data.dim() < 2:
            raise ShapeError("QuantizedTensor.data", "a tensor of rank >= 2", tuple(self.data.shape))
        block = _check_block(self.block, "QuantizedTensor.block")
        object.__setattr__(self, "block", block)
        if self.scale_format not in SCALE_FORMATS:
            raise ShapeError("QuantizedTensor.scale_format", f"one of {SCALE_FORMATS}", self.scale_format)
        if self.row_groups is not None:
            object.__setattr__(self, "row_groups", _check_row_groups(self.row_groups, self.data))
        expected = self.scale_shape(tuple(self.data.shape), block, self.row_groups)
        if tuple(self.scale.shape) != expected:
            raise ShapeError(
                "QuantizedTensor.scale",
                f"shape {expected} for data {tuple(self.data.shape)} and block {block}",
                tuple(self.scale.shape),
            )
        if self.scale.device != self.data.device:
            raise DeviceError("QuantizedTensor.scale", f"device {self.data.device} (that of data)", self.scale.device)

    @staticmethod
    def scale_shape(
        data_shape: tuple[int, ...], block: tuple[int, int], row_groups: tuple[tuple[int, int], ...] | None = None
    ) -> tuple[int, ...]:
        """Logical scale shape for ``data_shape`` blocked by ``block`` over its last two dims
        (row blocks restarting at each of ``row_groups`` when given)."""
        *lead, rows, cols = data_shape
        if row_groups is not None:
            return (*lead, sum(_ceil_div(e - s, block[0]) for s, e in row_groups), _ceil_div(cols, block[1]))
        return (*lead, _ceil_div(rows, block[0]), _ceil_div(cols, block[1]))

    def scale_rows(self) -> torch.Tensor:
        """int64 ``[R]`` on the host: the scale row of each data row (-1 outside every row group)."""
        rows = self.data.shape[-2]
        if self.row_groups is None:
            return torch.arange(rows, dtype=torch.int64) // self.block[0]
        index = torch.full((rows,), -1, dtype=torch.int64)
        first = 0
        for start, end in self.row_groups:
            index[start:end] = first + torch.arange(end - start, dtype=torch.int64) // self.block[0]
            first += _ceil_div(end - start, self.block[0])
        return index

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
        """Scales broadcast to ``data.shape`` (fp32), one value per element (0 on rows outside
        every row group)."""
        rows, cols = self.data.shape[-2:]
        if self.row_groups is None:
            s = self.scale.repeat_interleave(self.block[0], dim=-2)[..., :rows, :]
        else:
            index = self.scale_rows().to(self.scale.device)
            padded = torch.cat([self.scale, self.scale.new_zeros(1, self.scale.shape[-1])])
            s = padded.index_select(0, torch.where(index >= 0, index, self.scale.shape[0]))
        return s.repeat_interleave(self.block[1], dim=-1)[..., :cols]

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """``data * scale`` per block, computed in float32 (float64 if asked) and cast to ``dtype``."""
        work = torch.float64 if dtype == torch.float64 else torch.float32
        return (self.data.to(work) * self.expanded_scale().to(work)).to(dtype)


# -- quantization ------------------------------------------------------------------------------

#: Floor applied to a block's amax before dividing by 448 (DeepGEMM's value): an all-zero block gets
#: scale ``1e-4 / 448`` instead of 0, so dequantization never divides by zero and a later
#: ``ceil_to_ue8m0`` sees a normal positive number.
AMAX_FLOOR = 1e-4

_QUANTIZABLE = (torch.float32, torch.bfloat16, torch.float16)
#: Elements per chunk of the CPU quantization loop: the fp32 intermediate stays at 16 MiB (a cache,
#: not main memory, on server CPUs with large last-level caches), and chunks stay few, since every
#: torch op is a parallel region whose cost grows on a busy host.
_CPU_CHUNK_ELEMENTS = 1 << 22


def _check_block(block: object, argument: str = "block") -> tuple[int, int]:
    """``block`` as ``(rows, cols)``: exactly two positive ints (no bools, floats or strings)."""
    valid = (
        isinstance(block, (tuple, list))
        and len(block) == 2
        and all(hasattr(b, "__index__") and not isinstance(b, bool) for b in block)
    )
    if not valid or min(operator.index(b) for b in block) < 1:  # type: ignore[union-attr]
        raise ShapeError(argument, "two positive ints (rows, cols)", repr(block))
    rows, cols = (operator.index(b) for b in block)  # type: ignore[union-attr]
    return rows, cols


#: ``quantize_fp8`` rounding modes: ``"divide"`` computes ``x / scale`` (one correctly rounded fp32
#: division; the default), ``"reciprocal"`` computes ``x * (1 / scale)`` like DeepGEMM's casts
#: (``per_token_cast_to_fp8`` and friends), so fp8 codes are byte-identical with DeepGEMM's.
ROUNDINGS = ("divide", "reciprocal")


def quantize_fp8(
    x: torch.Tensor,
    block: tuple[int, int] = (1, 128),
    ue8m0: bool = False,
    *,
    rounding: str = "divide",
    row_groups: RowGroups | None = None,
) -> QuantizedTensor:
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

    ``rounding`` (keyword): ``"divide"`` (default) stores ``fp8(x / scale)``; ``"reciprocal"``
    stores ``fp8(x * (1 / scale))``, DeepGEMM's formula. The two differ by one fp8 code on rare
    exact ties with fp32 scales (about 0.05% of codes); with ``ue8m0`` scales (powers of two) they
    are identical. Use ``"reciprocal"`` to reproduce DeepGEMM's bytes.

    ``row_groups`` (keyword, 2-D ``x``): quantize each ``[start, end)`` row range on its own, row
    blocks restarting at its start (DeepGEMM's ``k_grouped_per_channel_cast_to_fp8`` with
    ``block=(128, 1)``); rows outside every group are stored as 0 and have no scale. See
    :attr:`QuantizedTensor.row_groups`.

    Returns a :class:`QuantizedTensor` with contiguous ``data`` and fp32 ``scale`` (for 2-D ``x``
    with ``block[0] > 1``, ``row_groups = ((0, R),)``: the row-0 block origin, stated).
    """
    if not isinstance(x, torch.Tensor):
        raise DTypeError("x", "a float32/bfloat16/float16 tensor", type(x).__name__)
    if x.dtype not in _QUANTIZABLE:
        raise DTypeError("x", "torch.float32, torch.bfloat16 or torch.float16", x.dtype)
    if x.dim() < 2:
        raise ShapeError("x", "a tensor of rank >= 2", tuple(x.shape))
    br, bc = _check_block(block)
    if rounding not in ROUNDINGS:
        raise ShapeError("rounding", f"one of {ROUNDINGS}", rounding)
    if row_groups is not None:
        groups = _check_row_groups(row_groups, x, "row_groups")
        data = torch.zeros(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
        scales = [x.new_empty(0, _ceil_div(x.shape[1], bc), dtype=torch.float32)]
        for start, end in groups:
            if end > start:
                part = quantize_fp8(x[start:end], (br, bc), ue8m0, rounding=rounding)
                data[start:end] = part.data
                scales.append(part.scale)
        return QuantizedTensor(data, torch.cat(scales), (br, bc), "ue8m0" if ue8m0 else "fp32", groups)
    *lead, rows, cols = x.shape
    sr, sc = _ceil_div(rows, br), _ceil_div(cols, bc)
    pad_r, pad_c = sr * br - rows, sc * bc - cols
    work = torch.nn.functional.pad(x, (0, pad_c, 0, pad_r)) if pad_r or pad_c else x
    nblock_rows = math.prod(lead) * sr
    block_rows = work.reshape(nblock_rows, br, sc, bc)
    data = torch.empty(work.shape, dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty(*lead, sr, sc, dtype=torch.float32, device=x.device)
    data_rows, scale_rows = data.view(nblock_rows, br, sc, bc), scale.view(nblock_rows, sc)
    # On the CPU, work through chunks so that the fp32 intermediate of x / scale stays small and
    # hot; elsewhere one chunk (a few large kernels).
    on_cpu = x.device.type == "cpu"
    step = max(1, _CPU_CHUNK_ELEMENTS // max(br * sc * bc, 1) if on_cpu else nblock_rows)
    for i in range(0, nblock_rows, step):
        chunk = block_rows[i : i + step]
        # max |x| per block as max(max, -min): no |x| temporary, exact in the input dtype.
        amax = torch.maximum(chunk.amax(dim=(1, 3)), chunk.amin(dim=(1, 3)).neg_()).to(torch.float32)
        chunk_scale = amax.clamp_(min=AMAX_FLOOR) / dtypes.FP8_E4M3_MAX
        if ue8m0:
            chunk_scale = ceil_to_ue8m0(chunk_scale)
        scale_rows[i : i + step] = chunk_scale
        # |x / scale| <= 448 up to one fp32 rounding, which the round-to-nearest fp8 cast maps to
        # 448: no clamp pass is needed.
        quotient = chunk.to(torch.float32, copy=True)
        if rounding == "divide":
            quotient.div_(chunk_scale[:, None, :, None])
        else:
            quotient.mul_(torch.reciprocal(chunk_scale)[:, None, :, None])
        data_rows[i : i + step].copy_(quotient)
    if pad_r or pad_c:
        data = data[..., :rows, :cols].contiguous()
    # Blocks of several rows counted from row 0, stated explicitly: a K-grouped call never has to
    # guess the origin of scales this function made.
    origin = ((0, rows),) if x.dim() == 2 and br > 1 else None
    return QuantizedTensor(data, scale, (br, bc), "ue8m0" if ue8m0 else "fp32", origin)


def dequantize(q: QuantizedTensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``q.data * q.scale`` per block, cast to ``dtype`` (same math as :meth:`QuantizedTensor.dequantize`)."""
    if not isinstance(q, QuantizedTensor):
        raise DTypeError("q", "a moe_hal.QuantizedTensor", type(q).__name__)
    return q.dequantize(dtype)


# -- block origin: row-0 blocks <-> per-group blocks ---------------------------------------------


def to_tensor_origin(q: QuantizedTensor) -> QuantizedTensor:
    """The same values with row blocks counted from row 0 (``row_groups == ((0, R),)``), exactly.

    A per-group operand (``q.row_groups`` with ranges) becomes blocks of ``d`` rows with ``d`` the
    gcd of ``block[0]`` and every non-empty group's start: each such block then lies inside one
    per-group block, so its scale is that block's scale and ``data`` is shared unchanged (no
    rounding). Blocks outside every group get scale 1.0 (their data is 0). With DeepGEMM's usual
    128-aligned group starts and ``gran_k = 128``, ``d = 128``. An operand already counted from
    row 0 is returned as is.
    """
    if not isinstance(q, QuantizedTensor):
        raise DTypeError("q", "a moe_hal.QuantizedTensor", type(q).__name__)
    rows = q.data.shape[-2]
    if q.row_groups is None or q.row_groups == ((0, rows),):
        return q
    step = math.gcd(q.block[0], *(s for s, e in q.row_groups if e > s))
    source = q.scale_rows()[::step]  # per-group scale row of each new block
    padded = torch.cat([q.scale, q.scale.new_ones(1, q.scale.shape[-1])])
    scale = padded.index_select(0, torch.where(source >= 0, source, q.scale.shape[0]).to(q.scale.device))
    return QuantizedTensor(q.data, scale, (step, q.block[1]), q.scale_format, ((0, rows),))


def to_group_origin(
    q: QuantizedTensor, row_groups: RowGroups, block_rows: int | None = None, *, rounding: str = "divide"
) -> QuantizedTensor:
    """The operand with row blocks of ``block_rows`` (default ``q.block[0]``) restarting at each of
    ``row_groups`` (DeepGEMM's K-grouped layout, ``block_rows = gran_k``).

    Exact (data shared, scales gathered) when every new block lies inside one block of ``q``, e.g.
    row-0 blocks of 128 rows and group starts that are multiples of 128. Otherwise the values are
    dequantized and quantized again per group with ``q``'s scale format and ``rounding``: one extra
    fp8 rounding of the rows whose block changes. Rows outside every group become 0.
    """
    if not isinstance(q, QuantizedTensor):
        raise DTypeError("q", "a moe_hal.QuantizedTensor", type(q).__name__)
    groups = _check_row_groups(row_groups, q.data, "row_groups")
    br = q.block[0] if block_rows is None else _check_block((block_rows, 1))[0]
    block = (br, q.block[1])
    q0 = to_tensor_origin(q)
    source = q0.scale_rows()
    picks, exact = [], True
    for start, end in groups:
        for first in range(start, end, br):
            rows = source[first : min(first + br, end)]
            exact = exact and bool((rows == rows[0]).all())
            picks.append(int(rows[0]))
    if exact:
        data = q.data
        outside = torch.ones(q.data.shape[0], dtype=torch.bool)
        for start, end in groups:
            outside[start:end] = False
        if bool(outside.any()):
            data = q.data.clone()
            data.view(torch.uint8)[outside.to(data.device)] = 0
        scale = q0.scale.index_select(0, torch.tensor(picks, dtype=torch.int64, device=q.scale.device))
        return QuantizedTensor(data, scale.reshape(-1, q.scale.shape[-1]), block, q.scale_format, groups)
    return quantize_fp8(q0.dequantize(), block, q.scale_format == "ue8m0", rounding=rounding, row_groups=groups)


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


# -- physical scale layouts ----------------------------------------------------------------------
#
# The logical scales are fp32 ``[MN, SK]`` (or ``[G, MN, SK]``), row-major, one per block. Hardware
# wants them MN-major (the MN index varies fastest in memory) so that one K-block's scales for a
# tile of rows are contiguous: TMA on NVIDIA loads a ``block_m x 1`` scale column per K-block.


def tma_aligned_size(mn: int, element_size: int = 4) -> int:
    """``align(mn, 16 // element_size)``: TMA needs 16-byte aligned strides (4 for fp32/int32)."""
    step = 16 // element_size
    return _ceil_div(mn, step) * step


def _check_rank(t: torch.Tensor, argument: str, what: str) -> None:
    if t.dim() not in (2, 3):
        raise ShapeError(argument, f"a 2-D [MN, {what}] or 3-D [G, MN, {what}] tensor", tuple(t.shape))


def _mn_major_zeros(like: torch.Tensor, mn: int, cols: int, dtype: torch.dtype, mn_stride: int) -> torch.Tensor:
    """Zero-filled ``like.shape[:-2] + (mn, cols)`` tensor with strides ``(1, mn_stride)`` on the last
    two dims and ``mn_stride * cols`` on a leading group dim; the rows past ``mn`` are padding."""
    lead = tuple(like.shape[:-2])
    groups = lead[0] if lead else 1
    storage = torch.zeros(groups * mn_stride * cols, dtype=dtype, device=like.device)
    strides = (1, mn_stride)
    if lead:
        strides = (mn_stride * cols,) + strides
    return storage.as_strided(lead + (mn, cols), strides)


def _is_mn_major(t: torch.Tensor, mn_stride: int) -> bool:
    mn, cols = t.shape[-2:]
    if t.stride(-2) != 1 or t.stride(-1) != mn_stride:
        return False
    return t.dim() == 2 or t.shape[0] <= 1 or t.stride(0) == mn_stride * cols


def tma_align_mn_major(scale: torch.Tensor) -> torch.Tensor:
    """SM90 activation-scale layout: fp32 ``[MN, SK]`` or ``[G, MN, SK]`` -> the same values, MN-major
    with a TMA-aligned stride: ``stride(-2) == 1``, ``stride(-1) == align(MN, 4)`` and, for 3-D,
    ``stride(0) == align(MN, 4) * SK`` (DeepGEMM's ``get_mn_major_tma_aligned_tensor``).

    The logical shape is kept; the ``align(MN, 4) - MN`` padding rows of the storage are zeros. An
    input already in this layout is returned as is. The inverse is :func:`from_tma_aligned` (the
    values are unchanged, so any row-major copy, ``.contiguous()``, is one).
    """
    _check_rank(_check_fp32(scale), "scale", "SK")
    mn, sk = scale.shape[-2:]
    stride = tma_aligned_size(mn)
    if _is_mn_major(scale, stride):
        return scale
    out = _mn_major_zeros(scale, mn, sk, torch.float32, stride)
    out.copy_(scale)
    return out


def from_tma_aligned(scale: torch.Tensor) -> torch.Tensor:
    """Row-major (contiguous) fp32 copy of a :func:`tma_align_mn_major` tensor: the logical scales."""
    _check_rank(_check_fp32(scale), "scale", "SK")
    return scale.contiguous()


def _exponent_bytes(scale: torch.Tensor, check: bool) -> torch.Tensor:
    """int64 biased exponents of fp32 powers of two; ScaleFormatError on anything else when ``check``."""
    bits = scale.contiguous().view(torch.int32)
    exponent = ((bits >> 23) & _EXP_MASK).to(torch.int64)
    if check and bits.numel():
        bad = ((bits & ~(_EXP_MASK << 23)) != 0) | (exponent == 0) | (exponent == _EXP_MASK)
        if bool(bad.any()):
            index = tuple(int(i) for i in torch.nonzero(bad)[0])
            raise ScaleFormatError(
                f"scale[{', '.join(map(str, index))}]",
                "a positive normal power of two (round scales up with ceil_to_ue8m0 or quantize with ue8m0=True)",
                float(scale[index]),
                "UE8M0 stores only the exponent byte; DeepGEMM would silently truncate this scale",
            )
    return exponent


def _pack_bytes(exponent: torch.Tensor, per_word: int, word_dtype: torch.dtype) -> torch.Tensor:
    """Little-endian packing along the last dim: byte ``j`` of word ``i`` is ``exponent[..., per_word*i + j]``
    (0 past the end). Returns ``word_dtype`` with two's-complement wrap-around of the top byte."""
    sk = exponent.shape[-1]
    words = _ceil_div(sk, per_word)
    padded = torch.nn.functional.pad(exponent, (0, words * per_word - sk))
    shifts = torch.arange(per_word, device=exponent.device, dtype=torch.int64) * 8
    value = (padded.reshape(*exponent.shape[:-1], words, per_word) << shifts).sum(-1)
    bits = 8 * per_word
    value = value - (value >= 2 ** (bits - 1)).to(torch.int64) * 2**bits
    return value.to(word_dtype)


def _unpack_bytes(packed: torch.Tensor, sk: int, per_word: int, word_dtype: torch.dtype, argument: str) -> torch.Tensor:
    if not isinstance(packed, torch.Tensor) or packed.dtype != word_dtype:
        got = packed.dtype if isinstance(packed, torch.Tensor) else type(packed).__name__
        raise DTypeError(argument, str(word_dtype), got)
    _check_rank(packed, argument, f"ceil(SK/{per_word})")
    if isinstance(sk, bool) or not isinstance(sk, int) or sk < 0 or _ceil_div(sk, per_word) != packed.shape[-1]:
        raise ShapeError("sk", f"an int with ceil(sk / {per_word}) == {packed.shape[-1]} (packed.shape[-1])", sk)
    value = packed.to(torch.int64) & (2 ** (8 * per_word) - 1)
    shifts = torch.arange(per_word, device=packed.device, dtype=torch.int64) * 8
    exponent = (value.unsqueeze(-1) >> shifts) & _EXP_MASK
    exponent = exponent.reshape(*packed.shape[:-1], packed.shape[-1] * per_word)[..., :sk]
    return (exponent.to(torch.int32) << 23).view(torch.float32).contiguous()


def pack_ue8m0(scale: torch.Tensor, check: bool = True) -> torch.Tensor:
    """SM100 scale layout: fp32 powers of two ``[MN, SK]`` / ``[G, MN, SK]`` -> int32 UE8M0 words.

    Output: int32 ``[MN, ceil(SK/4)]`` (``[G, MN, ceil(SK/4)]``), MN-major and TMA-aligned:
    ``stride(-2) == 1``, ``stride(-1) == align(MN, 4)``, 3-D ``stride(0) == align(MN, 4) * ceil(SK/4)``.
    Byte ``j`` (``j = 0`` least significant: little-endian along K) of word ``[mn, i]`` is the fp32
    exponent byte ``(bits >> 23) & 0xFF`` of ``scale[mn, 4i + j]``; bytes past ``SK`` and the padding
    rows are 0. This is DeepGEMM's ``get_mn_major_tma_aligned_packed_ue8m0_tensor`` layout.

    Every scale must be a positive normal power of two (what :func:`ceil_to_ue8m0` produces); any
    other value raises :class:`~moe_hal.errors.ScaleFormatError` naming the first bad index, where
    DeepGEMM's kernel would silently floor it. The check reads one flag on the host (one device
    sync); ``check=False`` skips it for scales known to be powers of two (the exponent byte is then
    taken as is). Inverse: :func:`unpack_ue8m0`.
    """
    _check_rank(_check_fp32(scale), "scale", "SK")
    mn, sk = scale.shape[-2:]
    words = _pack_bytes(_exponent_bytes(scale, check), 4, torch.int32)
    out = _mn_major_zeros(scale, mn, words.shape[-1], torch.int32, tma_aligned_size(mn))
    out.copy_(words)
    return out


def unpack_ue8m0(packed: torch.Tensor, sk: int) -> torch.Tensor:
    """Inverse of :func:`pack_ue8m0`: int32 ``[.., MN, ceil(sk/4)]`` (any strides) -> contiguous fp32
    ``[.., MN, sk]`` whose value is ``2 ** (byte - 127)``. Bytes past ``sk`` are ignored. Bytes 0 and
    255, which :func:`pack_ue8m0` never writes for a scale, decode as the fp32 with that exponent
    byte and zero mantissa (0.0 and inf)."""
    return _unpack_bytes(packed, sk, 4, torch.int32, "packed")


def pack_ue8m0x2(scale: torch.Tensor, check: bool = True) -> torch.Tensor:
    """Ascend-950 DeepGEMM-port scale layout: two UE8M0 exponents per int16.

    fp32 powers of two ``[MN, SK]`` / ``[G, MN, SK]`` -> int16 ``[MN, ceil(SK/2)]``
    (``[G, MN, ceil(SK/2)]``), MN-major: ``stride(-2) == 1``, ``stride(-1) == MN`` and, for 3-D,
    ``stride(0) == MN * ceil(SK/2)``. Byte 0 (low) of word ``[mn, i]`` is the exponent byte of
    ``scale[mn, 2i]``, byte 1 that of ``scale[mn, 2i + 1]`` (little-endian along K); 0 past ``SK``.
    With the port's MX granularity (32 K elements per scale) one word covers 64 K elements, the
    ``[..., MN, ceil(K/64)]`` shape of ``Afloat16/DeepGEMM-Ascend``. The port documents no stride
    padding (Ascend has no TMA), so the MN stride is unpadded. Same checks and ``check`` flag as
    :func:`pack_ue8m0`. Inverse: :func:`unpack_ue8m0x2`.
    """
    _check_rank(_check_fp32(scale), "scale", "SK")
    mn, sk = scale.shape[-2:]
    words = _pack_bytes(_exponent_bytes(scale, check), 2, torch.int16)
    out = _mn_major_zeros(scale, mn, words.shape[-1], torch.int16, mn)
    out.copy_(words)
    return out


def unpack_ue8m0x2(packed: torch.Tensor, sk: int) -> torch.Tensor:
    """Inverse of :func:`pack_ue8m0x2`: int16 ``[.., MN, ceil(sk/2)]`` -> contiguous fp32 ``[.., MN, sk]``."""
    return _unpack_bytes(packed, sk, 2, torch.int16, "packed")


__all__ = [
    "AMAX_FLOOR",
    "QuantizedTensor",
    "ROUNDINGS",
    "SCALE_FORMATS",
    "ceil_to_ue8m0",
    "dequantize",
    "from_tma_aligned",
    "pack_ue8m0",
    "pack_ue8m0x2",
    "quantize_fp8",
    "tma_align_mn_major",
    "tma_aligned_size",
    "to_group_origin",
    "to_tensor_origin",
    "unpack_ue8m0",
    "unpack_ue8m0x2",
]
