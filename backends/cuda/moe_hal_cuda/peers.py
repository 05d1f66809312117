"""Peer libraries the backends may call instead of their Triton kernels.

A peer runs a call only when a measurement says it is faster: :mod:`moe_hal_cuda.paths` lists the
``(arch, op, dtype, shape bucket)`` cases where ``backends/cuda/scripts/gpu_check.py`` timed it ahead of our kernel
(and checked it against the float64 reference first). :func:`blocker` says why a peer cannot take
a given call; the backend then keeps the Triton path and says so in ``explain()``.

* ``torch`` — ``torch.nn.functional.grouped_mm``: CUTLASS grouped GEMM on compute capability 9.x
  and 10.x for bf16 operands *and* bf16 output, driven by device offsets (no host sync), fewer
  than 1024 groups (pytorch/pytorch, torch 2.13.0, ``aten/src/ATen/native/cuda/GroupedBlas.cpp``,
  ``_grouped_mm_cuda``). Used for contiguous (rows of no
  group zeroed afterwards, as our contract requires) and K-grouped calls. Not for masked calls:
  it would compute and rewrite every row, and our contract never writes rows past ``masked_m``.
  ``scaled_grouped_mm`` has no 1x128/128x128 block-scaled recipe (same file,
  ``scale_grouped_kernel_dispatch``), so it never applies.
* ``deep_gemm`` — an installed DeepGEMM: ``m_grouped_fp8_gemm_nt_contiguous`` with the per-row
  ``m_indices`` layout for fp8 contiguous calls (rows of no group zeroed afterwards). Not for
  masked calls: DeepGEMM writes whole row tiles past ``masked_m`` (deepseek-ai/DeepGEMM at 54e2261,
  ``deep_gemm/include/deep_gemm/scheduler/gemm.cuh``: ``ceil(masked_m[g] / BLOCK_M)`` tiles per group).
  No machine this project has used has DeepGEMM installed, so this adapter has never run; it is
  reachable only through a path-table entry, which only a GPU run that checked it can write.
"""

from __future__ import annotations

import importlib

import torch

from moe_hal.plugin_api import Problem

PEERS = ("torch", "deep_gemm")
_TORCH_MAX_GROUPS = 1023


def _deep_gemm():
    try:
        return importlib.import_module("deep_gemm")
    except Exception:  # noqa: BLE001 - a broken install is an absent one
        return None


def _deep_gemm_alignment(dg) -> int | None:
    for name in ("get_mk_alignment_for_contiguous_layout", "get_m_alignment_for_contiguous_layout"):
        fn = getattr(dg, name, None)
        if fn is not None:
            return int(fn())
    return None


def _grouped_mm():
    """``torch.nn.functional.grouped_mm``, else ``torch._grouped_mm`` (torch builds before it was public)."""
    return getattr(torch.nn.functional, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)


def blocker(path: str, p: Problem) -> str | None:
    """Why peer ``path`` cannot run ``p`` (None when it can), from the problem's shapes and
    dtypes and from what is installed."""
    if p.device.type != "cuda":
        return "peers run on CUDA devices only"
    if path == "torch":
        if _grouped_mm() is None:
            return "this torch has no grouped_mm"
        if p.in_dtype != "bf16" or p.out_dtype_name != "bf16":
            return "grouped_mm's CUDA kernel takes bf16 operands with bf16 output only"
        if p.op == "masked":
            return "grouped_mm would rewrite rows past masked_m"
        inner = p.m if p.op == "k_grouped" else p.k
        if inner % 8 or p.n % 8 or p.b_major == "strided":
            return "grouped_mm needs 16-byte strides (K or M, and N, multiples of 8) and row- or column-major b"
        if p.op == "contiguous" and p.num_groups > _TORCH_MAX_GROUPS:
            return f"grouped_mm's CUDA kernel takes fewer than {_TORCH_MAX_GROUPS + 1} groups"
        return None
    if path == "deep_gemm":
        dg = _deep_gemm()
        if dg is None:
            return "deep_gemm is not installed"
        if p.op != "contiguous" or p.in_dtype != "fp8_e4m3" or p.out_dtype_name != "bf16":
            return "only fp8 contiguous calls with bf16 output go to DeepGEMM"
        if p.b_major != "k" or p.a.data.stride(-1) != 1:
            return "DeepGEMM needs K-major operands"
        if p.scale_blocks != ((1, 128), (128, 128)):
            return "DeepGEMM takes 1x128 activation and 128x128 weight scales"
        if not hasattr(dg, "m_grouped_fp8_gemm_nt_contiguous"):
            return "this deep_gemm has no m_grouped_fp8_gemm_nt_contiguous"
        if _deep_gemm_alignment(dg) != p.layout.alignment:
            return f"the layout's alignment ({p.layout.alignment}) differs from DeepGEMM's ({_deep_gemm_alignment(dg)})"
        return None
    return f"unknown peer {path!r}"


def run(path: str, p: Problem, out: torch.Tensor) -> torch.Tensor:
    """Run ``p`` through peer ``path`` into ``out`` (``blocker`` must have returned None)."""
    if path == "torch":
        return _torch(p, out)
    return _deep_gemm_contiguous(p, out)


def _zero_gap_rows(p: Problem, out: torch.Tensor) -> None:
    if p.layout.has_gaps():
        out.index_fill_(0, p.layout.gap_rows_on(out.device), 0)


def _torch(p: Problem, out: torch.Tensor) -> torch.Tensor:
    grouped_mm = _grouped_mm()
    lay = p.layout
    if p.op == "contiguous":
        # Aligned segment ends: padding rows are computed with their group, then zeroed.
        out.copy_(grouped_mm(p.a.contiguous(), p.b.transpose(1, 2), offs=lay.aligned_ends_on(p.device)))
        _zero_gap_rows(p, out)
        return out
    a, b = p.a.contiguous(), p.b.contiguous()
    offs = lay.psum_on(p.device)
    if lay.has_gaps():
        rows = lay.valid_rows_on(p.device)
        a, b, offs = a.index_select(0, rows), b.index_select(0, rows), lay.packed_ends_on(p.device)
    result = grouped_mm(a.t(), b, offs=offs)
    if p.c is not None:
        result = result.to(out.dtype) + p.c
    out.copy_(result)
    return out


def _deep_gemm_contiguous(p: Problem, out: torch.Tensor) -> torch.Tensor:
    dg = _deep_gemm()
    ids = p.layout.m_indices(p.device)
    dg.m_grouped_fp8_gemm_nt_contiguous((p.a.data, p.a.scale), (p.b.data, p.b.scale), out, ids)
    _zero_gap_rows(p, out)
    return out
