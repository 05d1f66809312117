"""Tests of ``moe-hal model`` (moe_hal/cli/model.py)."""

from __future__ import annotations

import argparse
import json
import sys

import pytest

from moe_hal.cli import model

SEED = "4,1026,1799,166,694,753,0,16,0,240,1119,19,6,0,46,659,10,0,112,808,181,0,28,22,90,0,176,0,37,5,10,22"


def run(argv, capsys):
    parser = argparse.ArgumentParser(prog="moe-hal")
    model.register(parser.add_subparsers())
    args = parser.parse_args(["model", *argv])
    rc = args.func(args)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_seed_question_json_on_the_peak_figures(capsys):
    # --no-achieved: the tile + wave model on the DB's peak and bandwidth alone (the ideal, not the
    # expected time), whose numbers the reference computes by hand
    rc, out, _ = run(
        ["--hw", "h200", "--counts", SEED, "--n", "4096", "--k", "7168", "--dtype", "fp8", "--json", "--no-achieved"],
        capsys,
    )
    assert rc == 0
    report = json.loads(out)
    ranked = report["ranked"]
    assert [e["block_m"] for e in ranked] == [64, 128, 256]
    assert [e["tiles"] for e in ranked] == [4480, 2560, 1568]
    assert [round(e["occupancy_m"], 3) for e in ranked] == [0.898, 0.786, 0.642]
    assert report["recommendation"]["tile"] == [64, 128]
    ans = report["answer"]
    # the DB's H200 as bench/calibrate.py measured it (hwdb/measured/nvidia-h200-sxm.yaml): fp8
    # 1455 TFLOP/s and 4081 GB/s read, one basis -> M* = 1455e12 / (2 x 4081e9) = 178 rows
    assert round(report["ridge_m"]) == 178
    basis = report["ranked"][0]["basis"]
    assert basis["roofline"] == "fp8 peak: measured; bandwidth: measured read"
    assert "no achieved efficiency" in basis["compute"]
    assert ans["free"] is False and ans["gap_best"] > 0.03
    assert len(ans["below"]) == 16 and ans["rows_below"] == 769
    assert sorted(ans["above"]) == sorted(g for g, c in enumerate(map(int, SEED.split(","))) if c > 178)
    assert report["problem"]["active_groups"] == 25 and report["problem"]["rows"] == 8048


def test_default_histogram_is_the_seed_and_table_output(capsys):
    rc, out, _ = run(["--dtype", "fp8", "--no-achieved"], capsys)
    assert rc == 0
    assert "issue #211" in out and "64x128" in out and "Recommendation: 64x128" in out
    assert "Not at the ideal here" in out and "M* = 178 rows" in out
    assert "compute-bound as a whole" in out  # small experts' padded tiles are charged in a compute-bound call


def test_seed_question_with_achieved_efficiency_uses_one_basis(capsys):
    rc, out, _ = run(
        ["--hw", "h200", "--counts", SEED, "--n", "4096", "--k", "7168", "--dtype", "fp8", "--json"], capsys
    )
    assert rc == 0
    report = json.loads(out)
    best = report["ranked"][0]
    assert "achieved" in best["basis"]["compute"] and "fitted" in best["basis"]["compute"]
    assert "achieved" in best["basis"]["bandwidth"]
    # M* from the achieved pair the prediction uses, not a datasheet peak over a measured copy bandwidth
    e_b = 1 + 4 / (128 * 128)
    assert report["ridge_m"] == pytest.approx(best["achieved_flops"] * e_b / (2 * best["achieved_bandwidth"]))
    # the roofline keeps the peak: the prediction is slower than the ideal
    assert best["t_predicted"] > best["t_roofline"]
    assert report["recommendation"]["equivalent"][0] == report["recommendation"]["tile"]


def test_memory_bound_decode_answer(capsys):
    rc, out, _ = run(
        [
            "--op",
            "masked",
            "--counts",
            ",".join(["8"] * 32),
            "--max-m",
            "128",
            "--dtype",
            "fp8",
            "--tiles",
            "64x128,128x128",
            "--json",
        ],
        capsys,
    )
    assert rc == 0
    report = json.loads(out)
    answer, best = report["answer"], report["ranked"][0]
    # every expert sits below M*, the call streams its weights, and padding costs nothing ...
    assert answer["above"] == [] and answer["rows_below"] == 256
    assert best["bound"] == "memory"
    assert best["t_padded"] == best["t_roofline"]
    assert report["recommendation"]["tile"] == [64, 128]
    # ... but "at the ideal" is the achieved streaming rate against the roofline's, said as such
    assert answer["free"] == (answer["gap_best"] <= model.AT_IDEAL)


