"""Suite-owned tolerance classes and the value comparison against the float64 golden.

A class is named ``<input>_<output>`` (``bf16_bf16``, ``fp8_bf16``, ...) and its parameters live in
the manifest, so they are versioned with the data and no backend can change them. Per element::

    |out - ref| <= atol + rtol * |ref| + acc_factor * sqrt(K) * acc_eps * sum_k |a_k| |b_k|

``rtol``/``atol`` are torch's ``assert_close`` defaults for the output dtype (the rounding of the
result); the last term bounds the accumulation error of K products in an accumulator with unit
roundoff ``acc_eps`` relative to the products' magnitude, so cancellation near zero is not
mistaken for an error. fp8 goldens are computed from the quantized operands (the quantization step
is part of the inputs, not of the error). On top of the elementwise bound: DeepGEMM's
``calc_diff`` must not exceed the class threshold, at most ``mismatch_fraction`` of the elements
may lie outside the bound and none by more than ``gross_factor`` times it, and NaN/Inf must
appear exactly where the reference has them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class ToleranceClass:
    name: str
    rtol: float
    atol: float
    acc_eps: float
    acc_factor: float
    calc_diff: float
    mismatch_fraction: float
    gross_factor: float

    @classmethod
    def from_mapping(cls, name: str, m: dict[str, Any]) -> "ToleranceClass":
        return cls(
            name,
            float(m["rtol"]),
            float(m["atol"]),
            float(m["acc_eps"]),
            float(m["acc_factor"]),
            float(m["calc_diff"]),
            float(m["mismatch_fraction"]),
            float(m["gross_factor"]),
        )

    def bound(self, ref: torch.Tensor, magnitude: torch.Tensor, k: torch.Tensor | float) -> torch.Tensor:
        """Per-element allowed ``|out - ref|`` (float64)."""
        k = torch.as_tensor(k, dtype=torch.float64)
        return self.atol + self.rtol * ref.abs() + self.acc_factor * torch.sqrt(k) * self.acc_eps * magnitude

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """DeepGEMM's similarity metric in float64: ``1 - 2 sum(x y) / sum(x^2 + y^2)`` (0 when both
    are zero). Scale-sensitive: it catches magnitude errors a cosine similarity would miss."""
    x, y = x.double(), y.double()
    denom = float((x * x + y * y).sum())
    return 0.0 if denom == 0.0 else 1.0 - 2.0 * float((x * y).sum()) / denom


@dataclass
class ValueComparison:
    """Outcome of comparing an output with its golden over a region."""

    ok: bool
    metrics: dict[str, Any]
    message: str


def _finite_or_none(v: float) -> float | None:
    return v if math.isfinite(v) else None


def compare(
    out: torch.Tensor,
    ref: torch.Tensor,
    magnitude: torch.Tensor,
    k: torch.Tensor | float,
    cls: ToleranceClass,
    region: torch.Tensor | None = None,
    shown: int = 3,
) -> ValueComparison:
    """Compare ``out`` (any float dtype, CPU) with ``ref`` on the elements where ``region`` is True."""
    out64, ref64 = out.double(), ref.double()
    bound = cls.bound(ref64, magnitude, k)
    if region is None:
        region = torch.ones(ref.shape, dtype=torch.bool)
    region = region.expand(ref.shape)
    numel = int(region.sum())
    nan_out, nan_ref = torch.isnan(out64), torch.isnan(ref64)
    inf_ref = torch.isinf(ref64)
    nonfinite_bad = region & ((nan_out != nan_ref) | (inf_ref & (out64 != ref64)))
    finite = region & torch.isfinite(ref64) & ~nan_out
    err = torch.where(finite, (out64 - ref64).abs(), torch.zeros_like(ref64))
    err = torch.where(torch.isnan(err), torch.full_like(err, math.inf), err)
    outside = finite & (err > bound)
    gross = finite & (err > cls.gross_factor * bound)
    n_outside = int(outside.sum())
    allowed = int(math.floor(cls.mismatch_fraction * numel))
    both_finite = finite & torch.isfinite(out64)
    cd = calc_diff(out64[both_finite], ref64[both_finite]) if bool(both_finite.any()) else 0.0
    ratio = torch.where(finite, err / bound, torch.zeros_like(err))
    rel = torch.where(finite & (ref64 != 0), err / ref64.abs(), torch.zeros_like(err))
    metrics = {
        "numel": numel,
        "max_abs_err": _finite_or_none(float(err[finite].max())) if bool(finite.any()) else 0.0,
        "max_rel_err": _finite_or_none(float(rel.max())) if numel else 0.0,
        "max_err_over_bound": _finite_or_none(float(ratio.max())) if numel else 0.0,
        "calc_diff": _finite_or_none(cd),
        "mismatches": n_outside,
        "mismatch_fraction": n_outside / numel if numel else 0.0,
        "allowed_mismatches": allowed,
        "gross_mismatches": int(gross.sum()),
        "nonfinite_mismatches": int(nonfinite_bad.sum()),
    }
    problems = []
    if metrics["nonfinite_mismatches"]:
        idx = _first(nonfinite_bad)
        problems.append(
            f"{metrics['nonfinite_mismatches']} NaN/Inf position(s) differ from the reference; "
            f"first at {idx}: got {float(out64[idx])!r}, expected {float(ref64[idx])!r}"
        )
    if n_outside > allowed or metrics["gross_mismatches"]:
        idx = _first(gross if metrics["gross_mismatches"] else outside)
        what = (
            f"{n_outside} of {numel} elements outside |out - ref| <= bound (allowed {allowed}"
            + (
                f", {metrics['gross_mismatches']} beyond {cls.gross_factor:g}x the bound"
                if metrics["gross_mismatches"]
                else ""
            )
            + ")"
        )
        examples = [
            f"{i}: got {float(out64[i]):.6g}, expected {float(ref64[i]):.6g}, bound {float(bound[i]):.3g}"
            for i in _firsts(gross if metrics["gross_mismatches"] else outside, shown)
        ]
        problems.append(f"{what}; first at " + "; ".join(examples) if examples else what + f" (first at {idx})")
    if cd > cls.calc_diff or math.isnan(cd):
        problems.append(f"calc_diff {cd:.3e} > {cls.calc_diff:g}")
    return ValueComparison(not problems, metrics, "; ".join(problems))


def _first(mask: torch.Tensor) -> tuple[int, ...]:
    return tuple(int(i) for i in torch.nonzero(mask)[0])


def _firsts(mask: torch.Tensor, n: int) -> list[tuple[int, ...]]:
    return [tuple(int(i) for i in row) for row in torch.nonzero(mask)[:n]]
