"""DeepGEMM v2.6's Python API on every moe_hal backend: ``import moe_hal.compat.deep_gemm as deep_gemm``.

Same names, positional order and defaults as ``deep_gemm`` 2.6.1 (the table, checked against
DeepGEMM's sources, is in ``tests/compat/deepgemm_signatures.json``); every GEMM writes into the
caller's ``d`` and returns None. Calls run through :func:`moe_hal.grouped_gemm` on the selected
backend (CPU, CUDA, Ascend), or through the real DeepGEMM when it can run them
(``passthrough="auto"``, :mod:`.passthrough`). :func:`install` makes ``import deep_gemm`` resolve
to this module, for unmodified code. What differs from DeepGEMM is listed in
``docs/deepgemm-compat.md``.
"""

from __future__ import annotations

import sys
from types import ModuleType

import torch

from . import settings, testing, utils
from .errors import DeepGEMMError, NotProvidedError
from .gemm import (
    bf16_gemm_nn,
    bf16_gemm_nt,
    bf16_gemm_tn,
    bf16_gemm_tt,
    fp8_fp4_gemm_nn,
    fp8_fp4_gemm_nt,
    fp8_fp4_gemm_tn,
    fp8_fp4_gemm_tt,
    k_grouped_bf16_gemm_tn_contiguous,
    k_grouped_fp8_gemm_nt_contiguous,
    k_grouped_fp8_gemm_tn_contiguous,
    m_grouped_bf16_gemm_nn_contiguous,
    m_grouped_bf16_gemm_nt_contiguous,
    m_grouped_bf16_gemm_nt_masked,
    m_grouped_fp8_fp4_gemm_nn_contiguous,
    m_grouped_fp8_fp4_gemm_nt_contiguous,
    m_grouped_fp8_fp4_gemm_nt_masked,
)
from .utils import (
    align,
    ceil_div,
    ceil_to_ue8m0,
    get_col_major_tma_aligned_tensor,
    get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor,
    get_mn_major_tma_aligned_packed_ue8m0_tensor,
    get_mn_major_tma_aligned_tensor,
    get_tma_aligned_size,
    per_block_cast_to_fp8,
    per_channel_cast_to_fp8,
    per_token_cast_to_fp8,
    transform_sf_into_required_layout,
)

#: The DeepGEMM API version this module mirrors (callers compare it).
__version__ = "2.6.1"
#: Marks the shim, so code (and :mod:`.passthrough`) can tell it from the real package.
__moe_hal_shim__ = True

# == aliases DeepGEMM defines ======================================================================
m_grouped_fp8_gemm_nt_contiguous = m_grouped_fp8_fp4_gemm_nt_contiguous
m_grouped_fp8_gemm_nn_contiguous = m_grouped_fp8_fp4_gemm_nn_contiguous
m_grouped_fp8_gemm_nt_masked = m_grouped_fp8_fp4_gemm_nt_masked
fp8_m_grouped_gemm_nt_masked = m_grouped_fp8_fp4_gemm_nt_masked
bf16_m_grouped_gemm_nt_masked = m_grouped_bf16_gemm_nt_masked
fp8_gemm_nt, fp8_gemm_nn, fp8_gemm_tn, fp8_gemm_tt = fp8_fp4_gemm_nt, fp8_fp4_gemm_nn, fp8_fp4_gemm_tn, fp8_fp4_gemm_tt


# == v1 names (DeepGEMM <= 2025-07; SM90, fp32 scales) ==============================================
def m_grouped_gemm_fp8_fp8_bf16_nt_contiguous(lhs, rhs, out, m_indices) -> None:
    """v1 name of :func:`m_grouped_fp8_gemm_nt_contiguous` (``m_indices`` layout)."""
    m_grouped_fp8_fp4_gemm_nt_contiguous(lhs, rhs, out, m_indices)


