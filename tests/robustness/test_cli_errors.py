"""Careless command lines: every error is one clear line with a documented exit status, never a
traceback; ``moe-hal info`` reports problems (strict plugins, a malformed hardware-DB file, bad
variables) after printing everything, with exit status 3."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from moe_hal import cli


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    try:
        code = cli.main(argv)
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


USAGE_ERRORS = [
    ["run", "--dtype", "int8"],
    ["run", "--tokens", "-1"],
    ["run", "--tokens", "many"],
    ["run", "--experts", "0"],
    ["run", "--k", "-3"],
    ["run", "--alignment", "0"],
    ["run", "--repeat", "-1"],
    ["run", "--out", "/nonexistent-dir/run.json"],
    ["run", "--op", "grouped"],
    ["model", "--plot", "/nonexistent-dir/plot.png", "--counts", "4,4"],
    ["bench", "--device", "tpu"],
    ["conformance", "run", "--device", "tpu"],
    ["conformance", "run", "--report", "/nonexistent-dir/r.json"],
    ["conformance", "run", "--junit", "/nonexistent-dir/r.xml"],
    ["hw", "frobnicate"],
    ["frobnicate"],
]


@pytest.mark.parametrize("argv", USAGE_ERRORS, ids=" ".join)
def test_a_bad_argument_is_a_usage_error_without_traceback(argv, capsys):
    code, out, err = _run(argv, capsys)
    assert code == 2
    assert "Traceback" not in out + err
    assert err.strip().splitlines()[-1].startswith("moe-hal")


LIBRARY_ERRORS = [
    (["hw", "show", "no-such-device"], 2),
    (["model", "--hw", "no-such-device", "--counts", "4,4"], 2),
    (["model", "--counts", "4,-4"], 2),
    (["model", "--counts", "a,b"], 2),
    (
        [
            "run",
            "--backend",
            "no_such_backend",
            "--tokens",
            "8",
            "--experts",
            "2",
            "--n",
            "8",
            "--k",
            "8",
            "--repeat",
            "0",
            "--conformance",
            "none",
        ],
        2,
    ),
    (["conformance", "verify", "/nonexistent-dir/report.json"], 2),
    (["conformance", "compare", "/nonexistent-dir/a.json", "/nonexistent-dir/b.json"], 2),
]


@pytest.mark.parametrize("argv,status", LIBRARY_ERRORS, ids=lambda v: " ".join(v) if isinstance(v, list) else str(v))
def test_a_library_error_is_one_line_without_traceback(argv, status, capsys):
    code, out, err = _run(argv, capsys)
    assert code == status, err
    assert "Traceback" not in out + err
    assert any(line.startswith(("moe-hal", "error:")) for line in err.splitlines()), err


def test_an_unexpected_error_is_one_line_and_the_traceback_is_opt_in(monkeypatch, capsys):
    def crash(args):
        raise ZeroDivisionError("division by zero")

    real_build = cli.build_parser

    def build():  # `moe-hal hw` whose command crashes with a bug
        parser = real_build()
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        sub.choices["hw"].set_defaults(func=crash)
        return parser

    monkeypatch.setattr(cli, "build_parser", build)
    code, out, err = _run(["hw"], capsys)
    assert code == 1
    assert "Traceback" not in err and "ZeroDivisionError: division by zero" in err and "--traceback" in err
    code, out, err = _run(["--traceback", "hw"], capsys)
    assert code == 1 and "Traceback" in err


@pytest.mark.filterwarnings("ignore::moe_hal.errors.PluginWarning")
@pytest.mark.parametrize(
    "variable,value,problem",
    [
        ("MOE_HAL_STRICT_PLUGINS", "1", "MOE_HAL_STRICT_PLUGINS is set"),
        ("MOE_HAL_HWDB", "{bomb}", "bomb.yaml"),
        ("MOE_HAL_TRACE_PLUGINS", "maybe", "MOE_HAL_TRACE_PLUGINS"),
        ("MOE_HAL_PREPARED_MAX_BYTES", "1e999", "MOE_HAL_PREPARED_MAX_BYTES"),
    ],
)
def test_info_reports_problems_and_exits_3(variable, value, problem, monkeypatch, fresh_plugins, tmp_path, capsys):
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("a: &a [x, x, x]\nb: &b [*a, *a, *a]\nc: [*b, *b, *b]\n")
    monkeypatch.setenv(variable, value.format(bomb=bomb))
    fresh_plugins()
    code, out, err = _run(["info", "--json"], capsys)
    assert code == 3, err
    snap = json.loads(out)
    assert any(problem in p for p in snap["problems"]), snap["problems"]
    assert "Traceback" not in err
    if variable != "MOE_HAL_TRACE_PLUGINS":  # that one stops plugin discovery: no devices or backends to list
        assert snap["devices"]
        assert {b["name"] for b in snap["backends"]} >= {"torch", "reference"}


@pytest.mark.filterwarnings("ignore::moe_hal.errors.PluginWarning")
def test_info_exits_0_without_problems(monkeypatch, fresh_plugins, capsys):
    monkeypatch.delenv("MOE_HAL_STRICT_PLUGINS", raising=False)
    monkeypatch.delenv("MOE_HAL_HWDB", raising=False)
    fresh_plugins()
    code, out, err = _run(["info", "--json"], capsys)
    assert code == 0 and json.loads(out)["problems"] == []


def test_the_console_script_prints_no_traceback():
    done = subprocess.run(
        [sys.executable, "-m", "moe_hal.cli", "run", "--tokens", "-1"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "--tokens" in done.stderr.strip().splitlines()[-1]


def test_help_documents_the_exit_statuses(capsys):
    code, out, err = _run(["--help"], capsys)
    assert code == 0
    text = " ".join(out.split())
    for status, meaning in cli.EXIT_STATUSES.items():
        assert f"{status} {' '.join(meaning.split())}" in text
