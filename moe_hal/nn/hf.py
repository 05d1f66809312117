"""Loading MoE weights from the usual checkpoint layouts, and converting transformers MoE blocks.

Expert weights come in three layouts (``{e}`` is the expert index):

* per-expert ``experts.{e}.gate_proj.weight`` / ``up_proj`` / ``down_proj`` (Qwen-MoE, DeepSeek),
* per-expert ``experts.{e}.w1.weight`` (gate) / ``w3`` (up) / ``w2`` (down) (Mixtral),
* fused ``experts.gate_up_proj [E, 2I, H]`` (gate rows first) and ``experts.down_proj [E, H, I]``
  (transformers >= 5).

:func:`expert_weights` turns any of them into ``(w13 [E, 2I, H], w2 [E, H, I])``;
:func:`parts_from_hf` reads a transformers block by duck typing (the router's ``weight``, ``top_k``, ``norm_topk_prob``, ``e_score_correction_bias``, ``n_group``/
``num_group``, ``topk_group``, ``routed_scaling_factor``; the experts; ``shared_experts``) into the parts
:meth:`moe_hal.nn.MoE.from_hf` assembles (this module knows nothing of ``MoE``). A block with parts this does not model (a gated shared expert, a non-SwiGLU activation) is refused.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

import torch
from torch import nn

from ..errors import ArgumentError, ShapeError
from .experts import GroupedExperts
from .router import TopKRouter

_PER_EXPERT = (("gate_proj", "up_proj", "down_proj"), ("w1", "w3", "w2"))


def expert_weights(
    state_dict: Mapping[str, torch.Tensor], num_experts: int, prefix: str = "experts."
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(w13 [E, 2I, H], w2 [E, H, I])`` from a state dict in any of the module's three layouts
    (keys under ``prefix``). Raises :class:`~moe_hal.errors.ArgumentError` naming the missing key."""
    fused = prefix + "gate_up_proj"
    if fused in state_dict:
        w13, w2 = state_dict[fused], state_dict.get(prefix + "down_proj")
        if w2 is None:
            raise ArgumentError(prefix + "down_proj", "a tensor [E, H, I] next to gate_up_proj", "missing")
        if w13.dim() != 3 or w13.shape[0] != num_experts:
            raise ShapeError(fused, f"[{num_experts}, 2I, H]", tuple(w13.shape))
        if w2.shape != (num_experts, w13.shape[2], w13.shape[1] // 2):
            raise ShapeError(
                prefix + "down_proj",
                f"[{num_experts}, {w13.shape[2]}, {w13.shape[1] // 2}] (from gate_up_proj [E, 2I, H])",
                tuple(w2.shape),
            )
        return w13, w2
    for gate, up, down in _PER_EXPERT:
        if f"{prefix}0.{gate}.weight" in state_dict:

            def get(e: int, name: str) -> torch.Tensor:
                key = f"{prefix}{e}.{name}.weight"
                if key not in state_dict:
                    raise ArgumentError(key, "a weight tensor", "missing")
                return state_dict[key]

            w13 = torch.stack([torch.cat([get(e, gate), get(e, up)], dim=0) for e in range(num_experts)])
            w2 = torch.stack([get(e, down) for e in range(num_experts)])
            return w13, w2
    raise ArgumentError(
        "state_dict",
        f"expert weights under {prefix!r}: gate_up_proj/down_proj, or per-expert "
        "gate_proj/up_proj/down_proj or w1/w3/w2",
        sorted(state_dict)[:8],
    )


def router_from_hf(block: nn.Module) -> TopKRouter:
    """A :class:`TopKRouter` equal to the block's router (softmax unless it has a correction bias)."""
    gate = block.gate
    weight = gate.weight
    num_experts, hidden = weight.shape
    top_k = getattr(gate, "top_k", None) or getattr(block, "top_k", None)
    if top_k is None:
        raise ArgumentError("block.gate.top_k", "the number of experts per token", "missing")
    bias = getattr(gate, "e_score_correction_bias", None)
    n_group = getattr(gate, "n_group", getattr(gate, "num_group", None))
    topk_group = getattr(gate, "topk_group", None)
    if n_group == 1 and topk_group == 1:  # one group: not group-limited
        n_group = topk_group = None
    norm = getattr(gate, "norm_topk_prob", getattr(block, "norm_topk_prob", True))
    router = TopKRouter(
        hidden,
        num_experts,
        top_k,
        score="sigmoid" if bias is not None else "softmax",
        n_group=n_group,
        topk_group=topk_group,
        correction_bias=bias is not None,
        norm_topk_prob=bool(norm),
        routed_scaling_factor=float(getattr(gate, "routed_scaling_factor", 1.0)),
        dtype=weight.dtype,
        device=weight.device,
    )
    with torch.no_grad():
        router.weight.copy_(weight)
        if bias is not None:
            router.correction_bias.copy_(bias)
    return router


def experts_from_hf(experts: nn.Module, num_experts: int) -> GroupedExperts:
    """A :class:`GroupedExperts` with copies of a transformers experts module's weights."""
    act = getattr(experts, "act_fn", None)
    if act is None and isinstance(experts, nn.ModuleList) and len(experts):
        act = getattr(experts[0], "act_fn", None)
    if act is not None:
        probe = torch.linspace(-4, 4, 17)  # by behaviour: activation classes differ across versions
        if not torch.allclose(act(probe), torch.nn.functional.silu(probe)):
            raise ArgumentError("block.experts.act_fn", "SiLU (SwiGLU experts)", type(act).__name__)
    w13, w2 = expert_weights(experts.state_dict(prefix=""), num_experts, prefix="")
    out = GroupedExperts(num_experts, w13.shape[2], w13.shape[1] // 2, dtype=w13.dtype, device=w13.device)
    with torch.no_grad():
        out.w13.copy_(w13)
        out.w2.copy_(w2)
    return out


def parts_from_hf(block: nn.Module) -> tuple[TopKRouter, GroupedExperts, nn.Module | None]:
    """``(router, experts, shared_expert)`` computing what ``block`` (a transformers MoE block)
    computes, in eval mode (router jitter noise is a training-time perturbation and is not
    reproduced), each holding copies of the block's weights."""
    if getattr(block, "shared_expert_gate", None) is not None:
        raise ArgumentError(
            "block.shared_expert_gate",
            "no gated shared expert (not modelled by moe_hal.nn.MoE)",
            type(block.shared_expert_gate).__name__,
        )
    router = router_from_hf(block)
    experts = experts_from_hf(block.experts, router.num_experts)
    shared = getattr(block, "shared_experts", None)
    return router, experts, copy.deepcopy(shared) if shared is not None else None
