"""Performance model of MoE grouped GEMM: an occupancy- and wave-aware roofline.

The question this module answers (DeepGEMM issue #211, seed ``000``): with very uneven tokens
per expert and one tile height ``BM`` for every group, is the plain roofline still the right
ideal? It is the right *speed of light* to report efficiency against, but not a good
*prediction*: a persistent grouped kernel pays for padded tiles and for partly idle waves. This
package computes both, plus the ridge height ``M*`` below which a group's padding is hidden
behind its weight streaming. ``docs/perf-model.md`` explains the answer with a worked example.

Modules: :mod:`.operands` (dtype sizes), :mod:`.efficiency` (achieved efficiency per device and
kernel implementation), :mod:`.hardware` (the device), :mod:`.model` (one call, one tile),
:mod:`.advisor` (ranking tiles), :mod:`.calibration` (fitting achieved efficiency to measured
timings and validating it out of sample); routing histograms come from :mod:`moe_hal.workloads`.
Everything here is pure Python (no torch; the fit in :mod:`.calibration` uses numpy) and never
loads plugins. Times are seconds, rates FLOP/s and bytes/s.

Formulas (``G`` groups, ``M_g`` rows of group ``g``, tile ``BM x BN``, ``S`` cores)::

    Mpad_g   = ceil(M_g / BM) * BM                     padded rows (0 for an empty group)
    occ_M    = sum M_g / sum Mpad_g                    aggregate, row-weighted M-occupancy
    occ_N    = N / (ceil(N / BN) * BN)
    tiles    = sum_g ceil(M_g / BM) * ceil(N / BN)
    waves    = ceil(tiles / S);   wave_eff = tiles / (waves * S)
    F_useful = 2 * sum M_g * N * K;   F_padded = 2 * sum Mpad_g * ceil(N/BN)*BN * K
    t_tile   = 2 * max(BM, min_m(dtype)) * BN * K / (R / S) + ceil(K / K_blk) * t_blk
               + t_oh * min(1, max(BM, min_m(dtype)) * BN / 128^2)
                                                       one tile on one core: MMA, the latency of
                                                       each K block, its share of the overhead
    T_comp   = waves * t_tile                          static round-robin, equal-cost tiles
    B_min    = G_act*N*K*e_b + sum M_g*K*e_a + sum M_g*N*e_c   each byte once, active experts
    B_kernel = B_min [+ (G - G_act)*N*K*e_b if the kernel streams all experts]
                     [+ sum (Mpad_g - M_g)*K*e_a if it reads padding rows]
    T_mem    = B_kernel / BW_eff,  BW_eff = min(B, min(tiles, S) * bw_per_core)   (cap optional)
               operands="l2" (operands just written, a benchmark's warm cache): the operand
               bytes B_L2 = B_kernel - output bytes stream at l2_bw if B_L2 <= L2 size (a larger
               call evicts each line before its reuse: B_L2 = 0):
               T_mem = (B_kernel - B_L2) / BW_eff + B_L2 / l2_bw
    T_pred   = max(T_comp, T_mem) + t_fixed            (or (T_comp^p + T_mem^p)^(1/p))
    split-K (split_k = s > 1, contiguous/masked): tiles x s slices of depth ceil(K / s) in t_tile,
               and B_kernel + 2 * s * sum M_g * N * 4 (fp32 partials written, then read back)
    T_ideal  = max(F_useful / peak, B_min / BW)        the plain roofline (speed of light)
    M*       = R * e_b / (2 * B)                       ridge height in rows

``peak`` and ``BW`` are the device's (the roofline); ``R = eta_c * peak_datasheet`` and
``B = eta_b * BW_datasheet`` are what kernels achieve, ``t_oh`` the overhead of a 128 x 128 tile, ``t_blk``
the latency of each ``K_blk``-deep K block in kernels that promote partial sums once per block
(``Hardware.promotion_k``: fp8, 128 on Hopper; none on Blackwell, whose MMA applies block scales
and accumulates in fp32 itself) and ``t_fixed`` the fixed time per call, per device
and kernel implementation (:mod:`.efficiency`). Without achieved figures ``R = peak``, ``B = BW``
and ``t_oh = t_blk = 0`` (the prediction is then an ideal, as the estimate's ``basis`` says).

``e_a``, ``e_b``, ``e_c`` are bytes per element of activations, weights and output; block-scaled
dtypes add their scale bytes (:data:`SCALE_BYTES`). Masked (decode) calls use the same formulas
with ``M_g = masked_m[g]``. K-grouped calls (weight gradients) group the reduction axis: every
non-empty group owns ``ceil(M/BM) * ceil(N/BN)`` output tiles of cost proportional to its ``K_g``;
the compute time is then the makespan of the static round-robin schedule (CTA ``s`` runs tiles
``s, s+S, ...``), which reduces to ``waves * t_tile`` when all tiles cost the same.
"""

from __future__ import annotations

from ..backend import OPS
from ..workloads import DISTRIBUTIONS, SEED_COUNTS, scale_counts, synthetic_counts
from .advisor import DEFAULT_TILES, TIE_BAND, Advice, advise, advise_decode, advise_problem, rank_key
from .hardware import Hardware, resolve_hardware, ridge_m
from .model import Estimate, estimate
from .operands import BYTES_PER_ELEMENT, SCALE_BYTES, default_out_dtype, dtype_name, operand_bytes

__all__ = [
    "Advice",
    "BYTES_PER_ELEMENT",
    "DEFAULT_TILES",
    "DISTRIBUTIONS",
    "Estimate",
    "Hardware",
    "OPS",
    "SCALE_BYTES",
    "SEED_COUNTS",
    "TIE_BAND",
    "advise",
    "advise_decode",
    "advise_problem",
    "default_out_dtype",
    "dtype_name",
    "estimate",
    "operand_bytes",
    "rank_key",
    "resolve_hardware",
    "ridge_m",
    "scale_counts",
    "synthetic_counts",
]
