"""What the command line prints: data in square brackets survives, key columns are never cut,
warnings are plain lines, errors are clear, help texts are complete, `moe-hal info` is a bug report."""

from __future__ import annotations

import argparse
import json
import warnings

import pytest

import moe_hal
from moe_hal.cli import build_parser, main, render


def test_square_brackets_in_data_survive_tables():
    from io import StringIO

    from rich.console import Console

    t = render.table(
        "t",
        ("case [path]", "reason"),
        [("gemm/x [direct]", "[hw_feature_missing] pip install moe-hal-ascend[npu]")],
        key=("case [path]",),
    )
    buf = StringIO()
    Console(file=buf, width=200).print(t)
    out = buf.getvalue()
    assert "gemm/x [direct]" in out and "[hw_feature_missing]" in out and "moe-hal-ascend[npu]" in out
    assert "case [path]" in out


def test_square_brackets_in_data_survive_the_conformance_progress_bar():
    from io import StringIO
    from types import SimpleNamespace

    from rich.console import Console

    from moe_hal.cli.conformance import _RichProgress

    buf = StringIO()
    progress = _RichProgress(Console(file=buf, force_terminal=True, width=200))
    progress.start(2)
    progress.step("cuda_sm90", SimpleNamespace(status="pass", id="gemm/x", path="direct"))
    progress.stop()
    assert "cuda_sm90: gemm/x [direct]" in buf.getvalue()


def test_key_columns_are_never_cut_in_a_narrow_console():
    from io import StringIO

    from rich.console import Console

    long_id = "nvidia-gb200-nvl72-some-very-long-id"
    t = render.table(None, ("id", "name", "features"), [(long_id, "a name " * 8, "f, " * 30)], key=("id",))
    buf = StringIO()
    Console(file=buf, width=60).print(t)
    assert long_id in buf.getvalue()


def test_hw_list_piped_keeps_every_id_whole(capsys):
    assert main(["hw", "list"]) == 0
    out = capsys.readouterr().out
    for entry in moe_hal.hwdb.all():
        assert entry.id in out, entry.id
    assert "…" not in out


def test_hw_show_keeps_the_plugin_origin(fresh_plugins, monkeypatch, capsys):
    monkeypatch.setenv("MOE_HAL_PLUGINS", "fake_vendor")
    fresh_plugins()
    assert main(["hw", "show", "fakeacc"]) == 0
    assert "[plugin fake_vendor]" in capsys.readouterr().out


def test_info_is_a_plain_bug_report_with_reason_codes(fresh_plugins, monkeypatch, capsys):
    monkeypatch.setenv("MOE_HAL_PLUGINS", "fake_vendor,broken_impl")
    fresh_plugins()
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "[backend_import_failed]" in out  # the reason code of broken_impl, brackets included
    assert "cpu: " in out and "threads: torch" in out and "libraries: torch" in out
    assert "fake vendor firmware (fake_vendor): 1.2.3 (fictional)" in out
    line = next(x for x in out.splitlines() if x.strip().startswith("fake_vendor ("))
    hooks = line.split("hooks: ", 1)[1].split(";", 1)[0].split(", ")
    assert {"conformance_manifest", "environment", "hardware_db", "probe_device", "register_backends"} <= set(hooks)
    assert "hardware-DB entries: example-fake-accelerator" in line
    assert "┃" not in out and "│" not in out  # plain lines, pasteable into an issue


def test_info_json_carries_the_same(fresh_plugins, monkeypatch, capsys):
    monkeypatch.setenv("MOE_HAL_PLUGINS", "fake_vendor")
    fresh_plugins()
    assert main(["info", "--json"]) == 0
    snap = json.loads(capsys.readouterr().out)
    assert {"versions", "machine", "facts", "devices", "plugins", "backends", "env"} <= set(snap)
    assert snap["machine"]["torch_threads"] >= 1 and snap["machine"]["cpu"]
    fake = next(p for p in snap["plugins"] if p["name"] == "fake_vendor")
    assert "probe_device" in fake["hooks"] and fake["hwdb_entries"] == ["example-fake-accelerator"]


