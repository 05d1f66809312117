"""Achieved efficiency in the model (moe_hal/perf/efficiency.py, hardware.py, model.py): the
fallback order, the basis every estimate reports, and the round trip of a fit through
``hwdb/measured`` overlays. Expected values are computed here by hand."""

from __future__ import annotations

from dataclasses import replace

import pytest
import yaml

from moe_hal import hwdb, perf
from moe_hal.errors import ArgumentError
from moe_hal.perf.efficiency import Achieved, EfficiencyTable


def rec(
    device="dev-a",
    arch="arch",
    impl="lib",
    kind="compute",
    value=0.5,
    cases=3,
    dtype="fp8",
    family="grouped_contiguous",
):
    if kind != "compute":
        dtype = family = None
    return Achieved(device, arch, impl, kind, value, cases, "fitted", "test", dtype=dtype, family=family)


def test_this_implementation_on_this_device_comes_first():
    table = EfficiencyTable([rec(value=0.5), rec(impl="other", value=0.8), rec(device="dev-b", value=0.9)])
    got = table.compute("dev-a", "arch", "lib", "fp8", "grouped_contiguous")
    assert got.value == 0.5 and "lib on device dev-a" in got.level


def test_without_an_implementation_the_best_known_one_answers():
    table = EfficiencyTable([rec(value=0.5), rec(impl="other", value=0.8)])
    got = table.compute("dev-a", "arch", None, "fp8", "grouped_contiguous")
    assert got.value == 0.8 and "best known implementation (other)" in got.level


def test_a_kernel_s_own_share_on_the_architecture_comes_before_other_kernels_on_the_device():
    # "new" reached 0.7 of the peak on dev-b; dev-a knows two other kernels at 0.5. A compute
    # fraction is the kernel's code, so on dev-a "new" takes its own dev-b figure; a kernel never
    # measured takes dev-a's typical one, and on dev-c (nothing measured there) the architecture's.
    table = EfficiencyTable([rec(value=0.5), rec(impl="mid", value=0.5), rec(device="dev-b", impl="new", value=0.7)])
    own = table.compute("dev-a", "arch", "new", "fp8", "grouped_contiguous")
    assert own.value == 0.7 and own.level.startswith("new on architecture arch"), own
    assert table.compute("dev-a", "arch", "unseen", "fp8", "grouped_contiguous").value == 0.5
    assert table.compute("dev-c", "arch", "new", "fp8", "grouped_contiguous").value == 0.7
    assert table.compute("dev-c", "elsewhere", "new", "fp8", "grouped_contiguous") is None
    # a streaming fraction is the device's memory system as much as the kernel's: the device's
    # kernels first, and elsewhere the architecture's typical figure, not the kernel's own
    streams = EfficiencyTable(
        [
            rec(kind="bandwidth", value=0.8),
            rec(impl="mid", kind="bandwidth", value=0.8),
            rec(device="dev-b", impl="new", kind="bandwidth", value=0.6),
        ]
    )
    assert streams.bandwidth("dev-a", "arch", "new").value == 0.8
    assert streams.bandwidth("dev-c", "arch", "new").value == 0.8


def test_a_typical_figure_pools_two_implementations_and_one_other_kernel_is_a_last_resort():
    slow_alone = rec(value=0.07)  # the only implementation measured on dev-a
    elsewhere = [rec(device="dev-b", impl="x", value=0.5), rec(device="dev-b", impl="y", value=0.6)]
    # dev-a knows one kernel, so the architecture answers: 0.07 x 3, 0.5 x 3, 0.6 x 3 -> 0.5
    got = EfficiencyTable([slow_alone, *elsewhere]).compute("dev-a", "arch", "new", "fp8", "grouped_contiguous")
    assert got.value == 0.5 and "typical implementation (lib, x, y) on architecture arch" in got.level
    # a kernel's own figure on another device of the architecture comes before one other kernel's
    own = EfficiencyTable([slow_alone, rec(device="dev-b", impl="new", value=0.8)])
    assert own.compute("dev-a", "arch", "new", "fp8", "grouped_contiguous").value == 0.8
    # where no level knows two, the lone figure still answers, and says so
    lone = EfficiencyTable([slow_alone]).compute("dev-a", "arch", "new", "fp8", "grouped_contiguous")
    assert lone.value == 0.07 and "no level pools two implementations" in lone.level
    # the rule is about typical figures: a kernel's own figure and the best known are unaffected
    assert EfficiencyTable([slow_alone]).compute("dev-a", "arch", "lib", "fp8", "grouped_contiguous").value == 0.07
    assert EfficiencyTable([slow_alone]).compute("dev-a", "arch", None, "fp8", "grouped_contiguous").value == 0.07


def test_one_other_kernel_of_the_architecture_comes_before_the_kernels_of_other_architectures():
    # the RTX 5090's case: held out, its CuTe DSL FP4 kernel takes its architecture's one other FP4
    # kernel, not the typical share of the B200's (another MMA, another share of its own peak)
    alone = rec(device="rtx", arch="consumer", value=0.8)
    datacenter = [rec(device="b200", impl=impl, value=value) for impl, value in (("x", 0.5), ("y", 0.6))]
    got = EfficiencyTable([alone, *datacenter]).compute("rtx", "consumer", "new", "fp8", "grouped_contiguous")
    assert got.value == 0.8 and "(lib) on device rtx" in got.level, got
    assert "no level pools two implementations" in got.level
    # with two kernels of its own the architecture pools them, as before
    two = EfficiencyTable([alone, rec(device="rtx", arch="consumer", impl="z", value=0.7), *datacenter])
    pooled = two.compute("rtx", "consumer", "new", "fp8", "grouped_contiguous")
    assert "typical implementation (lib, z) on device rtx" in pooled.level


def test_a_share_at_the_cap_is_not_lent_to_other_architectures():
    # two RTX 5090s run cuBLAS bf16 above the datasheet peak (the fitted share stops at 1): that
    # says the cards outran their datasheet, not what share of its peak cuBLAS reaches on a B200
    capped = [rec(device=d, arch="consumer", dtype="bf16", value=1.0) for d in ("rtx-a", "rtx-b")]
    hopper = rec(device="h100", arch="hopper", dtype="bf16", value=0.71)
    b200_fp4 = rec(device="b200", arch="blackwell", impl="fp4-kernel", dtype="fp4", value=0.6)
    table = EfficiencyTable([*capped, hopper, b200_fp4])
    got = table.compute("b200", "blackwell", "lib", "bf16", "grouped_contiguous")
    assert got.value == 0.71 and "lib on dtype bf16" in got.level, got
    # on its own device and architecture a capped share answers as before
    assert table.compute("rtx-a", "consumer", "lib", "bf16", "grouped_contiguous").value == 1.0
    assert table.compute("rtx-c", "consumer", "lib", "bf16", "grouped_contiguous").value == 1.0


def test_a_kernel_s_own_fixed_time_is_not_lent_to_another_architecture():
    # cuBLAS's own 10 us on an RTX 5090 (timed back to back) is not its prologue on a B200: an
    # architecture that borrows a fixed time borrows the joint one
    a100 = "nvidia-a100-sxm-80gb"  # Ampere, never measured: it borrows from NVIDIA's others
    table = EfficiencyTable(
        [
            rec(device="nvidia-rtx-5090", arch="blackwell_consumer", impl="cublas", kind="launch", value=10e-6),
            rec(device="nvidia-rtx-5090", arch="blackwell_consumer", impl="*", kind="launch", value=6e-6),
            rec(device="nvidia-h100-sxm", arch="hopper", impl="*", kind="launch", value=3e-6),
        ]
    )
    got = table.figure("launch", a100, "ampere", "cublas")
    assert got.value != 10e-6 and "every implementation (fitted jointly)" in got.level, got
    # on its own architecture the kernel's own time still answers, on every device of it
    assert table.figure("launch", "nvidia-rtx-5090", "blackwell_consumer", "cublas").value == 10e-6


def test_a_kernel_without_an_l2_rate_of_its_own_takes_the_best_known_not_a_typical_one():
    table = EfficiencyTable(
        [
            rec(impl="slow", kind="l2_bandwidth", value=1.7e12),
            rec(impl="fast", kind="l2_bandwidth", value=8.6e12),
            rec(device="dev-b", impl="faster", kind="l2_bandwidth", value=9.3e12),
        ]
    )
    assert table.figure("l2_bandwidth", "dev-a", "arch", "slow").value == 1.7e12  # its own
    got = table.figure("l2_bandwidth", "dev-a", "arch", "new")  # the device's best, then the architecture's
    assert got.value == 8.6e12 and "best known implementation (fast)" in got.level
    assert table.figure("l2_bandwidth", "dev-c", "arch", "new").value == 9.3e12
    assert table.figure("l2_bandwidth", "dev-c", "elsewhere", "new") is None


