"""Top-k token routers: softmax top-k (Mixtral, Qwen-MoE) and sigmoid group-limited top-k with a
score-correction bias (DeepSeek-V3)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..dtypes import accumulation_dtype
from ..errors import ArgumentError

SCORES = ("softmax", "sigmoid")


class TopKRouter(nn.Module):
    """Routes each token to ``top_k`` of ``num_experts`` experts.

    ``forward(x[T, hidden])`` returns ``(topk_weights [T, top_k], topk_ids int64 [T, top_k],
    logits [T, num_experts])``, weights and logits in fp32 (fp64 for fp64 inputs):

    * ``score="softmax"``: ``p = softmax(logits)``; the top-k of ``p`` (Mixtral, Qwen-MoE).
    * ``score="sigmoid"``: ``p = sigmoid(logits)``; experts are *chosen* by ``p + bias`` (the
      correction bias, a buffer updated outside the optimizer for load balance) but *weighted* by
      ``p`` (DeepSeek-V3).
    * ``n_group``/``topk_group``: group-limited routing: experts form ``n_group`` equal groups, a
      group scores the sum of its two best choice scores, and only the ``topk_group`` best groups
      are eligible.
    * ``norm_topk_prob``: the k weights are divided by their sum (``+1e-20`` for sigmoid scores);
      then multiplied by ``routed_scaling_factor``.

    Softmax routers compute logits in the dtype of ``x``/``weight`` and score them in fp32
    (Mixtral, Qwen-MoE); sigmoid routers compute logits in fp32 (DeepSeek-V3). ``weight``:
    ``[num_experts, hidden]`` (nn.Linear layout).
    """

    def __init__(
        self,
        hidden: int,
        num_experts: int,
        top_k: int,
        score: str = "softmax",
        n_group: int | None = None,
        topk_group: int | None = None,
        correction_bias: bool = False,
        norm_topk_prob: bool = True,
        routed_scaling_factor: float = 1.0,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ):
        super().__init__()
        if score not in SCORES:
            raise ArgumentError("score", f"one of {SCORES}", score)
        if not 1 <= top_k <= num_experts:
            raise ArgumentError("top_k", f"an int in [1, num_experts = {num_experts}]", top_k)
        if (n_group is None) != (topk_group is None):
            raise ArgumentError("topk_group", "given together with n_group (both or neither)", topk_group)
        if n_group is not None:
            if n_group < 1 or num_experts % n_group:
                raise ArgumentError("n_group", f"a divisor of num_experts = {num_experts}", n_group)
            if not 1 <= topk_group <= n_group:
                raise ArgumentError("topk_group", f"an int in [1, n_group = {n_group}]", topk_group)
            if topk_group * (num_experts // n_group) < top_k:
                raise ArgumentError("topk_group", f"enough groups to hold top_k = {top_k} experts", topk_group)
        self.hidden, self.num_experts, self.top_k, self.score = hidden, num_experts, top_k, score
        self.n_group, self.topk_group = n_group, topk_group
        self.norm_topk_prob, self.routed_scaling_factor = norm_topk_prob, routed_scaling_factor
        self.weight = nn.Parameter(torch.empty(num_experts, hidden, dtype=dtype, device=device))
        nn.init.normal_(self.weight, std=hidden**-0.5)
        if correction_bias:
            self.register_buffer("correction_bias", torch.zeros(num_experts, dtype=torch.float32, device=device))
        else:
            self.correction_bias = None

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        score_dtype = accumulation_dtype(x.dtype)
        if self.score == "softmax":
            logits = F.linear(x, self.weight.to(x.dtype)).to(score_dtype)
            probs = logits.softmax(dim=-1)
        else:
            logits = F.linear(x.to(score_dtype), self.weight.to(score_dtype))
            probs = logits.sigmoid()
        choice = probs if self.correction_bias is None else probs + self.correction_bias
        if self.n_group is not None:
            per_group = choice.view(-1, self.n_group, self.num_experts // self.n_group)
            group_scores = per_group.topk(min(2, per_group.shape[-1]), dim=-1).values.sum(dim=-1)
            best = group_scores.topk(self.topk_group, dim=-1, sorted=False).indices
            allowed = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best, True)
            allowed = allowed.unsqueeze(-1).expand_as(per_group).reshape(choice.shape)
            choice = choice.masked_fill(~allowed, float("-inf"))
        if self.correction_bias is None and self.n_group is None:
            weights, ids = probs.topk(self.top_k, dim=-1)
        else:
            ids = choice.topk(self.top_k, dim=-1).indices
            weights = probs.gather(1, ids)
        if self.norm_topk_prob:
            eps = 1e-20 if self.score == "sigmoid" else 0.0
            weights = weights / (weights.sum(dim=-1, keepdim=True) + eps)
        if self.routed_scaling_factor != 1.0:
            weights = weights * self.routed_scaling_factor
        return weights, ids, logits

    def extra_repr(self) -> str:
        text = f"hidden={self.hidden}, num_experts={self.num_experts}, top_k={self.top_k}, score={self.score!r}"
        if self.n_group is not None:
            text += f", n_group={self.n_group}, topk_group={self.topk_group}"
        return text + f", correction_bias={self.correction_bias is not None}"
