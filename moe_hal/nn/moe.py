"""The MoE layer: route → dispatch → grouped GEMM → SwiGLU → grouped GEMM → combine (+ shared expert)."""

from __future__ import annotations

import torch
from torch import nn

from ..errors import ArgumentError, CapacityError
from .dispatch import Dispatched, combine, dispatch_contiguous, dispatch_masked
from .experts import GroupedExperts
from .hf import parts_from_hf
from .router import TopKRouter

LAYOUTS = ("contiguous", "masked", "auto")


class MoE(nn.Module):
    """A Mixture-of-Experts block on moe_hal's grouped GEMMs.

    ``forward(x[..., H]) -> y[..., H]``: the router picks ``top_k`` experts per token; tokens are
    dispatched to expert-grouped rows (:meth:`dispatch`), the experts run two grouped GEMMs, and
    :meth:`combine` sums each token's expert outputs weighted by the router; ``shared_expert``
    (any module ``[T, H] -> [T, H]``), if given, is added.

    ``layout``: ``"contiguous"`` (``T * k`` rows, segments aligned to ``alignment``),
    ``"masked"`` (``[E, masked_capacity, H]`` with ``masked_m`` on the device: the decode form,
    fixed shapes for CUDA graphs; at most ``masked_capacity`` tokens per call) or ``"auto"``
    (masked when the call has at most ``masked_capacity`` tokens, contiguous otherwise).

    ``ep_group`` (a :class:`moe_hal.ep.EPGroup`): expert parallel. The router scores all
    ``ep_group.num_experts`` experts, ``experts`` holds only this rank's
    (``ep_group.local_experts``, in that order), and tokens travel with :func:`moe_hal.ep.dispatch`
    / :func:`moe_hal.ep.combine` — ``"contiguous"`` as mode ``"exact"`` (one host sync),
    ``"masked"`` as mode ``"capacity"`` with ``masked_capacity`` rows per (source rank, expert) (no
    host sync). ``"auto"`` is refused with a group: ranks with different token counts would pick
    different modes. Every rank of the group must run every forward and backward.

    :attr:`tokens_per_expert` (int64 ``[E]`` buffer) holds the last forward's slots per expert,
    for load-balancing losses and correction-bias updates. Works forward and backward on every
    backend that takes the layout, and under ``torch.compile(fullgraph=True)``: nothing here reads
    a device value on the host.
    """

    def __init__(
        self,
        router: TopKRouter,
        experts: GroupedExperts,
        shared_expert: nn.Module | None = None,
        layout: str = "contiguous",
        alignment: int = 1,
        masked_capacity: int = 32,
        ep_group=None,
    ):
        super().__init__()
        if layout not in LAYOUTS:
            raise ArgumentError("layout", f"one of {LAYOUTS}", layout)
        if ep_group is not None:
            self._check_ep_group(ep_group, router, experts, layout)
        elif router.num_experts != experts.num_experts:
            raise ArgumentError(
                "experts.num_experts", f"{router.num_experts} (router.num_experts)", experts.num_experts
            )
        if router.hidden != experts.hidden:
            raise ArgumentError("experts.hidden", f"{router.hidden} (router.hidden)", experts.hidden)
        self.router, self.experts, self.shared_expert = router, experts, shared_expert
        self.layout, self.alignment, self.masked_capacity = layout, alignment, masked_capacity
        self.ep_group = ep_group
        self.register_buffer("tokens_per_expert", torch.zeros(router.num_experts, dtype=torch.int64), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = x.reshape(-1, x.shape[-1])
        topk_weights, topk_ids, _ = self.router(hidden)
        if self.ep_group is not None:
            y = self._forward_ep(hidden, topk_ids, topk_weights)
            if self.shared_expert is not None:
                y = y + self.shared_expert(hidden)
            return y.view(x.shape)
        d = self.dispatch(hidden, topk_ids)
        with torch.no_grad():
            self.tokens_per_expert.copy_(d.tokens_per_expert)
        y = self.combine(self.experts(d.a, d.layout, d.row_expert), d, topk_weights)
        if self.shared_expert is not None:
            y = y + self.shared_expert(hidden)
        return y.view(x.shape)

    # -- the seam an expert-parallel dispatch replaces -------------------------------------------------------
    def dispatch(self, hidden: torch.Tensor, topk_ids: torch.Tensor) -> Dispatched:
        """Expert-grouped rows of ``hidden[T, H]`` for ``topk_ids[T, k]``, in this layer's layout."""
        tokens = hidden.shape[0]
        masked = self.layout == "masked" or (self.layout == "auto" and tokens <= self.masked_capacity)
        if not masked:
            return dispatch_contiguous(hidden, topk_ids, self.experts.num_experts, self.alignment)
        if tokens > self.masked_capacity:
            raise CapacityError(
                "x", f"at most masked_capacity = {self.masked_capacity} tokens for the masked layout", tokens
            )
        return dispatch_masked(hidden, topk_ids, self.experts.num_experts, self.masked_capacity)

    def combine(self, expert_out: torch.Tensor, d: Dispatched, topk_weights: torch.Tensor) -> torch.Tensor:
        """``y[T, H]``: each token's expert outputs weighted by ``topk_weights``."""
        return combine(expert_out, d, topk_weights)

    # -- expert parallel -----------------------------------------------------------------------------------------
    @staticmethod
    def _check_ep_group(ep_group, router: TopKRouter, experts: GroupedExperts, layout: str) -> None:
        from ..ep import EPGroup

        if not isinstance(ep_group, EPGroup):
            raise ArgumentError("ep_group", "None or a moe_hal.ep.EPGroup", type(ep_group).__name__)
        if router.num_experts != ep_group.num_experts:
            raise ArgumentError(
                "router.num_experts", f"{ep_group.num_experts} (ep_group.num_experts)", router.num_experts
            )
        if experts.num_experts != ep_group.num_local_experts:
            raise ArgumentError(
                "experts.num_experts",
                f"{ep_group.num_local_experts} (this rank's experts in ep_group.local_experts)",
                experts.num_experts,
            )
        if layout == "auto":
            raise ArgumentError(
                "layout",
                "'contiguous' or 'masked' with an ep_group (every rank must use the same dispatch mode)",
                layout,
            )

    def _forward_ep(self, hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        from .. import ep

        masked = self.layout == "masked"
        d = ep.dispatch(
            hidden,
            topk_ids,
            topk_weights,
            self.ep_group,
            mode="capacity" if masked else "exact",
            alignment=self.alignment,
            capacity=self.masked_capacity if masked else None,
        )
        with torch.no_grad():  # this rank's slots per (global) expert, counted on the device
            ids = topk_ids.reshape(-1)
            self.tokens_per_expert.zero_().scatter_add_(0, ids.clamp(min=0), (ids >= 0).to(torch.int64))
        row_expert = None if masked else d.layout.m_indices(hidden.device).to(torch.int64)
        return ep.combine(self.experts(d.a, d.layout, row_expert), d)

    @classmethod
    def from_hf(
        cls, block: nn.Module, layout: str = "contiguous", alignment: int = 1, masked_capacity: int = 32
    ) -> MoE:
        """An MoE computing what a transformers MoE block (Mixtral, Qwen2/3-MoE, DeepSeek-V3; fused
        or per-expert weights) computes in eval mode, with copies of its weights. Also available as
        :func:`moe_hal.nn.from_hf`. See :mod:`moe_hal.nn.hf`."""
        router, experts, shared = parts_from_hf(block)
        return cls(router, experts, shared, layout=layout, alignment=alignment, masked_capacity=masked_capacity)

    def extra_repr(self) -> str:
        text = f"layout={self.layout!r}, alignment={self.alignment}, masked_capacity={self.masked_capacity}"
        return text if self.ep_group is None else f"{text}, ep_group={self.ep_group!r}"