def test_an_implementation_never_measured_is_taken_as_typical_not_as_the_best():
    # cases behind the values: 0.5 x 3, 0.6 x 3, 0.9 x 2 -> the 4th of 8 cases is 0.6
    table = EfficiencyTable([rec(value=0.5), rec(impl="mid", value=0.6), rec(impl="fast", value=0.9, cases=2)])
    got = table.compute("dev-a", "arch", "never-measured", "fp8", "grouped_contiguous")
    assert got.value == 0.6 and "typical implementation (fast, lib, mid)" in got.level
    assert table.compute("dev-a", "arch", None, "fp8", "grouped_contiguous").value == 0.9  # what the device reaches
    assert table.compute("dev-a", "arch", "fast", "fp8", "grouped_contiguous").value == 0.9  # measured: its own
    times = EfficiencyTable(
        [
            rec(kind="launch", value=2e-6),
            rec(impl="mid", kind="launch", value=5e-6),
            rec(impl="slow", kind="launch", value=9e-6),
        ]
    )
    assert times.figure("launch", "dev-a", "arch", None).value == 2e-6  # the best time is the shortest
    assert times.figure("launch", "dev-a", "arch", "other").value == 5e-6


def test_a_kernel_s_own_fixed_time_on_another_device_of_the_architecture_comes_before_the_joint_one():
    # "slow" paid 6 us per call on dev-b; every kernel pays 3 us on dev-a and dev-b (fitted
    # jointly). On dev-a "slow" is predicted with its own 6 us, every other kernel with the
    # joint 3 us; another architecture's own time is not the kernel's code on this one.
    table = EfficiencyTable(
        [
            rec(impl="*", kind="launch", value=3e-6),
            rec(device="dev-b", impl="*", kind="launch", value=3e-6),
            rec(device="dev-b", impl="slow", kind="launch", value=6e-6),
            rec(device="dev-c", arch="other-arch", impl="*", kind="launch", value=3e-6),
        ]
    )
    own = table.figure("launch", "dev-a", "arch", "slow")
    assert own.value == 6e-6 and own.level.startswith("slow on architecture arch"), own
    for impl in ("lib", None):
        assert table.figure("launch", "dev-a", "arch", impl).value == 3e-6
    assert table.figure("launch", "dev-c", "other-arch", "slow").value == 3e-6


def test_the_family_class_is_tried_before_other_devices():
    # a masked call on dev-a: dev-a's contiguous (same forward class) before dev-b's masked
    table = EfficiencyTable(
        [rec(value=0.6), rec(device="dev-b", value=0.9, family="grouped_masked"), rec(value=0.4, family="k_grouped")]
    )
    assert table.compute("dev-a", "arch", "lib", "fp8", "grouped_masked").value == 0.6
    assert table.compute("dev-a", "arch", "lib", "fp8", "k_grouped").value == 0.4


def test_an_implementation_s_own_forward_figure_on_the_device_comes_before_another_s_family_figure():
    # a masked call of lib on dev-a: lib's own contiguous figure there (same forward class) before
    # another library's masked one; the other library's answers only when lib has none on dev-a
    table = EfficiencyTable([rec(value=0.9), rec(impl="other", value=0.5, family="grouped_masked")])
    got = table.compute("dev-a", "arch", "lib", "fp8", "grouped_masked")
    assert got.value == 0.9 and "lib on device dev-a, fp8 forward kernels" in got.level
    # an unmeasured kernel: the masked level knows one kernel only, the forward class pools two
    got = table.compute("dev-a", "arch", "new", "fp8", "grouped_masked")
    assert got.value == 0.5 and "typical implementation (lib, other) on device dev-a, fp8 forward kernels" in got.level
    # lib's own figure on dev-b (the same architecture) comes before other libraries' on dev-a,
    # two of them or one: a share of the MMA peak is the kernel's code (OWN_ON_ARCHITECTURE_FIRST)
    others = [
        rec(impl="other", value=0.5, family="grouped_masked"),
        rec(impl="third", value=0.5, family="grouped_masked"),
    ]
    for known in (others, others[:1]):
        table = EfficiencyTable([*known, rec(device="dev-b", value=0.9)])
        got = table.compute("dev-a", "arch", "lib", "fp8", "grouped_masked")
        assert got.value == 0.9 and got.level.startswith("lib on architecture arch"), got
        assert table.compute("dev-a", "arch", "new", "fp8", "grouped_masked").value == 0.5


def test_fp16_and_bf16_answer_for_each_other_before_another_width():
    # the device knows bf16 and fp8 kernels; an fp16 call takes the bf16 figure, not the fp8 one
    # (nor the architecture's fp16 one: the device comes first)
    table = EfficiencyTable(
        [
            rec(dtype="bf16", value=0.6),
            rec(dtype="fp8", value=0.9),
            rec(device="dev-b", dtype="fp16", value=0.4),
        ]
    )
    got = table.compute("dev-a", "arch", "lib", "fp16", "grouped_contiguous")
    assert got.value == 0.6 and "bf16 grouped_contiguous" in got.level
    # its own dtype first when the device has both
    table = EfficiencyTable([rec(dtype="bf16", value=0.6), rec(dtype="fp16", value=0.7)])
    assert table.compute("dev-a", "arch", "lib", "fp16", "grouped_contiguous").value == 0.7
    # fp8 has no twin: with only bf16 and fp16 on the device it goes to the architecture's any-dtype level
    got = EfficiencyTable([rec(dtype="bf16", value=0.6)]).compute("dev-a", "arch", "lib", "fp8", "grouped_contiguous")
    assert got.value == 0.6 and "any dtype" in got.level


def test_a_dtype_elsewhere_comes_before_another_dtype_here():
    # the architecture knows fp4 kernels only; a bf16 call takes bf16 kernels of another
    # architecture (its own library's first), not the fp4 share of the fp4 peak
    table = EfficiencyTable(
        [
            rec(arch="new", device="dev-n", impl="fp4lib", dtype="fp4", value=0.45),
            rec(arch="new", device="dev-n", impl="fp4lib2", dtype="fp4", value=0.55),
            rec(arch="old", device="dev-o", impl="blas", dtype="bf16", value=0.71),
            rec(arch="old", device="dev-o", impl="other", dtype="bf16", value=0.65, cases=4),
        ]
    )
    got = table.compute("dev-n", "new", "blas", "bf16", "dense")
    assert got.value == 0.71 and "blas on dtype bf16" in got.level
    got = table.compute("dev-n", "new", "unknown", "bf16", "dense")
    # the case-weighted median: 4 of the 7 cases are other's
    assert got.value == 0.65 and "typical implementation (blas, other) on dtype bf16" in got.level
    # fp16 takes its twin elsewhere too
    assert table.compute("dev-n", "new", "blas", "fp16", "dense").value == 0.71
    # an fp8 call, which no architecture knows, takes the architecture's any-dtype figure
    assert "any dtype" in table.compute("dev-n", "new", "unknown", "fp8", "dense").level
    # the architecture's own bf16 figure, of any implementation, comes before the dtype elsewhere
    table = EfficiencyTable([*table, rec(arch="new", device="dev-n", impl="x", dtype="bf16", value=0.6)])
    table = EfficiencyTable([*table, rec(arch="new", device="dev-n", impl="y", dtype="bf16", value=0.6)])
    assert table.compute("dev-n", "new", "blas", "bf16", "dense").value == 0.6
    # an architecture never measured, on a device the hardware DB does not know, borrows nothing
    assert table.compute("dev-z", "unmeasured", "blas", "bf16", "dense") is None


VENDORS = {"dev-h": "green", "dev-b": "green", "dev-new": "green", "dev-npu": "red", "dev-nobw": "green"}
BANDWIDTHS = {"dev-h": 3e12, "dev-b": 8e12, "dev-new": 2e12, "dev-npu": 1.6e12}


def borrowing_table(records):
    return EfficiencyTable(records, vendor_of=VENDORS.get, bandwidth_of=BANDWIDTHS.get)


