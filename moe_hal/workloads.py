"""Workloads: routing histograms (rows per expert) for benchmarks, the model and tests, and the
cases of the ``moe-hal bench`` sweep.

The distributions are ``uniform``, ``balanced``, ``zipf:A`` and ``seed`` (the 32-expert histogram of
DeepGEMM issue #211); :func:`synthetic_counts` draws a histogram, :func:`scale_counts` rescales
one, :func:`masked_decode_counts` draws a decode step's ``masked_m`` and :func:`route_tokens` draws
the router's ``topk_ids``/``topk_weights`` themselves (torch, imported only there).
:data:`MODEL_SHAPES` holds the expert GEMM shapes of real models and :func:`sweep` the benchmark's
cases built from them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
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


# Expert GEMM shapes (weights [G, N, K]):
# DeepSeek-V3: hidden 7168, moe_intermediate 2048, 256 routed experts, top-8
#   (huggingface.co/deepseek-ai/DeepSeek-V3 config.json); gate+up fused N = 2*2048, K = 7168, down
#   N = 7168, K = 2048 (DeepGEMM's test shapes); 32 local experts = expert parallelism 8.
# Qwen3-30B-A3B: hidden 2048, moe_intermediate 768, 128 experts, top-8
#   (huggingface.co/Qwen/Qwen3-30B-A3B config.json; also THUDM/slime scripts/models/qwen3-30B-A3B.sh).
# Qwen3-235B-A22B: hidden 4096, moe_intermediate 1536, 128 experts, top-8
#   (huggingface.co/Qwen/Qwen3-235B-A22B config.json; also slime scripts/models/qwen3-235B-A22B.sh).
#: name -> (description, N, K, local experts G).
MODEL_SHAPES = {
    "dsv3-gateup": ("DeepSeek-V3 gate+up", 4096, 7168, 32),
    "dsv3-down": ("DeepSeek-V3 down", 7168, 2048, 32),
    "q30b-gateup": ("Qwen3-30B-A3B gate+up", 1536, 2048, 128),
    "q30b-down": ("Qwen3-30B-A3B down", 2048, 768, 128),
    "q235b-gateup": ("Qwen3-235B-A22B gate+up", 3072, 4096, 128),
    "q235b-down": ("Qwen3-235B-A22B down", 4096, 1536, 128),
}


@dataclass
class Case:
    """One grouped-GEMM call of a benchmark. ``op``: contiguous, masked or k_grouped; ``dtype``:
    fp32, bf16, fp16 or fp8 (1x128 / 128x128 block-scaled e4m3). ``counts``: rows per group
    (contiguous, aligned to ``alignment``), ``masked_m`` (masked, ``max_m`` rows per group) or
    tokens per group (k_grouped: ``m`` output rows per group, ``k`` None)."""

    name: str
    source: str
    op: str
    dtype: str
    n: int
    k: int | None
    counts: list[int]
    m: int | None = None
    max_m: int | None = None
    dist: str = ""
    alignment: int = 128


def sweep(full: bool, dtype: str, fp8: bool, seed: int = 0) -> list[Case]:
    """The cases of ``moe-hal bench``: the quick (CPU-sized) or full (GPU-sized, the shapes of
    :data:`MODEL_SHAPES`) sweep in ``dtype``; ``fp8`` adds block-scaled fp8 cases. Histograms are
    deterministic in ``seed``."""
    return _full_sweep(dtype, fp8, seed) if full else _quick_sweep(dtype, fp8, seed)


def _quick_sweep(dtype: str, fp8: bool, seed: int) -> list[Case]:
    def counts(dist: str, tokens: int = 128) -> list[int]:
        return synthetic_counts(dist, tokens, 8, 2, seed)

    cases = [
        Case(f"small-{d}", "synthetic", "contiguous", dtype, 256, 512, counts(d), dist=d)
        for d in ("uniform", "zipf:1.2")
    ]
    cases.append(
        Case("small-seed", "issue #211 histogram", "contiguous", dtype, 128, 256, list(SEED_COUNTS), dist="seed")
    )
    for m in (4, 16):
        decode = masked_decode_counts(m, 8, 32, seed)
        cases.append(
            Case(
                f"small-decode-m{m}", "synthetic", "masked", dtype, 256, 512, decode, max_m=32, dist=f"uniform mean {m}"
            )
        )
    wgrad = counts("zipf:1.2", 256)
    cases.append(Case("small-wgrad", "synthetic", "k_grouped", dtype, 256, None, wgrad, m=128, dist="zipf:1.2"))
    if fp8:
        uniform = counts("uniform")
        cases.append(Case("small-fp8-uniform", "synthetic", "contiguous", "fp8", 256, 512, uniform, dist="uniform"))
    return cases


def _full_sweep(dtype: str, fp8: bool, seed: int) -> list[Case]:
    cases: list[Case] = []

    def add(shape: str, dist: str, tokens: int | None, dt: str = dtype) -> None:
        source, n, k, experts = MODEL_SHAPES[shape]
        if dist == "seed":
            c = synthetic_counts("seed", tokens, 32, 8) if tokens else list(SEED_COUNTS)
        else:
            c = synthetic_counts(dist, tokens, experts, 8, seed)
        suffix = "" if dt == dtype else f"-{dt}"
        cases.append(Case(f"{shape}-{dist}-{sum(c)}{suffix}", source, "contiguous", dt, n, k, c, dist=dist))

    def decode(shape: str, m: int, max_m: int, dt: str = dtype) -> None:
        source, n, k, experts = MODEL_SHAPES[shape]
        suffix = "" if dt == dtype else f"-{dt}"
        c = masked_decode_counts(m, experts, max_m, seed)
        name = f"{shape}-decode-m{m}{suffix}"
        cases.append(Case(name, source + " decode", "masked", dt, n, k, c, max_m=max_m, dist=f"uniform mean {m}"))

    for shape in ("dsv3-gateup", "dsv3-down"):
        for dist in ("uniform", "zipf:0.8", "zipf:1.2"):
            add(shape, dist, 1024)
        add(shape, "seed", None)
    add("dsv3-gateup", "seed", 4024)  # the seed histogram x4: 32192 rows
    for shape in ("q30b-gateup", "q30b-down"):
        for dist in ("uniform", "zipf:1.2"):
            add(shape, dist, 4096)
    for shape in ("q235b-gateup", "q235b-down"):
        for dist in ("uniform", "zipf:1.2"):
            add(shape, dist, 2048)
    for m in (4, 16, 64):
        decode("dsv3-gateup", m, 128)
    for m in (8, 32):
        decode("dsv3-down", m, 128)
    for m in (4, 16):
        decode("q235b-gateup", m, 64)
    # weight gradients: dW[g] = dy[rows_g].T @ x[rows_g] -> out [G, N_fwd, K_fwd]
    for name, source, n, m, dist, tokens, experts in (
        ("q30b-gateup-wgrad-uniform", "Qwen3-30B-A3B gate+up wgrad", 2048, 1536, "uniform", 4096, 128),
        ("dsv3-down-wgrad-zipf:1.2", "DeepSeek-V3 down wgrad", 2048, 7168, "zipf:1.2", 1024, 32),
    ):
        c = synthetic_counts(dist, tokens, experts, 8, seed)
        cases.append(Case(name, source, "k_grouped", dtype, n, None, c, m=m, dist=dist))
    if fp8:
        add("dsv3-gateup", "uniform", 1024, dt="fp8")
        add("dsv3-gateup", "seed", None, dt="fp8")
        add("dsv3-down", "zipf:1.2", 1024, dt="fp8")
        add("q235b-gateup", "uniform", 2048, dt="fp8")
        decode("dsv3-gateup", 16, 128, dt="fp8")
        decode("dsv3-down", 32, 128, dt="fp8")
    return cases
