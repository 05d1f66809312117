"""DeepGEMM's ``deep_gemm.utils`` helpers: integer math, scale-factor layouts and the fp8 casts its
tests and callers use, on moe_hal's one implementation of each (:mod:`moe_hal.quant`).

Layouts (byte-identical with DeepGEMM's on its layout test shapes, ``tests/compat``):

* :func:`get_mn_major_tma_aligned_tensor`: fp32 ``[.., MN, SK]`` -> same values, strides
  ``(1, align(MN, 4))`` (moe_hal's :func:`~moe_hal.quant.tma_align_mn_major`).
* :func:`get_mn_major_tma_aligned_packed_ue8m0_tensor`: fp32 -> int32 words of four exponent bytes,
  little-endian along K, MN-major (moe_hal's :func:`~moe_hal.quant.pack_ue8m0`); like DeepGEMM it
  keeps only each scale's exponent byte (a non-power-of-two scale is floored).
* :func:`get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor`: the same per K group.
* :func:`transform_sf_into_required_layout`: what the kernels of ``arch_major`` read.

Casts (``rounding="reciprocal"``: ``x * (1 / sf)``, DeepGEMM's formula, so the fp8 codes match):
:func:`per_token_cast_to_fp8`, :func:`per_channel_cast_to_fp8`, :func:`per_block_cast_to_fp8`.
"""

from __future__ import annotations

import torch

from ... import quant
from ...errors import DTypeError, ShapeError
from . import passthrough, settings
from .errors import DeepGEMMError
from .gemm import deepgemm_api


def ceil_div(x: int, y: int) -> int:
    """``ceil(x / y)`` for ints."""
    return (x + y - 1) // y


def align(x: int, y: int) -> int:
    """Smallest multiple of ``y`` that is >= ``x``."""
    return ceil_div(x, y) * y


def get_tma_aligned_size(x: int, element_size: int) -> int:
    """``align(x, 16 // element_size)``: TMA needs 16-byte aligned strides."""
    if element_size not in (1, 2, 4, 8, 16):
        raise DeepGEMMError(f"get_tma_aligned_size: element_size must divide 16, got {element_size}")
    return quant.tma_aligned_size(x, element_size)


def ceil_to_ue8m0(x: torch.Tensor) -> torch.Tensor:
    """Round fp32 scales up to powers of two (exponent clamped to [1, 254])."""
    return quant.ceil_to_ue8m0(x.abs().float())


def _fp32_sf(sf: object, argument: str = "sf") -> torch.Tensor:
    if not isinstance(sf, torch.Tensor) or sf.dtype != torch.float32:
        got = sf.dtype if isinstance(sf, torch.Tensor) else type(sf).__name__
        raise DTypeError(argument, "a torch.float32 tensor", got)
    if sf.dim() not in (2, 3):
        raise ShapeError(argument, "a 2-D [MN, SK] or 3-D [G, MN, SK] tensor", tuple(sf.shape))
    return sf


@deepgemm_api
def get_mn_major_tma_aligned_tensor(sf):
    """fp32 ``[MN, SK]`` / ``[G, MN, SK]`` -> the same values, MN-major with a TMA-aligned stride."""
    return quant.tma_align_mn_major(_fp32_sf(sf))


def _pack(sf: torch.Tensor) -> torch.Tensor:
    """DeepGEMM's packing: exponent bytes as they are (the mantissa is dropped), four per int32."""
    return quant.pack_ue8m0(sf, check=False)


