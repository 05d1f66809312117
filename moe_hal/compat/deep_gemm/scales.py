"""DeepGEMM operands ``(tensor, sf)`` plus recipes -> :class:`moe_hal.QuantizedTensor`.

A recipe is DeepGEMM's scale granularity: ``recipe = (gran_m_a, gran_n_b, gran_k)`` for both
operands, or ``recipe_a = (gran_mn, gran_k)`` with ``recipe_b`` likewise. Scales come as fp32
logical values (any strides: row-major or DeepGEMM's MN-major TMA-aligned layout) or as int32
words of four packed UE8M0 exponents (``[.., MN, ceil(ceil(K / gran_k) / 4)]``). The result keeps
logical fp32 scales, which every moe_hal backend takes.

Which rules apply depends on ``arch_major`` (:mod:`.settings`):

* ``9`` (SM90): fp32 scales only, used as given; packed scales are refused, as DeepGEMM does.
* ``10`` (SM100): fp32 scales are **floored** to a power of two (DeepGEMM's UE8M0 cast keeps the
  exponent byte), with a one-time warning when that changes a value; ``disable_ue8m0_cast=True``
  with fp32 scales is refused, as DeepGEMM's SM100 grouped kernels take only packed scales.
* ``None`` (portable, the default off SM90/SM100): fp32 scales used exactly as given, packed
  scales accepted; ``disable_ue8m0_cast`` has nothing to disable.
"""

from __future__ import annotations

import torch

from ... import notices
from ...errors import DTypeError, PathWarning, ShapeError
from ...quant import QuantizedTensor, unpack_ue8m0
from .errors import DeepGEMMError

Recipe2 = tuple[int, int]


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _check_recipe(recipe: object, length: int, argument: str) -> tuple[int, ...]:
    if not (
        isinstance(recipe, (tuple, list))
        and len(recipe) == length
        and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in recipe)
    ):
        raise ShapeError(argument, f"None or a tuple of {length} positive ints", recipe)
    return tuple(recipe)


def resolve_recipes(
    sfa: torch.Tensor, sfb: torch.Tensor, recipe, recipe_a, recipe_b, arch_major: int | None
) -> tuple[Recipe2, Recipe2]:
    """``((gran_m_a, gran_k_a), (gran_n_b, gran_k_b))`` from DeepGEMM's recipe arguments: ``recipe``
    or the ``recipe_a``/``recipe_b`` pair (never both); with none, DeepGEMM's default for the
    scale dtypes: ``(1, 128, 128)`` for fp32 weight scales, ``(1, 1, 128)`` for packed ones."""
    if (recipe_a is None) != (recipe_b is None):
        raise DeepGEMMError(
            "recipe_a and recipe_b must be given together (DeepGEMM: recipe_a.has_value() == recipe_b.has_value())"
        )
    if recipe_a is not None and recipe is not None:
        raise DeepGEMMError(
            "pass either recipe or recipe_a/recipe_b, not both (DeepGEMM: recipe_a.has_value() != recipe.has_value())"
        )
    if recipe_a is not None:
        return _check_recipe(recipe_a, 2, "recipe_a"), _check_recipe(recipe_b, 2, "recipe_b")
    if recipe is None:
        if arch_major == 9 and (sfa.dtype != torch.float32 or sfb.dtype != torch.float32):
            raise DeepGEMMError("SM90 takes fp32 scale factors only (DeepGEMM's default recipe check)")
        recipe = (1, 1, 128) if sfb.dtype == torch.int32 else (1, 128, 128)
    g_a, g_b, g_k = _check_recipe(recipe, 3, "recipe")
    return (g_a, g_k), (g_b, g_k)


def floor_to_ue8m0(scale: torch.Tensor) -> torch.Tensor:
    """fp32 scales with the mantissa dropped (a power of two <= the value for positive normals):
    what DeepGEMM's UE8M0 packing keeps of an fp32 scale on SM100."""
    bits = scale.contiguous().view(torch.int32)
    return (bits & (0xFF << 23)).view(torch.float32).reshape(scale.shape)