def test_dist_and_k_grouped(capsys):
    rc, out, _ = run(["--dist", "zipf:1.2", "--tokens", "4096", "--experts", "32", "--topk", "8", "--json"], capsys)
    assert rc == 0 and sum(json.loads(out)["problem"]["counts"]) == 4096 * 8
    rc, out, _ = run(["--dist", "seed", "--tokens", "512", "--topk", "8", "--json"], capsys)
    assert rc == 0 and sum(json.loads(out)["problem"]["counts"]) == 4096
    rc, out, _ = run(["--op", "k_grouped", "--m", "4096", "--n", "7168", "--counts", "8192,0,300", "--json"], capsys)
    report = json.loads(out)
    assert rc == 0 and report["problem"]["k"] is None and report["ranked"][0]["m"] == 4096


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--dist", "uniform"], "--tokens"),
        (["--counts", "1,x"], "--counts"),
        (["--tiles", "64by128"], "--tiles"),
        (["--dtype", "fp64"], "dtype"),
        (["--hw", "no-such-gpu"], "hw"),
        (["--op", "masked", "--counts", "5,300", "--max-m", "256"], "counts[1]"),
    ],
)
def test_bad_input_exits_2_with_a_message(argv, needle, capsys):
    rc, _, err = run(argv, capsys)
    assert rc == 2 and needle in err


def test_plot_renders(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    path = tmp_path / "seed.png"
    rc, out, _ = run(["--dtype", "fp8", "--plot", str(path)], capsys)
    assert rc == 0 and "plot written" in out
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000


def test_plot_without_matplotlib_says_which_extra(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    rc, _, err = run(["--plot", str(tmp_path / "x.png")], capsys)
    assert rc == 2 and "moe-hal[plot]" in err


def test_plot_labels_say_what_is_drawn(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    rc, out, _ = run(["--dtype", "fp8", "--plot", str(tmp_path / "c.png"), "--json"], capsys)
    labels = json.loads(out)["plot_labels"]
    assert rc == 0 and "N=4096, K=7168" in labels["title"] and "vs the plain roofline" in labels["title"]
    assert len(labels["candidates"]) == 3 and len(set(labels["candidates"])) == 3  # one label per tile
    assert "M_g (rows)" in labels["panels"][0]
    rc, out, _ = run(
        [
            "--op",
            "k_grouped",
            "--m",
            "1536",
            "--n",
            "2048",
            "--counts",
            "300,0,700",
            "--plot",
            str(tmp_path / "k.png"),
            "--json",
        ],
        capsys,
    )
    labels = json.loads(out)["plot_labels"]
    assert rc == 0 and "M=1536, N=2048" in labels["title"] and "K=None" not in labels["title"]
    assert "K_g (tokens)" in labels["panels"][0] and "M_g" not in labels["panels"][0]


def test_fast_accumulation_drops_the_k_block_latency_from_the_seed_call(capsys):
    argv = ["--hw", "h200", "--counts", SEED, "--n", "4096", "--k", "7168", "--dtype", "fp8", "--json"]
    _, promoted, _ = run(argv, capsys)
    rc, fast, _ = run([*argv, "--fast-accumulation"], capsys)
    assert rc == 0
    by_tile = {tuple(e["tile"]): e for e in json.loads(promoted)["ranked"]}
    for e in json.loads(fast)["ranked"]:
        before = by_tile[tuple(e["tile"])]
        # the fitted Hopper figures charge each 128-deep K block; a fast-accumulating kernel is spared it
        assert before["stage_latency"] > 0 and e["stage_latency"] == 0 and e["promotion_k"] == 0
        assert e["t_compute"] < before["t_compute"]
        assert "fast_accumulation" in e["basis"]["stage_latency"]


def test_the_explanation_names_a_tile_load_rate_where_one_applies(capsys):
    # cuBLAS on the RTX 4090 has a load rate of its own (hwdb/measured): a 64 x 64 tile's MMA runs
    # below the compute rate, and the explanation must say why; DeepSeek-V3 shapes on the H200 with
    # a kernel that has none print no such line
    argv = ["--counts", "2056", "--n", "2056", "--k", "2056", "--dtype", "bf16", "--tiles", "64x64"]
    _, out, _ = run(["--hw", "nvidia-rtx-4090", "--impl", "cublas", *argv], capsys)
    line = next(x for x in out.splitlines() if "prediction tile_load_rate" in x)
    assert "GB/s" in line and "of the achieved compute rate" in line
    _, out, _ = run(["--hw", "nvidia-h200-sxm", "--impl", "torch_grouped_mm", *argv], capsys)
    assert "prediction tile_load_rate" not in out and "prediction launch" in out
