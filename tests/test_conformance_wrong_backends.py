"""Deliberately wrong backends must fail the conformance suite with a message naming case and check.

Each backend below is the reference backend with exactly one bug. They are passed to the runner
as instances (they are not registered, so only the direct path runs).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from moe_hal import quant
from moe_hal.builtin import REFERENCE
from moe_hal.builtin.reference import ReferenceBackend
from moe_hal.conformance import session
from moe_hal.quant import QuantizedTensor


def _spec(name):
    return replace(REFERENCE, name=name)


class OffByOneBoundary(ReferenceBackend):
    """Every group of a contiguous or K-grouped layout starts one row too early, so the row before
    it (the previous group's last row or a padding row) is computed with this group's operands."""

    def _contiguous(self, p, out, work):
        from moe_hal.builtin.reference import group_of, rows_f64

        result = torch.zeros(p.m, p.n, dtype=torch.float64, device=work)
        for g, start, end in p.layout.segments():
            if end > start:
                first = max(start - 1, 0)
                w = rows_f64(group_of(p.b, g), 0, p.n, work)
                result[first:end] = rows_f64(p.a, first, end, work) @ w.T
        out.copy_(result.to(out.dtype))


class WritesPastMaskedM(ReferenceBackend):
    """Computes one row more than masked_m[g] in every group that has room for it."""

    def _masked(self, p, out, work):
        from moe_hal.builtin.reference import group_of, rows_f64

        for g, rows in enumerate(p.layout.masked_m.tolist()):
            rows = min(rows + 1, p.m)
            w = rows_f64(group_of(p.b, g), 0, p.n, work)
            out[g, :rows].copy_((rows_f64(group_of(p.a, g), 0, rows, work) @ w.T).to(out.dtype))


def _big_endian_words(scale: torch.Tensor) -> torch.Tensor:
    """The SM100 words with the four bytes of each in reverse order (the bug), row-major."""
    w = quant.pack_ue8m0(scale).to(torch.int64) & 0xFFFFFFFF
    swapped = ((w & 0xFF) << 24) | (((w >> 8) & 0xFF) << 16) | (((w >> 16) & 0xFF) << 8) | ((w >> 24) & 0xFF)
    return torch.where(swapped >= 2**31, swapped - 2**32, swapped).to(torch.int32)


class WrongUE8M0ByteOrder(ReferenceBackend):
    """Packs UE8M0 scales big-endian along K, then decodes them little-endian (as the hardware
    reads them): the per-K-block scales land on the wrong blocks."""

    def physical_scales(self, q: QuantizedTensor, role: str) -> torch.Tensor:
        words = _big_endian_words(q.scale.cpu())
        mn = words.shape[-2]
        aligned = quant.tma_aligned_size(mn)
        out = torch.zeros(words.shape[-1] * aligned, dtype=torch.int32).as_strided(words.shape, (1, aligned))
        out.copy_(words)
        return out.to(q.scale.device) if q.scale.device.type == "cpu" else out

    def _misread(self, q: QuantizedTensor) -> QuantizedTensor:
        sk = q.scale.shape[-1]
        scale = quant.unpack_ue8m0(_big_endian_words(q.scale), sk)
        return QuantizedTensor(q.data, scale, q.block, q.scale_format)

    def run(self, problem, out):
        if problem.scale_format == "ue8m0":
            problem.a = self._misread(problem.a)
            problem.b = self._misread(problem.b)
        return super().run(problem, out)


class OneWrongElement(ReferenceBackend):
    """Correct except for one element of every output: the first element of the first row that
    belongs to a group is off by 1 + |value|/2."""

    def run(self, problem, out):
        out = super().run(problem, out)
        if problem.op == "contiguous":
            rows = [s for _, s, e in problem.layout.segments() if e > s]
            index = (rows[0], 0) if rows else None
        elif problem.op == "masked":
            groups = [g for g, m in enumerate(problem.layout.masked_m.tolist()) if m > 0]
            index = (groups[0], 0, 0) if groups else None
        else:
            index = (0, 0, 0)
        if index is not None and out.numel():
            value = out[index].float()
            out[index] = (value + 1.0 + value.abs() / 2).to(out.dtype)
        return out


def _run(backend, cases):
    report = session.run(backend, ["full"], cases=cases, use_plugin_manifests=False)
    (run,) = report["runs"]
    assert run["available"]
    return run


def _failures(run):
    return {c["id"]: c for c in run["cases"] if c["status"] == "fail"}


def test_off_by_one_group_boundary_fails():
    run = _run(OffByOneBoundary(_spec("off_by_one")), ["contiguous/bf16/seed32_div16@1", "contiguous/fp32/basic@1"])
    failed = _failures(run)
    assert run["summary"]["verdict"] == "non-conformant"
    # Padding rows before a group are now written: the padding check names them.
    msg = failed["contiguous/bf16/seed32_div16@1"]["message"]
    assert "contiguous/bf16/seed32_div16@1 [direct]" in msg and "check 'padding_zero' failed" in msg
    # Without padding, the previous group's last row gets the wrong weights: the values check.
    msg = failed["contiguous/fp32/basic@1"]["message"]
    assert "contiguous/fp32/basic@1 [direct]" in msg and "check 'values' failed" in msg


def test_writes_past_masked_m_fails():
    run = _run(WritesPastMaskedM(_spec("past_masked_m")), ["masked/bf16/mixed@1", "masked/bf16/all_full@1"])
    failed = _failures(run)
    msg = failed["masked/bf16/mixed@1"]["message"]
    assert "masked/bf16/mixed@1 [direct]" in msg
    assert "check 'sentinel' failed (out=sentinel)" in msg and "past masked_m were written" in msg
    assert "check 'masked_zero' failed" in msg
    # With every group full there is no row past masked_m to write: the bug cannot show.
    assert not any(c["status"] == "fail" for c in run["cases"] if c["id"] == "masked/bf16/all_full@1")


def test_wrong_ue8m0_byte_order_fails():
    cases = [
        "contiguous/fp8_ue8m0/kblock_scales@1",
        "masked/fp8_ue8m0/mixed@1",
        "physical_scales/*",
        "contiguous/fp8_fp32/align128@1",
    ]
    run = _run(WrongUE8M0ByteOrder(_spec("ue8m0_big_endian")), cases)
    failed = _failures(run)
    for cid in ("contiguous/fp8_ue8m0/kblock_scales@1", "masked/fp8_ue8m0/mixed@1"):
        assert f"{cid} [direct]: check 'values' failed" in failed[cid]["message"]
    msg = failed["physical_scales/fp8_ue8m0/act_m37_k640@1"]["message"]
    assert "check 'bytes' failed" in msg and "[ue8m0]" in msg and "byte(s) differ" in msg
    # fp32-format scales are never packed, so that case still passes.
    assert "contiguous/fp8_fp32/align128@1" not in failed


def test_one_wrong_element_fails_every_kind_of_case():
    cases = [
        "contiguous/bf16/seed32_div16@1",
        "masked/bf16/mixed@1",
        "k_grouped/bf16/empty_groups_out_fp32@1",
        "contiguous/fp8_ue8m0/kblock_scales@1",
    ]
    run = _run(OneWrongElement(_spec("one_wrong_element")), cases)
    failed = _failures(run)
    assert set(failed) == set(cases)
    for cid in cases:
        msg = failed[cid]["message"]
        assert f"{cid} [direct]: check 'values' failed" in msg
        assert "1 of " in msg and "elements outside" in msg


def test_correct_reference_subclass_passes_the_same_cases():
    """The control: the unmodified reference backend, run as an unregistered instance, passes."""
    run = _run(ReferenceBackend(_spec("plain_reference")), ["contiguous/*", "masked/*", "k_grouped/*"])
    assert run["summary"]["verdict"] == "conformant", [c["message"] for c in run["cases"] if c["status"] == "fail"]
    assert run["summary"]["counts"]["pass"] > 30


@pytest.mark.parametrize("backend", ["reference", "fake_vendor"])
def test_registered_backends_pass_full_tier_on_both_paths(backend):
    report = session.run(backend, ["full"])
    (run,) = report["runs"]
    if not run["available"]:
        pytest.skip(f"{backend} is not installed here")
    assert run["summary"]["verdict"] == "conformant", [
        c["message"] for c in run["cases"] if c["status"] != "pass" and c["status"] != "not_applicable"
    ]
    assert {c["path"] for c in run["cases"]} == {"direct", "dispatcher", "library"}
