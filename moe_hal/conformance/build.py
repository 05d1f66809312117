"""Case tensors: generating them (for ``regen`` and the sweep tier) and turning them into calls.

A case's data file holds its inputs and its golden outputs under fixed names:

* GEMM inputs: ``a``, ``b`` (``[G, N, K]``; stored ``[G, K, N]`` when ``b_major`` is ``n`` and
  passed as a transposed view), ``c``; fp8 operands as ``a.data``/``a.scale``/``b.data``/``b.scale``;
  ``masked_m`` for masked cases. Golden: ``golden.out`` (float32, rounded once from the float64
  oracle).
* Transforms: their inputs and ``golden.<name>`` outputs; strided outputs are stored as the flat
  storage span (``golden.<name>.span``) with ``golden.<name>.shape`` and ``.strides`` (int64).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .. import dtypes
from . import generate, oracle
from .generate import GeneratorSpec
from .suite import Case

_FP8 = "fp8_e4m3"


@dataclass(frozen=True)
class GemmSpec:
    """A GEMM case's signature and problem, parsed. ``counts`` are rows per group (contiguous) or
    tokens per group (K-grouped); ``m``/``n``/``k`` follow :class:`moe_hal.Problem`."""

    op: str
    dtype: str
    out_dtype: str
    scale_format: str | None
    a_block: tuple[int, int] | None
    b_block: tuple[int, int] | None
    b_major: str
    groups: int
    n: int
    k: int
    m: int = 0
    counts: tuple[int, ...] = ()
    alignment: int = 1
    num_rows: int = 0
    masked_m: tuple[int, ...] = ()
    max_m: int = 0
    expected_m: int | None = None
    with_c: bool = False

    @classmethod
    def from_case(cls, case: Case) -> "GemmSpec":
        s, p = case.signature, case.problem
        fp8 = s["dtype"] == _FP8
        common = dict(
            op=case.op,
            dtype=s["dtype"],
            out_dtype=s["out_dtype"],
            scale_format=s.get("scale_format") if fp8 else None,
            a_block=tuple(s.get("a_block", _default_blocks(case.op)[0])) if fp8 else None,
            b_block=tuple(s.get("b_block", _default_blocks(case.op)[1])) if fp8 else None,
            b_major=s.get("b_major", "k"),
            groups=int(p["groups"]),
            n=int(p["n"]),
        )
        if case.op == "masked":
            return cls(
                **common,
                k=int(p["k"]),
                masked_m=tuple(p["masked_m"]),
                max_m=int(p["max_m"]),
                m=int(p["max_m"]),
                expected_m=p.get("expected_m"),
            )
        counts = tuple(int(c) for c in p["counts"])
        alignment = int(p.get("alignment", 1))
        rows = int(p.get("num_rows") or oracle.aligned_rows(counts, alignment))
        if case.op == "contiguous":
            return cls(**common, k=int(p["k"]), m=rows, counts=counts, alignment=alignment, num_rows=rows)
        return cls(
            **common,
            k=rows,
            m=int(p["m"]),
            counts=counts,
            alignment=alignment,
            num_rows=rows,
            with_c=bool(p.get("c", False)),
        )

    @property
    def fp8(self) -> bool:
        return self.dtype == _FP8

    @property
    def out_shape(self) -> tuple[int, ...]:
        return (self.num_rows, self.n) if self.op == "contiguous" else (self.groups, self.m, self.n)

    def operand_shapes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Logical shapes of ``a`` and ``b``."""
        if self.op == "contiguous":
            return (self.num_rows, self.k), (self.groups, self.n, self.k)
        if self.op == "masked":
            return (self.groups, self.max_m, self.k), (self.groups, self.n, self.k)
        return (self.num_rows, self.m), (self.num_rows, self.n)


def _default_blocks(op: str) -> tuple[tuple[int, int], tuple[int, int]]:
    if op == "k_grouped":
        return (128, 1), (128, 1)
    return (1, 128), (128, 128)


# -- generation -------------------------------------------------------------------------------------


def _round(x: np.ndarray, dtype_name: str) -> torch.Tensor:
    """float64 -> float32 (numpy, IEEE) -> the operand dtype (torch, round to nearest even)."""
    return torch.from_numpy(np.ascontiguousarray(x.astype(np.float32))).to(dtypes.DTYPES[dtype_name])


