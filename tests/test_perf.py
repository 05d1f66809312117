"""Unit tests of the performance model (moe_hal.perf) against hand-computed cases.

Golden values are recomputed here with small independent loops from the formulas stated in
moe_hal/perf/__init__.py (docs/perf-model.md explains them), or worked out by hand in the
comments, never taken from the model's own output.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moe_hal import perf
from moe_hal.errors import ArgumentError, DTypeError
from moe_hal.perf.model import _round_robin_makespan

from .seed_histogram import SEED_HISTOGRAM as SEED

# The H200 of the reference's worked example: 132 SMs, 1979 TFLOPS fp8 (spec), 788 TFLOPS bf16
# (measured), 4.3 TB/s (measured copy), wgmma M >= 64.
H200 = perf.Hardware("h200-example", 132, {"fp8": 1979e12, "bf16": 788e12}, 4.3e12, mma_min_m=64)


def ceil_div(a, b):
    return (a + b - 1) // b


def test_seed_constant_is_the_issue_histogram():
    assert list(perf.SEED_COUNTS) == SEED
    assert sum(SEED) == 8048 and sum(1 for c in SEED if c) == 25


@pytest.mark.parametrize("bm, occ, tiles", [(64, 0.898, 4480), (128, 0.786, 2560), (256, 0.642, 1568)])
def test_seed_occupancy_and_tiles(bm, occ, tiles):
    # independent loop over the groups
    used = padded = blocks = 0
    for m in SEED:
        used += m
        padded += ceil_div(m, bm) * bm
        blocks += ceil_div(m, bm)
    hand_tiles = blocks * (4096 // 128)
    est = perf.estimate(SEED, n=4096, k=7168, hw=H200, dtype="fp8", block_m=bm)
    assert est.tiles == hand_tiles == tiles
    assert est.occupancy_m == pytest.approx(used / padded)
    assert round(est.occupancy_m, 3) == occ  # the numbers printed in reference §4.5
    assert est.occupancy_n == 1.0
    assert est.rows == 8048 and est.padded_rows == padded and est.active_groups == 25
    assert est.waves == ceil_div(tiles, 132)
    assert est.wave_efficiency == pytest.approx(tiles / (ceil_div(tiles, 132) * 132))


@pytest.mark.parametrize("bm, reference_us", [(64, 266), (128, 313), (256, 376)])
def test_seed_predicted_time_h200_fp8(bm, reference_us):
    est = perf.estimate(SEED, n=4096, k=7168, hw=H200, dtype="fp8", block_m=bm)
    # hand: waves x (one BM x 128 tile of K=7168 on one SM at peak/132)
    t_tile = 2 * bm * 128 * 7168 / (1979e12 / 132)
    t_comp = math.ceil(ceil_div_sum(SEED, bm) * 32 / 132) * t_tile
    assert est.t_compute == pytest.approx(t_comp, rel=1e-12)
    assert est.bound == "compute" and est.t_predicted == pytest.approx(t_comp)
    assert est.t_predicted * 1e6 == pytest.approx(reference_us, abs=0.6)


def ceil_div_sum(counts, bm):
    return sum(ceil_div(m, bm) for m in counts)


def test_seed_plain_roofline_and_bytes():
    est = perf.estimate(SEED, n=4096, k=7168, hw=H200, dtype="fp8", block_m=128)
    useful = 2 * 8048 * 4096 * 7168
    assert est.useful_flops == useful
    assert est.padded_flops == 2 * (ceil_div_sum(SEED, 128) * 128) * 4096 * 7168
    # 25 active experts' weights (fp8 + fp32 scale per 128x128 block), A rows (+ fp32 scale per
    # 1x128), bf16 output
    weights = 25 * 4096 * 7168 * (1 + 4 / 16384)
    acts = 8048 * 7168 * (1 + 4 / 128)
    out = 8048 * 4096 * 2
    assert est.bytes_min == pytest.approx(weights + acts + out)
    assert est.bytes_kernel == est.bytes_min
    assert est.t_roofline == pytest.approx(max(useful / 1979e12, (weights + acts + out) / 4.3e12))
    assert est.t_roofline * 1e6 == pytest.approx(239, abs=0.5)  # reference §4.5: 239 us
    assert est.t_memory * 1e6 == pytest.approx(200, abs=1.0)  # §4.5: 199 us without scale bytes


@pytest.mark.parametrize("bm, reference_us", [(64, 669), (128, 787), (256, 944)])
def test_seed_predicted_time_h200_bf16(bm, reference_us):
    est = perf.estimate(SEED, n=4096, k=7168, hw=H200, dtype="bf16", block_m=bm)
    assert est.t_predicted * 1e6 == pytest.approx(reference_us, abs=0.6)
    assert est.t_roofline * 1e6 == pytest.approx(600, abs=0.5)


@pytest.mark.parametrize("bm, reference_us", [(64, 338), (128, 348), (256, 372)])
def test_seed_serial_bound(bm, reference_us):
    # experts one after another, each at its own padded roofline (reference §4.5)
    hand = 0.0
    for m in SEED:
        if m:
            comp = 2 * ceil_div(m, bm) * bm * 4096 * 7168 / 1979e12
            mem = (4096 * 7168 * (1 + 4 / 16384) + m * 7168 * (1 + 4 / 128) + m * 4096 * 2) / 4.3e12
            hand += max(comp, mem)
    est = perf.estimate(SEED, n=4096, k=7168, hw=H200, dtype="fp8", block_m=bm)
    assert est.t_serial == pytest.approx(hand)
    assert est.t_serial * 1e6 == pytest.approx(reference_us, abs=1.0)


def test_ridge_height():
    assert perf.ridge_m(H200, "bf16") == pytest.approx(788e12 * 2 / (2 * 4.3e12))  # 183 rows
    assert round(perf.ridge_m(H200, "bf16")) == 183
    assert round(perf.ridge_m(H200, "fp8")) == 230  # 1979e12 * 1 / 8.6e12 (+ scale bytes)
    est = perf.estimate(SEED, n=4096, k=7168, hw=H200, dtype="fp8")
    assert est.ridge_m == pytest.approx(perf.ridge_m(H200, "fp8"))


def test_group_bounds_follow_the_ridge():
    est = perf.estimate(SEED, n=4096, k=7168, hw=H200, dtype="fp8", block_m=64)
    for m, bound in zip(SEED, est.group_bounds):
        if m == 0:
            assert bound == "empty"
        else:
            padded = ceil_div(m, 64) * 64
            comp = 2 * padded * 4096 * 7168 / 1979e12
            mem = (4096 * 7168 * (1 + 4 / 16384) + m * 7168 * (1 + 4 / 128) + m * 4096 * 2) / 4.3e12
            assert bound == ("compute" if comp > mem else "memory")
    # the 17 experts of at most M* = 230 rows stream their weights (reference §4.5); the 240-row
    # one pads to 256 > M*, but its activation and output bytes keep it (barely) memory-bound too
    below = [m for m in SEED if 0 < m <= 230]
    memory = [m for m, b in zip(SEED, est.group_bounds) if b == "memory"]
    assert len(below) == 17 and set(below) <= set(memory) and sorted(set(memory) - set(below)) == [240]


def test_empty_groups_and_streaming_all_experts():
    kw = dict(n=256, k=512, hw=H200, dtype="bf16", block_m=64, block_n=128)
    only = perf.estimate([100, 0, 0, 30], **kw)
    assert only.tiles == (2 + 1) * 2 and only.active_groups == 2
    assert only.bytes_min == 2 * 256 * 512 * 2 + 130 * 512 * 2 + 130 * 256 * 2
    streamed = perf.estimate([100, 0, 0, 30], streams_all_experts=True, **kw)
    assert streamed.bytes_min == only.bytes_min
    assert streamed.bytes_kernel == only.bytes_min + 2 * 256 * 512 * 2
    assert streamed.t_memory > only.t_memory and streamed.t_roofline == only.t_roofline
    padding = perf.estimate([100, 0, 0, 30], reads_padding_rows=True, **kw)
    assert padding.bytes_kernel == only.bytes_min + ((128 - 100) + (64 - 30)) * 512 * 2


def test_all_groups_empty():
    est = perf.estimate([0, 0, 0], n=128, k=128, hw=H200, dtype="bf16")
    assert est.tiles == 0 and est.waves == 0 and est.t_compute == 0 and est.bytes_min == 0
    assert est.t_predicted == 0 and est.occupancy_m == 1.0 and est.wave_efficiency == 1.0


def test_mma_floor_makes_small_tiles_cost_a_full_instruction():
    kw = dict(n=128, k=1024, hw=H200, dtype="bf16", block_n=128)
    small = perf.estimate([16], block_m=16, **kw)
    full = perf.estimate([16], block_m=64, **kw)
    assert small.t_compute == full.t_compute == 2 * 64 * 128 * 1024 / (788e12 / 132)
    no_floor = H200.replace(mma_min_m=None)
    assert perf.estimate([16], block_m=16, **{**kw, "hw": no_floor}).t_compute == pytest.approx(full.t_compute / 4)


def test_wave_quantization_edges():
    hw = perf.Hardware("four-cores", 4, {"bf16": 4e12}, 1e15)  # compute-bound always
    kw = dict(n=128, k=256, hw=hw, dtype="bf16", block_m=64, block_n=128)
    t_tile = 2 * 64 * 128 * 256 / 1e12
    four = perf.estimate([64] * 4, **kw)
    assert (four.tiles, four.waves, four.wave_efficiency) == (4, 1, 1.0)
    assert four.t_compute == pytest.approx(t_tile)
    five = perf.estimate([64] * 5, **kw)
    assert (five.tiles, five.waves) == (5, 2) and five.wave_efficiency == pytest.approx(5 / 8)
    assert five.t_compute == pytest.approx(2 * t_tile)


def test_fixed_time_overlap_and_bandwidth_cap():
    kw = dict(n=1024, k=1024, dtype="bf16", block_m=64, block_n=128)
    base = perf.estimate([64], hw=H200, **kw)
    assert perf.estimate([64], hw=H200, t_fixed=5e-6, **kw).t_predicted == pytest.approx(base.t_predicted + 5e-6)
    assert perf.estimate([64], hw=H200.replace(t_fixed=3e-6), **kw).t_predicted == pytest.approx(
        base.t_predicted + 3e-6
    )
    summed = perf.estimate([64], hw=H200, overlap_p=1, **kw)
    assert summed.t_predicted == pytest.approx(base.t_compute + base.t_memory)
    # 8 tiles on 132 cores, each core streams at most 10 GB/s -> 80 GB/s effective
    capped = perf.estimate([64], hw=H200.replace(bw_per_core=10e9), **kw)
    assert capped.tiles == 8
    assert capped.t_memory == pytest.approx(base.bytes_kernel / 80e9)
    assert capped.t_roofline == base.t_roofline


def test_split_k_spreads_a_few_tiles_over_the_cores():
    # one 64-row group, N = 256: 2 tiles of 64 x 128 on 8 cores; K = 1024 split 4 -> 8 slices of 256
    hw = perf.Hardware("eight-cores", 8, {"bf16": 8e12}, 1e18)  # compute-bound, 1e12 FLOP/s a core
    kw = dict(n=256, k=1024, hw=hw, dtype="bf16", block_m=64, block_n=128)
    whole = perf.estimate([64], **kw)
    split = perf.estimate([64], split_k=4, **kw)
    assert (whole.tiles, whole.waves, whole.split_k) == (2, 1, 1)
    assert (split.tiles, split.waves, split.split_k) == (8, 1, 4)
    assert whole.t_compute == pytest.approx(2 * 64 * 128 * 1024 / 1e12)
    assert split.t_compute == pytest.approx(2 * 64 * 128 * 256 / 1e12)
    # an uneven split rounds the slice depth up: 1024 / 3 -> 342
    assert perf.estimate([64], split_k=3, **kw).t_compute == pytest.approx(2 * 64 * 128 * 342 / 1e12)
    # the fp32 partials are written and read back: 2 x 4 slices x 64 x 256 x 4 bytes, on top of the
    # call's own bytes (the bf16 output is written by the reduction instead of the GEMM)
    assert split.bytes_min == whole.bytes_min
    assert split.bytes_kernel == whole.bytes_kernel + 2 * 4 * 64 * 256 * 4
    assert split.useful_flops == whole.useful_flops and split.t_roofline == whole.t_roofline
    assert split.as_dict()["split_k"] == 4


def test_split_k_partials_stream_from_memory_in_a_warm_call():
    hw = H200.replace(l2_bytes=50 * 2**20, l2_bandwidth=8e12)
    kw = dict(n=2112, k=7168, hw=hw, dtype="bf16", block_m=64, block_n=64, operands="l2")
    whole, split = perf.estimate([16], **kw), perf.estimate([16], split_k=4, **kw)
    # the operands read come from the L2 either way; the partials are not operands
    assert split.bytes_l2 == whole.bytes_l2 == 2112 * 7168 * 2 + 16 * 7168 * 2


def test_uneven_n_tile():
    est = perf.estimate([100], n=200, k=64, hw=H200, dtype="bf16", block_m=128, block_n=128)
    assert est.occupancy_n == pytest.approx(200 / 256)
    assert est.padded_flops == 2 * 128 * 256 * 64
    assert est.tiles == 2


def test_masked_matches_contiguous_and_checks_capacity():
    kw = dict(n=4096, k=7168, hw=H200, dtype="fp8", block_m=64)
    masked = perf.estimate([16, 0, 33, 64], op="masked", max_m=128, **kw)
    contiguous = perf.estimate([16, 0, 33, 64], **kw)
    assert masked.t_predicted == contiguous.t_predicted and masked.tiles == contiguous.tiles == 3 * 32
    assert masked.op == "masked"
    with pytest.raises(ArgumentError) as err:
        perf.estimate([16, 200], op="masked", max_m=128, **kw)
    assert err.value.argument == "counts[1]"


def brute_force_round_robin(tile_costs, cores):
    load = [0.0] * cores
    for i, c in enumerate(tile_costs):
        load[i % cores] += c
    return max(load)


def test_k_grouped_against_a_brute_force_schedule():
    hw = perf.Hardware("eight-cores", 8, {"bf16": 8e12}, 1e18)  # compute-bound
    ks = [256, 0, 1024, 128, 512]
    m, n, bm, bn = 300, 256, 128, 128
    est = perf.estimate(ks, n=n, m=m, hw=hw, dtype="bf16", block_m=bm, block_n=bn, op="k_grouped")
    per_group = ceil_div(m, bm) * ceil_div(n, bn)  # 3 x 2 = 6 tiles for every non-empty group
    costs = []
    for kg in ks:
        if kg:
            costs += [2 * bm * bn * kg / 1e12] * per_group
    assert est.tiles == len(costs) == 24 and est.waves == 3
    assert est.t_compute == pytest.approx(brute_force_round_robin(costs, 8))
    assert est.useful_flops == 2 * m * n * sum(ks)
    assert est.padded_flops == 2 * 384 * 256 * sum(ks)
    assert est.occupancy_m == pytest.approx(300 / 384)
    # reads a and b rows once, writes every group's fp32 output (empty ones get zeros)
    assert est.out_dtype == "fp32"
    assert est.bytes_min == sum(ks) * (m + n) * 2 + len(ks) * m * n * 4
    acc = perf.estimate(ks, n=n, m=m, hw=hw, dtype="bf16", block_m=bm, block_n=bn, op="k_grouped", accumulate=True)
    assert acc.bytes_min == est.bytes_min + len(ks) * m * n * 4
    assert est.group_bounds[1] == "empty"


def test_k_grouped_equal_groups_reduce_to_waves():
    hw = perf.Hardware("eight-cores", 8, {"bf16": 8e12}, 1e18)
    est = perf.estimate([512] * 5, n=256, m=256, hw=hw, dtype="bf16", block_m=128, block_n=128, op="k_grouped")
    assert est.tiles == 20 and est.waves == 3
    assert est.t_compute == pytest.approx(3 * 2 * 128 * 128 * 512 / 1e12)


def test_round_robin_against_brute_force_many_runs():
    import random

    rng = random.Random(3)
    for _ in range(50):
        cores = rng.randint(1, 9)
        runs = [(rng.randint(0, 30), rng.random()) for _ in range(rng.randint(1, 6))]
        costs = [c for count, c in runs for _ in range(count)]
        expected = brute_force_round_robin(costs, cores) if costs else 0.0
        assert _round_robin_makespan(runs, cores) == pytest.approx(expected)


def test_advise_ranks_the_seed_tiles():
    adv = perf.advise(SEED, 4096, 7168, H200, "fp8")
    assert [e.block_m for e in adv.ranked] == [64, 128, 256]
    assert adv.tile == (64, 128) and adv.best is adv.ranked[0]
    assert "64x128" in adv.reason
    assert adv.as_dict()["tile"] == [64, 128]


def test_advise_tie_break_prefers_less_compute_then_smaller_tiles():
    # 32 groups of 8 rows stream 32 experts' weights: every tile is memory-bound, times tie on T_mem
    adv = perf.advise([8] * 32, 4096, 7168, H200, "fp8", tiles=[(128, 128), (64, 128)])
    assert len({round(e.t_predicted, 12) for e in adv.ranked}) == 1
    assert adv.tile == (64, 128)
    assert "compute time" in adv.reason
    # equal compute too (BM=32 is rounded up to the 64-row MMA): the smaller tile wins by size
    adv = perf.advise([8] * 32, 4096, 7168, H200, "fp8", tiles=[(64, 128), (32, 128)])
    assert adv.tile == (32, 128) and "BM+BN" in adv.reason


def test_advise_decode_shortcut():
    tiles = [(64, 128), (128, 128), (256, 128)]
    low = perf.advise_decode(max_m=256, expected_m=16, num_groups=32, n=4096, k=7168, hw=H200, dtype="fp8", tiles=tiles)
    assert low.tile == (64, 128) and low.best.bound == "memory"
    assert "expected_m <= M*" in low.reason
    assert low.best.counts == (16,) * 32 and low.best.op == "masked"
    # 300 rows per group: BM=64 pads to 320 (occupancy 0.94), 128 -> 384, 256 -> 512
    high = perf.advise_decode(
        max_m=512, expected_m=300, num_groups=32, n=4096, k=7168, hw=H200, dtype="fp8", tiles=tiles
    )
    assert high.best.bound == "compute" and "expected_m > M*" in high.reason
    hand = {}
    for bm, _ in tiles:
        tiles_ = 32 * ceil_div(300, bm) * 32
        hand[bm] = math.ceil(tiles_ / 132) * 2 * bm * 128 * 7168 / (1979e12 / 132)
    assert high.tile[0] == min(hand, key=hand.get)
    worst = perf.advise_decode(max_m=128, expected_m=None, num_groups=4, n=4096, k=7168, hw=H200, dtype="fp8")
    assert worst.best.counts == (128,) * 4
    with pytest.raises(ArgumentError):
        perf.advise_decode(max_m=64, expected_m=65, num_groups=4, n=4096, k=7168, hw=H200, dtype="fp8")


def test_dtype_aliases_and_out_dtype():
    a = perf.estimate([64], n=128, k=128, hw=H200, dtype="fp8_e4m3")
    assert a.dtype == "fp8" and a.out_dtype == "bf16"
    b = perf.estimate([64], n=128, k=128, hw=H200, dtype="bfloat16", out_dtype="fp32")
    assert b.dtype == "bf16" and b.out_dtype == "fp32"
    assert b.bytes_min == 128 * 128 * 2 + 64 * 128 * 2 + 64 * 128 * 4


@pytest.mark.parametrize(
    "kwargs, argument",
    [
        (dict(counts=[1, -1]), "counts[1]"),
        (dict(counts=[1.5]), "counts[0]"),
        (dict(counts=[]), "counts"),
        (dict(counts="12"), "counts"),
        (dict(n=0), "n"),
        (dict(k=None), "k"),
        (dict(block_m=0), "block_m"),
        (dict(block_n=True), "block_n"),
        (dict(op="grouped"), "op"),
        (dict(hw=None), "hw"),
        (dict(hw=3.5), "hw"),
        (dict(m=5), "m"),
        (dict(t_fixed=-1.0), "t_fixed"),
        (dict(overlap_p=0.5), "overlap_p"),
        (dict(split_k=0), "split_k"),
        (dict(split_k=2.0), "split_k"),
        (dict(split_k=2, op="k_grouped", k=None, m=64), "split_k"),
    ],
)
def test_bad_arguments_name_themselves(kwargs, argument):
    call = dict(counts=[4, 8], n=128, k=128, hw=H200, dtype="bf16")
    call.update(kwargs)
    counts = call.pop("counts")
    with pytest.raises(ArgumentError) as err:
        perf.estimate(counts, **call)
    assert err.value.argument == argument


def test_bad_dtypes():
    with pytest.raises(DTypeError):
        perf.estimate([4], n=128, k=128, hw=H200, dtype="fp64")
    with pytest.raises(DTypeError) as err:
        perf.estimate([4], n=128, k=128, hw=H200, dtype="fp16")  # no fp16 peak in H200 above
    assert "h200-example" in str(err.value)
    with pytest.raises(ArgumentError):
        perf.estimate([4], n=128, op="k_grouped", k=128, m=16, hw=H200)
    with pytest.raises(ArgumentError):
        perf.advise([4], 128, 128, H200, "bf16", tiles=[])
    with pytest.raises(ArgumentError):
        perf.advise([4], 128, 128, H200, "bf16", tiles=[(64,)])


def test_hardware_validation():
    with pytest.raises(ArgumentError):
        perf.Hardware("x", 0, {"bf16": 1e12}, 1e12)
    with pytest.raises(ArgumentError):
        perf.Hardware("x", 4, {}, 1e12)
    with pytest.raises(ArgumentError):
        perf.Hardware("x", 4, {"bf16": -1}, 1e12)
    with pytest.raises(ArgumentError):
        perf.Hardware("x", 4, {"bf16": 1e12}, 0)
    with pytest.raises(DTypeError):
        perf.Hardware("x", 4, {"fp64": 1e12}, 1e12)


def test_counts_accept_numpy_and_tensors():
    import numpy as np
    import torch

    ref = perf.estimate([3, 0, 7], n=128, k=128, hw=H200)
    assert perf.estimate(np.array([3, 0, 7]), n=128, k=128, hw=H200).tiles == ref.tiles
    assert perf.estimate(torch.tensor([3, 0, 7], dtype=torch.int32), n=128, k=128, hw=H200).tiles == ref.tiles


@settings(max_examples=60, deadline=None)
@given(
    counts=st.lists(st.integers(0, 3000), min_size=1, max_size=40),
    bm=st.sampled_from([16, 32, 64, 128, 256]),
    bn=st.sampled_from([64, 128, 256]),
    n=st.integers(1, 5000),
    k=st.integers(1, 8000),
    dtype=st.sampled_from(["fp8", "bf16"]),
)
def test_invariants(counts, bm, bn, n, k, dtype):
    est = perf.estimate(counts, n=n, k=k, hw=H200, dtype=dtype, block_m=bm, block_n=bn)
    assert est.t_predicted >= est.t_roofline * (1 - 1e-12)
    assert est.t_padded >= est.t_roofline * (1 - 1e-12)
    assert est.t_compute >= est.padded_flops / est.peak_flops * (1 - 1e-12)
    assert 0 < est.occupancy_m <= 1 and 0 < est.occupancy_n <= 1 and 0 < est.wave_efficiency <= 1
    if est.rows:
        assert est.padded_flops == pytest.approx(est.useful_flops / (est.occupancy_m * est.occupancy_n))
    assert est.bound in ("compute", "memory")
    assert len(est.group_bounds) == len(counts)


def test_synthetic_counts():
    for dist in ("uniform", "balanced", "zipf:0.8", "zipf:1.2"):
        c = perf.synthetic_counts(dist, tokens=1000, experts=16, topk=4, seed=1)
        assert len(c) == 16 and sum(c) == 4000 and max(c) <= 1000
        assert c == perf.synthetic_counts(dist, tokens=1000, experts=16, topk=4, seed=1)
    assert perf.synthetic_counts("balanced", 10, 4, 1) == [3, 3, 2, 2]
    skew = max(perf.synthetic_counts("zipf:1.2", 4000, 32, 8, seed=0))
    flat = max(perf.synthetic_counts("uniform", 4000, 32, 8, seed=0))
    assert skew > flat
    assert perf.synthetic_counts("seed", None, 32) == SEED
    scaled = perf.synthetic_counts("seed", tokens=503, experts=32, topk=8)
    assert sum(scaled) == 4024 and all((a == 0) == (b == 0) for a, b in zip(scaled, SEED) if b == 0)
    with pytest.raises(ArgumentError):
        perf.synthetic_counts("seed", None, 16)
    with pytest.raises(ArgumentError):
        perf.synthetic_counts("zipf:x", 10, 4, 1)
    with pytest.raises(ArgumentError):
        perf.synthetic_counts("normal", 10, 4, 1)
    with pytest.raises(ArgumentError):
        perf.synthetic_counts("uniform", 10, 4, 5)


def test_scale_counts_largest_remainder():
    assert perf.scale_counts([1, 1, 1], 10) == [4, 3, 3]
    assert perf.scale_counts([2, 0, 6], 4) == [1, 0, 3]
    with pytest.raises(ArgumentError):
        perf.scale_counts([0, 0], 4)


class FakeEntry:
    """The hwdb entry contract: values may be None when unknown."""

    id = "fake-gpu"
    num_cores = 10
    mma_min_m = 64
    l2_bytes = 1 << 20

    def __init__(self, measured_bw=None, copy_bw=None):
        self._measured_bw, self._copy_bw = measured_bw, copy_bw

    def peak_flops(self, dtype, *, measured=True):
        return {"bf16": 100e12 if measured else 120e12, "fp8": 200e12}.get(dtype)

    def mem_bandwidth(self, *, measured=True):
        return self._measured_bw if (measured and self._measured_bw) else 2e12

    def quantity(self, path):
        class Q:
            si = self._copy_bw

        return Q() if (path == "measured.copy_bandwidth" and self._copy_bw) else None


def test_hardware_from_entry():
    h = perf.Hardware.from_entry(FakeEntry())
    assert h.peak("bf16") == 100e12 and h.peak("fp8") == 200e12 and h.mem_bandwidth == 2e12
    assert h.sources["peak.bf16"] == "measured" and h.sources["peak.fp8"] == "spec"
    assert (h.num_cores, h.mma_min_m, h.l2_bytes) == (10, 64, 1 << 20)
    assert perf.Hardware.from_entry(FakeEntry(), measured=False).peak("bf16") == 120e12
    assert perf.Hardware.from_entry(FakeEntry(copy_bw=1.5e12)).mem_bandwidth == 1.5e12
    assert perf.Hardware.from_entry(FakeEntry(measured_bw=1.8e12, copy_bw=1.5e12)).mem_bandwidth == 1.8e12
    assert perf.Hardware.from_entry(FakeEntry(copy_bw=1.5e12), measured=False).mem_bandwidth == 2e12
    assert perf.estimate([64], n=128, k=128, hw=FakeEntry(), dtype="bf16").hw == "fake-gpu"


def test_design_call_with_the_hardware_db():
    # the call docs/design.md §7 and the README show, through the hardware DB
    est = perf.estimate([4, 1026, 0, 77], n=4096, k=7168, hw="nvidia-h200-sxm", dtype="fp8", block_m=128)
    assert est.hw == "nvidia-h200-sxm" and est.num_cores == 132 and est.block_m == 128
    assert perf.estimate([4], n=128, k=128, hw="h200", dtype="bf16").hw == "nvidia-h200-sxm"
    with pytest.raises(ArgumentError):
        perf.estimate([4], n=128, k=128, hw="no-such-device")


def test_model_imports_without_torch():
    # the model must work where torch is not installed: block torch and load moe_hal.perf
    # without running the package __init__ (which imports the torch-based API)
    root = Path(__file__).resolve().parents[1]
    code = f"""
