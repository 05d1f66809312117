"""Physical scale formats the kernels read, built from the API's logical fp32 scales.

The API carries fp32 scales in natural row-major shape, one per block (:class:`moe_hal.QuantizedTensor`).
Each architecture wants its own layout — DeepGEMM's, as its ``transform_sf_into_required_layout``
builds them (deepseek-ai/DeepGEMM at 54e2261, ``deep_gemm/utils/layout.py`` and
``csrc/utils/layout.hpp``):

=========  ===========================================  ==============================================
operand    SM90 (``cuda_sm90``)                          SM100 (``cuda_sm100``)
=========  ===========================================  ==============================================
A-side     fp32 ``[.., MN, SK]``, MN-major, MN stride    int32 ``[.., MN, ceil(SK/4)]``: four UE8M0
           ``align(MN, 4)`` (``tma_align_mn_major``)     bytes per word, little-endian along K, MN-major
                                                         with MN stride ``align(MN, 4)`` (``pack_ue8m0``)
weights    fp32 ``[G, ceil(N/bn), SK]`` as given          the 128x128 scales broadcast to one per row of
           (read without TMA, as DeepGEMM does)          ``b`` (``[G, N, SK]``), then packed as above
=========  ===========================================  ==============================================

"A-side" is every operand whose scale varies along its MN rows: the activations of M-grouped
calls (block 1x128) and both operands of K-grouped calls (block 128x1 along tokens, stored
``[ST, MN]``, transposed here to ``[MN, ST]``). :class:`Physical` records the tensor and how the
kernels index it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from moe_hal import QuantizedTensor
from moe_hal.errors import ScaleFormatError
from moe_hal.quant import pack_ue8m0, tma_align_mn_major

#: ``SCALES`` constexpr values of :mod:`moe_hal_cuda.kernels`.
SCALES_NONE, SCALES_FP32, SCALES_UE8M0 = 0, 1, 2


@dataclass(frozen=True)
class Physical:
    """A physical scale tensor and its meaning for the kernels.

    ``tensor``: what the kernel reads (fp32 or int32). ``kind``: ``SCALES_FP32`` or
    ``SCALES_UE8M0``. ``rows_per_scale``: rows of the operand that share one scale row (128 for
    SM90 weights with 128x128 blocks, else 1).
    """

    tensor: torch.Tensor
    kind: int
    rows_per_scale: int


def kind_for(arch: str) -> int:
    return SCALES_UE8M0 if arch == "sm100" else SCALES_FP32


def _row_scales(scale: torch.Tensor, arch: str, checked: bool) -> torch.Tensor:
    """fp32 ``[.., MN, SK]`` (one scale per row and K-block) in ``arch``'s A-side layout."""
    if arch == "sm100":
        return pack_ue8m0(scale, check=checked)
    return tma_align_mn_major(scale)


def activation(q: QuantizedTensor, arch: str) -> Physical:
    """Scales of an operand whose rows each have their own scales: M-grouped activations
    (block ``(1, 128)``) or a K-grouped operand (block ``(128, 1)`` along tokens).

    SM100 packing trusts the declared ``ue8m0`` format here (no host check: activations change
    every call and a check costs a device sync, which the masked path must never do); weights are
    checked once when prepared (:func:`weight`).
    """
    if q.block == (128, 1):
        return Physical(_row_scales(q.scale.transpose(-1, -2), arch, checked=False), kind_for(arch), 1)
    if q.block[0] != 1:
        raise ScaleFormatError("a.block", "(1, 128) activation blocks or (128, 1) K-grouped blocks", q.block)
    return Physical(_row_scales(q.scale, arch, checked=False), kind_for(arch), 1)


def weight(q: QuantizedTensor, arch: str) -> Physical:
    """Scales of M-grouped weights ``b[G, N, K]`` with block ``(128, 128)`` or ``(1, 128)``.

    SM90 keeps the logical ``[G, ceil(N/bn), SK]`` fp32 tensor (made contiguous). SM100 repeats
    each scale row over the ``bn`` rows it covers and packs UE8M0, checking that every scale is a
    power of two (:class:`~moe_hal.errors.ScaleFormatError` otherwise; skipped for meta tensors,
    which have no values).
    """
    rows = q.block[0]
    if arch != "sm100":
        return Physical(q.scale.contiguous(), SCALES_FP32, rows)
    n = q.data.shape[-2]
    per_row = q.scale.repeat_interleave(rows, dim=-2)[..., :n, :] if rows > 1 else q.scale
    return Physical(pack_ue8m0(per_row, check=per_row.device.type != "meta"), SCALES_UE8M0, 1)


def physical_scales(q: QuantizedTensor, role: str, arch: str) -> torch.Tensor:
    """The tensor ``arch``'s kernels read for operand ``role`` (``"a"`` or ``"b"``) of a call.

    ``role="b"`` with 3-D data is an M-grouped weight; everything else is converted as an
    A-side operand (see the module docstring).
    """
    if role not in ("a", "b"):
        raise ValueError(f"role: expected 'a' or 'b', got {role!r}")
    if role == "b" and q.data.dim() == 3:
        return weight(q, arch).tensor
    return activation(q, arch).tensor
