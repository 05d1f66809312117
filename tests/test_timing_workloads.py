"""The measurement module (moe_hal.timing) and the workloads module (moe_hal.workloads) on the CPU.

Nothing here checks a speed: only how many calls are made, in which order, and what is reported.
"""

from __future__ import annotations

import pytest
import torch

from moe_hal import timing, workloads
from moe_hal.errors import ArgumentError


def counting(n: int) -> tuple[list, list[int]]:
    calls = [0] * n

    def make(i):
        def fn():
            calls[i] += 1

        return fn

    return [make(i) for i in range(n)], calls


def test_time_calls_rotates_input_sets_and_counts_reps():
    fns, calls = counting(3)
    t = timing.time_calls(fns, "cpu", warmup=2, reps=7)
    assert t.reps == 7 and t.copies == 3
    # 2 warm-up calls (sets 0, 1), then 7 timed calls round-robin (0,1,2,0,1,2,0)
    assert calls == [1 + 3, 1 + 2, 0 + 2]
    assert 0 <= t.min <= t.median and t.host >= 0


def test_time_calls_warms_up_at_least_once_and_respects_the_budget():
    import time

    fns, calls = counting(1)
    timing.time_calls(fns[0], "cpu", warmup=0, reps=2)
    assert calls == [1 + 2]

    def slow():
        time.sleep(0.02)

    t = timing.time_calls(slow, "cpu", warmup=0, reps=50, budget_s=0.01)
    assert t.reps == 3  # cut to the floor of 3 when one call alone exceeds the budget


def test_cpu_has_no_events_and_synchronize_is_a_no_op():
    assert not timing.has_events("cpu")
    timing.synchronize(torch.device("cpu"))
    assert timing.describe("cpu", warmup=1, reps=5).startswith("time.perf_counter")
    timer = timing.Timer(torch.device("cpu"), warmup=1, reps=3)
    assert set(timer(lambda: None)) == {"median", "min", "host", "reps"}


@pytest.mark.parametrize("flush, evict", [("write", "zero_"), ("read", "sum")])
def test_time_calls_flushes_the_l2_before_each_timed_call_by_writing_or_reading(monkeypatch, flush, evict):
    log: list[str] = []

    class Event:
        def __init__(self, enable_timing):
            pass

        def record(self):
            log.append("record")

        def elapsed_time(self, other):
            return 1.0

    class Buffer:  # stands in for the flush buffer: says which way it was touched
        def zero_(self):
            log.append("zero_")

        def sum(self):
            log.append("sum")

    module = type("Events", (), {"Event": Event, "synchronize": staticmethod(lambda device: None)})
    monkeypatch.setattr(timing, "_device_module", lambda device: module)
    monkeypatch.setattr(torch, "empty", lambda *args, **kwargs: Buffer())
    t = timing.time_calls(lambda: log.append("call"), "cpu", warmup=1, reps=2, flush_bytes=1 << 20, flush=flush)
    assert t.reps == 2 and t.median == 1e-3
    assert log == ["call"] + [evict, "record", "call", "record"] * 2
    assert f"1 MiB L2 flush ({'written' if flush == 'write' else 'read'})" in timing.describe(
        "cpu", warmup=1, reps=2, flush_bytes=1 << 20, flush=flush
    )


def test_time_calls_refuses_an_unknown_flush():
    with pytest.raises(ArgumentError, match="flush") as err:
        timing.time_calls(lambda: None, "cpu", warmup=1, reps=1, flush="evict")
    assert "'write'" in str(err.value) and "evict" in str(err.value)


def test_interleaved_and_host_timings_call_each_function_in_turn():
    order = []
    fns = {"a": lambda: order.append("a"), "b": lambda: order.append("b")}
    times = timing.interleaved_wall_seconds(fns, "cpu", warmup=1, repeat=3)
    assert order == ["a", "b"] + ["a", "b"] * 3
    assert {k: len(v) for k, v in times.items()} == {"a": 3, "b": 3}
    assert len(timing.wall_seconds(lambda: None, "cpu", warmup=0, repeat=4)) == 4
    order.clear()
    per_call = timing.host_seconds_per_call(fns, iters=10, repeats=2)
    assert order.count("a") == 3 + 20 and set(per_call) == {"a", "b"}


