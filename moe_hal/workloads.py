"""Workloads: routing histograms (rows per expert) for benchmarks, the model and tests.

The distributions are ``uniform``, ``balanced``, ``zipf:A`` and ``seed`` (the 32-expert histogram of
DeepGEMM issue #211); :func:`synthetic_counts` draws a histogram, :func:`scale_counts` rescales
one, :func:`masked_decode_counts` draws a decode step's ``masked_m`` and :func:`route_tokens` draws
the router's ``topk_ids``/``topk_weights`` themselves (torch, imported only there).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from .checks import group_counts, positive_int
from .errors import ArgumentError

#: The 32-expert routing histogram of DeepGEMM issue #211 (seed ``000``): 8048 rows, 25 active.
SEED_COUNTS: tuple[int, ...] = (
    4,
    1026,
    1799,
    166,
    694,
    753,
    0,
    16,
    0,
    240,
    1119,
    19,
    6,
    0,
    46,
    659,
    10,
    0,
    112,
    808,
    181,
    0,
    28,
    22,
    90,
    0,
    176,
    0,
    37,
    5,
    10,
    22,
)


DISTRIBUTIONS = ("uniform", "balanced", "zipf:A", "seed")


def synthetic_counts(dist: str, tokens: int | None, experts: int, topk: int = 1, seed: int = 0) -> list[int]:
    """Rows per expert for ``tokens`` tokens each routed to ``topk`` distinct of ``experts``.

    ``uniform``: each token picks its experts uniformly at random. ``balanced``: exactly
    ``tokens * topk / experts`` each (the remainder to the first experts). ``zipf:A``: expert
    popularity proportional to ``rank^-A`` over a random ranking, ``topk`` drawn without
    replacement. ``seed``: :data:`SEED_COUNTS` (32 experts), scaled to ``tokens * topk`` rows
    when ``tokens`` is given. The sum is always ``tokens * topk``. Deterministic in ``seed``.
    """
    experts = positive_int(experts, "experts")
    topk = positive_int(topk, "topk")
    if not isinstance(dist, str):
        raise ArgumentError("dist", f"one of {DISTRIBUTIONS}", dist)
    if dist == "seed":
        if experts != len(SEED_COUNTS):
            raise ArgumentError("experts", f"{len(SEED_COUNTS)} for dist='seed'", experts)
        if tokens is None:
            return list(SEED_COUNTS)
        return scale_counts(SEED_COUNTS, positive_int(tokens, "tokens") * topk)
    tokens = positive_int(tokens, "tokens")
    if topk > experts:
        raise ArgumentError("topk", f"<= experts ({experts})", topk)
    if dist == "balanced":
        q, r = divmod(tokens * topk, experts)
        return [q + (1 if e < r else 0) for e in range(experts)]
    import numpy as np  # sampling 10^5..10^6 picks is only practical vectorised

    rng = np.random.default_rng(seed)
    if dist == "uniform":
        log_w = np.zeros(experts)
    elif dist.startswith("zipf:"):
        try:
            alpha = float(dist.split(":", 1)[1])
        except ValueError:
            raise ArgumentError("dist", "zipf:A with a number A >= 0, e.g. zipf:1.2", dist) from None
        if not alpha >= 0 or math.isinf(alpha):
            raise ArgumentError("dist", "zipf:A with a number A >= 0, e.g. zipf:1.2", dist)
        ranks = rng.permutation(experts) + 1
        log_w = -alpha * np.log(ranks)
    else:
        raise ArgumentError("dist", f"one of {DISTRIBUTIONS}", dist)
    # Gumbel top-k draws topk distinct experts per token with probabilities proportional to w.
    keys = log_w[None, :] + rng.gumbel(size=(tokens, experts))
    picks = np.argpartition(-keys, topk - 1, axis=1)[:, :topk]
    return [int(c) for c in np.bincount(picks.ravel(), minlength=experts)]


def scale_counts(counts: Sequence[int], total: int) -> list[int]:
    """``counts`` rescaled to sum to ``total`` by largest remainders; zeros stay zero."""
    values = group_counts(counts)
    total = int(total)
    if total < 0:
        raise ArgumentError("total", "a non-negative int", total)
    s = sum(values)
    if s == 0:
        raise ArgumentError("counts", "at least one non-zero count to scale", list(values))
    exact = [c * total / s for c in values]
    out = [int(math.floor(x)) for x in exact]
    order = sorted(range(len(values)), key=lambda i: (-(exact[i] - out[i]), i))
    for i in order[: total - sum(out)]:
        out[i] += 1
    return out


def route_tokens(tokens: int, experts: int, topk: int, dist: str = "uniform", seed: int = 0) -> tuple[Any, Any]:
    """Router output for ``tokens`` tokens: ``topk_ids`` int64 ``[tokens, topk]`` (distinct experts
    per token) and ``topk_weights`` fp32 ``[tokens, topk]`` (each row sums to 1), on the CPU.

    Expert popularity follows ``dist``: ``uniform``, ``zipf:A`` (``rank^-A`` over a random ranking)
    or ``seed`` (proportional to :data:`SEED_COUNTS`; 32 experts, those with no rows never chosen).
    Gumbel top-k samples ``topk`` distinct experts per token without replacement. Deterministic in
    ``seed``. Raises :class:`~moe_hal.errors.ArgumentError` naming ``experts``, ``dist`` or ``topk``.
    """
    import torch

    g = torch.Generator().manual_seed(seed)
    if dist == "seed":
        if experts != len(SEED_COUNTS):
            raise ArgumentError("experts", f"{len(SEED_COUNTS)} for dist 'seed'", experts)
        log_w = torch.tensor(SEED_COUNTS, dtype=torch.float64).log()
    elif dist == "uniform":
        log_w = torch.zeros(experts, dtype=torch.float64)
    elif isinstance(dist, str) and dist.startswith("zipf:"):
        try:
            alpha = float(dist.split(":", 1)[1])
        except ValueError:
            raise ArgumentError("dist", "zipf:A with a number A, e.g. zipf:1.2", dist) from None
        log_w = -alpha * (torch.randperm(experts, generator=g) + 1).double().log()
    else:
        raise ArgumentError("dist", "seed, uniform or zipf:A", dist)
    choosable = int(torch.isfinite(log_w).sum())
    if topk > choosable:
        raise ArgumentError("topk", f"at most the {choosable} experts that can be chosen", topk)
    gumbel = -torch.empty(tokens, experts, dtype=torch.float64).exponential_(generator=g).log()
    topk_ids = (log_w + gumbel).topk(topk, dim=1).indices
    topk_weights = torch.rand(tokens, topk, generator=g).softmax(dim=1)
    return topk_ids, topk_weights


def masked_decode_counts(mean: int, groups: int, max_m: int, seed: int = 0) -> list[int]:
    """Valid rows per group of a masked decode step: ``mean * groups / topk`` tokens routed
    uniformly to ``topk = min(8, groups)`` experts each, capped at ``max_m`` rows per group."""
    topk = min(8, groups)
    return [min(c, max_m) for c in synthetic_counts("uniform", mean * groups // topk, groups, topk, seed)]