def _quantized(
    x: np.ndarray, gen: GeneratorSpec, name: str, block: tuple[int, int], ue8m0: bool, k_axis: int
) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    shaped = generate.shape_blocks(x, gen, name, block, k_axis)
    codes, scale = oracle.quantize(shaped.astype(np.float32), block, ue8m0)
    data = torch.from_numpy(np.ascontiguousarray(codes)).view(torch.float8_e4m3fn)
    return data, torch.from_numpy(np.ascontiguousarray(scale)), oracle.dequantize(codes, scale, block)


def gemm_tensors(spec: GemmSpec, gen: GeneratorSpec) -> dict[str, torch.Tensor]:
    """Inputs and the golden output of a GEMM case, generated from ``gen``."""
    a_shape, b_shape = spec.operand_shapes()
    xa, xb = generate.values(gen, "a", a_shape), generate.values(gen, "b", b_shape)
    out: dict[str, torch.Tensor] = {}
    if spec.fp8:
        k_axis = -2 if spec.op == "k_grouped" else -1
        ue8m0 = spec.scale_format == "ue8m0"
        out["a.data"], out["a.scale"], a64 = _quantized(xa, gen, "a", spec.a_block, ue8m0, k_axis)
        out["b.data"], out["b.scale"], b64 = _quantized(xb, gen, "b", spec.b_block, ue8m0, k_axis)
    else:
        a, b = _round(xa, spec.dtype), _round(xb, spec.dtype)
        a64, b64 = a.double().numpy(), b.double().numpy()
        out["a"] = a
        out["b"] = b.transpose(1, 2).contiguous() if spec.b_major == "n" else b
    c64 = None
    if spec.with_c:
        c = _round(generate.values(gen, "c", (spec.groups, spec.m, spec.n)), spec.out_dtype)
        out["c"] = c
        c64 = c.double().numpy()
    if spec.op == "masked":
        out["masked_m"] = torch.tensor(spec.masked_m, dtype=torch.int32)
    out["golden.out"] = torch.from_numpy(golden(spec, a64, b64, c64).astype(np.float32))
    return out


def golden(spec: GemmSpec, a64: np.ndarray, b64: np.ndarray, c64: np.ndarray | None) -> np.ndarray:
    """float64 oracle output of ``spec`` for float64 logical operands."""
    if spec.op == "contiguous":
        return oracle.contiguous(a64, b64, spec.counts, spec.alignment, spec.num_rows)
    if spec.op == "masked":
        return oracle.masked(a64, b64, spec.masked_m)
    return oracle.k_grouped(a64, b64, spec.counts, spec.alignment, c64)


def _strided_golden(
    prefix: str, result: tuple[np.ndarray, tuple[int, ...], tuple[int, ...]]
) -> dict[str, torch.Tensor]:
    span, shape, strides = result
    return {
        f"{prefix}.span": torch.from_numpy(np.ascontiguousarray(span)),
        f"{prefix}.shape": torch.tensor(shape, dtype=torch.int64),
        f"{prefix}.strides": torch.tensor(strides, dtype=torch.int64),
    }


