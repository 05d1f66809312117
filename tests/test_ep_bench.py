"""bench/bench_ep.py: its CPU-time bound on hand-made rounds, and an end-to-end run at a tiny size
(figures are not checked: a benchmark is never a timed test)."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

BENCH_DIR = Path(__file__).resolve().parent.parent / "bench"


@pytest.fixture(scope="module")
def bench_ep():
    # imported by name from a path entry: the spawned ranks unpickle bench_ep._rank by importing it
    sys.path.insert(0, str(BENCH_DIR))
    try:
        yield importlib.import_module("bench_ep")
    finally:
        sys.path.remove(str(BENCH_DIR))
        sys.modules.pop("bench_ep", None)


def _rank(ep_cpu, ep_wall, bare_cpu):
    return {"exact": {"ep_cpu_s_per_round": ep_cpu, "ep_wall_s_per_round": ep_wall, "bare_cpu_s_per_round": bare_cpu}}


def test_cpu_use_adds_the_ranks_call_by_call_and_bounds_the_ratio_by_cpu_over_cores(bench_ep, monkeypatch):
    monkeypatch.setattr(bench_ep, "_cores", lambda: 2)
    per_rank = [
        _rank([0.010, 0.020, 0.030], [0.020, 0.030, 0.050], [0.004, 0.005, 0.006]),
        _rank([0.012, 0.018, 0.040], [0.021, 0.029, 0.060], [0.005, 0.005, 0.009]),
    ]
    use = bench_ep._cpu_use(per_rank, "exact", bare_s=0.015, peers={"bare": "bare"})
    # rounds add up to 22, 38, 70 ms (ep) and 9, 10, 15 ms (bare): medians 38 and 10
    assert use["cpu_ms_per_call_all_ranks"] == pytest.approx({"ep": 38.0, "bare": 10.0})
    # per round over the slower rank's wall: 22/21, 38/30, 70/60 -> median 70/60
    assert use["ep_cores_busy"] == pytest.approx(70 / 60)
    # 15 ms bare over (38 ms of CPU on 2 cores)
    assert use["ratio_ceiling_at_full_cpu"] == pytest.approx(15 / 19)
    # 0.7 needs a call of 15 / 0.7 ms: that much CPU per core, 2 cores shared by 2 ranks
    assert use["cpu_ms_per_rank_for_target"] == pytest.approx(15 / 0.7)
    assert use["cores"] == 2


def test_cpu_use_refuses_ranks_with_different_round_counts(bench_ep):
    per_rank = [_rank([0.01, 0.02], [0.02, 0.03], [0.0, 0.0]), _rank([0.01], [0.02], [0.0])]
    with pytest.raises(ValueError):
        bench_ep._cpu_use(per_rank, "exact", bare_s=0.01, peers={"bare": "bare"})


def test_bench_ep_runs_at_a_tiny_size_and_records_the_cpu_accounting(bench_ep, tmp_path):
    out = tmp_path / "ep.json"
    args = ["--tokens", "32", "--hidden", "64", "--experts", "4", "--topk", "2", "--warmup", "1", "--repeat", "3"]
    assert bench_ep.main([*args, "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    for mode in ("exact", "capacity"):
        m = result["median_over_trials"][mode]
        assert set(m["cpu_ms_per_call_all_ranks"]) == {"ep", "bare", "bare_moved", "handwritten_exact"}
        assert all(t > 0 for t in m["cpu_ms_per_call_all_ranks"].values())
        assert m["ratio_ceiling_at_full_cpu"] > 0 and m["ep_cores_busy"] > 0
        # per call, the time outside the collectives is part of that call's wall time
        assert 0 <= m["host_s_per_call"] <= m["ep_s_per_call"]
