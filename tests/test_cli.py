"""The command line: the main job, info, and --help everywhere."""

from __future__ import annotations

import json

import pytest

from moe_hal.cli import SUBCOMMANDS, build_parser, main

SMALL = ["--tokens", "96", "--n", "48", "--k", "160", "--repeat", "1", "--conformance", "none"]


@pytest.mark.parametrize(
    "extra",
    [
        [],
        ["--dtype", "fp32", "--dist", "uniform", "--experts", "8", "--alignment", "16"],
        ["--dtype", "fp8", "--dist", "zipf:1.2", "--experts", "8", "--k", "256"],
        ["--op", "masked", "--dtype", "fp16", "--experts", "8", "--dist", "uniform"],
        ["--op", "k_grouped", "--dtype", "bf16", "--experts", "8", "--dist", "zipf:0.8", "--alignment", "1"],
        ["--backend", "reference", "--experts", "8", "--dist", "uniform", "--topk", "2"],
    ],
)
def test_main_job_verifies_against_the_reference(extra, tmp_path, capsys):
    out = tmp_path / "run.json"
    assert main(["run", *SMALL, *extra, "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["verified"] and r["calc_diff"] <= r["calc_diff_max"]
    assert "selected:" in r["explain"]
    assert sum(r["counts"]) == r["tokens"] * r["topk"]  # every routed slot got a row (nothing dropped)
    if r["op"] == "contiguous":
        assert r["padding_rows_zero"] is True
    assert "verified against the reference" in capsys.readouterr().out


def test_main_job_defaults_use_the_seed_skew_and_print_a_conformance_verdict(tmp_path):
    out = tmp_path / "run.json"
    assert main(["run", "--tokens", "128", "--n", "32", "--k", "64", "--repeat", "0", "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["experts"] == 32 and r["dist"] == "seed" and r["backend"] == "torch"
    assert r["counts"].count(0) >= 7  # the seed histogram has 7 empty experts
    assert r["conformance"]["tier"] == "smoke" and r["conformance"]["verdict"] == "conformant"


def test_bad_arguments_give_a_clean_error(capsys):
    assert main(["run", "--dist", "seed", "--experts", "8", *SMALL]) == 2
    err = capsys.readouterr().err
    assert "--experts" in err and "expected 32" in err and "Traceback" not in err


def test_every_subcommand_has_help(capsys):
    parser = build_parser()
    for name in SUBCOMMANDS:
        with pytest.raises(SystemExit) as info:
            parser.parse_args([name, "--help"])
        assert info.value.code == 0
        assert "unavailable" not in capsys.readouterr().out, f"`moe-hal {name}` failed to load"


def test_info_text(capsys):
    assert main(["info"]) == 0
    text = capsys.readouterr().out
    assert "devices" in text and "backends" in text and "torch" in text


def test_main_job_json_goes_to_stdout(capsys):
    assert main(["run", *SMALL, "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["verified"] and r["backend"] == "torch"