@deepgemm_api
def get_mn_major_tma_aligned_packed_ue8m0_tensor(sf, psum_layout=None):
    """fp32 ``[MN, SK]`` / ``[G, MN, SK]`` -> int32 ``[.., MN, ceil(SK/4)]``, MN-major, TMA-aligned.

    ``psum_layout`` (int32 ``[G]`` exclusive ends of the M-grouped psum layout of a 2-D ``sf``):
    rows in the gaps between groups are not read and pack as 0 (they may be uninitialised)."""
    sf = _fp32_sf(sf)
    if psum_layout is not None:
        if sf.dim() != 2:
            raise ShapeError("sf", "a 2-D [M, SK] tensor with psum_layout", tuple(sf.shape))
        from ...layouts import ContiguousLayout

        layout = ContiguousLayout.from_psum(psum_layout, settings.current()["mk_alignment"], num_rows=sf.shape[0])
        gaps = layout.gap_rows_on(sf.device)
        sf = sf.index_fill(0, gaps, 1.0) if gaps.numel() else sf
        packed = _pack(sf)
        if gaps.numel():
            packed.index_fill_(0, gaps, 0)
        return packed
    return _pack(sf)


@deepgemm_api
def get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(
    sf, grouped_layout, ks_cpu, gran_k, k_alignment, use_psum_layout=False
):
    """K-grouped fp32 scales ``[sum ceil(K_g/gran_k), MN]`` -> int32 ``[sum ceil(K_g/(4 gran_k)), MN]``:
    each group's exponent bytes packed four per word along K, little-endian, 0 past its end."""
    sf = _fp32_sf(sf)
    if sf.dim() != 2:
        raise ShapeError("sf", "a 2-D [sum SK, MN] tensor", tuple(sf.shape))
    if gran_k not in (32, 128) or k_alignment % 32:
        raise DeepGEMMError(f"gran_k must be 32 or 128 and k_alignment % 32 == 0, got {gran_k}, {k_alignment}")
    ks = group_ks(ks_cpu, grouped_layout, use_psum_layout, k_alignment)
    parts, row = [], 0
    for k in ks:
        sk = ceil_div(k, gran_k)
        parts.append(_pack(sf[row : row + sk].T).T.contiguous())
        row += sk
    if row != sf.shape[0]:
        raise ShapeError("sf", f"{row} rows (sum of ceil(K_g / {gran_k}))", sf.shape[0])
    return torch.cat(parts) if parts else sf.new_empty(0, sf.shape[1], dtype=torch.int32)


def group_ks(ks_cpu, grouped_layout, use_psum_layout: bool, k_alignment: int) -> list[int]:
    """Real per-group K: ``ks_cpu`` (or ``grouped_layout``) without psum, the psum differences with it."""
    values = [int(v) for v in grouped_layout.tolist()] if isinstance(grouped_layout, torch.Tensor) else None
    if not use_psum_layout:
        return list(ks_cpu) if ks_cpu else (values or [])
    ks, end = [], 0
    for e in values or []:
        start = align(end, k_alignment)
        ks.append(e - start)
        end = e
    return ks


