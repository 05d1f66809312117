"""MoE layers on moe_hal's grouped GEMMs: :class:`TopKRouter`, :class:`GroupedExperts`, :class:`MoE`.

    x ─► TopKRouter ─► dispatch ─► GroupedExperts (grouped GEMM, SwiGLU, grouped GEMM) ─► combine ─► y

``MoE.from_hf(block)`` (also ``from_hf(block)``) converts transformers MoE blocks (Mixtral,
Qwen-MoE, DeepSeek-V3); :func:`expert_weights` reads per-expert or fused expert weights from a
state dict.
"""

from .dispatch import Dispatched, combine, dispatch_contiguous, dispatch_masked
from .experts import GroupedExperts
from .hf import expert_weights
from .moe import MoE
from .router import TopKRouter

#: :meth:`MoE.from_hf` under its functional name.
from_hf = MoE.from_hf

__all__ = [
    "Dispatched",
    "GroupedExperts",
    "MoE",
    "TopKRouter",
    "combine",
    "dispatch_contiguous",
    "dispatch_masked",
    "expert_weights",
    "from_hf",
]
