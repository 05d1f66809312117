"""The shape of the code base: the import graph of the core has no cycle and no knowledge of any
plugin, and the lint configuration CI runs is in force (every suppression names its rule and
says why)."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "moe_hal"

#: Function-level imports that close a cycle, each left on purpose and named here so that no new
#: one goes unnoticed. Module-level imports have no cycle at all.
ALLOWED_LAZY_EDGES: set[tuple[str, str]] = set()

#: Module-level imports that close a cycle (the same rule: named, with how to break it).
ALLOWED_TOP_LEVEL_EDGES: set[tuple[str, str]] = set()

#: Names only plugins may know: their packages, distributions, variables and vendor stacks.
PLUGIN_KNOWLEDGE = re.compile(
    r"moe_hal_cuda|moe_hal_ascend|moe-hal-cuda|moe-hal-ascend|MOE_HAL_CUDA_|MOE_HAL_ASCEND_"
    r"|\btorch_npu\b|\btriton\b|cuda\.bindings|\bcuda-python\b|\bCANN\b"
)
VENDOR_MODULES = ("moe_hal_cuda", "moe_hal_ascend", "torch_npu", "triton", "cuda", "deep_gemm")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in CORE.rglob("*.py")}


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """ids of the import nodes inside ``if TYPE_CHECKING:`` blocks (never run)."""
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for n in ast.walk(node))
    return skip


def _imports(name: str) -> list[tuple[str, ast.AST, bool]]:
    """(imported module, node, at module level) for every runtime import of ``name``."""
    path = MODULES[name]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _type_checking_nodes(tree)
    top = {id(n) for n in tree.body}
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out += [(a.name, node, id(node) in top) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                out.append((sub if sub in MODULES else base, node, id(node) in top))
    return out


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def _graph(include_lazy: bool) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for name in MODULES:
        for target, _, at_top in _imports(name):
            if target in MODULES and target != name and (at_top or include_lazy):
                if (name, target) in (ALLOWED_TOP_LEVEL_EDGES if at_top else ALLOWED_LAZY_EDGES):
                    continue
                edges.setdefault(name, set()).add(target)
    return edges


def test_the_core_import_graph_has_no_cycle():
    assert not _cycles(_graph(include_lazy=False)), "cycle among module-level imports"
    assert not _cycles(_graph(include_lazy=True)), "cycle among the core's imports (function-level included)"


def test_the_allowed_edges_still_exist_and_lazy_ones_stay_lazy():
    for source, target in ALLOWED_TOP_LEVEL_EDGES:
        assert any(t == target and top for t, _, top in _imports(source)), f"{source} -> {target} is gone: unlist it"
    for source, target in ALLOWED_LAZY_EDGES:
        edges = [(t, top) for t, _, top in _imports(source) if t == target]
        assert edges and not any(top for _, top in edges), f"{source} -> {target} must stay a function-level import"


def test_the_core_knows_no_plugin():
    offenders = []
    for name, path in MODULES.items():
        for target, node, _ in _imports(name):
            if target.split(".")[0] in VENDOR_MODULES:
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {target}")
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {
            id(n.body[0].value)
            for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and n.body
            and isinstance(n.body[0], ast.Expr)
            and isinstance(n.body[0].value, ast.Constant)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                if PLUGIN_KNOWLEDGE.search(node.value):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} names {node.value[:60]!r}")
    assert not offenders, "\n".join(offenders)


def test_every_noqa_names_its_rule_and_says_why():
    import io
    import tokenize

    bare = []
    for path in ROOT.rglob("*.py"):
        if any(part.startswith((".venv", ".ci-venv")) or part in ("build", "ci-out") for part in path.parts):
            continue
        source = path.read_text(encoding="utf-8")
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if (
                token.type == tokenize.COMMENT
                and "noqa" in token.string
                and not re.search(r"# noqa: [A-Z]+[0-9]+(, ?[A-Z]+[0-9]+)* ?[-:(] ?\w", token.string)
            ):
                bare.append(f"{path.relative_to(ROOT)}:{token.start[0]}: {token.string}")
    assert not bare, "\n".join(bare)


def test_ci_runs_the_linter_with_the_projects_configuration():
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert "[tool.ruff.lint]" in pyproject and "select" in pyproject
    assert re.search(r"^ruff check \.$", (ROOT / ".ci" / "run").read_text(encoding="utf-8"), flags=re.M)


def test_the_hardware_db_is_pure_data():
    """moe_hal.hwdb never reaches the plugin host, not even lazily: recognising a real device (which
    asks the plugins' probes) is moe_hal.devices.match_device, above both."""
    reached = [
        f"{name} imports {target}"
        for name in MODULES
        if name == "moe_hal.hwdb" or name.startswith("moe_hal.hwdb.")
        for target, _, _ in _imports(name)
        if target.startswith("moe_hal.") and not target.startswith(("moe_hal.hwdb", "moe_hal.errors"))
    ]
    assert not reached, "\n".join(reached)


#: Citations of notes that are not in the repository (the project's working notes on peers and its
#: design notes): a reader cannot follow them. Cite docs/design.md or the public source instead.
UNPUBLISHED_NOTES = re.compile(r"\breference/[\w-]+\.md\b|\bDESIGN\.md\b")


def _tracked_text_files() -> list[Path]:
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, text=True
        ).stdout.split("\0")
        files = [ROOT / p for p in listed if p]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout (an unpacked sdist)
        files = [
            p
            for p in ROOT.rglob("*")
            if p.is_file() and not any(part.startswith(".") for part in p.parts[len(ROOT.parts) :])
        ]
    return [p for p in files if p.is_file() and p.suffix not in (".png", ".svg", ".safetensors", ".pt", ".gz")]


def test_no_file_cites_notes_outside_the_repository():
    offenders = []
    for path in _tracked_text_files():
        rel = path.relative_to(ROOT).as_posix()
        text = path.read_text(encoding="utf-8", errors="replace")
        for lineno, line in enumerate(text.splitlines(), 1):
            if UNPUBLISHED_NOTES.search(line):
                offenders.append(f"{rel}:{lineno}: {line.strip()[:100]}")
    assert not offenders, "\n".join(offenders)


def test_plugins_import_moe_hal_only_through_its_stable_surface():
    """A plugin's package imports ``moe_hal.plugin_api``, the names ``moe_hal`` or the plugin API
    export (and from the modules among them, e.g. ``moe_hal.errors``), or the conformance package
    (tools that drive the suite): what keeps its meaning within an API major version. The core's
    other modules may move."""
    import moe_hal
    from moe_hal import plugin_api

    public = set(moe_hal.__all__) | set(plugin_api.__all__)
    offenders = []
    for path in sorted((ROOT / "backends").glob("*/moe_hal_*/**/*.py")):
        rel = path.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                module, names = node.module, [a.name for a in node.names]
            elif isinstance(node, ast.Import):
                module, names = None, [a.name for a in node.names]
            else:
                continue
            if module is None:
                bad = [n for n in names if n.startswith("moe_hal.")]
            elif module == "moe_hal":
                bad = [n for n in names if n not in public]
            elif module.startswith("moe_hal.") and module != "moe_hal.plugin_api":
                bad = [] if module.split(".")[1] in public | {"conformance"} else [module]
            else:
                bad = []
            offenders += [f"{rel}:{node.lineno} imports {b}" for b in bad]
    assert not offenders, "\n".join(offenders)