@pytest.mark.parametrize("dist", ["uniform", "zipf:1.2", "seed"])
def test_route_tokens_picks_distinct_experts_with_normalised_weights(dist):
    ids, weights = workloads.route_tokens(300, 32, 4, dist, seed=5)
    assert ids.shape == (300, 4) and ids.dtype == torch.int64
    assert weights.shape == (300, 4) and weights.dtype == torch.float32
    assert all(len(set(row)) == 4 for row in ids.tolist())
    assert torch.allclose(weights.sum(1), torch.ones(300))
    again, _ = workloads.route_tokens(300, 32, 4, dist, seed=5)
    assert torch.equal(ids, again)
    if dist == "seed":  # experts with no rows in the seed histogram are never chosen
        empty = {e for e, c in enumerate(workloads.SEED_COUNTS) if c == 0}
        assert not empty & set(ids.flatten().tolist())


def test_route_tokens_errors_name_the_argument():
    with pytest.raises(ArgumentError, match="experts"):
        workloads.route_tokens(10, 8, 2, "seed")
    with pytest.raises(ArgumentError, match="dist"):
        workloads.route_tokens(10, 8, 2, "normal")
    with pytest.raises(ArgumentError, match="topk"):
        workloads.route_tokens(10, 4, 5, "uniform")


def test_masked_decode_counts_caps_at_max_m():
    counts = workloads.masked_decode_counts(16, 8, 12, seed=0)
    assert len(counts) == 8 and max(counts) <= 12
    # 16 rows per group on average before the cap: the uncapped draw sums to 16 * 8
    uncapped = workloads.masked_decode_counts(16, 8, 10**6, seed=0)
    assert sum(uncapped) == 16 * 8


def test_perf_re_exports_the_workloads():
    from moe_hal import perf

    assert perf.synthetic_counts is workloads.synthetic_counts and perf.SEED_COUNTS is workloads.SEED_COUNTS


def test_device_figures_count_flops_and_bytes():
    # ``seconds`` stands for the caller's timing: a fixed 0.5 s, so the figures are the counts / 0.5.
    results = []

    def seconds(fn):
        results.append(fn())
        return 0.5

    previous_tf32 = torch.backends.cuda.matmul.allow_tf32
    assert timing.matmul_rate("bf16", 8, "cpu", seconds) == 2 * 8**3 / 0.5
    assert results[-1].shape == (8, 8) and results[-1].dtype == torch.bfloat16
    assert torch.backends.cuda.matmul.allow_tf32 == previous_tf32
    assert timing.read_bandwidth(4000, "cpu", seconds) == 4000 / 0.5
    assert float(results[-1]) == 1000  # the sum of 1000 fp32 ones: the whole buffer was read
    assert timing.copy_bandwidth(4000, "cpu", seconds) == 2 * 4000 / 0.5  # read + write
    assert results[-1].numel() == 1000 and bool((results[-1] == 1).all())
    for dtype in ("tf32", "fp8", "int8"):  # CUDA-only modes are refused, not faked
        with pytest.raises(RuntimeError):
            timing.matmul_call(dtype, 8, "cpu")
    with pytest.raises(ArgumentError, match="fp64"):
        timing.matmul_call("fp64", 8, "cpu")


def test_sweep_cases_are_deterministic_in_the_seed():
    assert workloads.sweep(False, "fp32", True, seed=3) == workloads.sweep(False, "fp32", True, seed=3)
    assert workloads.sweep(False, "fp32", False, seed=3) != workloads.sweep(False, "fp32", False, seed=4)
    for case in workloads.sweep(True, "bf16", False):
        if case.op != "k_grouped":
            _, n, k, _ = workloads.MODEL_SHAPES[case.name.split("-")[0] + "-" + case.name.split("-")[1]]
            assert (case.n, case.k) == (n, k)