import sys, types
sys.modules["torch"] = None
pkg = types.ModuleType("moe_hal"); pkg.__path__ = [{str(root / "moe_hal")!r}]
sys.modules["moe_hal"] = pkg
from moe_hal import perf
hw = perf.Hardware("x", 132, {{"fp8": 1979e12}}, 4.3e12, mma_min_m=64)
print(perf.advise(perf.SEED_COUNTS, 4096, 7168, hw, "fp8").tile)
print(perf.estimate(perf.SEED_COUNTS, n=4096, k=7168, hw="nvidia-h200-sxm", dtype="fp8").tiles)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["(64,", "128)", "2560"]


def test_l2_resident_operands_stream_at_the_l2_rate():
    # one group, 64 x 4096 x 4096 bf16 on a device with a 16 MB L2 streaming 8 TB/s and 2 TB/s
    # memory: A 64*4096*2 = 0.5 MiB and B 4096*4096*2 = 32 MiB are read, C 0.5 MiB written
    hw = perf.Hardware("small", 4, {"bf16": 1e18}, 2e12, l2_bytes=16_000_000, l2_bandwidth=8e12)
    kw = dict(n=4096, k=4096, hw=hw, dtype="bf16", block_m=64, block_n=128)
    read, written = 64 * 4096 * 2 + 4096 * 4096 * 2, 64 * 4096 * 2
    cold = perf.estimate([64], **kw)
    assert cold.operands == "hbm" and cold.bytes_l2 == 0
    assert cold.t_memory == pytest.approx((read + written) / 2e12)
    # operands that fit: every byte read comes from the L2, the output goes to memory
    small = perf.estimate([64], operands="l2", **{**kw, "n": 512})
    small_read, small_written = 64 * 4096 * 2 + 512 * 4096 * 2, 64 * 512 * 2
    assert small.bytes_l2 == small_read
    assert small.t_memory == pytest.approx(small_read / 8e12 + small_written / 2e12)
    assert f"{small_read / 1e6:.1f} MB" in small.basis["operands"]
    # 34.1 MB read through a 16 MB L2, call after call: each line is evicted before it is read
    # again, so a warm call this large streams from memory like a cold one
    warm = perf.estimate([64], operands="l2", **kw)
    assert warm.bytes_l2 == 0 and warm.t_memory == cold.t_memory
    assert "exceed the 16.0 MB L2" in warm.basis["operands"]
    # without an L2 rate the call is predicted cold, and the basis says so
    plain = perf.estimate([64], operands="l2", **{**kw, "hw": hw.replace(l2_bandwidth=None)})
    assert plain.t_memory == cold.t_memory and "predicted cold" in plain.basis["operands"]
    with pytest.raises(ArgumentError, match="operands"):
        perf.estimate([64], operands="warm", **kw)


