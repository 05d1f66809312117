"""The README's API tour and every Python block of docs/*.md run as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).parents[1] / "README.md"


def test_readme_tour_runs(capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README.md has no python block"
    for block in blocks:
        exec(compile(block, str(README), "exec"), {"__name__": "readme"})
    assert "selected:" in capsys.readouterr().out


def test_readme_has_exactly_two_setup_commands():
    text = README.read_text()
    setup = text.split("## Set up", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"```\n(.*?)```", setup, flags=re.S)
    assert len(commands) == 2, commands
    assert "moe-hal run" in commands[0] and "torch==2.13.0" in commands[0]
    assert commands[1].strip() == "scripts/test.sh"
    ci = (README.parent / ".ci" / "run").read_text()
    assert "scripts/test.sh" in ci, ".ci/run must call the README's test command"


def test_the_test_command_keeps_its_own_venv():
    # The tests install deliberately broken plugins: they must never land in the user's .venv.
    script = (README.parent / "scripts" / "test.sh").read_text()
    default = re.search(r'venv="\$\{MOE_HAL_VENV:-([^}]+)\}"', script)
    assert (
        default
        and default.group(1) not in (".venv", "venv", "")
        and default.group(1) in (README.parent / ".gitignore").read_text()
    )


DOCS = sorted((README.parent / "docs").glob("*.md"))
DOC_BLOCKS = [
    (path.name, i, block)
    for path in DOCS
    for i, block in enumerate(re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S))
]


@pytest.mark.parametrize("name,index,block", DOC_BLOCKS, ids=[f"{n}#{i}" for n, i, _ in DOC_BLOCKS])
def test_every_python_block_of_the_docs_runs(name, index, block, tmp_path, monkeypatch):
    # Each block runs on its own, in a fresh namespace, from a scratch directory (blocks may write
    # files), as a reader would paste it.
    monkeypatch.chdir(tmp_path)
    exec(compile(block, f"docs/{name} block {index}", "exec"), {"__name__": f"docs_{index}"})


@pytest.mark.filterwarnings("ignore::moe_hal.errors.PathWarning")
def test_the_sample_explain_output_is_what_explain_prints(capsys):
    # docs/plugins.md shows a call and what explain() prints for it with the CUDA plugin alone.
    pytest.importorskip("moe_hal_cuda")
    from moe_hal.testing import only_plugins

    text = (README.parent / "docs" / "plugins.md").read_text()
    code = next((m for m in re.finditer(r"```python\n(.*?)```", text, flags=re.S) if ".explain()" in m.group(1)), None)
    printed = code and re.compile(r"```text\n(.*?)```", flags=re.S).search(text, code.end())
    assert printed, "docs/plugins.md lost its explain() sample (a python block, then a text block)"
    with only_plugins("cuda"):
        exec(compile(code.group(1), "docs/plugins.md explain sample", "exec"), {"__name__": "docs_explain"})
    assert capsys.readouterr().out == printed.group(1)