def transform_tensors(case: Case) -> dict[str, torch.Tensor]:
    """Inputs and byte-exact goldens of a transform case."""
    p = case.problem
    gen = GeneratorSpec.from_mapping(case.generator or {"seed": 0})
    out: dict[str, torch.Tensor] = {}
    if case.op in ("tma_align_mn_major", "pack_ue8m0", "pack_ue8m0x2"):
        fn = getattr(oracle, case.op)
        for i, shape in enumerate(p["shapes"]):
            if case.op == "tma_align_mn_major":
                s = (generate.Stream(gen.seed, f"scale.{i}").uniform(shape) * 3.0 + 1e-3).astype(np.float32)
            else:
                s = generate.power_of_two_scales(gen, f"scale.{i}", shape)
            out[f"scale.{i}"] = torch.from_numpy(np.ascontiguousarray(s))
            out.update(_strided_golden(f"golden.{i}", fn(s)))
    elif case.op == "quantize_fp8":
        x64 = generate.values(gen, "x", p["shape"])
        x64 = generate.shape_blocks(x64, gen, "x", tuple(p["block"]), -1)
        x = _round(x64, p["dtype"])
        out["x"] = x
        x32 = x.float().numpy()
        for ue8m0 in (False, True):
            codes, scale = oracle.quantize(x32, tuple(p["block"]), ue8m0)
            name = "ue8m0" if ue8m0 else "fp32"
            out[f"golden.{name}.data"] = torch.from_numpy(np.ascontiguousarray(codes)).view(torch.float8_e4m3fn)
            out[f"golden.{name}.scale"] = torch.from_numpy(np.ascontiguousarray(scale))
    elif case.op == "layout_indices":
        counts, alignment = p["counts"], p["alignment"]
        rows = p.get("num_rows") or oracle.aligned_rows(counts, alignment)
        out["golden.m_indices"] = torch.from_numpy(oracle.m_indices(counts, alignment, rows))
        out["golden.psum"] = torch.from_numpy(oracle.psum(counts, alignment))
    elif case.op in ("routing_dispatch", "routing_dispatch_masked"):
        ids = generate.topk_ids(gen, "topk_ids", p["tokens"], p["top_k"], p["num_experts"], p.get("skip_fraction", 0.0))
        hidden = _round(generate.values(gen, "hidden", (p["tokens"], p["hidden"])), "bf16")
        out["topk_ids"] = torch.from_numpy(ids)
        out["hidden"] = hidden
        raw = hidden.view(torch.int16).numpy()
        if case.op == "routing_dispatch":
            ref = oracle.dispatch(ids, p["num_experts"], p["alignment"])
        else:
            ref = oracle.dispatch_masked(ids, p["num_experts"], p["max_m"])
        rows = oracle.gather_rows(raw, ref["slot_of_row"], p["top_k"])
        for name, value in ref.items():
            out[f"golden.{name}"] = torch.from_numpy(np.ascontiguousarray(value))
        out["golden.a"] = torch.from_numpy(np.ascontiguousarray(rows)).view(torch.bfloat16)
    elif case.op == "physical_scales":
        m, k = p["m"], p["k"]
        x = generate.shape_blocks(generate.values(gen, "a", (m, k)), gen, "a", (1, 128), -1)
        codes, scale = oracle.quantize(x.astype(np.float32), (1, 128), True)
        out["a.data"] = torch.from_numpy(np.ascontiguousarray(codes)).view(torch.float8_e4m3fn)
        out["a.scale"] = torch.from_numpy(np.ascontiguousarray(scale))
        out.update(_strided_golden("golden.tma", oracle.tma_align_mn_major(scale)))
        out.update(_strided_golden("golden.ue8m0", oracle.pack_ue8m0(scale)))
        out.update(_strided_golden("golden.ue8m0x2", oracle.pack_ue8m0x2(scale)))
    else:
        raise ValueError(f"no generator for op {case.op!r}")
    return out


def case_tensors(case: Case) -> dict[str, torch.Tensor]:
    """Everything a case's data file holds, generated from the manifest entry."""
    if case.is_gemm:
        return gemm_tensors(GemmSpec.from_case(case), GeneratorSpec.from_mapping(case.generator))
    return transform_tensors(case)


# -- calls -----------------------------------------------------------------------------------------


@dataclass
class GemmCall:
    """The arguments of one GEMM case on a device. ``golden`` (float32) and ``magnitude``
    (float64 ``sum |a||b|`` per output element, plus ``|c|``) stay on the CPU."""

    spec: GemmSpec
    a: Any
    b: Any
    c: torch.Tensor | None
    out_dtype: torch.dtype
    masked_m: torch.Tensor | None
    golden: torch.Tensor
    magnitude: torch.Tensor

    def layout(self):
        """A fresh layout object (layouts cache device tensors; each run gets its own)."""
        from ..layouts import ContiguousLayout, KGroupedLayout, MaskedLayout

        s = self.spec
        if s.op == "contiguous":
            return ContiguousLayout.from_counts(list(s.counts), alignment=s.alignment, num_rows=s.num_rows)
        if s.op == "masked":
            return MaskedLayout(self.masked_m, s.max_m, expected_m=s.expected_m)
        return KGroupedLayout.from_counts(list(s.counts), alignment=s.alignment, num_rows=s.num_rows)

    def inputs(self) -> dict[str, torch.Tensor]:
        """Every input tensor by name (for the inputs-unchanged check)."""
        from ..quant import QuantizedTensor

        out: dict[str, torch.Tensor] = {}
        for name, x in (("a", self.a), ("b", self.b)):
            if isinstance(x, QuantizedTensor):
                out[name + ".data"], out[name + ".scale"] = x.data, x.scale
            else:
                out[name] = x
        if self.c is not None:
            out["c"] = self.c
        if self.masked_m is not None:
            out["masked_m"] = self.masked_m
        return out