def m_grouped_gemm_fp8_fp8_bf16_nt_masked(lhs, rhs, out, masked_m, expected_m) -> None:
    """v1 name of :func:`m_grouped_fp8_gemm_nt_masked`."""
    m_grouped_fp8_fp4_gemm_nt_masked(lhs, rhs, out, masked_m, expected_m)


def gemm_fp8_fp8_bf16_nt(lhs, rhs, out) -> None:
    """v1 name of :func:`fp8_gemm_nt`."""
    fp8_fp4_gemm_nt(lhs, rhs, out)


# == settings (per thread; see .settings) ===========================================================
def set_num_sms(new_num_sms) -> None:
    """Record the SM budget DeepGEMM kernels may use (moe_hal backends choose their own grids)."""
    settings.put("num_sms", new_num_sms)


def get_num_sms() -> int:
    """The recorded SM budget; by default the CUDA device's SM count (``torch.get_num_threads()``
    off CUDA)."""
    value = settings.current()["num_sms"]
    if value is not None:
        return value
    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    return torch.get_num_threads()


def set_tc_util(new_tc_util) -> None:
    settings.put("tc_util", new_tc_util)


def get_tc_util() -> int:
    return settings.current()["tc_util"]


def set_pdl(new_enable_pdl) -> None:
    settings.put("pdl", new_enable_pdl)


def get_pdl() -> bool:
    return settings.current()["pdl"]


def set_ignore_compile_dims(new_value) -> None:
    settings.put("ignore_compile_dims", new_value)


def set_block_size_multiple_of(new_value) -> None:
    settings.put("block_size_multiple_of", tuple(new_value) if isinstance(new_value, list) else new_value)


def set_mk_alignment_for_contiguous_layout(new_value) -> None:
    """The alignment of every contiguous / psum / K-grouped layout this thread's calls build (any
    positive int, e.g. 224 as DeepGEMM's SM100 tests use)."""
    settings.put("mk_alignment", new_value)


def get_mk_alignment_for_contiguous_layout() -> int:
    return settings.current()["mk_alignment"]


get_m_alignment_for_contiguous_layout = get_mk_alignment_for_contiguous_layout
get_k_alignment_for_contiguous_layout = get_mk_alignment_for_contiguous_layout


def get_theoretical_mk_alignment_for_contiguous_layout(expected_m=None) -> int:
    """DeepGEMM's best block M: 128 off SM100; on SM100 (``arch_major=10``) the smallest of
    32, 64, ..., 224 that is >= ``expected_m`` (224 without it)."""
    chosen = settings.current()["arch_major"]
    arch = (
        chosen if chosen is not None else (torch.cuda.get_device_capability()[0] if torch.cuda.is_available() else None)
    )
    if arch != 10:
        return 128
    block_m = 224
    while expected_m is not None and block_m - 32 >= max(expected_m, 32):
        block_m -= 32
    return block_m


# == moe_hal extras ==============================================================================
#: ``with scoped_settings(num_sms=…, mk_alignment=…, backend=…, arch_major=…, passthrough=…):``
scoped_settings = settings.scoped


def set_passthrough(mode: str) -> None:
    """``"auto"`` (default), ``"never"`` or ``"always"``: when to call the real DeepGEMM."""
    settings.put("passthrough", mode)


def set_backend(backend) -> None:
    """The moe_hal backend (name or preference list) the shim's calls use; None: moe_hal's choice."""
    settings.put("backend", backend)


def set_arch_major(arch_major) -> None:
    """Whose scale rules apply: 9 (SM90), 10 (SM100) or None (portable; the default off SM90/SM100)."""
    settings.put("arch_major", arch_major)


# == install ======================================================================================
_SUBMODULES = {
    "deep_gemm.utils": utils,
    "deep_gemm.utils.layout": utils,
    "deep_gemm.utils.math": utils,
    "deep_gemm.testing": testing,
}
_saved_modules: list[dict] = []


