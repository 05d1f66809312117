"""The fake vendor's backend: a straightforward per-group implementation of the contracts."""

import torch

import moe_hal


class FakeVendorBackend(moe_hal.Backend):
    def describe_path(self, problem):
        return "per-group torch.mm with fp32 accumulation (test vendor)"

    def run(self, problem, out):
        out = problem.new_out() if out is None else out
        a, b = problem.a.float(), problem.b.float()
        if problem.op == "contiguous":
            result = torch.zeros(problem.m, problem.n)
            for g, start, end in problem.layout.segments():
                result[start:end] = a[start:end] @ b[g].T
            out.copy_(result)
        elif problem.op == "masked":
            for g, rows in enumerate(problem.layout.masked_m.tolist()):
                out[g, :rows].copy_(a[g, :rows] @ b[g].T)
        else:
            result = torch.zeros(problem.num_groups, problem.m, problem.n)
            if problem.c is not None:
                result += problem.c.float()
            for g, start, end in problem.layout.segments():
                result[g] += a[start:end].T @ b[start:end]
            out.copy_(result)
        return out