@deepgemm_api
def transform_sf_into_required_layout(
    sf, mn, k, recipe, num_groups=None, is_sfa=None, disable_ue8m0_cast=False, psum_layout=None
):
    """Scale factors in the layout the kernels of the current ``arch_major`` read.

    ``recipe``: ``(gran_m, gran_n, gran_k)`` with ``is_sfa`` saying which operand, or
    ``(gran_mn, gran_k)`` without it. SM100 (``arch_major=10``): fp32 -> packed UE8M0 int32 (a
    ``gran_mn > 1`` weight scale is first broadcast to one row per MN), int32 checked and returned.
    Otherwise (SM90 and portable): fp32 ``(1, 128)`` -> MN-major TMA-aligned, fp32 ``(128, 128)``
    returned as is; int32 is accepted only off SM90.
    """
    if isinstance(recipe, (tuple, list)) and len(recipe) == 3:
        if is_sfa is None:
            raise DeepGEMMError("a 3-element recipe needs is_sfa")
        gran_mn, gran_k = (recipe[0] if is_sfa else recipe[1]), recipe[2]
    elif isinstance(recipe, (tuple, list)) and len(recipe) == 2:
        if is_sfa is not None:
            raise DeepGEMMError("is_sfa must be None with a 2-element recipe")
        gran_mn, gran_k = recipe
    else:
        raise DeepGEMMError(f"Invalid recipe {recipe!r}")
    if not isinstance(sf, torch.Tensor) or sf.dtype not in (torch.float32, torch.int32):
        raise DTypeError("sf", "torch.float32 or torch.int32", sf.dtype if isinstance(sf, torch.Tensor) else sf)
    lead = () if num_groups is None else (num_groups,)
    chosen = settings.current()["arch_major"]
    arch = chosen if chosen is not None else passthrough.device_arch_major(sf)
    if sf.dtype == torch.int32:
        expected = (*lead, mn, ceil_div(ceil_div(k, gran_k), 4))
        if arch == 9 or gran_mn != 1 or tuple(sf.shape) != expected:
            raise DeepGEMMError(
                f"Unknown SF transformation: int32 sf {tuple(sf.shape)} (expected {expected}, "
                f"gran_mn 1, SM100) for recipe ({gran_mn}, {gran_k})"
            )
        return sf
    expected = (*lead, ceil_div(mn, gran_mn), ceil_div(k, gran_k))
    if tuple(sf.shape) != expected:
        raise ShapeError("sf", f"shape {expected} for mn={mn}, k={k}, recipe ({gran_mn}, {gran_k})", tuple(sf.shape))
    if arch == 10 and not disable_ue8m0_cast:
        if gran_k not in (32, 128):
            raise DeepGEMMError(f"Unknown SF transformation: gran_k {gran_k} on SM100")
        rows = torch.arange(mn, device=sf.device) // gran_mn
        broadcast = sf if gran_mn == 1 else sf.index_select(-2, rows)
        return get_mn_major_tma_aligned_packed_ue8m0_tensor(broadcast, psum_layout)
    if gran_mn == 1 and gran_k == 128:
        return quant.tma_align_mn_major(sf)
    if gran_mn == 128 and gran_k == 128:
        return sf
    raise DeepGEMMError(f"Unknown SF transformation: fp32 recipe ({gran_mn}, {gran_k}) without the SM100 UE8M0 cast")


def get_col_major_tma_aligned_tensor(x):
    """DeepGEMM v1 name of :func:`get_mn_major_tma_aligned_tensor`."""
    return get_mn_major_tma_aligned_tensor(x)


# -- casts -----------------------------------------------------------------------------------------
def per_token_cast_to_fp8(x, use_ue8m0, gran_k=128, use_packed_ue8m0=False):
    """``[M, K]`` -> ``(fp8 [M, K], sf fp32 [M, ceil(K/gran_k)])`` (or packed int32 sf)."""
    if x.dim() != 2:
        raise ShapeError("x", "a 2-D tensor", tuple(x.shape))
    q = quant.quantize_fp8(x, (1, gran_k), use_ue8m0, rounding="reciprocal")
    if use_packed_ue8m0:
        return q.data, quant.pack_ue8m0(q.scale)
    return q.data, q.scale


def per_channel_cast_to_fp8(x, use_ue8m0, gran_k=128):
    """``[K, N]`` (``K % gran_k == 0``) -> ``(fp8 [K, N], sf fp32 [K/gran_k, N])``."""
    if x.dim() != 2 or x.shape[0] % gran_k:
        raise ShapeError("x", f"a 2-D tensor with shape[0] % {gran_k} == 0", tuple(x.shape))
    q = quant.quantize_fp8(x, (gran_k, 1), use_ue8m0, rounding="reciprocal")
    return q.data, q.scale


def per_block_cast_to_fp8(x, use_ue8m0, gran_k=128):
    """``[M, N]`` -> ``(fp8 [M, N], sf fp32 [ceil(M/gran_k), ceil(N/gran_k)])``."""
    if x.dim() != 2:
        raise ShapeError("x", "a 2-D tensor", tuple(x.shape))
    q = quant.quantize_fp8(x, (gran_k, gran_k), use_ue8m0, rounding="reciprocal")
    return q.data, q.scale