def to_quantized(
    operand: object, argument: str, gran: Recipe2, arch_major: int | None, disable_ue8m0_cast: bool, rank: int
) -> QuantizedTensor:
    """DeepGEMM operand ``(tensor, sf)`` of ``rank`` dims -> a QuantizedTensor with blocks ``gran``."""
    if not (isinstance(operand, (tuple, list)) and len(operand) == 2):
        raise DTypeError(argument, "a (tensor, scale factors) pair", type(operand).__name__)
    data, sf = operand
    if not isinstance(data, torch.Tensor) or data.dtype != torch.float8_e4m3fn:
        got = data.dtype if isinstance(data, torch.Tensor) else type(data).__name__
        raise DTypeError(f"{argument}[0]", "a torch.float8_e4m3fn tensor (packed FP4 operands are not supported)", got)
    if data.dim() != rank:
        raise ShapeError(f"{argument}[0]", f"a {rank}-D tensor", tuple(data.shape))
    if not isinstance(sf, torch.Tensor) or sf.dtype not in (torch.float32, torch.int32):
        got = sf.dtype if isinstance(sf, torch.Tensor) else type(sf).__name__
        raise DTypeError(f"{argument}[1]", "torch.float32 or torch.int32 (packed UE8M0) scale factors", got)
    gran_mn, gran_k = gran
    *lead, mn, k = data.shape
    sk = _ceil_div(k, gran_k)
    if sf.dtype == torch.int32:
        if arch_major == 9:
            raise DeepGEMMError(
                f"{argument}: packed UE8M0 scale factors need SM100 (arch_major=10); SM90 takes fp32 scale factors"
            )
        if gran_mn != 1:
            raise ShapeError(f"recipe for {argument}", "gran_mn == 1 with packed UE8M0 scale factors", gran)
        expected = (*lead, mn, _ceil_div(sk, 4))
        if tuple(sf.shape) != expected:
            raise ShapeError(f"{argument}[1]", f"packed shape {expected}", tuple(sf.shape))
        return QuantizedTensor(data, unpack_ue8m0(sf, sk), (1, gran_k), "ue8m0")
    expected = (*lead, _ceil_div(mn, gran_mn), sk)
    if tuple(sf.shape) != expected:
        raise ShapeError(f"{argument}[1]", f"shape {expected} for recipe {gran}", tuple(sf.shape))
    if arch_major == 9 and (gran_k != 128 or gran_mn not in (1, 128)):
        raise DeepGEMMError(f"{argument}: SM90 takes fp32 scales with recipe (1, 128) or (128, 128), got {gran}")
    scale, scale_format = fp32_scales_for_arch(sf, argument, arch_major, disable_ue8m0_cast)
    return QuantizedTensor(data, scale, (gran_mn, gran_k), scale_format)


def fp32_scales_for_arch(
    sf: torch.Tensor, argument: str, arch_major: int | None, disable_ue8m0_cast: bool
) -> tuple[torch.Tensor, str]:
    """fp32 scale factors as the kernels of ``arch_major`` would read them, and their format:
    floored to powers of two on SM100 (one warning when that changes a value), as given otherwise."""
    if arch_major != 10:
        return sf, "fp32"
    if disable_ue8m0_cast:
        raise DeepGEMMError(
            f"{argument}: on SM100 the grouped kernels take fp32 scale factors only through "
            "the UE8M0 cast; disable_ue8m0_cast=True leaves them unsupported"
        )
    floored = floor_to_ue8m0(sf)
    if not torch.equal(floored, sf.contiguous()):
        notices.warn_once(
            ("deep_gemm.ue8m0_floor", argument),
            "moe_hal.compat.deep_gemm (arch_major=10): fp32 scale factors that are not powers "
            "of two are floored to one, as DeepGEMM's SM100 UE8M0 cast does; round them up "
            "(ceil_to_ue8m0) when quantizing to keep results exact",
            PathWarning,
            stacklevel=6,
        )
    return floored, "ue8m0"
