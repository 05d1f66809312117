"""moe_hal.peers on the CPU: the calls it builds compute the case, and a timed row reports them.

The expected products are computed here, group by group in float64, from the operands the module
built; timings are never asserted.
"""

from __future__ import annotations

import pytest
import torch

from moe_hal import peers, timing
from moe_hal.workloads import Case

CASES = {
    "contiguous": Case("c", "test", "contiguous", "fp32", 8, 16, [3, 0, 5], alignment=4),
    "masked": Case("m", "test", "masked", "fp32", 8, 16, [3, 0, 5], max_m=6),
    "k_grouped": Case("k", "test", "k_grouped", "fp32", 8, None, [3, 0, 5], m=4),
}


def expected(case: Case, a: torch.Tensor, b: torch.Tensor) -> list[tuple[tuple, torch.Tensor]]:
    """(index into the output, its float64 value) for every valid block of ``case``."""
    a, b = a.double(), b.double()
    blocks, start = [], 0
    for g, c in enumerate(case.counts):
        if case.op == "contiguous":
            blocks.append(((slice(start, start + c),), a[start : start + c] @ b[g].T))
            start += -(-c // case.alignment) * case.alignment
        elif case.op == "masked":
            blocks.append(((g, slice(0, c)), a[g, :c] @ b[g].T))
        else:
            blocks.append(((g,), a[start : start + c].T @ b[start : start + c]))
            start += c
    return blocks


@pytest.mark.parametrize("op", sorted(CASES))
def test_every_call_computes_the_case(op):
    case = CASES[op]
    prep = peers.prepare(case, "cpu", seed=1)
    assert list(prep.calls) == [peers.MOE_HAL, peers.GROUPED_MM, peers.MM_LOOP]
    a, b = prep.args
    for name, call in prep.calls.items():
        out = call()
        for index, want in expected(case, a, b):
            torch.testing.assert_close(out[index].double(), want, rtol=1e-4, atol=1e-5, msg=name)


def test_fp8_and_no_peers_time_moe_hal_alone():
    fp8 = Case("f", "test", "contiguous", "fp8", 128, 128, [3, 0, 5])
    prep = peers.prepare(fp8, "cpu")
    assert list(prep.calls) == [peers.MOE_HAL] and type(prep.args[0]).__name__ == "QuantizedTensor"
    assert list(peers.prepare(CASES["masked"], "cpu", peers=False).calls) == [peers.MOE_HAL]


def test_time_case_reports_times_speedups_and_the_check():
    timer = timing.Timer(torch.device("cpu"), warmup=1, reps=2)
    row = peers.time_case(CASES["contiguous"], torch.device("cpu"), timer)
    assert "error" not in row and row["backend"] == "torch" and row["rows"] == 8
    assert set(row["times"]) == {peers.MOE_HAL, peers.GROUPED_MM, peers.MM_LOOP}
    assert row["max_rel_diff_vs_loop"] < 1e-5
    for peer, ratio in row["speedup_vs"].items():
        assert ratio == pytest.approx(row["times"][peer]["median"] / row["times"][peers.MOE_HAL]["median"])


def test_time_case_records_a_case_it_cannot_run():
    timer = timing.Timer(torch.device("cpu"), warmup=1, reps=2)
    row = peers.time_case(CASES["masked"], torch.device("cpu"), timer, backend="no-such-backend")
    assert "no-such-backend" in row["error"] and "times" not in row