def install() -> ModuleType:
    """Make ``import deep_gemm`` (and ``deep_gemm.utils``, ``deep_gemm.utils.layout``,
    ``deep_gemm.utils.math``, ``deep_gemm.testing``) resolve to this shim. Opt-in, process-wide,
    idempotent; :func:`uninstall` puts back what was there. With passthrough "auto" the real
    package is still used for calls it can run. Returns the shim module."""
    this = sys.modules[__name__]
    if sys.modules.get("deep_gemm") is this:
        return this
    names = ["deep_gemm", *_SUBMODULES]
    _saved_modules.append({n: sys.modules.get(n) for n in names})
    sys.modules["deep_gemm"] = this
    sys.modules.update(_SUBMODULES)
    return this


def uninstall() -> None:
    """Undo :func:`install`."""
    if not _saved_modules:
        return
    for name, module in _saved_modules.pop().items():
        if module is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = module


#: DeepGEMM's names this module provides, then the moe_hal extras.
__all__ = [
    # grouped GEMMs and their aliases
    "m_grouped_fp8_fp4_gemm_nt_contiguous",
    "m_grouped_fp8_gemm_nt_contiguous",
    "m_grouped_fp8_fp4_gemm_nn_contiguous",
    "m_grouped_fp8_gemm_nn_contiguous",
    "m_grouped_fp8_fp4_gemm_nt_masked",
    "m_grouped_fp8_gemm_nt_masked",
    "fp8_m_grouped_gemm_nt_masked",
    "k_grouped_fp8_gemm_tn_contiguous",
    "k_grouped_fp8_gemm_nt_contiguous",
    "m_grouped_bf16_gemm_nt_contiguous",
    "m_grouped_bf16_gemm_nn_contiguous",
    "m_grouped_bf16_gemm_nt_masked",
    "bf16_m_grouped_gemm_nt_masked",
    "k_grouped_bf16_gemm_tn_contiguous",
    # dense GEMMs
    "fp8_fp4_gemm_nt",
    "fp8_fp4_gemm_nn",
    "fp8_fp4_gemm_tn",
    "fp8_fp4_gemm_tt",
    "fp8_gemm_nt",
    "fp8_gemm_nn",
    "fp8_gemm_tn",
    "fp8_gemm_tt",
    "bf16_gemm_nt",
    "bf16_gemm_nn",
    "bf16_gemm_tn",
    "bf16_gemm_tt",
    # v1 names
    "m_grouped_gemm_fp8_fp8_bf16_nt_contiguous",
    "m_grouped_gemm_fp8_fp8_bf16_nt_masked",
    "gemm_fp8_fp8_bf16_nt",
    "get_col_major_tma_aligned_tensor",
    # layouts and utils
    "get_tma_aligned_size",
    "get_mn_major_tma_aligned_tensor",
    "get_mn_major_tma_aligned_packed_ue8m0_tensor",
    "get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor",
    "transform_sf_into_required_layout",
    "ceil_div",
    "align",
    "ceil_to_ue8m0",
    "per_token_cast_to_fp8",
    "per_channel_cast_to_fp8",
    "per_block_cast_to_fp8",
    # settings
    "set_num_sms",
    "get_num_sms",
    "set_tc_util",
    "get_tc_util",
    "set_pdl",
    "get_pdl",
    "set_ignore_compile_dims",
    "set_block_size_multiple_of",
    "set_mk_alignment_for_contiguous_layout",
    "get_mk_alignment_for_contiguous_layout",
    "get_m_alignment_for_contiguous_layout",
    "get_k_alignment_for_contiguous_layout",
    "get_theoretical_mk_alignment_for_contiguous_layout",
    # moe_hal extras
    "scoped_settings",
    "set_passthrough",
    "set_backend",
    "set_arch_major",
    "install",
    "uninstall",
    "DeepGEMMError",
    "NotProvidedError",
]


def __getattr__(name: str):
    """Any other DeepGEMM entry point (attention, einsum, mega-MoE, ...): a NotProvidedError."""
    if name.startswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    raise NotProvidedError(name, [n for n in __all__ if n[0].islower()])