H20 = perf.Hardware("h20-example", 78, {"fp8": 296e12}, 4.0e12, mma_min_m=64)


@pytest.mark.parametrize(
    "counts, reference_us", [([16] * 2, 30.9), ([16] * 4, 61.9), ([32] * 2, 30.9), ([32] * 9, 123.8)]
)
def test_published_h20_points_of_the_reference(counts, reference_us):
    # reference §4.4 "tile+wave model" column for DeepGEMM PR #116 (masked, fp8, N=4096, K=7168,
    # BM=64, BN=128): waves x one 64x128x7168 tile at 296/78 TFLOP/s per SM
    est = perf.estimate(counts, n=4096, k=7168, hw=H20, dtype="fp8", block_m=64, op="masked")
    waves = math.ceil(len(counts) * 32 / 78)
    assert est.t_predicted == pytest.approx(waves * 2 * 64 * 128 * 7168 / (296e12 / 78))
    assert est.t_predicted * 1e6 == pytest.approx(reference_us, abs=0.1)


def test_published_h200_streaming_point_of_the_reference():
    # reference §4.4: DeepGEMM issue #20, 256 groups x 64 rows, N=7168, K=4096, fp8, 4.3 TB/s -> 1818 us
    est = perf.estimate([64] * 256, n=7168, k=4096, hw=H200, dtype="fp8", block_m=64, op="masked")
    assert est.bound == "memory"
    assert est.t_predicted * 1e6 == pytest.approx(1818, rel=0.005)


