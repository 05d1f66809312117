"""``deep_gemm.testing``: the accuracy metric DeepGEMM's tests use (moe_hal's one definition)."""

from __future__ import annotations

from ...conformance.tolerances import calc_diff

__all__ = ["calc_diff"]