def test_warnings_print_as_one_plain_line(monkeypatch, capsys):
    import moe_hal.cli.info as info

    def warn_and_exit(args):
        warnings.warn("the path changed", moe_hal.errors.PathWarning, stacklevel=1)
        return 0

    monkeypatch.setattr(info, "run", warn_and_exit)  # registered as `moe-hal info`'s func
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        assert main(["info"]) == 0
    err = capsys.readouterr().err
    assert "warning: the path changed\n" in err
    assert ".py:" not in err and "warnings.warn" not in err  # no file:line, no source line


def test_unknown_dtype_and_unknown_case_are_clear_errors(capsys):
    with pytest.raises(SystemExit) as info:
        main(["run", "--dtype", "int4"])
    assert info.value.code == 2
    assert "invalid choice: 'int4'" in capsys.readouterr().err
    assert main(["bench", "--only", "nosuch", "--no-peers"]) == 2
    err = capsys.readouterr().err
    assert "--only" in err and "nosuch" in err and "Traceback" not in err


def test_fuzz_without_hypothesis_is_a_clear_error(monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "hypothesis" else real(name, *a))
    rc = main(["conformance", "run", "--backend", "torch", "--tier", "fuzz", "--no-progress"])
    assert rc == 2
    captured = capsys.readouterr()
    assert "pip install 'moe-hal[test]'" in " ".join((captured.out + captured.err).split())


def _subparsers(parser: argparse.ArgumentParser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield name, sub
                yield from ((f"{name} {n}", s) for n, s in _subparsers(sub))


def test_every_subcommand_has_a_description_and_help_shows_defaults():
    for name, sub in _subparsers(build_parser()):
        assert sub.description, f"`moe-hal {name}` has no description"
        text = sub.format_help()
        assert "[/" not in text and "[bold]" not in text and "``" not in text and ":mod:" not in text, name
        for action in sub._actions:
            if action.help in (None, argparse.SUPPRESS) or action.option_strings == ["-h", "--help"]:
                continue
            default = action.default
            if default not in (None, False, argparse.SUPPRESS) and not isinstance(action, argparse._StoreTrueAction):
                assert "default" in action.help, f"`moe-hal {name} {action.option_strings}` hides its default"


def test_a_low_priority_plugin_does_not_trigger_a_contradicting_warning(fresh_plugins, monkeypatch, gen):
    import torch

    monkeypatch.setenv("MOE_HAL_PLUGINS", "")
    host = fresh_plugins().ensure_loaded()
    low = moe_hal.BackendSpec(
        "lowprio",
        "test",
        ("cpu",),
        "optimized",
        -10,
        "moe_hal.builtin.torch_grouped_mm:TorchBackend",
        host.specs["torch"].signatures,
    )
    host.specs["lowprio"] = low
    moe_hal.clear_cache()
    a, b = torch.randn(6, 8, generator=gen), torch.randn(2, 4, 8, generator=gen)
    lay = moe_hal.ContiguousLayout.from_counts([2, 4], alignment=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sel = moe_hal.select(a, b, lay)
    assert sel.name == "torch"
    assert not [w for w in caught if issubclass(w.category, moe_hal.errors.PathWarning)]
    assert "lowprio (optimized, priority -10)" in sel.explain()


def test_conformant_with_waivers_lists_the_waived_and_now_passing_cases(tmp_path, capsys):
    manifest = tmp_path / "xfails.yaml"
    manifest.write_text('entries:\n  - id: "layout_indices/*"\n    kind: bug\n    reason: "believed broken"\n')
    rc = main(
        [
            "conformance",
            "run",
            "--backend",
            "reference",
            "--tier",
            "smoke",
            "--case",
            "layout_indices/*",
            "--manifest",
            str(manifest),
            "--no-progress",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0 and "conformant with waivers" in out
    assert "reference: waived cases:" in out and "now passes: remove its waiver" in out
    assert "layout_indices/" in out and "[library]" in out  # the case id and its path, brackets kept


def test_hw_match_lists_the_visible_devices(capsys):
    from moe_hal import sysinfo

    assert main(["hw", "match", "--json"]) == 0
    listed = [r["device"] for r in json.loads(capsys.readouterr().out)]
    assert listed == [str(d) for d in sysinfo.visible_devices()] and listed[0] == "cpu"
