"""The ``torch`` backend: ``torch.nn.functional.grouped_mm`` plus the fix-ups our contracts need.

``F.grouped_mm`` (see its docstring in ``torch/nn/functional.py``, torch 2.13) differs from
moe_hal's contracts (``docs/design.md`` §2) in ways this module repairs, each stated by
:meth:`TorchBackend.describe_path`:

* It groups rows by exclusive ends with no gaps, and never writes rows past the last end. We pass
  the *aligned* segment ends, so alignment padding is computed with its group, then zero every row
  that belongs to no group (the contiguous contract).
* Operand strides must be multiples of 16 bytes; an operand that breaks the rule is copied into a
  padded buffer first.
* The output dtype must equal the input dtype: fp32 output from bf16/fp16 operands upcasts them.
* It has no grouped kernel for 1x128/128x128 block-scaled fp8: fp8 operands are dequantized to
  fp32 (weights once, through the prepared-weight cache).
* The masked layout has no native form: all ``max_m`` rows are multiplied (3D x 3D) and only rows
  below ``masked_m[g]`` are written, with ``torch.where`` on the device (no host sync).
* The CUDA fast path handles fewer than 1024 groups; larger calls are split into chunks.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..backend import Backend, Reason
from ..layouts import align
from ..notices import warn_once
from ..problem import Problem

_CUDA_MAX_GROUPS = 1023
#: Above this many multiply-adds a CPU call loops over groups itself (the Python loop is then noise).
_CPU_LOOP_MIN_MACS = 1 << 22
#: Elements per 16 bytes: grouped_mm's non-unit strides must be multiples of this.
_QUANTUM = {torch.float32: 4, torch.bfloat16: 8, torch.float16: 8}


class TorchBackend(Backend):
    """Grouped GEMM through ``torch.nn.functional.grouped_mm`` on CPU and CUDA."""

    def is_available(self) -> list[Reason]:
        if not hasattr(F, "grouped_mm"):
            return [
                Reason(
                    "library_missing",
                    "torch.nn.functional.grouped_mm is not in this torch",
                    "torch >= 2.9",
                    torch.__version__,
                )
            ]
        return []

    # -- explanation ----------------------------------------------------------------------------
    def dtype_notes(self, p: Problem) -> list[str]:
        """Precision changes this call takes; each is also announced once as a PathWarning."""
        if p.quantized:
            return ["dequantizes fp8 operands to fp32 (torch has no grouped 1x128/128x128 fp8 kernel)"]
        if p.out_dtype != p.a.dtype:
            return [f"upcasts {p.in_dtype} operands to fp32 (grouped_mm's output dtype must match its input)"]
        if _adds_c_in_fp32(p):
            return [f"upcasts {p.in_dtype} operands to fp32 to add c before the one rounding to {p.out_dtype_name}"]
        return []

    def path_notes(self, p: Problem) -> list[str]:
        """Every deviation from a plain ``F.grouped_mm`` call this problem takes."""
        notes = self.dtype_notes(p)
        if p.b_major == "strided":
            notes.append("copies b (neither K- nor N-major) into a row-major buffer")
        if p.op == "masked":
            notes.append("multiplies all max_m rows, then writes rows < masked_m[g] with torch.where")
        if p.op == "k_grouped" and p.layout.has_gaps():
            notes.append("gathers the rows that belong to groups (the layout has gaps)")
        if p.op == "contiguous" and p.device_type == "cuda" and p.num_groups > _CUDA_MAX_GROUPS:
            notes.append(f"splits the call into chunks of {_CUDA_MAX_GROUPS} groups (CUDA kernel limit)")
        return notes

    def describe_path(self, p: Problem) -> str:
        base = {
            "contiguous": "F.grouped_mm 2D x 3D (on the CPU, above 4M multiply-adds, torch.mm per group "
            "into the output, which is what grouped_mm does there); rows of no group are "
            "zeroed (and skipped when they outnumber 1/8 of the rows of groups)",
            "masked": "F.grouped_mm 3D x 3D",
            "k_grouped": "F.grouped_mm 2D x 2D over group ends",
        }[p.op]
        return "; ".join([base, *self.path_notes(p)])

    # -- execution ------------------------------------------------------------------------------
    def run(self, p: Problem, out: torch.Tensor | None) -> torch.Tensor:
        if p.quantized or p.out_dtype is not p.a.dtype or p.c is not None:
            for note in self.dtype_notes(p):
                warn_once(("torch", note), f"moe_hal torch backend {note}", stacklevel=4)
        if p.is_empty:
            return p.empty_product(out)
        a, b = self._operands(p)
        if p.op == "contiguous":
            return self._contiguous(p, a, b, out)
        if p.op == "masked":
            return self._masked(p, a, b, out)
        return self._k_grouped(p, a, b, out)

    def _operands(self, p: Problem) -> tuple[torch.Tensor, torch.Tensor]:
        if p.quantized:
            from ..prepared import prepared_cache

            b = prepared_cache.get(self.name, p.b, "dequantized_fp32", lambda q: q.dequantize(torch.float32))
            return p.a.dequantize(torch.float32), b
        if p.out_dtype != p.a.dtype or _adds_c_in_fp32(p):
            return p.a.float(), p.b.float()
        return p.a, p.b

    def _contiguous(self, p: Problem, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
        lay = p.layout
        if p.device_type == "cpu" and a.dtype == p.out_dtype and lay.num_valid_rows * p.n * p.k >= _CPU_LOOP_MIN_MACS:
            return self._contiguous_cpu_loop(p, a, b, out)
        bt = b.transpose(1, 2)
        # Dense CPU operands with K a multiple of 16 bytes already meet the stride rules.
        dense = p.device_type == "cpu" and p.k % _QUANTUM[a.dtype] == 0 and _row_major(a) and _row_major(b)
        if not dense:
            bt = _stride_safe(bt)
        chunked = p.device_type == "cuda" and p.num_groups > _CUDA_MAX_GROUPS
        if lay.has_gaps() and not chunked and (lay.num_rows - lay.num_valid_rows) * 8 > lay.num_valid_rows:
            # Padding is a large share of the rows: multiply only the rows of groups, then scatter.
            rows = lay.valid_rows_on(p.device)
            packed = F.grouped_mm(_stride_safe(a.index_select(0, rows)), bt, offs=lay.packed_ends_on(p.device))
            out = p.new_out() if out is None else out
            out.zero_()  # cheaper than filling only the rows of no group, which are scattered
            out.index_copy_(0, rows, packed.to(out.dtype))
            return out
        if not dense:
            a = _stride_safe(a)
        if chunked:
            result = self._contiguous_chunked(p, a, bt)
        else:
            result = F.grouped_mm(a, bt, offs=lay.aligned_ends_on(p.device))
        if lay.has_gaps():
            result.index_fill_(0, lay.gap_rows_on(p.device), 0)
        return _deliver(result, out, p.out_dtype)

    def _contiguous_cpu_loop(
        self, p: Problem, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None
    ) -> torch.Tensor:
        """On the CPU grouped_mm is itself a loop of mm over the groups; calling mm per group into
        the output directly skips the padding rows and grouped_mm's buffers."""
        out = p.new_out() if out is None else out
        done = 0
        for g, start, end in p.layout.segments():
            if start > done:
                out[done:start].zero_()
            if end > start:
                torch.mm(a[start:end], b[g].T, out=out[start:end])
            done = end
        if done < p.m:
            out[done:].zero_()
        return out

    def _contiguous_chunked(self, p: Problem, a: torch.Tensor, bt: torch.Tensor) -> torch.Tensor:
        lay = p.layout
        result = torch.empty(p.m, p.n, dtype=a.dtype, device=a.device)
        ends = lay.aligned_ends_on(p.device)
        for g0 in range(0, p.num_groups, _CUDA_MAX_GROUPS):
            g1 = min(g0 + _CUDA_MAX_GROUPS, p.num_groups)
            row0 = lay.starts[g0]
            row1 = align(lay.ends[g1 - 1], lay.alignment)
            offs = ends[g0:g1] - row0
            result[row0:row1] = F.grouped_mm(a[row0:row1], bt[g0:g1], offs=offs)
        return result

    def _masked(self, p: Problem, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
        out = p.new_out() if out is None else out
        full = F.grouped_mm(_stride_safe(a), _stride_safe(b.transpose(1, 2)))
        out.copy_(torch.where(p.masked_rows(), full.to(out.dtype), out))
        return out

    def _k_grouped(self, p: Problem, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
        lay = p.layout
        if lay.has_gaps():
            rows = lay.valid_rows_on(p.device)
            a, b = a.index_select(0, rows), b.index_select(0, rows)
            offs = lay.packed_ends_on(p.device)
        else:
            offs = lay.psum_on(p.device)
        result = F.grouped_mm(_stride_safe(a.t()), _stride_safe(b), offs=offs)
        if p.c is not None:
            result = result.add_(p.c.to(result.dtype))
        return _deliver(result, out, p.out_dtype)


def _adds_c_in_fp32(p: Problem) -> bool:
    """A 16-bit K-grouped call with ``c``: adding ``c`` to a 16-bit product would round twice."""
    return p.c is not None and p.out_dtype is not torch.float32 and not p.quantized


def _row_major(t: torch.Tensor) -> bool:
    """True when ``t``'s strides are exactly the row-major ones, size-1 dimensions included
    (``is_contiguous()`` ignores those, but grouped_mm checks every stride)."""
    expected = 1
    for size, stride in zip(reversed(t.shape), reversed(t.stride())):
        if stride != expected:
            return False
        expected *= size
    return True


def _deliver(result: torch.Tensor, out: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """``result`` as the call's output: copied into ``out`` when given, else returned as a
    contiguous tensor of ``dtype`` (grouped_mm may pad the row stride of what it allocates)."""
    if out is None:
        result = result if result.dtype == dtype else result.to(dtype)
        return result if result.is_contiguous() else result.contiguous()
    out.copy_(result)
    return out


def _stride_safe(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself when its last two dims satisfy grouped_mm's stride rules (row- or column-major,
    the non-unit stride a multiple of 16 bytes, 16-byte aligned data on accelerators), else a copy
    in a row-major buffer whose row stride is padded to 16 bytes."""
    quantum = _QUANTUM[t.dtype]
    shape, strides = t.shape, t.stride()
    rows, cols = shape[-2], shape[-1]
    s_row, s_col = strides[-2], strides[-1]
    row_major = s_col == 1 and s_row >= max(1, cols) and s_row % quantum == 0
    col_major = s_row == 1 and s_col >= max(1, rows) and s_col % quantum == 0
    aligned = t.device.type == "cpu" or t.data_ptr() % 16 == 0
    if (row_major or col_major) and aligned:
        return t
    buf = torch.empty(*t.shape[:-1], align(max(cols, 1), quantum), dtype=t.dtype, device=t.device)
    view = buf[..., :cols]
    view.copy_(t)
    return view