def test_advise_problem_reads_the_layout_without_a_sync():
    import torch

    import moe_hal
    from moe_hal.problem import Problem

    counts = [5, 0, 300, 64]
    lay = moe_hal.ContiguousLayout.from_counts(counts, alignment=128)
    p = Problem.build(
        torch.zeros(lay.num_rows, 256, dtype=torch.bfloat16), torch.zeros(4, 128, 256, dtype=torch.bfloat16), lay
    )
    adv = perf.advise_problem(p, H200)
    direct = perf.advise(counts, 128, 256, H200, "bf16")
    assert adv.best == direct.best and adv.best.counts == tuple(counts)

    masked = moe_hal.MaskedLayout(torch.tensor([3, 9], dtype=torch.int32), max_m=32, expected_m=8)
    p = Problem.build(torch.zeros(2, 32, 256), torch.zeros(2, 128, 256), masked)
    adv = perf.advise_problem(p, perf.Hardware("x", 8, {"fp32": 1e13}, 1e12))
    assert adv.best.counts == (8, 8) and adv.best.op == "masked" and adv.best.out_dtype == "fp32"

    klay = moe_hal.KGroupedLayout.from_counts([10, 0, 22])
    p = Problem.build(torch.zeros(32, 48), torch.zeros(32, 64), klay)
    adv = perf.advise_problem(p, perf.Hardware("x", 8, {"fp32": 1e13}, 1e12))
    assert adv.best.op == "k_grouped" and adv.best.m == 48 and adv.best.n == 64 and adv.best.counts == (10, 0, 22)
