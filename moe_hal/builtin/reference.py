"""The ``reference`` backend: float64 per-group products, the oracle.

Each group is computed on its own in float64 from the dequantized operands and rounded once to
the output dtype. It runs on the tensors' device when that device has float64 matmul (CPU, CUDA)
and on the CPU otherwise. It reads group sizes on the host, so it is neither fast nor capturable
in a CUDA graph — it exists to be obviously right.
"""

from __future__ import annotations

import torch

from ..backend import Backend
from ..problem import Problem
from ..quant import QuantizedTensor

_F64_DEVICES = ("cpu", "cuda")


def rows_f64(x: torch.Tensor | QuantizedTensor, start: int, end: int, device: torch.device) -> torch.Tensor:
    """Rows ``start:end`` of a 2-D operand as float64 on ``device``, dequantized if needed."""
    if not isinstance(x, QuantizedTensor):
        return x[start:end].to(device=device, dtype=torch.float64)
    block_rows, block_cols = x.block
    rows = torch.arange(start, end, device=x.scale.device) // block_rows
    scale = x.scale.index_select(0, rows).repeat_interleave(block_cols, dim=1)[:, : x.data.shape[1]]
    return (x.data[start:end].to(torch.float64) * scale.to(torch.float64)).to(device)


def group_of(x: torch.Tensor | QuantizedTensor, g: int) -> torch.Tensor | QuantizedTensor:
    """Group ``g`` of a 3-D operand, as a 2-D operand."""
    if isinstance(x, QuantizedTensor):
        return QuantizedTensor(x.data[g], x.scale[g], x.block, x.scale_format)
    return x[g]


class ReferenceBackend(Backend):
    """float64 per-group products on any device."""

    def describe_path(self, problem: Problem) -> str:
        return "float64 per-group products (the oracle; slow, host-synchronising)"

    def run(self, problem: Problem, out: torch.Tensor | None) -> torch.Tensor:
        work = problem.device if problem.device.type in _F64_DEVICES else torch.device("cpu")
        out = problem.new_out() if out is None else out
        if problem.op == "contiguous":
            self._contiguous(problem, out, work)
        elif problem.op == "masked":
            self._masked(problem, out, work)
        else:
            self._k_grouped(problem, out, work)
        return out

    def _contiguous(self, p: Problem, out: torch.Tensor, work: torch.device) -> None:
        result = torch.zeros(p.m, p.n, dtype=torch.float64, device=work)
        for g, start, end in p.layout.segments():
            if end > start:
                w = rows_f64(group_of(p.b, g), 0, p.n, work)
                result[start:end] = rows_f64(p.a, start, end, work) @ w.T
        out.copy_(result.to(out.dtype))

    def _masked(self, p: Problem, out: torch.Tensor, work: torch.device) -> None:
        counts = [min(int(v), p.m) for v in p.layout.masked_m.tolist()]
        results = []
        for g, rows in enumerate(counts):
            if rows > 0:
                w = rows_f64(group_of(p.b, g), 0, p.n, work)
                results.append((g, rows, rows_f64(group_of(p.a, g), 0, rows, work) @ w.T))
        for g, rows, value in results:
            out[g, :rows].copy_(value.to(out.dtype))

    def _k_grouped(self, p: Problem, out: torch.Tensor, work: torch.device) -> None:
        result = torch.zeros(p.num_groups, p.m, p.n, dtype=torch.float64, device=work)
        if p.c is not None:
            result += p.c.to(device=work, dtype=torch.float64)
        for g, start, end in p.layout.segments():
            if end > start:
                result[g] += rows_f64(p.a, start, end, work).T @ rows_f64(p.b, start, end, work)
        out.copy_(result.to(out.dtype))
