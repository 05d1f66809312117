"""The main job of ``moe-hal run``, shared by the single-process run (:mod:`.run`) and the
expert-parallel one (:mod:`.run_ep`): the routed tokens and expert weights, the verification
bound, and how a result is printed or written.

Both commands build the same global problem from the same seeds, so that ``run --ep W`` verifies
the very tokens ``run`` would compute.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any, Callable

#: calc_diff bound per operand dtype (DeepGEMM's thresholds; fp8 against the dequantized operands).
CALC_DIFF_MAX = {"fp32": 1e-9, "bf16": 1e-5, "fp16": 1e-5, "fp8_e4m3": 1e-5}


def is_fp8(dtype: str) -> bool:
    """Whether the ``--dtype`` text asks for block-scaled fp8 e4m3 operands."""
    return dtype.lower() in ("fp8", "fp8_e4m3", "e4m3")


def route(tokens: int, experts: int, topk: int, dist: str, seed: int) -> tuple[Any, Any]:
    """Router output (:func:`moe_hal.workloads.route_tokens`), errors naming the CLI options."""
    from .. import workloads
    from ..errors import ArgumentError

    try:
        return workloads.route_tokens(tokens, experts, topk, dist, seed)
    except ArgumentError as exc:
        raise ArgumentError(f"--{exc.argument}", exc.expected, exc.actual, exc.detail) from None


def tensors(*, tokens: int, experts: int, n: int, k: int, topk: int, dtype: str, dist: str, seed: int) -> tuple:
    """``(hidden [tokens, k], weights [experts, n, k], topk_ids int64 [tokens, topk], topk_weights
    fp32 [tokens, topk], generator)`` on the CPU; hidden and weights in ``dtype``, bf16 for fp8
    (the caller quantizes, with the blocks its op needs); further data the caller draws comes
    from ``generator``, which drew hidden and weights."""
    import torch

    from .. import dtypes

    dt = torch.bfloat16 if is_fp8(dtype) else dtypes.parse(dtype)
    g = torch.Generator().manual_seed(seed + 1)
    topk_ids, topk_weights = route(tokens, experts, topk, dist, seed)
    hidden = torch.randn(tokens, k, generator=g).to(dt)
    weights = (torch.randn(experts, n, k, generator=g) / math.sqrt(k)).to(dt)
    return hidden, weights, topk_ids, topk_weights, g


def described(args: argparse.Namespace, in_dtype: str) -> dict[str, Any]:
    """The problem as a result reports it: the options that define it, the operand dtype named."""
    fields = ("experts", "n", "k", "tokens", "topk", "dtype", "dist", "alignment", "seed")
    return {name: in_dtype if name == "dtype" else getattr(args, name) for name in fields}


def counts_of(layout: Any) -> list[int]:
    """Rows per expert of a contiguous, K-grouped or masked layout."""
    if hasattr(layout, "counts_list"):
        return list(layout.counts_list)
    return [int(v) for v in layout.masked_m.tolist()]


def verify(got: Any, want: Any, in_dtype: str) -> tuple[float, bool]:
    """``(calc_diff, passed)`` of ``got`` against ``want``: within :data:`CALC_DIFF_MAX` for the
    operand dtype, finite and of the same shape."""
    import torch

    from ..conformance.tolerances import calc_diff

    diff = calc_diff(got, want)
    return diff, diff <= CALC_DIFF_MAX[in_dtype] and bool(torch.isfinite(got).all()) and got.shape == want.shape


def emit(result: dict[str, Any], args: argparse.Namespace, show: Callable[[dict[str, Any]], None]) -> None:
    """Print ``result`` as JSON (``--json``) or through ``show``; with ``--out``, also write the JSON."""
    text = json.dumps(result, indent=2)
    if args.json:
        print(text)
    else:
        show(result)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


def verdict(verified: bool, against: str) -> Any:
    """The last line of a run: green "verified against ``against``", or red "FAILED verification"."""
    from . import render

    return (
        render.text(f"verified against {against}", "green") if verified else render.text("FAILED verification", "red")
    )