def gemm_call(spec: GemmSpec, tensors: dict[str, torch.Tensor], device: torch.device) -> GemmCall:
    """Move a case's stored tensors to ``device`` as the call's operands."""
    from ..quant import QuantizedTensor

    if spec.fp8:
        fmt = spec.scale_format or "fp32"
        a = QuantizedTensor(tensors["a.data"].to(device), tensors["a.scale"].to(device), spec.a_block, fmt)
        b = QuantizedTensor(tensors["b.data"].to(device), tensors["b.scale"].to(device), spec.b_block, fmt)
        a64 = _dequant64(tensors["a.data"], tensors["a.scale"], spec.a_block)
        b64 = _dequant64(tensors["b.data"], tensors["b.scale"], spec.b_block)
    else:
        a = tensors["a"].to(device)
        b_stored = tensors["b"].to(device)
        b = b_stored.transpose(1, 2) if spec.b_major == "n" else b_stored
        a64 = tensors["a"].double()
        b64 = tensors["b"].double()
        if spec.b_major == "n":
            b64 = b64.transpose(1, 2)
    c = tensors["c"].to(device) if "c" in tensors else None
    masked_m = tensors["masked_m"].to(device) if "masked_m" in tensors else None
    magnitude = _magnitude(spec, a64.abs(), b64.abs(), tensors["c"].double().abs() if c is not None else None)
    return GemmCall(spec, a, b, c, dtypes.DTYPES[spec.out_dtype], masked_m, tensors["golden.out"], magnitude)


def _dequant64(data: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    codes = data.view(torch.uint8).numpy()
    return torch.from_numpy(oracle.dequantize(codes, scale.numpy(), block))


def _magnitude(spec: GemmSpec, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None) -> torch.Tensor:
    """``sum_k |a||b|`` per output element in float64 (the scale of the accumulation error)."""
    a, b = torch.nan_to_num(a, posinf=0.0), torch.nan_to_num(b, posinf=0.0)
    out = torch.zeros(spec.out_shape, dtype=torch.float64)
    if spec.op == "contiguous":
        for g, (start, count) in enumerate(zip(oracle.segment_starts(spec.counts, spec.alignment), spec.counts)):
            if count:
                out[start : start + count] = a[start : start + count] @ b[g].T
    elif spec.op == "masked":
        for g, rows in enumerate(spec.masked_m):
            if rows:
                out[g, :rows] = a[g, :rows] @ b[g].T
    else:
        for g, (start, count) in enumerate(zip(oracle.segment_starts(spec.counts, spec.alignment), spec.counts)):
            if count:
                out[g] = a[start : start + count].T @ b[start : start + count]
        if c is not None:
            out += torch.nan_to_num(c, posinf=0.0)
    return out


# The tensors of the last generated case: a case is run through several paths in a row.
_last_generated: tuple[str | None, Any] = (None, None)


def tensors(suite: Any, case: Case) -> dict[str, torch.Tensor]:
    """The tensors of ``case`` (CPU torch tensors): the stored ones from ``suite``, or for a
    generated (sweep or fuzz) case its inputs and the oracle's golden, built here (the last one is
    kept, as each case runs through several paths in a row)."""
    global _last_generated
    if case.file is not None:
        return suite.tensors(case)
    key = json.dumps([case.id, case.op, case.signature, case.problem, case.generator], sort_keys=True)
    if _last_generated[0] != key:
        _last_generated = (key, case_tensors(case))
    return _last_generated[1]