def test_an_architecture_never_measured_borrows_its_vendor_s_shares_and_times_but_not_rates():
    table = borrowing_table(
        [
            rec(device="dev-h", arch="hop", impl="blas", dtype="bf16", family="dense", value=0.7),
            rec(device="dev-b", arch="bw", impl="blas", dtype="bf16", family="dense", value=0.6),
            rec(device="dev-h", arch="hop", impl="fp8lib", dtype="fp8", value=0.9),
            rec(device="dev-h", arch="hop", impl="blas", kind="bandwidth", value=0.8),
            rec(device="dev-b", arch="bw", impl="other", kind="bandwidth", value=0.6),
            rec(device="dev-h", arch="hop", impl="*", kind="launch", value=3e-6),
            rec(device="dev-b", arch="bw", impl="*", kind="launch", value=5e-6, cases=5),
            rec(device="dev-h", arch="hop", impl="blas", kind="l2_bandwidth", value=3.6e12),
            rec(device="dev-b", arch="bw", impl="other", kind="l2_bandwidth", value=8e12),
            rec(device="dev-h", arch="hop", impl="blas", kind="bandwidth_per_unit", value=30e9),
        ]
    )
    got = table.compute("dev-new", "fresh", "blas", "bf16", "dense")
    # blas's own bf16 figures on the vendor's architectures: the case-weighted median of 0.7 and 0.6
    assert got.value == 0.6 and "blas on vendor green" in got.level and "fresh never measured" in got.level
    # its twin answers for fp16 there too, and an fp8 call takes the fp8 kernels, not bf16 ones
    assert table.compute("dev-new", "fresh", "blas", "fp16", "dense").value == 0.6
    assert table.compute("dev-new", "fresh", "blas", "fp8", "grouped_contiguous").value == 0.9
    # streaming, typical over the vendor's kernels for a kernel with no figure of its own there
    band = table.bandwidth("dev-new", "fresh", "unknown")
    assert band.value == 0.6 and "typical implementation (blas, other) on vendor green" in band.level
    launch = table.figure("launch", "dev-new", "fresh", "blas")
    assert launch.value == 5e-6 and "fresh never measured" in launch.level  # 5 of the 8 cases
    # an L2 rate is borrowed as a multiple of the datasheet bandwidth, the best one the vendor
    # reaches (blas's 3.6 / 3 = 1.2x, not other's 1x), as for a kernel without its own L2 rate
    l2 = table.figure("l2_bandwidth", "dev-new", "fresh", "other")
    assert l2.value == pytest.approx(1.2 * 2e12) and "multiple of the datasheet bandwidth" in l2.level
    assert table.figure("l2_bandwidth", "dev-nobw", "fresh", "blas") is None  # its bandwidth unknown
    # a per-core streaming cap is the device's own
    assert table.figure("bandwidth_per_unit", "dev-new", "fresh", "blas") is None
    # another vendor's device borrows nothing, and neither does one whose vendor is unknown
    assert table.compute("dev-npu", "npu-arch", "blas", "bf16", "dense") is None
    assert table.bandwidth("dev-npu", "npu-arch", "blas") is None
    assert table.figure("l2_bandwidth", "dev-npu", "npu-arch", "blas") is None
    assert table.compute("dev-unknown", "other-arch", "blas", "bf16", "dense") is None


def test_an_architecture_with_figures_of_a_kind_borrows_nothing_of_that_kind():
    table = borrowing_table(
        [
            rec(device="dev-h", arch="hop", impl="blas", kind="bandwidth", value=0.8),
            rec(device="dev-b", arch="bw", impl="blas", kind="bandwidth", value=0.5),
            rec(device="dev-b", arch="bw", impl="blas", dtype="bf16", family="dense", value=0.6),
        ]
    )
    # bw's own streaming figure answers; hop's is never pooled into it
    assert table.bandwidth("dev-new", "bw", "blas").value == 0.5
    # bw has compute figures (of bf16 only): an fp8 call on it is not answered from other architectures
    # by step 5, and no architecture knows fp8 here, so it falls to bw's any-dtype figure
    assert "architecture bw, any dtype" in table.compute("dev-new", "bw", "blas", "fp8", "dense").level


def test_a_device_of_an_unmeasured_architecture_in_the_hardware_db_is_predicted_from_borrowed_shares():
    # the A100 (Ampere) has no published case: its estimate borrows NVIDIA's measured architectures'
    # shares and says so, instead of predicting from the datasheet peak
    a100 = perf.Hardware.from_entry(hwdb.get("nvidia-a100-sxm-80gb"))
    est = perf.estimate([256] * 8, 4096, 7168, a100, "bf16", 128, 128)
    assert "ampere never measured" in est.basis["compute"]
    assert "ampere never measured" in est.basis["bandwidth"]
    assert est.achieved_flops < a100.peak("bf16")
    # the Ascend entries borrow nothing from NVIDIA's
    est = perf.estimate(
        [256] * 8, 4096, 7168, perf.Hardware.from_entry(hwdb.get("huawei-ascend-910c")), "bf16", 128, 128
    )
    assert "no achieved efficiency" in est.basis["compute"]


def test_one_case_is_not_enough_to_calibrate_a_level():
    table = EfficiencyTable([rec(value=0.2, cases=1), rec(device="dev-b", value=0.7, cases=4)])
    assert table.compute("dev-a", "arch", "lib", "fp8", "grouped_contiguous").value == 0.7


def test_bandwidth_falls_back_to_the_streaming_of_the_other_kernels_on_the_device():
    table = EfficiencyTable(
        [
            rec(kind="bandwidth", value=0.45),
            rec(kind="bandwidth", impl="other", value=0.6),
            rec(kind="bandwidth", impl="fast", value=0.8),
            rec(device="dev-b", kind="bandwidth", impl="third", value=0.9),
        ]
    )
    assert table.bandwidth("dev-a", "arch", "lib").value == 0.45
    assert table.bandwidth("dev-a", "arch", "third").value == 0.6  # typical on this device, before dev-b's own
    assert table.bandwidth("dev-a", "arch", None).value == 0.8  # the best this device reaches


@pytest.mark.parametrize("bad", [{"value": 1.5}, {"value": 0.0}, {"kind": "speed"}, {"family": "dense2"}])
def test_bad_achieved_figures_are_refused(bad):
    with pytest.raises(ArgumentError):
        rec(**bad)


H800 = {
    "num_cores": 132,
    "peak_flops": {"fp8": 1979e12, "bf16": 989.5e12},
    "mem_bandwidth": 3.35e12,
    "mma_min_m": 64,
    "promotion_k": {"fp8": 128},
}


