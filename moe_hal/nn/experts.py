"""Grouped SwiGLU experts: two grouped GEMMs around the gated activation, one expert per group."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..api import grouped_gemm
from ..errors import ArgumentError, GradientError
from ..layouts import MaskedLayout
from ..quant import QuantizedTensor, quantize_fp8

ACTIVATIONS = ("swiglu",)
#: DeepGEMM's fp8 blocks: 1x128 per-token activation groups, 128x128 weight blocks.
_ACT_BLOCK, _WEIGHT_BLOCK = (1, 128), (128, 128)


class GroupedExperts(nn.Module):
    """``num_experts`` SwiGLU MLPs applied to expert-grouped rows.

    Weights follow nn.Linear (and transformers' fused expert tensors): ``w13 [E, 2I, H]`` holds
    each expert's gate rows ``[:I]`` then up rows ``[I:]``; ``w2 [E, H, I]``. With ``bias``:
    ``b13 [E, 2I]``, ``b2 [E, H]``.

    ``forward(a, layout, row_expert=None)``: ``a`` is ``[rows, H]`` with a contiguous layout
    (:class:`~moe_hal.ContiguousLayout` or :class:`~moe_hal.PsumLayout`) or ``[E, max_m, H]`` with
    a :class:`~moe_hal.MaskedLayout`; returns ``w2 @ (silu(gate) * up)`` per row, same leading
    shape, ``[..., H]``. ``row_expert`` (int ``[rows]``, -1 on rows of no group) is needed only for
    biases on the contiguous layout. Rows of no group stay zero without biases.

    :meth:`prepare_fp8` quantizes the weights once (128x128 blocks); later forwards quantize the
    activations per token (1x128) and run fp8 grouped GEMMs, forward only.
    """

    def __init__(
        self,
        num_experts: int,
        hidden: int,
        intermediate: int,
        activation: str = "swiglu",
        bias: bool = False,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ArgumentError("activation", f"one of {ACTIVATIONS}", activation)
        self.num_experts, self.hidden, self.intermediate, self.activation = (
            num_experts,
            hidden,
            intermediate,
            activation,
        )
        self.w13 = nn.Parameter(torch.empty(num_experts, 2 * intermediate, hidden, dtype=dtype, device=device))
        self.w2 = nn.Parameter(torch.empty(num_experts, hidden, intermediate, dtype=dtype, device=device))
        nn.init.normal_(self.w13, std=hidden**-0.5)
        nn.init.normal_(self.w2, std=intermediate**-0.5)
        if bias:
            self.b13 = nn.Parameter(torch.zeros(num_experts, 2 * intermediate, dtype=dtype, device=device))
            self.b2 = nn.Parameter(torch.zeros(num_experts, hidden, dtype=dtype, device=device))
        else:
            self.b13 = self.b2 = None
        self._fp8: tuple[QuantizedTensor, QuantizedTensor] | None = None

    @torch.no_grad()
    def prepare_fp8(self) -> None:
        """Quantize ``w13`` and ``w2`` to fp8 (128x128 blocks) once; forwards then run in fp8.
        Call again after the weights change; :meth:`drop_fp8` returns to the float weights."""
        self._fp8 = (quantize_fp8(self.w13.detach(), _WEIGHT_BLOCK), quantize_fp8(self.w2.detach(), _WEIGHT_BLOCK))

    def drop_fp8(self) -> None:
        self._fp8 = None

    def forward(self, a: torch.Tensor, layout, row_expert: torch.Tensor | None = None) -> torch.Tensor:
        masked = isinstance(layout, MaskedLayout)
        h = self._gemm(a, 0, layout)
        if self.b13 is not None:
            h = h + self._bias(self.b13, h, masked, row_expert)
        gate, up = h.split(self.intermediate, dim=-1)
        out = self._gemm(F.silu(gate) * up, 1, layout)
        if self.b2 is not None:
            out = out + self._bias(self.b2, out, masked, row_expert)
        return out

    def _gemm(self, x: torch.Tensor, which: int, layout) -> torch.Tensor:
        if self._fp8 is None:
            return grouped_gemm(x, self.w13 if which == 0 else self.w2, layout)
        if torch.is_grad_enabled() and x.requires_grad:
            raise GradientError(
                "GroupedExperts",
                "torch.no_grad() or float weights (drop_fp8()) for a gradient",
                "fp8 weights from prepare_fp8(), which are forward only",
            )
        out = grouped_gemm(quantize_fp8(x, _ACT_BLOCK), self._fp8[which], layout)
        return out.to(x.dtype)

    @staticmethod
    def _bias(bias: torch.Tensor, h: torch.Tensor, masked: bool, row_expert: torch.Tensor | None) -> torch.Tensor:
        if masked:
            return bias[:, None, :]
        if row_expert is None:
            raise ArgumentError("row_expert", "the expert of each row (int [rows], -1 for none) when bias=True", None)
        return torch.where((row_expert >= 0)[:, None], bias[row_expert.clamp(min=0)], 0).to(h.dtype)

    def extra_repr(self) -> str:
        return (
            f"num_experts={self.num_experts}, hidden={self.hidden}, intermediate={self.intermediate}, "
            f"activation={self.activation!r}, bias={self.b13 is not None}, fp8={self._fp8 is not None}"
        )
