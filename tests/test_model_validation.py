"""The model against published measurements (bench/published/cases.yaml), out of sample.

This is the CI gate of issue 14: the leave-one-source-out median error must stay at or below the
target. The worst case is reported, and asserted only not to get worse than what was recorded.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest

from moe_hal.cli import model as model_cli
from moe_hal.cli import model_validation
from moe_hal.errors import ArgumentError
from moe_hal.perf import calibration

ROOT = Path(__file__).parents[1]
#: the committed validation reports, and the page that quotes them
RESULTS = ROOT / "bench" / "results"
PERF_DOC = ROOT / "docs" / "perf-model.md"

#: The architectures the published set measures (each held out whole, and each a row of the split).
ARCHITECTURES = {"hopper", "blackwell", "blackwell_ultra", "ada", "blackwell_consumer"}


def _committed(name: str = "model_validation_published.json") -> dict:
    return json.loads((RESULTS / name).read_text())


@pytest.fixture(scope="module")
def loso():
    return model_validation.report()


def test_out_of_sample_median_error_meets_the_target(loso):
    s = loso["summary"]["all"]
    assert loso["evaluation"] == "leave-one-source-out"
    assert s["cases"] >= 60
    assert s["model_median"] <= model_validation.TARGET_MEDIAN, s
    # the model must beat the plain roofline it refines
    assert s["model_median"] < s["roofline_median"]


def test_each_architecture_can_be_held_out_whole_with_no_verdict_on_the_source_target(capsys, tmp_path):
    parser = argparse.ArgumentParser(prog="moe-hal")
    model_cli.register(parser.add_subparsers())
    out = tmp_path / "report.json"
    args = parser.parse_args(["model", "validate", "--hold-out", "architecture", "--out", str(out)])
    assert args.func(args) == 0
    text = capsys.readouterr().out
    assert "per source (leave-one-architecture-out)" in text and "target on" not in text
    data = json.loads(out.read_text())
    assert data["evaluation"] == "leave-one-architecture-out"
    assert data["target"]["median_met"] is None and data["own"]["target"]["median_met"] is None
    assert set(data["by_architecture"]) == ARCHITECTURES
    assert len(data["per_case"]) == len(calibration.load_cases())
    # a held-out architecture's devices are predicted with the shares and times of the other
    # (moe_hal.perf.efficiency, step 5): without them the model fell back to the datasheet and was
    # about as far off as the plain roofline (57.3% and 37.0% median against 59.4% and 39.1%).
    # Ada held out only beats the roofline (28.4% against 35.0%): its two L40S sources time one
    # kernel warm and cold 2-3x apart (docs/perf-model.md, "The target, and the timings beyond
    # it"), and no borrowed figure fits both. So does consumer Blackwell (24.8% against 40.3%):
    # two of its three RTX 5090s run cuBLAS bf16 above the datasheet peak, which no share
    # borrowed from another architecture predicts (docs/perf-model-history.md, "A seventeenth
    # round").
    only_beat = {"ada", "blackwell_consumer"}
    for arch, s in data["by_architecture"].items():
        assert s["model_median"] < s["roofline_median"] / (1 if arch in only_beat else 2), (arch, s)
    assert all("never measured" in row["basis"]["bandwidth"] for row in data["per_case"])
    with pytest.raises(ArgumentError, match="hold_out"):
        model_validation.report(hold_out="device")
    with pytest.raises(SystemExit):  # a fit on every case holds nothing out
        parser.parse_args(["model", "validate", "--in-sample", "--hold-out", "architecture"])


def test_a_cases_file_of_own_runs_alone_is_validated_without_a_published_verdict(capsys):
    own = ROOT / "bench" / "own_measurements" / "gpu_check_h200.yaml"
    data = model_validation.report(in_sample=True, cases_path=str(own))
    assert data["cases"] == 0 and data["own"]["cases"] == len(data["per_case"]) > 0
    assert data["target"]["median_met"] is None and data["target"]["worst_met"] is None
    model_validation.print_report(data)
    out = capsys.readouterr().out
    assert "target on the published set" not in out and "target on them" in out


def test_the_gpu_runs_of_this_project_are_predicted_within_their_target(loso):
    # issue 14: the H200 gpu_check timings feed the fit, and the model's error on them is reported;
    # each run is predicted from the other and the published set (the second repeats the first's
    # calls with the refitted advisor: out of run, not out of shape)
    own = loso["own"]
    assert own["cases"] >= 100 and len(own["sources"]) >= 2
    assert own["summary"]["all"]["model_median"] <= model_validation.TARGET_OWN_MEDIAN, own["summary"]
    assert own["target"]["median_met"]
    assert set(own["by_impl"]) == {"moe_hal_triton", "torch_grouped_mm"}


#: The out-of-sample worst recorded in bench/results/model_validation_published.json (41.1%),
#: rounded up: a ratchet until the worst target (TARGET_WORST, 30%) is met, then replaced by it.
#: It was 0.41 before the cache state became a measurement condition (sources whose benchmark
#: left the operands in the L2 are predicted so, bench/published/cases.yaml cache_state), 0.32
#: before the K-block latency (moe_hal.perf.Hardware.promotion_k), 0.315 (30.9%) before the first
#: Blackwell sources joined the set (torchao PR #2427 and the torchao MoE-training README, B200:
#: 92.2% when they came, the fit then picking a fixed time of 0 from millisecond calls), and is
#: 0.485 since the fit borrows times an architecture's cases do not show
#: (moe_hal.perf.calibration.IDENTIFIES), and 0.412 since an implementation with no figure of its
#: own is predicted with a typical one's, not the best one's (moe_hal.perf.efficiency); vLLM PR
#: #19566 (B200 FP8 GEMMs of 6-324 us, predicted up to 78.9% slow) raised it to 0.79, and it is
#: 0.513 since only the devices whose fp8 kernels promote partial sums in software (Hopper) are
#: charged a K-block latency (hwdb compute.fp8_promotion_k), and 0.377 since calls made mostly of
#: fixed time no longer set a kernel's rate (moe_hal.perf.calibration.BINDING_SHARE), and 0.31
#: since a weight-gradient call taken from forward kernels' rates is scaled by the measured
#: weight-gradient / forward ratio (moe_hal.perf.efficiency); the worst is then a Hopper case
#: again (README a6d97a1, 30.9%, the fast end of a call three sources timed 1.56x apart); vLLM
#: PR #23280 (cuBLAS bf16 GEMMs of 1 to 8192 rows on the H100, a source found to test the model
#: on cases it had not seen) raised it to 0.75: its calls of a few rows run much faster than 33
#: tiles of the whole K on 132 SMs could; and 0.36 since an implementation that splits K says so
#: and is predicted split (moe_hal.perf.estimate split_k; cases.yaml impls.cublas.split_k); TileOPs
#: PRs #2148 and #2110 (H200 GEMMs of a few microseconds by cuBLAS and TileLang kernels, CUPTI
#: kernel time) raised it to 0.94: the fitted fixed times per architecture are DeepGEMM's; it is
#: 0.42 since a tile pays the overhead by its accumulator's area up to a 128 x 128 tile's
#: (moe_hal.perf.model.OVERHEAD_TILE), the worst then torchao PR #2427's small NVFP4 GEMMs (B200).
#: This project's two H200 runs (bench/own_measurements/) raised it to 0.53: their torch grouped_mm
#: calls, streaming at 0.58 of the datasheet bandwidth, joined the typical H200 streaming fraction,
#: which DeepGEMM's v0 masked kernel (issue #20's 256 x 64 call, no figure of its own on the H200)
#: falls back to, while it streams at 0.85: a limit of the typical-implementation fallback. It is
#: 0.42 since a call informs a streaming fraction only when its memory time is 1.5x its compute
#: time at the datasheet rates (moe_hal.perf.calibration.STREAMING_MARGIN): those torch calls are
#: balanced (1.0-1.1x) and no longer set it; issue #20's case is then 29.9% and the worst torchao
#: PR #2427's NVFP4 1024^3 GEMM again (41.1%). DeepGEMM PRs #193 and #192 (masked calls, found to
#: test the model on cases it had not seen) raised it to 0.43 on arrival (README a6d97a1's masked
#: calls held out took PR #193's slower kernel's rate); with that kernel its own implementation and
#: an implementation's own figures on a device tried before another's (moe_hal.perf.efficiency) it
#: is 0.42 again. FlashInfer PRs #2464 and #2540 (B200 and GB200) and SGLang PR #9333 (H20), found
#: to test the model on cases it had not seen, raised it to 0.56 with the model unchanged: the
#: GB200's NVFP4 calls of few tiles and long K run twice as long as predicted, and as the typical
#: Blackwell figures they slow the predictions of vLLM PR #19566's and torchao PR #2427's kernels.
#: FlashInfer PR #2503 and vLLM PRs #18778 and #20578 (B200), found the same way, took it to 8.17
#: with the model unchanged: vLLM's slow NVFP4 GEMM, charged to the MMA at 0.07 of the peak, was
#: the only FP4 kernel on the B200 once torchao's was held out, and its L2 draw set the Blackwell
#: L2 rate. With a typical figure pooling two kernels, the compute fraction taken only from calls
#: compute-bound at the datasheet rates, and the L2 rate per kernel (the best known for a kernel
#: without its own), the worst is that NVFP4 kernel held out, predicted 2.5x fast (60.0%). With
#: block-scaled FP4 tiles costed at 128 rows (hwdb compute.fp4_mma_min_m) and a dtype's figure on
#: another architecture tried before another dtype's (moe_hal.perf.efficiency, step 4), it is the
#: same kernel at 51.4%. With that kernel launching the 128 x 256 tiles its code lists (one wave,
#: compute-bound) it is predicted within 13.1%, and the worst is vLLM PR #18778's warm cuBLAS
#: call of 64 rows, streamed at vLLM's FP8 GEMM's L2 rate (45.9%). vLLM PR #49363 (H100) joined
#: with the model unchanged and stayed within it (29.2%); vLLM PR #20071 (B200) joined the same way
#: and raised it: its cuBLAS bf16 call of one row at N = K = 4096 takes 13.3 us where its 16-row
#: call takes 7.4 (50.2%; a kernel choice of cuBLAS's at that shape the model has no term for).
#: Seven more sources, gathered without running the model (vLLM PR #17126, SGLang PR #29638, Helion
#: PRs #2987 and #3209, TileOPs PR #1580, DeepGEMM PRs #86 and #186), left it at 50.1%: their worst
#: is Helion's torch._scaled_mm rowwise FP8 call on the B200 (49.7%), a kernel with a fixed time of
#: its own that no other source timed. The RTX 4090 run of SGLang PR #29638, gathered the same way,
#: left it there too (its own worst 32.5%). The fifteenth round's two sources, gathered the same
#: way (docs/perf-model-history.md), raised it to 151.5% with the model unchanged: vLLM PR #6677's
#: CUTLASS FP8 kernel on the L40S, held out, is predicted with the RTX 4090's Triton kernel's L2
#: rate and compute share, where its warm calls of a few rows read the L2 at up to 3.3 TB/s. The
#: sixteenth round's cold L40S source of the same kernel (SGLang PR #6756), 2-3x slower than the
#: warm one, took it to 372.4%: held out, each L40S source takes the other's figures, and the RTX
#: 4090's kernel Ada's typical ones from them. On every source of the fourteenth round or before
#: off Ada the worst stayed at 50.1% (WORST_RECORDED_EARLIER). The seventeenth round's five RTX
#: 5090 sources left the worst where it was, and so did the eighteenth round's seven (their own
#: worst 73.5%, torchao PR #3342's Triton FP8 kernel on the H100 PCIe). It is 321.9% since PR
#: #6677's source carries its kernel's tile list (16-row tiles for calls of up to 16 rows, which
#: had been charged 64-row ones): the same source held out, whose calls of a few rows take the
#: cold source's fixed time of 30 us and the RTX 4090 Triton kernel's L2 rate (1.44 TB/s); and
#: 323.4% since SGLang PR #6756's sgl-kernel calls carry the tile its dispatch fixes per M bucket;
#: 144.3% since every call of vLLM's SM89 kernel carries its bucket's tile too: the cold source no
#: longer fits that kernel a fixed time of 30 us (it paid for the list's 16 x 64 tiles), and PR
#: #6677's worst is a one-row call reading its weight from the L2 at the RTX 4090 Triton kernel's
#: 1.46 TB/s, where it runs at 3.3.
WORST_RECORDED = 1.45

#: The sources of the fifteenth to eighteenth rounds, and the ratchet on every earlier source's
#: held-out cases off Ada (whose RTX 4090 source, held out, borrows the L40S sources' figures).
LATER_SOURCES = (
    "vllm-pr6677-l40s",
    "flashinfer-pr3948-b200",
    "sglang-pr6756-l40s",
    "flashinfer-pr3051-rtx5090",
    "flashinfer-pr3026-rtx5090",
    "zzc-issue96-rtx5090",
    "zzc-issue124-rtx5090",
    "zzc-issue200-rtx5090",
    "zzc-issue79-h100",
    "zzc-issue77-h20",
    "zzc-issue95-h100pcie",
    "torchao-pr3342-h100pcie",
    "liger-pr1380-b200",
    "zzc-issue78-rtx4090",
    "pytorch-issue181718-rtx4090",
)
WORST_RECORDED_EARLIER = 0.51


def test_the_out_of_sample_worst_error_does_not_regress(loso):
    from moe_hal import hwdb

    assert loso["summary"]["all"]["model_worst"] <= WORST_RECORDED
    earlier = [
        abs(row["error"])
        for row in loso["per_case"]
        if row["origin"] == "published"
        and row["source"] not in LATER_SOURCES
        and hwdb.get(row["device"]).architecture != "ada"
    ]
    assert max(earlier) <= WORST_RECORDED_EARLIER


def test_the_worst_case_is_reported_honestly(loso):
    s = loso["summary"]["all"]
    worst = max(abs(row["error"]) for row in loso["per_case"] if row["origin"] == "published")
    assert s["model_worst"] == pytest.approx(worst)
    assert loso["target"]["worst_met"] == (worst <= model_validation.TARGET_WORST)


def test_no_source_is_predicted_from_its_own_cases(monkeypatch):
    cases = calibration.load_published()
    seen, fitted = [], []
    real_fit, real_fit_architecture = calibration.fit, calibration._fit_architecture

    def spy(train, **kwargs):
        seen.append({c.source for c in train})
        return real_fit(train, **kwargs)

    def spy_architecture(group, *args):
        fitted.append({p.case.source for p in group})
        return real_fit_architecture(group, *args)

    monkeypatch.setattr(calibration, "fit", spy)
    monkeypatch.setattr(calibration, "_fit_architecture", spy_architecture)
    # three Hopper sources, one Ada and one RTX 5090 source: a fold refits only the architecture
    # it holds a source of (and those that borrow from it)
    sources = ("deepgemm-readme-a6d97a1", "deepgemm-readme-55ab91f", "deepgemm-pr74")
    small = [c for c in cases if c.source in (*sources, "sglang-pr6756-l40s", "zzc-issue96-rtx5090")]
    outcomes = calibration.leave_one_source_out(small)
    held_out = sorted({c.source for c in small})
    assert len(seen) == len(held_out) == 5 and len(outcomes) == len(small)
    for train_sources, source in zip(seen, held_out):
        assert source not in train_sources and len(train_sources) == 4
    assert len(fitted) < 3 * len(held_out)
    # an architecture fitted for one fold and taken by another is the one a fit of its own gives
    for source in held_out:
        alone = calibration.fit([c for c in small if c.source != source])
        assert [o.as_dict() for o in outcomes if o.case.source == source] == [
            calibration.Outcome(c, calibration.predict(c, alone), calibration._roofline(c)).as_dict()
            for c in small
            if c.source == source
        ]


def test_the_folds_give_the_same_outcomes_in_several_processes():
    from moe_hal.errors import ArgumentError

    cases = calibration.load_published()
    small = [c for c in cases if c.source in ("deepgemm-readme-a6d97a1", "deepgemm-pr74", "vllm-pr18778-b200")]
    told = {1: [], 2: []}
    here = calibration.leave_one_source_out(small, progress=lambda *step: told[1].append(step))
    spread = calibration.leave_one_source_out(small, jobs=2, progress=lambda *step: told[2].append(step))
    # every fold is reported once as it ends, counted up to the number of folds
    for steps in told.values():
        assert sorted(s[0] for s in steps) == sorted({c.source for c in small})
        assert [s[1:] for s in steps] == [(1, 3), (2, 3), (3, 3)]
    assert [o.case.id for o in spread] == [o.case.id for o in here]
    assert [o.estimate.t_predicted for o in spread] == [o.estimate.t_predicted for o in here]
    assert [o.estimate.basis for o in spread] == [o.estimate.basis for o in here]
    with pytest.raises(ArgumentError, match="jobs"):
        calibration.leave_one_source_out(small, jobs=0)


def test_the_fold_progress_bar_shows_on_a_terminal_only(monkeypatch):
    import io

    from rich.console import Console

    from moe_hal.cli import render

    with model_validation.fold_progress() as progress:  # pytest's stderr is not a terminal
        assert progress is None
    screen = io.StringIO()
    monkeypatch.setattr(render, "console", lambda stderr=False: Console(file=screen, force_terminal=True, width=120))
    with model_validation.fold_progress(enabled=False) as progress:
        assert progress is None
    with model_validation.fold_progress() as progress:
        progress("vllm-pr6677-[l40s]", 1, 2)
    assert "held out: vllm-pr6677-[l40s]" in screen.getvalue()  # the markup-like name printed as is


def _published_subset(directory: Path, kept: tuple[str, ...]) -> tuple[Path, int]:
    """The published set cut to the sources ``kept``, written to ``directory`` with the schema it
    is read with, and its number of cases: a fit of seconds, where the whole set takes 20."""
    import yaml

    published = yaml.safe_load(calibration.PUBLISHED.read_text())
    published["sources"] = {name: source for name, source in published["sources"].items() if name in kept}
    published["cases"] = [case for case in published["cases"] if case["source"] in kept]
    subset = directory / "cases.yaml"
    subset.write_text(yaml.safe_dump(published, sort_keys=False))
    schema = calibration.PUBLISHED.with_name("schema.json")
    (directory / schema.name).write_text(schema.read_text())
    return subset, len(published["cases"])


def test_cli_validate_prints_per_case_errors_and_the_verdict(capsys, tmp_path, monkeypatch):
    # the default cases (the published set, cut to two sources, and this project's own runs)
    subset, published_cases = _published_subset(tmp_path, ("deepgemm-readme-a6d97a1", "zzc-issue79-h100"))
    monkeypatch.setattr(calibration, "PUBLISHED", subset)
    parser = argparse.ArgumentParser(prog="moe-hal")
    model_cli.register(parser.add_subparsers())
    out = tmp_path / "report.json"
    args = parser.parse_args(["model", "validate", "--in-sample", "--out", str(out)])
    assert args.func(args) == 0
    text = capsys.readouterr().out
    assert "target on the published set (in-sample" in text and "h800-readme0-contig" in text
    assert "this project's own runs" in text
    data = json.loads(out.read_text())
    assert len(data["per_case"]) == data["cases"] + data["own"]["cases"]
    assert data["cases"] == sum(1 for row in data["per_case"] if row["origin"] == "published")
    assert data["cases"] == published_cases and data["own"]["cases"] > 0


def test_cli_validate_markdown_prints_the_docs_tables(capsys, tmp_path):
    # four sources of the published set, on two architectures (the whole set's tables are checked
    # against the docs from the committed report, below)
    kept = ("deepgemm-readme-a6d97a1", "deepgemm-pr74", "sglang-pr6756-l40s", "zzc-issue96-rtx5090")
    subset, _ = _published_subset(tmp_path, kept)
    parser = argparse.ArgumentParser(prog="moe-hal")
    model_cli.register(parser.add_subparsers())
    args = parser.parse_args(["model", "validate", "--in-sample", "--markdown", "--cases", str(subset)])
    assert args.func(args) == 0
    text = capsys.readouterr().out
    rows = [line for line in text.splitlines() if line]
    assert rows and all(line.startswith("|") and line.endswith("|") for line in rows)
    assert "| source | device | cache | kernel: dtypes, layouts | cases | median | worst |" in rows
    assert sorted(line.split("`")[1] for line in rows if line.startswith("| `")) == sorted(kept)
    with pytest.raises(SystemExit):
        parser.parse_args(["model", "validate", "--json", "--markdown"])


def test_the_advisor_tie_band_covers_the_model_error(loso):
    from moe_hal import perf

    assert perf.TIE_BAND >= loso["summary"]["all"]["model_median"]


def test_the_committed_results_match_a_fresh_run(loso):
    # bench/results/model_validation_published.json is what docs/perf-model.md quotes
    committed = _committed()
    for key in ("model_median", "model_worst", "roofline_median", "roofline_worst"):
        assert committed["summary"]["all"][key] == pytest.approx(loso["summary"]["all"][key], abs=1e-9), key


def test_the_docs_results_tables_and_evaluations_are_the_committed_ones():
    # every row of the Results tables (`--markdown`: summary, split, one row per source) computed
    # from the committed JSON must be a line of docs/perf-model.md, the page must list no other
    # source, and each evaluation's row (median, worst, cases above 30%) is what its JSON holds
    doc = PERF_DOC.read_text()
    lines = set(doc.splitlines())
    committed = _committed()
    tables = model_validation.markdown(committed, model_validation.published_sources()).splitlines()
    missing = [row for row in tables if row and row not in lines]
    assert not missing, f"docs/perf-model.md lacks these rows of `bench/model_validation.py --markdown`: {missing}"
    source_row = re.compile(r"^\| `[\w.-]+` \|.*\| \d+ \| [\d.]+% \| [\d.]+% \|$")
    assert sorted(filter(source_row.match, doc.splitlines())) == sorted(filter(source_row.match, tables))
    for name, evaluation in (
        ("model_validation_published.json", "leave one source out"),
        ("model_validation_published_by_architecture.json", "leave one architecture out"),
        ("model_validation_published_in_sample.json", "in sample"),
    ):
        data = _committed(name)
        row = re.search(rf"^\| {evaluation} .*\| ([\d.]+)% \| ([\d.]+)% \| (\d+) \|$", doc, re.M)
        assert row, f"docs/perf-model.md has no row for {evaluation}"
        s = data["summary"]["all"]
        above = sum(
            1
            for r in data["per_case"]
            if r["origin"] == "published" and abs(r["error"]) > model_validation.TARGET_WORST
        )
        assert (float(row[1]), float(row[2]), int(row[3])) == (
            round(100 * s["model_median"], 1),
            round(100 * s["model_worst"], 1),
            above,
        ), evaluation


def test_the_plot_takes_any_number_of_devices(tmp_path):
    # the set grew to eight devices while the plot had seven markers, and the validation command
    # failed after writing its JSON; past the marker list they repeat
    data = _committed()
    row = data["per_case"][0]
    data["per_case"] += [{**row, "device": f"dev-{i:02d}"} for i in range(20)]
    out = tmp_path / "plot.png"
    model_validation.plot(data, str(out))
    assert out.stat().st_size > 0


def test_the_same_call_timed_by_several_sources_is_listed_with_its_spread(loso):
    # DeepGEMM's dense FP8 GEMM m 64, n 7168, k 2048: README a6d97a1 prints 295 TFLOPS on an H800,
    # PR #31 262 TFLOPS on an H800, issue #136 189 TFLOPS on an H100 (same datasheet figures)
    rows = [r for r in loso["same_call_spread"] if r["call"].startswith("deepgemm dense fp8 rows=[64] n=7168 k=2048")]
    assert len(rows) == 1
    row = rows[0]
    assert len(row["times_us"]) == 3
    assert row["ratio"] == pytest.approx(295 / 189)
    assert row["times_us"]["deepgemm-issue136-h100 (nvidia-h100-sxm)"] == pytest.approx(2 * 64 * 7168 * 2048 / 189e6)
    # a call timed by one source only is not listed; the list is sorted, largest spread first
    ratios = [r["ratio"] for r in loso["same_call_spread"]]
    assert ratios == sorted(ratios, reverse=True) and all(r >= 1 for r in ratios)
    assert all(len(r["times_us"]) >= 2 for r in loso["same_call_spread"])


def test_the_per_architecture_split_covers_every_case(loso):
    from moe_hal import hwdb

    by_arch = loso["by_architecture"]
    assert set(by_arch) == ARCHITECTURES
    assert sum(s["cases"] for s in by_arch.values()) == loso["summary"]["all"]["cases"]
    for arch, s in by_arch.items():
        errors = [
            abs(r["error"])
            for r in loso["per_case"]
            if hwdb.get(r["device"]).architecture == arch and r["origin"] == "published"
        ]
        assert s["cases"] == len(errors) and s["model_worst"] == pytest.approx(max(errors)), arch


def test_the_implementation_coverage_split_covers_every_case(loso):
    # Recomputed from the per-case rows: a published case whose kernel implementation no other
    # source (published or own) timed is predicted, held out, with other kernels' figures.
    split = loso["by_implementation_coverage"]
    assert set(split) == {model_validation.IMPL_ELSEWHERE, model_validation.IMPL_ONLY_HERE}
    assert sum(s["cases"] for s in split.values()) == loso["summary"]["all"]["cases"]
    sources_of: dict[str, set[str]] = {}
    for row in loso["per_case"]:
        sources_of.setdefault(row["impl"], set()).add(row["source"])
    published = [r for r in loso["per_case"] if r["origin"] == "published"]
    for name, only_here in ((model_validation.IMPL_ONLY_HERE, True), (model_validation.IMPL_ELSEWHERE, False)):
        errors = [abs(r["error"]) for r in published if (sources_of[r["impl"]] == {r["source"]}) == only_here]
        s = split[name]
        assert s["cases"] == len(errors) and s["model_worst"] == pytest.approx(max(errors)), name
        assert s["cases_above_worst_target"] == sum(e > model_validation.TARGET_WORST for e in errors), name
    # torchao PR #2427's NVFP4 torch._scaled_mm: no other source timed it
    assert sources_of["torch_scaled_mm"] == {"torchao-pr2427-b200"}


def _timed(source: str, t_us: float, operands: str = "hbm", device: str = "nvidia-h800-sxm"):
    return calibration.MeasuredCase(
        f"{source}-c", source, device, "lib", "contiguous", "fp8", "bf16", (128,), 4096, 7168, None, t_us * 1e-6,
        ((128, 128),), operands=operands,
    )  # fmt: skip


def test_only_a_spread_in_one_cache_state_bounds_a_model_of_the_cache_state():
    # 10 us and 30 us for one call in one cache state: any single prediction p is off by
    # max(p / 10 - 1, 1 - p / 30), least at p = 15, 50%; an H100 SXM counts as the H800 it matches
    cold = [_timed("a", 10.0), _timed("b", 30.0, device="nvidia-h100-sxm")]
    (row,) = calibration.same_call_spread(cold)
    assert row["ratio"] == pytest.approx(3.0) and row["operands"] == ["hbm"]
    assert row["least_worst_error"] == pytest.approx(0.5)
    assert calibration.least_worst_error([row])["error"] == pytest.approx(0.5)
    # warm and cold: the model takes the cache state, so the spread does not bound it
    (mixed,) = calibration.same_call_spread([_timed("a", 10.0), _timed("b", 40.0, operands="l2")])
    assert mixed["operands"] == ["hbm", "l2"] and mixed["least_worst_error"] is None
    assert calibration.least_worst_error([mixed]) is None
    # the widest spread in one cache state sets the bound, not the widest spread
    rows = calibration.same_call_spread(cold + [_timed("c", 1.0, operands="l2"), _timed("d", 9.0, operands="l2")])
    assert calibration.least_worst_error(rows)["error"] == pytest.approx(0.8)


def test_the_report_states_the_least_worst_error_the_set_allows_and_splits_by_layout(loso, capsys):
    # the bound is the published set's: the widest spread in one cache state among calls no run
    # of this project's timed
    floor = loso["target"]["least_worst_error"]
    own = tuple(loso["own"]["sources"])
    bounded = [
        r
        for r in loso["same_call_spread"]
        if r["least_worst_error"] is not None and not any(who.startswith(own) for who in r["times_us"])
    ]
    assert floor["error"] == pytest.approx(max(r["least_worst_error"] for r in bounded))
    assert floor["call"] in {r["call"] for r in bounded}
    # held out, as in sample, the model is no nearer at its worst than the bound allows
    assert loso["summary"]["all"]["model_worst"] >= floor["error"]
    by_layout = loso["by_layout"]
    assert list(by_layout) == [model_validation.GROUPED, "grouped_contiguous", "grouped_masked", "k_grouped", "dense"]
    published = [r for r in loso["per_case"] if r["origin"] == "published"]
    for layout, s in by_layout.items():
        errors = [
            abs(r["error"])
            for r in published
            if (r["family"] != "dense" if layout == model_validation.GROUPED else r["family"] == layout)
        ]
        assert s["cases"] == len(errors) and s["model_worst"] == pytest.approx(max(errors)), layout
        assert s["cases_above_worst_target"] == sum(e > model_validation.TARGET_WORST for e in errors), layout
    assert by_layout[model_validation.GROUPED]["cases"] + by_layout["dense"]["cases"] == len(published)
    model_validation.print_report(loso)
    out = capsys.readouterr().out
    assert "per layout (published set):" in out
    if floor["error"] > model_validation.TARGET_WORST:
        assert f"within {floor['error']:.1%} of every case" in out