def test_estimate_applies_achieved_figures_and_says_so():
    table = EfficiencyTable(
        [
            rec(device="gpu", value=0.5),
            rec(device="gpu", kind="bandwidth", value=0.8),
            rec(device="gpu", kind="tile_overhead", value=2e-6, impl="*"),
            rec(device="gpu", kind="launch", value=3e-6, impl="*"),
        ]
    )
    hw = perf.Hardware("gpu", architecture="arch", efficiency=table, impl="lib", **H800)
    est = perf.estimate([8192] * 4, 4096, 7168, hw, "fp8", 128, 128)
    tiles = 4 * 64 * 32
    waves = -(-tiles // 132)
    t_tile = 2 * 128 * 128 * 7168 / (0.5 * 1979e12 / 132) + 2e-6
    assert est.t_compute == pytest.approx(waves * t_tile)
    assert est.t_predicted == pytest.approx(waves * t_tile + 3e-6)
    assert est.t_roofline == pytest.approx(2 * 4 * 8192 * 4096 * 7168 / 1979e12)  # the roofline keeps the peak
    assert "0.5" in est.basis["compute"] and "fitted" in est.basis["compute"]
    assert "fitted" in est.basis["bandwidth"] and "as given" in est.basis["roofline"]


def _staged(latency):
    table = EfficiencyTable(
        [
            rec(device="gpu", value=0.5),
            rec(device="gpu", value=0.5, dtype="bf16"),
            rec(device="gpu", kind="bandwidth", value=0.8),
            rec(device="gpu", kind="tile_overhead", value=2e-6, impl="*"),
            rec(device="gpu", kind="stage_latency", value=latency, impl="*"),
            rec(device="gpu", kind="launch", value=3e-6, impl="*"),
        ]
    )
    return perf.Hardware("gpu", architecture="arch", efficiency=table, impl="lib", **H800)


def test_each_k_block_of_a_tile_adds_its_latency_and_says_so():
    hw = _staged(100e-9)
    # one wave of 7168 / 56 = 128 tiles of 64 x 56, K = 2048: 16 blocks of 128 run one after another
    est = perf.estimate([64], 7168, 2048, hw, "fp8", 64, 56, family="dense")
    assert est.tiles == 128 and est.waves == 1 and est.promotion_k == 128
    mma = 2 * 64 * 56 * 2048 / (0.5 * 1979e12 / 132)
    # the 2 us overhead is stated per 128 x 128 tile: a 64 x 56 one pays its area's share
    assert est.t_compute == pytest.approx(mma + 16 * 100e-9 + 2e-6 * 64 * 56 / 128**2)
    assert est.stage_latency == 100e-9
    assert "100 ns per K block" in est.basis["stage_latency"] and "fitted" in est.basis["stage_latency"]
    # a partial last block is a whole block
    assert perf.estimate([64], 7168, 2049, hw, "fp8", 64, 56).t_compute == pytest.approx(
        2 * 64 * 56 * 2049 / (0.5 * 1979e12 / 132) + 17 * 100e-9 + 2e-6 * 64 * 56 / 128**2
    )


def test_more_k_blocks_predict_longer_all_else_equal():
    # the same bytes (n * k equal) and tiles per wave, more K blocks per tile: the longer K loop is
    # slower, and without the latency the two calls would be predicted alike within their bytes
    hw, plain = _staged(100e-9), _staged(0.0)
    short = perf.estimate([64], 7168, 2048, hw, "fp8", 64, 56, family="dense")
    long = perf.estimate([64], 2048, 7168, hw, "fp8", 64, 16, family="dense")
    assert long.t_compute - short.t_compute == pytest.approx(
        (56 - 16) * 100e-9
        + 2 * 64 * 16 * 7168 / (0.5 * 1979e12 / 132)
        - 2 * 64 * 56 * 2048 / (0.5 * 1979e12 / 132)
        + 2e-6 * 64 * (16 - 56) / 128**2
    )
    assert long.t_predicted > short.t_predicted
    assert perf.estimate([64], 2048, 7168, plain, "fp8", 64, 16, family="dense").t_predicted < long.t_predicted


def test_the_k_block_latency_weighs_less_the_larger_the_tile_and_skips_unpromoted_dtypes():
    hw, plain = _staged(100e-9), _staged(0.0)
    calls = [([8192] * 8, 7168, 4096, tile) for tile in ((64, 56), (128, 128), (128, 256))]
    shares = []
    for counts, n, k, (bm, bn) in calls:
        with_latency = perf.estimate(counts, n, k, hw, "fp8", bm, bn)
        without = perf.estimate(counts, n, k, plain, "fp8", bm, bn)
        # every wave's tiles run 4096 / 128 = 32 blocks, each 100 ns longer
        assert with_latency.t_compute - without.t_compute == pytest.approx(with_latency.waves * 32 * 100e-9)
        shares.append(1 - without.t_compute / with_latency.t_compute)
    # the latency is paid per block whatever the block's MMA: the bigger the MMA, the smaller its share
    assert shares[0] > shares[1] > shares[2] > 0
    # bf16 kernels do not promote partial sums per K block: no latency, and the basis says why
    bf16 = perf.estimate([64], 7168, 2048, hw, "bf16", 64, 56)
    assert bf16.stage_latency == 0.0 and bf16.promotion_k == 0
    assert bf16.t_compute == pytest.approx(2 * 64 * 56 * 2048 / (0.5 * 989.5e12 / 132) + 2e-6 * 64 * 56 / 128**2)
    assert "not applied" in bf16.basis["stage_latency"]
    # nor do fp8 kernels where the MMA applies the block scales and accumulates in fp32 itself
    mma_scales = hw.replace(promotion_k={})
    fp8 = perf.estimate([64], 7168, 2048, mma_scales, "fp8", 64, 56, family="dense")
    assert fp8.stage_latency == 0.0 and fp8.promotion_k == 0 and "not applied" in fp8.basis["stage_latency"]
    assert fp8.t_compute == pytest.approx(2 * 64 * 56 * 2048 / (0.5 * 1979e12 / 132) + 2e-6 * 64 * 56 / 128**2)


def test_a_fast_accumulating_kernel_pays_no_k_block_latency_on_a_device_that_promotes():
    hw = _staged(100e-9)
    promoted = perf.estimate([64], 7168, 2048, hw, "fp8", 64, 56, family="dense")
    fast = perf.estimate([64], 7168, 2048, hw, "fp8", 64, 56, family="dense", fast_accumulation=True)
    assert promoted.promotion_k == 128 and fast.promotion_k == 0 and fast.stage_latency == 0.0
    assert promoted.t_compute - fast.t_compute == pytest.approx(16 * 100e-9)
    assert "fast_accumulation" in fast.basis["stage_latency"]
    # a dtype the device does not promote says why it is not applied, whatever the flag
    bf16 = perf.estimate([64], 7168, 2048, hw, "bf16", 64, 56, fast_accumulation=True)
    assert "Hardware.promotion_k" in bf16.basis["stage_latency"]
    # the advisor ranks the tiles of the same call, flag included
    best = perf.advise([64], 7168, 2048, hw, "fp8", ((64, 56),), family="dense", fast_accumulation=True).best
    assert best.t_compute == pytest.approx(fast.t_compute)


def test_the_published_set_marks_vllm_s_sm90_fp8_gemm_fast_accumulating():
    from moe_hal.perf import calibration

    cases = [c for c in calibration.load_published() if c.impl == "vllm_cutlass_scaled_mm"]
    hopper = [c for c in cases if c.device == "nvidia-h100-sxm"]
    assert hopper and all(c.fast_accumulation for c in cases)
    est = calibration.predict(hopper[0])
    assert est.promotion_k == 0 and "fast_accumulation" in est.basis["stage_latency"]
    # its block-scaled sibling applies its scales per K block, so it promotes
    block = next(c for c in calibration.load_published() if c.impl == "vllm_cutlass_scaled_mm_blockwise")
    assert not block.fast_accumulation and calibration.predict(block).promotion_k == 128


def test_a_tile_pays_the_overhead_by_its_accumulator_area_up_to_128_by_128():
    hw = _staged(0.0)  # 2 us per 128 x 128 tile, 3 us per call
    for (bm, bn), share in (((128, 128), 1.0), ((64, 64), 0.25), ((128, 256), 1.0), ((64, 56), 64 * 56 / 128**2)):
        est = perf.estimate([bm], bn, 256, hw, "bf16", bm, bn, family="dense")
        assert est.tiles == 1 and est.tile_overhead == 2e-6
        assert est.overhead_per_tile == pytest.approx(2e-6 * share)
        assert est.t_compute == pytest.approx(2 * bm * bn * 256 / (0.5 * 989.5e12 / 132) + 2e-6 * share)
        assert "per 128 x 128 tile" in est.basis["tile_overhead"]
    # a tile shorter than the MMA's minimum M fills the whole MMA accumulator, and pays for it
    short = perf.estimate([16], 128, 256, hw, "bf16", 16, 128, family="dense")
    assert short.overhead_per_tile == pytest.approx(2e-6 * 64 * 128 / 128**2)
    # a long call in 64 x 64 tiles pays twice the overhead of 128 x 256 ones (8x the waves at a
    # quarter each), so the advisor still prefers the large tile there, and the small one for a
    # call of one wave
    counts, n, k = [8192] * 8, 7168, 4096
    small, large = (perf.estimate(counts, n, k, hw, "bf16", bm, bn) for bm, bn in ((64, 64), (128, 256)))
    assert small.waves * small.overhead_per_tile == pytest.approx(2 * large.waves * large.overhead_per_tile, rel=0.01)
    assert perf.advise(counts, n, k, hw, "bf16", [(64, 64), (128, 256)]).best.tile == (128, 256)
    assert perf.advise([128] * 8, 128, 128, hw, "bf16", [(64, 64), (128, 256)]).best.tile == (64, 64)


def test_only_the_hopper_entries_promote_fp8_partial_sums_per_k_block():
    for device in ("nvidia-h100-sxm", "nvidia-h100-pcie", "nvidia-h800-sxm", "nvidia-h200-sxm", "nvidia-h20"):
        assert dict(perf.Hardware.from_entry(hwdb.get(device)).promotion_k) == {"fp8": 128}, device
    for device in ("nvidia-b200", "nvidia-gb200-nvl72", "nvidia-b300"):
        assert dict(perf.Hardware.from_entry(hwdb.get(device)).promotion_k) == {}, device
    for bad in ({"fp8": 0}, {"fp8": 1.5}, 128, [("fp8", 128)]):
        with pytest.raises(ArgumentError, match="promotion_k"):
            perf.Hardware("bad", **{**H800, "promotion_k": bad})
    with pytest.raises(ArgumentError, match="peak_flops"):
        perf.Hardware("bad", **{**H800, "peak_flops": [("fp8", 1979e12)]})


def test_block_scaled_fp4_tiles_cost_128_rows_on_datacenter_blackwell():
    # tcgen05's block-scaled MMA takes 128 rows per SM where a dense one takes 64 (hwdb
    # compute.fp4_mma_min_m); elsewhere fp4 takes the device's own floor
    for device in ("nvidia-b200", "nvidia-gb200-nvl72", "nvidia-b300"):
        hw = perf.Hardware.from_entry(hwdb.get(device), achieved=False)
        assert (hw.min_m("fp4"), hw.min_m("fp8"), hw.min_m("bf16")) == (128, 64, 64), device
        assert hwdb.get(device).to_dict()["derived"]["fp4_mma_min_m"] == 128
    rtx = perf.Hardware.from_entry(hwdb.get("nvidia-rtx-5090"), achieved=False)
    assert rtx.min_m("fp4") == rtx.mma_min_m == 16
    b200 = perf.Hardware.from_entry(hwdb.get("nvidia-b200"), achieved=False)
    # 148 groups of 64 rows: one 64-row tile each costs the MMA time of a 128-row one
    args = ([64] * 148, 256, 7168, b200)
    fp4_64, fp4_128 = perf.estimate(*args, "fp4", 64, 256), perf.estimate(*args, "fp4", 128, 256)
    assert fp4_64.t_compute == pytest.approx(fp4_128.t_compute)
    bf16_64, bf16_128 = perf.estimate(*args, "bf16", 64, 256), perf.estimate(*args, "bf16", 128, 256)
    assert bf16_64.t_compute == pytest.approx(bf16_128.t_compute / 2, rel=0.05)
    for bad in ({"fp4": 0}, {"fp4": 128.0}, 128):
        with pytest.raises(ArgumentError, match="mma_min_m_of"):
            perf.Hardware("bad", **{**H800, "mma_min_m_of": bad})


def test_a_dense_gemm_uses_the_dense_family_fraction():
    table = EfficiencyTable([rec(device="gpu", value=0.5), rec(device="gpu", value=0.8, family="dense")])
    hw = perf.Hardware("gpu", architecture="arch", efficiency=table, impl="lib", **H800)
    grouped = perf.estimate([4096], 4096, 7168, hw, "fp8", 128, 128)
    dense = perf.estimate([4096], 4096, 7168, hw, "fp8", 128, 128, family="dense")
    assert grouped.achieved_flops == pytest.approx(0.5 * 1979e12)
    assert dense.achieved_flops == pytest.approx(0.8 * 1979e12)
    assert "dense" in dense.basis["compute"]
    with pytest.raises(ArgumentError, match="family"):
        perf.estimate([4096], 4096, 7168, hw, "fp8", 128, 128, family="sparse")


def test_estimate_without_achieved_figures_says_it_predicts_from_the_peak():
    est = perf.estimate([256] * 4, 4096, 7168, perf.Hardware("plain", **H800), "fp8", 128, 128)
    assert "no achieved efficiency" in est.basis["compute"]
    assert est.achieved_flops == 1979e12


def test_a_fit_round_trips_through_hwdb_measured(tmp_path):
    from moe_hal.perf import calibration

    cases = [c for c in calibration.load_published() if c.source == "deepgemm-readme-55ab91f"]
    table = calibration.fit(cases)
    written = calibration.write_overlays(table, tmp_path, suffix=".published-fit", method="test fit", tool="pytest")
    assert [p.name for p in written] == ["nvidia-h800-sxm.published-fit.yaml"]
    doc = yaml.safe_load(written[0].read_text())
    fraction = doc["achieved"]["deepgemm"]["compute"]["fp8"]["grouped_contiguous"]
    assert fraction["basis"] == "fitted" and fraction["cases"] == 4
    try:
        hwdb.add_overlay(written[0], "test")
        entry = hwdb.get("nvidia-h800-sxm")
        assert entry.raw["achieved"]["deepgemm"]["compute"]["fp8"]["grouped_contiguous"]["value"] == fraction["value"]
        est = perf.estimate([8192] * 4, 4096, 7168, "nvidia-h800-sxm", "fp8", 128, 128, impl="deepgemm")
        assert est.achieved_flops == pytest.approx(fraction["value"] * 1979e12)
        assert "fitted" in est.basis["compute"] and "deepgemm" in est.basis["compute"]
    finally:
        hwdb.reload(forget_overlays=True)


def test_the_fast_fit_arithmetic_is_the_model_itself():
    # against the committed fit of every case (the hardware DB's overlays), not a fit of its own
    from moe_hal.perf import calibration
    from moe_hal.perf.efficiency import table_from_entries

    cases = calibration.load_published()
    table = table_from_entries(hwdb.all())
    checked_loads = 0
    for case in cases[::7]:
        prepared = calibration._prepare([case])[0]
        overhead = table.figure("tile_overhead", case.device, prepared.architecture, case.impl)
        stage = table.figure("stage_latency", case.device, prepared.architecture, case.impl)
        launch = table.figure("launch", case.device, prepared.architecture, case.impl)
        load = table.figure("tile_load_rate", case.device, prepared.architecture, case.impl)
        times = (overhead.value, stage.value, launch.value, load and load.value)
        fast = calibration._fast_predict(calibration._Batch([prepared]), table, *times)[0][0]
        assert calibration.predict(case, table).t_predicted == pytest.approx(fast, rel=1e-9)
        checked_loads += load is not None
    # a kernel with a tile load rate of its own is among the cases checked (DeepGEMM's, in the committed fit)
    assert checked_loads


def test_predicting_cases_together_is_predicting_each_alone():
    # the fit predicts a group's cases at once (calibration._Batch): cases with different numbers
    # of candidate tiles, warm and cold, each case's own launch and load rate
    from moe_hal.perf import calibration
    from moe_hal.perf.efficiency import table_from_entries

    cases = calibration.load_published()
    table = table_from_entries(hwdb.all())  # the committed fit
    prepared = calibration._prepare(cases[::11])
    assert len({len(p.candidates) for p in prepared}) > 1 and {p.case.operands for p in prepared} == {"hbm", "l2"}
    launches = [1e-6 * (i % 4) for i in range(len(prepared))]
    loads = [None if i % 3 else 80e9 for i in range(len(prepared))]
    batch = calibration._Batch(prepared)
    together = calibration._fast_predict(batch, table, 2e-6, 40e-9, launches, loads)
    for i, p in enumerate(prepared):
        alone = calibration._fast_predict(calibration._Batch([p]), table, 2e-6, 40e-9, launches[i], loads[i])
        assert together[0][i] == alone[0][0] and together[2][i] == alone[2][0]
        assert batch.candidates[together[1][i]] is p.candidates[alone[1][0]]


def test_a_per_core_cap_and_l2_bandwidth_in_an_overlay_are_loaded(tmp_path):
    # the fields issue 14 found missing: a measured per-SM streaming cap and L2 bandwidth
    overlay = {
        "schema_version": 1,
        "overlay_of": "nvidia-h20",
        "achieved": {
            "probe_impl": {
                "bandwidth_per_unit": {
                    "value": 10,
                    "unit": "GB/s",
                    "basis": "measured",
                    "source": "test",
                    "date": "2026-12-02",
                    "method": "test",
                    "tool": "pytest",
                },
                "l2_bandwidth": {
                    "value": 5,
                    "unit": "TB/s",
                    "basis": "measured",
                    "source": "test",
                    "date": "2026-12-02",
                    "method": "test",
                    "tool": "pytest",
                },
            }
        },
    }
    path = tmp_path / "h20-probe.yaml"
    path.write_text(yaml.safe_dump(overlay))
    try:
        hwdb.add_overlay(path, "test")
        est = perf.estimate([16, 16], 4096, 7168, "nvidia-h20", "fp8", 64, 128, op="masked", impl="probe_impl")
        assert "measured" in est.basis["bw_per_core"] and "measured" in est.basis["l2_bandwidth"]
        # 2 groups x 32 n-blocks = 64 tiles on 78 SMs: at most 64 x 10 GB/s
        assert est.tiles == 64
        assert est.t_memory == pytest.approx(est.bytes_kernel / min(est.achieved_bandwidth, 64 * 10e9))
    finally:
        hwdb.reload(forget_overlays=True)


def test_the_committed_fit_carries_the_k_block_latency_with_its_basis():
    # hwdb/measured/*.published-fit.yaml (moe-hal model calibrate) stores it per Hopper device
    est = perf.estimate([64], 7168, 2048, "nvidia-h800-sxm", "fp8", 64, 56, family="dense")
    assert est.stage_latency > 0
    assert "per K block" in est.basis["stage_latency"] and "fitted" in est.basis["stage_latency"]
    with pytest.raises(ArgumentError, match="stage_latency"):
        perf.Hardware("bad", stage_latency=-1e-9, **H800)


#: (m, n, k) of streaming-bound small-M calls with 4 to 56 K blocks and compute-bound large ones.
MIXED_SHAPES = [(64, 7168, 2048), (64, 2112, 7168), (128, 2112, 7168), (64, 4096, 7168), (64, 24576, 1536)]
MIXED_SHAPES += [(64, 32768, 512), (4096, 7168, 2048), (4096, 4096, 7168), (4096, 2112, 7168), (2048, 7168, 16384)]


def _model_made_h800(shapes, extra=lambda m, n, k: 0.0):
    """Cases of one kernel ("lib", dense fp8 on the H800) timed by the model itself with known
    figures (0.8 of the fp8 peak, 0.7 of the bandwidth, 2 us per tile, 80 ns per K block, 3 us per
    call), ``extra(m, n, k)`` seconds added to each: (the table of those figures, the cases)."""
    from moe_hal.perf import calibration

    def r(kind, value, **kw):
        return Achieved("nvidia-h800-sxm", "hopper", kw.pop("impl", "*"), kind, value, 9, "fitted", "test", **kw)

    truth = EfficiencyTable(
        [
            r("compute", 0.8, impl="lib", dtype="fp8", family="dense"),
            r("bandwidth", 0.7, impl="lib"),
            r("tile_overhead", 2e-6),
            r("stage_latency", 80e-9),
            r("launch", 3e-6),
        ]
    )
    tiles = tuple((bm, bn) for bm in (64, 128) for bn in (16, 32, 56, 64, 128))
    cases = []
    for i, (m, n, k) in enumerate(shapes):
        case = calibration.MeasuredCase(
            f"c{i}", f"s{i % 3}", "nvidia-h800-sxm", "lib", "contiguous", "fp8", "bf16", (m,), n, k, None, 1.0,
            tiles, kernel_family="dense",
        )  # fmt: skip
        t = calibration.predict(case, truth).t_predicted + extra(m, n, k)
        cases.append(calibration.MeasuredCase(**{**case.__dict__, "t_measured": t}))
    return truth, cases


def test_the_fit_recovers_a_known_k_block_latency():
    # timings made by the model itself with known figures (_model_made_h800): the fit must find
    # them again, the latency included, from a mix of streaming-bound small-M calls with 4 to 56 K
    # blocks and compute-bound large ones
    from moe_hal.perf import calibration

    _, cases = _model_made_h800(MIXED_SHAPES)
    fitted = calibration.fit(cases)
    for kind, value in (("tile_overhead", 2e-6), ("stage_latency", 80e-9), ("launch", 3e-6)):
        assert fitted.figure(kind, "nvidia-h800-sxm", "hopper", "lib").value == pytest.approx(value), kind
    assert fitted.compute("nvidia-h800-sxm", "hopper", "lib", "fp8", "dense").value == pytest.approx(0.8)
    for case in cases:
        assert calibration.predict(case, fitted).t_predicted == pytest.approx(case.t_measured, rel=1e-6)


def _two_architectures(blackwell_impls: tuple[str, ...] = ("lib", "alt")):
    """Model-made timings of two kernels (``lib``, ``alt``: the same figures), 3 us per call and
    2 us per tile on both architectures: microsecond and millisecond FP8 calls on an H800,
    millisecond bf16 calls on a B200, made by ``blackwell_impls`` in turn. Returns the truth and
    the cases."""
    from moe_hal.perf import calibration

    def r(device, arch, kind, value, **kw):
        return Achieved(device, arch, kw.pop("impl", "*"), kind, value, 9, "fitted", "test", **kw)

    truth = EfficiencyTable(
        [
            *(
                r("nvidia-h800-sxm", "hopper", "compute", 0.8, impl=i, dtype="fp8", family="dense")
                for i in ("lib", "alt")
            ),
            *(r("nvidia-h800-sxm", "hopper", "bandwidth", 0.7, impl=i) for i in ("lib", "alt")),
            r("nvidia-h800-sxm", "hopper", "tile_overhead", 2e-6),
            r("nvidia-h800-sxm", "hopper", "stage_latency", 80e-9),
            r("nvidia-h800-sxm", "hopper", "launch", 3e-6),
            *(
                r("nvidia-b200", "blackwell", "compute", 0.85, impl=i, dtype="bf16", family="dense")
                for i in ("lib", "alt")
            ),
            r("nvidia-b200", "blackwell", "tile_overhead", 2e-6),
            r("nvidia-b200", "blackwell", "launch", 3e-6),
        ]
    )
    tiles = tuple((bm, bn) for bm in (64, 128) for bn in (16, 32, 56, 64, 128))
    shapes = {
        ("nvidia-h800-sxm", "fp8"): [(64, 7168, 2048), (64, 2112, 7168), (128, 2112, 7168), (64, 24576, 1536)]
        + [(4096, 7168, 2048), (4096, 4096, 7168), (2048, 7168, 16384)],
        ("nvidia-b200", "bf16"): [(16384, 16384, 16384), (32768, 8192, 16384), (16384, 32768, 8192)],
    }
    cases = []
    for (device, dtype), sizes in shapes.items():
        impls = ("lib", "alt") if device == "nvidia-h800-sxm" else blackwell_impls
        for i, (m, n, k) in enumerate(sizes):
            case = calibration.MeasuredCase(
                f"{device}-{i}", f"{device}-s{i % 2}", device, impls[i % len(impls)], "contiguous", dtype, "bf16",
                (m,), n, k, None, 1.0, tiles, kernel_family="dense",
            )  # fmt: skip
            cases.append(
                calibration.MeasuredCase(
                    **{**case.__dict__, "t_measured": calibration.predict(case, truth).t_predicted}
                )
            )
    return truth, cases


def test_times_an_architecture_cannot_see_are_borrowed_not_guessed():
    # The Hopper cases include microsecond calls (they identify the fixed time), the Blackwell
    # ones are millisecond bf16 calls only (3 us is under 1% of each: the error is flat along the
    # grid). The Blackwell fit must take Hopper's fixed time, say so, and set the K-block latency
    # to 0 (nothing of it is visible, and it is a trait of SM90 kernels).
    from moe_hal.perf import calibration

    truth, cases = _two_architectures()
    tiles = cases[0].tiles
    fitted = calibration.fit(cases)
    for device, arch in (("nvidia-h800-sxm", "hopper"), ("nvidia-b200", "blackwell")):
        for kind, value in (("tile_overhead", 2e-6), ("launch", 3e-6)):
            assert fitted.figure(kind, device, arch, "lib").value == pytest.approx(value), (device, kind)
    # the per-tile overhead shows in the Blackwell calls' hundreds of waves; the fixed time does not
    launch = fitted.figure("launch", "nvidia-b200", "blackwell", "lib")
    assert "borrowed from hopper (7 cases)" in launch.source, launch.source
    assert "borrowed" not in fitted.figure("tile_overhead", "nvidia-b200", "blackwell", "lib").source
    stage = fitted.figure("stage_latency", "nvidia-b200", "blackwell", "lib")
    assert stage.value == 0 and "not identified" in stage.source
    assert fitted.compute("nvidia-b200", "blackwell", "lib", "bf16", "dense").value == pytest.approx(0.85, rel=1e-3)
    # a microsecond call on the Blackwell device is then predicted with the borrowed fixed time
    # (3 of its 3.6 us: a fixed time of 0 or 6 us would move it by 80%; the fitted rates match the
    # true ones to 1e-3 only, as the weighted median picks one case's, hence 1%)
    small = calibration.MeasuredCase(
        "small", "s", "nvidia-b200", "lib", "contiguous", "bf16", "bf16", (256,), 1024, 1024, None, 1.0, tiles,
        kernel_family="dense",
    )  # fmt: skip
    assert calibration.predict(small, fitted).t_predicted == pytest.approx(
        calibration.predict(small, truth).t_predicted, rel=1e-2
    )


def test_times_every_kernel_pays_are_not_read_from_one_kernel():
    # The same calls, but every Blackwell call made by one kernel: its millisecond calls show the
    # tile overhead, yet one kernel's pipeline is not every kernel's (DeepGEMM's SM100 kernels
    # hide their epilogues; the B300's only source fitted 0 us), so the architecture borrows
    # Hopper's tile overhead and fixed time and says so.
    from moe_hal.perf import calibration

    _, cases = _two_architectures(blackwell_impls=("lib",))
    fitted = calibration.fit(cases)
    for kind in ("tile_overhead", "launch"):
        figure = fitted.figure(kind, "nvidia-b200", "blackwell", "lib")
        assert "borrowed from hopper (7 cases)" in figure.source, (kind, figure.source)
    prepared = calibration._prepare([c for c in cases if c.device == "nvidia-b200"])
    assert calibration._identified(prepared, calibration.GRID)["tile_overhead"] is False
    _, both = _two_architectures()
    shown_by_two = calibration._prepare([c for c in both if c.device == "nvidia-b200"])
    assert calibration._identified(shown_by_two, calibration.GRID)["tile_overhead"] is True


def _slow_twin(cases, extra: float):
    """``cases`` as kernel "slow" timed them: the same calls, ``extra`` seconds longer each."""
    return [replace(c, id=f"slow-{c.id}", impl="slow", t_measured=c.t_measured + extra) for c in cases]


def test_a_kernel_whose_calls_span_sizes_gets_its_own_fixed_time():
    # Model-made H800 timings (_model_made_h800's figures): "lib" pays the 3 us per call every
    # kernel pays, "slow" (its twin in every rate) 15 us, as FlashInfer's masked NVFP4 kernel and
    # DeepGEMM's SM100 masked kernel on the B300 do (an intercept of 10-20 us under calls of 16 to
    # 760 us). "slow"'s calls run from microseconds to milliseconds: the fit must find its 15 us
    # and keep 3 us for every other kernel, "lib" and one never measured alike.
    from moe_hal.perf import calibration

    _, lib = _model_made_h800(MIXED_SHAPES)
    slow = _slow_twin(lib, 12e-6)
    fitted = calibration.fit(lib + slow)
    own = fitted.figure("launch", "nvidia-h800-sxm", "hopper", "slow")
    assert own.value == pytest.approx(15e-6) and "slow's own" in own.source, own
    for impl in ("lib", "never_measured", None):
        figure = fitted.figure("launch", "nvidia-h800-sxm", "hopper", impl)
        assert figure.value == pytest.approx(3e-6) and "fitted jointly" in figure.level, (impl, figure)
    assert fitted.compute("nvidia-h800-sxm", "hopper", "slow", "fp8", "dense").value == pytest.approx(0.8)
    for case in lib + slow:
        assert calibration.predict(case, fitted).t_predicted == pytest.approx(case.t_measured, rel=1e-6)


def test_calls_of_similar_length_tell_a_fixed_time_when_rates_explain_little_of_some():
    # "slow" (lib's twin, 15 us per call) timed at calls of 16 to 33 us, a factor of 2: its
    # narrow calls move a few hundred kilobytes and are mostly fixed time, its wide ones stream
    # tens of megabytes, as Helion PR #3209's GB200 calls of torch._scaled_mm with rowwise scales
    # (7.5 to 11.8 us) do. How far apart the measured times are does not decide it.
    from moe_hal.perf import calibration

    _, lib = _model_made_h800(MIXED_SHAPES)
    _, similar = _model_made_h800(
        [(64, 256, 1024), (64, 512, 2048), (64, 7168, 2048), (64, 24576, 1536), (64, 4096, 7168)]
    )
    slow = _slow_twin(similar, 12e-6)
    times = sorted(c.t_measured for c in slow)
    assert times[-1] < 2.5 * times[0]
    fitted = calibration.fit(lib + slow)
    own = fitted.figure("launch", "nvidia-h800-sxm", "hopper", "slow")
    assert own.value == pytest.approx(15e-6) and "slow's own" in own.source, own
    for case in slow:
        assert calibration.predict(case, fitted).t_predicted == pytest.approx(case.t_measured, rel=1e-6)


def test_a_kernel_timed_at_one_size_or_past_the_grid_gets_no_fixed_time_of_its_own():
    # Calls its rates explain almost wholly cannot tell a fixed time from a rate: "slow" timed
    # only at millisecond calls keeps the joint fixed time (12 us more moves none of them by a
    # tenth). One whose best fixed time is the top of the grid tried
    # ran out of range: that time would be making up for something else, and is not kept.
    from moe_hal.perf import calibration

    _, lib = _model_made_h800(MIXED_SHAPES)
    _, long_only = _model_made_h800([(4096, 7168, 2048), (4096, 4096, 7168), (2048, 7168, 16384), (4096, 7168, 4096)])
    slow = _slow_twin(long_only, 12e-6)
    figure = calibration.fit(lib + slow).figure("launch", "nvidia-h800-sxm", "hopper", "slow")
    assert "fitted jointly" in figure.level, figure
    beyond = _slow_twin(lib, calibration.LAUNCHES[-1])
    figure = calibration.fit(lib + beyond).figure("launch", "nvidia-h800-sxm", "hopper", "slow")
    assert "fitted jointly" in figure.level, figure


def test_a_call_made_of_fixed_time_does_not_set_the_compute_fraction():
    # Model-made H800 timings of one kernel (_model_made_h800): the calls of the test above as the
    # model says, and six 1024^3 calls timed 2 us slower (another harness's fixed time). The short
    # calls' MMA is under half of their time, so they must not move the fraction (taken from them
    # it would be far below 0.8).
    from moe_hal.perf import calibration

    sizes = [(64, 7168, 2048), (64, 2112, 7168), (128, 2112, 7168), (64, 24576, 1536)]
    sizes += [(4096, 7168, 2048), (4096, 4096, 7168), (2048, 7168, 16384)] + [(1024, 1024, 1024)] * 6
    truth, cases = _model_made_h800(sizes, extra=lambda m, n, k: 2e-6 if m == 1024 else 0.0)
    short = calibration.predict(cases[-1], truth)
    assert short.bound == "compute" and short.t_compute - 2e-6 - 80e-9 * 8 < 0.5 * cases[-1].t_measured
    # the fractions at the true times (the grid's search for the times is tested above)
    fitted = calibration._fit_fractions(
        calibration._Batch(calibration._prepare(cases)), 2e-6, 80e-9, 3e-6, "fitted", "test"
    )
    assert fitted.compute("nvidia-h800-sxm", "hopper", "lib", "fp8", "dense").value == pytest.approx(0.8)


def test_a_long_call_pins_the_compute_fraction_more_than_short_ones():
    # Model-made H800 timings of one kernel (_model_made_h800): three long calls as the model says
    # (0.8 of the peak), four 2048^3 calls timed 2 us slower. Those still run mostly MMA, so they
    # inform the fraction, and alone they imply a lower one; counted alike they would outnumber
    # the long calls. Weighted by the MMA seconds each explains, the long calls set it.
    from moe_hal.perf import calibration

    long_calls = [(4096, 7168, 2048), (4096, 4096, 7168), (2048, 7168, 16384)]
    truth, cases = _model_made_h800(
        long_calls + [(2048, 2048, 2048)] * 4, extra=lambda m, n, k: 2e-6 * (m == 2048 == n)
    )
    short = cases[-1]
    assert calibration.predict(short, truth).t_compute > 0.5 * short.t_measured
    times = (2e-6, 80e-9, 3e-6, "fitted", "test")  # the true times (their search is tested above)
    alone = calibration._fit_fractions(calibration._Batch(calibration._prepare(cases[3:])), *times)
    assert alone.compute("nvidia-h800-sxm", "hopper", "lib", "fp8", "dense").value < 0.75
    fitted = calibration._fit_fractions(calibration._Batch(calibration._prepare(cases)), *times)
    assert fitted.compute("nvidia-h800-sxm", "hopper", "lib", "fp8", "dense").value == pytest.approx(0.8)


def test_a_weight_gradient_call_taken_from_forward_kernels_is_scaled_by_the_measured_ratio():
    # h800: one kernel measured in both classes (K-grouped 0.54 of the peak, forward 0.9: 0.6);
    # b200: forward kernels only. A K-grouped call on the b200 takes its forward rate x 0.6.
    table = EfficiencyTable(
        [
            rec(device="h800", arch="hopper", impl="dg", value=0.9, family="grouped_contiguous"),
            rec(device="h800", arch="hopper", impl="dg", value=0.54, family="k_grouped"),
            rec(device="b200", arch="blackwell", impl="lib", value=0.7, family="dense"),
        ]
    )
    got = table.compute("b200", "blackwell", "new", "fp8", "k_grouped")
    assert got.value == pytest.approx(0.7 * 0.6)
    assert "x 0.600: the weight-gradient / forward ratio of dg fp8 on h800 (0.60)" in got.level
    # the other way round: a forward call from weight-gradient kernels, divided (and capped at 1)
    grads = EfficiencyTable(
        [*table.records, rec(device="b300", arch="blackwell", impl="wg", value=0.66, family="k_grouped")]
    )
    assert grads.compute("b300", "blackwell", "new", "fp8", "grouped_masked").value == pytest.approx(
        0.7
    )  # same class first
    only_grads = EfficiencyTable(
        [*table.records[:2], rec(device="b300", arch="blackwell", impl="wg", value=0.66, family="k_grouped")]
    )
    assert only_grads.compute("b300", "blackwell", "new", "fp8", "dense").value == pytest.approx(
        1.0
    )  # 0.66 / 0.6, capped
    # no kernel measured in both classes: the ratio is taken as 1, and the level says so
    alone = EfficiencyTable([table.records[2]])
    got = alone.compute("b200", "blackwell", "new", "fp8", "k_grouped")
    assert got.value == 0.7 and "ratio taken as 1" in got.level


# ---------------------------------------------------------------------------------------------
# This project's own kernels, and the tile load rate


def test_own_kernels_answer_only_for_themselves():
    ours = Achieved(
        "dev-a", "arch", "ours", "compute", 0.3, 40, "fitted", "own run", "fp8", "grouped_contiguous", False
    )
    lib = rec(device="dev-b", value=0.7)
    table = EfficiencyTable([ours, lib])
    assert table.compute("dev-a", "arch", "ours", "fp8", "grouped_contiguous").value == 0.3
    # another kernel on dev-a is not taken to be like ours: the architecture's typical one answers
    other = table.compute("dev-a", "arch", "never_measured", "fp8", "grouped_contiguous")
    assert other.value == 0.7 and "architecture" in other.level and "ours" not in other.level
    # nor is ours what the device can reach
    best = table.compute("dev-a", "arch", None, "fp8", "grouped_contiguous")
    assert best.value == 0.7 and "best known implementation (lib)" in best.level


def test_a_tile_load_rate_is_the_own_implementations_only():
    load = Achieved("dev-a", "arch", "ours", "tile_load_rate", 80e9, 40, "fitted", "own run")
    table = EfficiencyTable([load, rec()])
    assert table.figure("tile_load_rate", "dev-a", "arch", "ours").value == 80e9
    assert table.figure("tile_load_rate", "dev-a", "arch", "lib") is None
    assert table.figure("tile_load_rate", "dev-a", "arch", None) is None


def test_a_tile_runs_its_mma_no_faster_than_its_operands_arrive():
    # one core at 1 TFLOP/s loading operands at 10 GB/s: a bf16 64 x 128 tile does
    # 2*64*128 FLOP per (64 + 128) * 2 bytes = 42.67 FLOP/B, so its MMA runs at 0.4267 TFLOP/s;
    # a 128 x 256 tile (85.33 FLOP/B) at 0.8533 TFLOP/s; both below the 1 TFLOP/s peak
    base = perf.Hardware("one-core", num_cores=1, peak_flops={"bf16": 1e12}, mem_bandwidth=1e15)
    capped = base.replace(tile_load_rate=10e9)
    for (bm, bn), rate in (
        ((64, 128), 10e9 * 2 * 64 * 128 / (192 * 2)),
        ((128, 256), 10e9 * 2 * 128 * 256 / (384 * 2)),
    ):
        free = perf.estimate([bm], bn, 1024, base, "bf16", bm, bn)
        slow = perf.estimate([bm], bn, 1024, capped, "bf16", bm, bn)
        mma = 2 * bm * bn * 1024
        assert free.t_compute == pytest.approx(mma / 1e12)
        assert slow.t_compute == pytest.approx(mma / rate)
        assert slow.tile_load_rate == 10e9 and "of the achieved compute rate" in slow.basis["tile_load_rate"]
    # a fast enough load rate leaves the MMA at the compute rate
    fast = perf.estimate([128], 256, 1024, base.replace(tile_load_rate=1e12), "bf16", 128, 256)
    assert fast.t_compute == pytest.approx(2 * 128 * 256 * 1024 / 1e12)
    with pytest.raises(ArgumentError, match="tile_load_rate"):
        base.replace(tile_load_rate=0)


def test_own_kernel_flag_and_load_rate_round_trip_through_an_overlay():
    from moe_hal.perf import calibration, efficiency

    table = EfficiencyTable(
        [
            Achieved("nvidia-h200-sxm", "hopper", "ours", "tile_load_rate", 80e9, 40, "fitted", "own", typical=False),
            Achieved(
                "nvidia-h200-sxm", "hopper", "ours", "compute", 0.6, 40, "fitted", "own", "bf16", "k_grouped", False
            ),
        ]
    )
    doc = calibration.overlays(table, method="m", tool="t", date="2026-12-04")["nvidia-h200-sxm"]
    assert doc["achieved"]["ours"]["typical"] is False
    assert doc["achieved"]["ours"]["tile_load_rate"]["value"] == 80.0
    back = efficiency.records_of("nvidia-h200-sxm", "hopper", doc["achieved"])
    assert {(r.kind, r.typical) for r in back} == {("tile_load_rate", False), ("compute", False)}
    assert next(r for r in back if r.kind == "tile_load_rate").value == pytest.approx(80e9)


def test_a_call_near_the_ridge_does_not_set_the_streaming_fraction(monkeypatch):
    # Model-made H800 timings of one kernel (0.95 of the fp8 peak, 0.7 of the bandwidth, 3 us per
    # call, no per-tile time): small-M calls that stream their weights (memory time several times
    # the compute time), and calls of 192 to 256 rows near the ridge, still bound by their stream
    # but timed 35% slower than the model says (compute and memory overlapping imperfectly). Those
    # cannot tell a slow stream from a slow MMA and must not move the streaming fraction.
    from moe_hal.perf import calibration

    def r(kind, value, **kw):
        return Achieved("nvidia-h800-sxm", "hopper", kw.pop("impl", "*"), kind, value, 9, "fitted", "test", **kw)

    truth = EfficiencyTable(
        [r("compute", 0.95, impl="lib", dtype="fp8", family="dense"), r("bandwidth", 0.7, impl="lib")]
        + [r("tile_overhead", 0.0), r("stage_latency", 0.0), r("launch", 3e-6)]
    )
    streaming = [(64, 7168, 2048), (64, 32768, 512), (64, 24576, 1536)]
    balanced = [(256, 7168, 7168), (256, 4096, 7168), (192, 7168, 7168), (256, 7168, 2048)]
    hw = calibration.datasheet_hardware("nvidia-h800-sxm")
    cases = []
    for i, (m, n, k) in enumerate(streaming + balanced):
        case = calibration.MeasuredCase(
            f"c{i}", f"s{i % 3}", "nvidia-h800-sxm", "lib", "contiguous", "fp8", "bf16", (m,), n, k, None, 1.0,
            ((64, 128), (128, 128)), kernel_family="dense",
        )  # fmt: skip
        est = calibration.predict(case, truth)
        ideal = perf.estimate([m], n, k, hw, "fp8", est.block_m, est.block_n)
        assert est.bound == "memory", case.id
        near = (m, n, k) in balanced
        assert (ideal.t_memory < calibration.STREAMING_MARGIN * ideal.t_compute) == near, case.id
        cases.append(
            calibration.MeasuredCase(**{**case.__dict__, "t_measured": est.t_predicted * (1.35 if near else 1)})
        )

    def fitted_bandwidth():
        table = calibration._fit_fractions(
            calibration._Batch(calibration._prepare(cases)), 0.0, 0.0, 3e-6, "fitted", "test"
        )
        return table.bandwidth("nvidia-h800-sxm", "hopper", "lib").value

    assert fitted_bandwidth() == pytest.approx(0.7)
    monkeypatch.setattr(calibration, "STREAMING_MARGIN", 0.0)  # every memory-bound call informs it
    assert fitted_bandwidth() < 0.6


def test_the_rtx_4090s_small_cublas_tiles_are_held_back_by_their_operand_loads():
    # PyTorch issue #181718: at N 2056 and 2072 cuBLAS picks a 64 x 64 kernel that runs at 0.54 of
    # the 128 x 128 one's TFLOP/s at N 2040. A 64 x 64 bf16 tile does 32 FLOP per operand byte,
    # half a 128 x 128 one's, and Ada's SMs load about 21 GB/s each: the fit must find a load rate
    # in that range (below any Hopper kernel's) and predict the slow calls from it, not from a low
    # share of the peak that would also slow the 128 x 128 call.
    from moe_hal.perf import calibration

    cases = [c for c in calibration.load_published() if c.device in ("nvidia-rtx-4090", "nvidia-l40s")]
    table = calibration.fit(cases)
    load = table.figure("tile_load_rate", "nvidia-rtx-4090", "ada", "cublas")
    assert load is not None and 15e9 <= load.value <= 30e9, load
    errors = {
        c.n: calibration.predict(c, table).t_predicted / c.t_measured - 1
        for c in cases
        if c.source == "pytorch-issue181718-rtx4090"
    }
    assert set(errors) == {2040, 2056, 2072}
    assert all(abs(e) <= 0.15 for e in errors.values()), errors


def test_a_share_lent_by_a_device_of_a_higher_mma_rate_per_cycle_is_converted():
    # The L40S's datasheet counts FP8 with FP32 accumulation at twice the RTX 4090's rate per SM
    # and clock (same AD102 silicon): a share of the L40S's peak lent to the RTX 4090 is converted
    # at that ratio (capped at 1); lent the other way it is not, and a device's own figure never is
    from moe_hal.perf.efficiency import CONVERTED

    rates = {"fast": 2.0, "slow": 1.0}
    table = EfficiencyTable(
        [rec("fast", impl="a", value=0.4), rec("fast", impl="b", value=0.45), rec("slow", impl="c", value=0.95)],
        mma_rate_of=lambda device, dtype: rates.get(device),
    )
    lent = table.compute("slow", "arch", "new", "fp8", "grouped_contiguous")
    # 0.4 and 0.45 -> 0.8 and 0.9, pooled with c's 0.95 on the architecture (one kernel on the
    # device is no typical figure)
    assert lent.value == pytest.approx(0.9) and CONVERTED in lent.level and "architecture" in lent.level
    assert table.compute("slow", "arch", "a", "fp8", "grouped_contiguous").value == pytest.approx(0.8)
    own = table.compute("slow", "arch", "c", "fp8", "grouped_contiguous")
    assert own.value == 0.95 and CONVERTED not in own.level
    back = table.compute("fast", "arch", "c", "fp8", "grouped_contiguous")
    assert back.value == 0.95 and CONVERTED not in back.level  # not converted down
    capped = EfficiencyTable([rec("fast", value=0.7)], mma_rate_of=lambda device, dtype: rates.get(device))
    assert capped.compute("slow", "arch", "lib", "fp8", "grouped_contiguous").value == 1.0
    unknown = EfficiencyTable([rec("fast", value=0.4)], mma_rate_of=lambda device, dtype: None)
    assert unknown.compute("slow", "arch", "lib", "fp8", "grouped_contiguous").value == 0.4


def test_a_share_lent_between_parts_of_one_design_is_not_converted():
    # Datasheets of one SM design quote their peaks at clocks a few percent apart (the H100 SXM's
    # and PCIe board's are 0.13% apart per boost cycle, the GB200's 3.1% above the B200's): no
    # conversion below CONVERSION_RATIO, where a design with a lower rate per cycle starts
    from moe_hal.perf.efficiency import CONVERSION_RATIO, CONVERTED

    for ratio, converted in ((1.0013, False), (1.031, False), (CONVERSION_RATIO, True), (3.95, True)):
        rates = {"fast": ratio, "slow": 1.0}
        table = EfficiencyTable([rec("fast", value=0.5)], mma_rate_of=lambda device, dtype, r=rates: r.get(device))
        lent = table.compute("slow", "arch", "lib", "fp8", "grouped_contiguous")
        assert lent.value == pytest.approx(min(1.0, 0.5 * ratio) if converted else 0.5), ratio
        assert (CONVERTED in lent.level) is converted, ratio
