"""Malformed hardware-DB overlays (``MOE_HAL_HWDB``): each is refused with a ``HardwareDBError``
naming the file, in well under a second of this thread's CPU time (wall time would flake on a loaded
CI machine; an expanding alias bomb or a backtracking pattern is CPU work either way) — no hang, no
unbounded memory, no raw ``RecursionError``."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

import moe_hal
from moe_hal import errors, hwdb

BUILTIN = Path(__file__).parents[2] / "hwdb"


def _entry(**changes) -> str:
    """A valid entry (a copy of a built-in one under a new id) with ``changes`` applied to the
    parsed data; keys are dotted paths."""
    data = yaml.safe_load((BUILTIN / "nvidia-h100-sxm.yaml").read_text())
    data["id"] = "robustness-test-gpu"
    data.pop("aliases", None)
    data["recognition"] = {"cpu": {"model_pattern": "^never matches this machine$"}}
    for dotted, value in changes.items():
        node = data
        *parents, last = dotted.split(".")
        for key in parents:
            node = node[key]
        node[last] = value
    return yaml.safe_dump(data)


def _laughs(kind: str) -> str:
    if kind == "seq":
        lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
        lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 12)]
    else:
        lines = ['a0: &a0 {x: "lol"}']
        lines += [f"a{i}: &a{i} {{" + ", ".join(f"k{j}: *a{i - 1}" for j in range(9)) + "}" for i in range(1, 12)]
    return "\n".join(lines) + "\n"


OVERLAYS = {
    "alias-bomb-sequences": _laughs("seq"),
    "alias-bomb-mappings": _laughs("map"),
    "recursive-anchor": "a: &a [*a]\n",
    "recursive-anchor-mapping": "a: &a {b: *a}\n",
    "merge-key-alias": "base: &b {x: 1}\nother:\n  <<: *b\n",
    "deep-flow-nesting": "a: " + "[" * 50000 + "]" * 50000 + "\n",
    "deep-block-nesting": "".join(" " * i + f"k{i}:\n" for i in range(300)) + " " * 300 + "v: 1\n",
    "redos-nested-repeat": _entry(**{"recognition.cpu.model_pattern": "^(a+)+$"}),
    "redos-alternation": _entry(**{"recognition.cpu.model_pattern": "^(a|a)*$"}),
    "redos-backreference": _entry(**{"recognition.cpu.model_pattern": "(a*)\\1*b"}),
    "pattern-too-many-repeats": _entry(**{"recognition.cpu.model_pattern": "a*a*a*a*a*b"}),
    "pattern-too-long": _entry(**{"recognition.cpu.model_pattern": "x" * 1000}),
    "pattern-invalid": _entry(**{"recognition.cpu.model_pattern": "(unclosed"}),
    "nan-peak": _entry(**{"peak_dense.bf16.value": float("nan")}),
    "inf-bandwidth": _entry(**{"memory.bandwidth.value": float("inf")}),
    "minus-inf-clock": _entry(**{"compute.boost_clock.value": float("-inf")}),
    "yaml-nan-literal": _entry().replace("id: robustness-test-gpu", "id: robustness-test-gpu\nextra_nan: .nan"),
    "zero-units": _entry(**{"compute.units.value": 0}),
    "zero-bandwidth": _entry(**{"memory.bandwidth.value": 0}),
    "zero-peak": _entry(**{"peak_dense.bf16.value": 0}),
    "negative-capacity": _entry(**{"memory.capacity.value": -80}),
    "huge-number": _entry().replace("id: robustness-test-gpu", "id: robustness-test-gpu\nx: 1e400"),
    "file-too-large": "# " + "x" * (2 << 20) + "\n",
    "impossible-date": "a: 2026-13-45\n",
    "python-tag": "a: !!python/object/apply:os.system ['true']\n",
    "unhashable-key": "? [1, 2]\n: 3\n",
    "top-level-list": "- 1\n- 2\n",
    "empty": "",
    "tabs": "a:\n\t- b\n",
    "unclosed-quote": 'a: "open\n',
    "duplicate-id": _entry(**{"id": "nvidia-h100-sxm"}),
    "unknown-overlay-target": "schema_version: 1\noverlay_of: no-such-device\nmeasured: {}\n",
    "wrong-type": _entry(**{"compute.units": "many"}),
}


@pytest.fixture(autouse=True)
def _fresh_db(monkeypatch):
    hwdb.reload()
    hwdb.get("cpu-generic")  # the built-in files are parsed before the clock starts
    yield
    monkeypatch.undo()
    hwdb.reload()


@pytest.mark.parametrize("name", sorted(OVERLAYS))
def test_a_malformed_overlay_is_refused_fast_naming_the_file(name, tmp_path, monkeypatch):
    path = tmp_path / f"{name}.yaml"
    path.write_text(OVERLAYS[name], encoding="utf-8")
    monkeypatch.setenv("MOE_HAL_HWDB", str(path))
    hwdb.reload()
    start = time.thread_time()
    with pytest.raises(errors.HardwareDBError) as info:
        hwdb.get("cpu-generic")
    assert time.thread_time() - start < 1.0
    assert str(path) in info.value.file and str(path) in str(info.value)


@pytest.mark.parametrize("content", [b"\xff\xfe\x00garbage", b"a: \x80\x81\n"])
def test_an_overlay_that_is_not_text_is_refused(content, tmp_path, monkeypatch):
    path = tmp_path / "binary.yaml"
    path.write_bytes(content)
    monkeypatch.setenv("MOE_HAL_HWDB", str(path))
    hwdb.reload()
    with pytest.raises(errors.HardwareDBError, match="binary.yaml"):
        hwdb.get("cpu-generic")


def test_a_valid_overlay_with_scalar_aliases_still_loads(tmp_path, monkeypatch):
    entry = yaml.safe_load(_entry())
    data = {"sources": {**entry.pop("sources", {}), "s": "ANCHOR"}, **entry}  # the anchor comes first
    data["memory"]["bandwidth"]["source"] = "ALIAS"
    text = yaml.safe_dump(data, sort_keys=False).replace("ANCHOR", "&s some source").replace("ALIAS", "*s")
    path = tmp_path / "ok.yaml"
    path.write_text(text)
    monkeypatch.setenv("MOE_HAL_HWDB", str(path))
    hwdb.reload()
    entry = hwdb.get("robustness-test-gpu")
    assert entry.raw["memory"]["bandwidth"]["source"] == "some source"


def test_recognition_matches_long_names_in_bounded_time():
    start = time.thread_time()
    assert hwdb.match_cpu("a" * 100_000 + "!").id == "cpu-generic"
    hwdb.match_cuda("H" * 100_000, 9, 0)
    assert time.thread_time() - start < 1.0


def test_every_call_still_reports_the_bad_overlay(tmp_path, monkeypatch):
    path = tmp_path / "bomb.yaml"
    path.write_text(OVERLAYS["alias-bomb-sequences"])
    monkeypatch.setenv("MOE_HAL_HWDB", str(path))
    hwdb.reload()
    import torch

    lay = moe_hal.ContiguousLayout.from_counts([1], alignment=1)
    start = time.thread_time()
    with pytest.raises(errors.HardwareDBError, match="bomb.yaml"):
        moe_hal.select(torch.zeros(1, 4), torch.zeros(1, 2, 4), lay, backend="reference")
    assert time.thread_time() - start < 1.0
