"""Extract the Python signatures of DeepGEMM's public functions from its sources at a commit.

    python tests/compat/extract_deepgemm_signatures.py DEEPGEMM_GIT_DIR > tests/compat/deepgemm_signatures.json

Reads, with ``git show`` (no checkout, nothing imported or built): the pybind11 registrations
(``m.def`` with their ``py::arg`` names and defaults, ``m.attr`` aliases) in ``csrc/apis/*.hpp`` and
the Python ``def``/alias lines of ``deep_gemm/__init__.py`` and ``deep_gemm/utils/*.py`` at
:data:`PINNED` (v2.6.1), and the Python functions of the v1 API at :data:`V1`. A registration
without ``py::arg`` takes positional arguments only (pybind11 names them ``arg0``, ...); the count
comes from the C++ declaration.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys

PINNED = "54e2261"  # "Multiple updates and refactorings (#364)", __version__ = '2.6.1'
V1 = "03d0be3"  # the last v1 layout of the API (2025-07-02)

_DEF_START = re.compile(r'm\.def\(\s*"(\w+)"\s*,')
_ARG = re.compile(r'py::arg\("(\w+)"\)(?:\s*=\s*((?:std::make_tuple\([^)]*\))|[^,)\n]+))?')
_ATTR = re.compile(r'm\.attr\("(\w+)"\)\s*=\s*m\.attr\("(\w+)"\)')
_PY_ALIAS = re.compile(r"^\s*(\w+)\s*=\s*(\w+)\s*$", re.M)


def _show(git_dir: str, commit: str, path: str) -> str:
    return subprocess.run(
        ["git", "--git-dir", git_dir, "show", f"{commit}:{path}"], check=True, capture_output=True, text=True
    ).stdout


def _files(git_dir: str, commit: str, prefix: str) -> list[str]:
    out = subprocess.run(
        ["git", "--git-dir", git_dir, "ls-tree", "-r", "--name-only", commit, prefix],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return out.split()


def _registrations(text: str) -> list[tuple[str, str]]:
    """``(name, rest of the call)`` of every ``m.def("name", ...)``, the call's parentheses balanced
    (a lambda body holds its own parentheses and semicolons)."""
    found = []
    for match in _DEF_START.finditer(text):
        depth, i = 1, match.end()
        while depth:
            ch = text[i]
            if ch == '"':
                i = text.index('"', i + 1)
            depth += ch in "({"
            depth -= ch in ")}"
            i += 1
        found.append((match.group(1), text[match.end() : i - 1]))
    return found


def _default(cpp: str):
    cpp = cpp.strip()
    if cpp == "std::nullopt":
        return None
    if cpp in ("true", "false"):
        return cpp == "true"
    if cpp.startswith('"'):
        return cpp.strip('"')
    tuple_match = re.fullmatch(r"std::make_tuple\(([^)]*)\)", cpp)
    if tuple_match:
        return [int(v) for v in tuple_match.group(1).split(",")]
    try:
        return int(cpp)
    except ValueError:
        return {"cpp": cpp}  # a C++ value with no Python literal (e.g. torch::kFloat32)


def _cpp_param_count(sources: str, name: str, body: str) -> int:
    lam = re.match(r"\s*\[&\]\s*\(([^)]*)\)", body)
    params = lam.group(1) if lam else None
    if params is None:
        decl = re.search(r"\b" + re.escape(name) + r"\(([^)]*)\)\s*(?:->|\{|const)", sources)
        params = decl.group(1) if decl else ""
    depth, count, seen = 0, 0, False
    for ch in params:  # commas inside template arguments do not count
        depth += ch == "<"
        depth -= ch == ">"
        if ch == "," and depth == 0:
            count += 1
        seen = seen or not ch.isspace()
    return count + 1 if seen else 0


def pybind_functions(git_dir: str, commit: str) -> tuple[dict, dict]:
    sources = "".join(
        _show(git_dir, commit, p) for p in _files(git_dir, commit, "csrc") if p.endswith((".hpp", ".cpp"))
    )
    functions, aliases = {}, {}
    for path in _files(git_dir, commit, "csrc/apis"):
        text = _show(git_dir, commit, path)
        for name, body in _registrations(text):
            if name == "init":
                continue
            args = _ARG.findall(re.sub(r"\[&\]\s*\([^)]*\)\s*\{.*\}", "", body, flags=re.S))
            if args:
                functions[name] = {
                    "params": [{"name": n, **({"default": _default(d)} if d else {})} for n, d in args],
                    "source": path,
                }
            else:
                functions[name] = {"positional_only": _cpp_param_count(sources, name, body), "source": path}
        aliases.update(dict(_ATTR.findall(text)))
    return functions, aliases


def _py_default(node: ast.expr):
    try:
        value = ast.literal_eval(node)
    except ValueError:
        return {"python": ast.unparse(node)}  # not a literal (e.g. torch.float)
    return list(value) if isinstance(value, tuple) else value


def python_functions(git_dir: str, commit: str, paths: list[str]) -> tuple[dict, dict]:
    functions, aliases = {}, {}
    for path in paths:
        text = _show(git_dir, commit, path)
        for node in ast.parse(text).body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
                args = node.args
                defaults = [None] * (len(args.args) - len(args.defaults)) + list(args.defaults)
                functions[node.name] = {
                    "params": [
                        {"name": a.arg, **({"default": _py_default(d)} if d is not None else {})}
                        for a, d in zip(args.args, defaults)
                    ],
                    "source": path,
                }
        aliases.update(dict(_PY_ALIAS.findall(text)))
    return functions, aliases


def main(git_dir: str) -> dict:
    functions, aliases = pybind_functions(git_dir, PINNED)
    py_paths = ["deep_gemm/__init__.py"] + [p for p in _files(git_dir, PINNED, "deep_gemm/utils") if p.endswith(".py")]
    py_functions, py_aliases = python_functions(git_dir, PINNED, py_paths)
    functions.update({k: v for k, v in py_functions.items() if k not in functions and not k.startswith("_")})
    aliases.update({k: v for k, v in py_aliases.items() if v in functions or v in aliases})
    v1_paths = [p for p in _files(git_dir, V1, "deep_gemm/jit_kernels") if p.endswith(".py")]
    v1, _ = python_functions(git_dir, V1, v1_paths)
    v1_exports = re.findall(r"^\s+(\w+),?", _show(git_dir, V1, "deep_gemm/__init__.py"), re.M)
    return {
        "repository": "deepseek-ai/DeepGEMM",
        "commit": PINNED,
        "v1_commit": V1,
        "functions": dict(sorted(functions.items())),
        "aliases": dict(sorted(aliases.items())),
        "v1_functions": {k: v for k, v in sorted(v1.items()) if k in v1_exports},
    }


if __name__ == "__main__":
    json.dump(main(sys.argv[1]), sys.stdout, indent=1, sort_keys=False)
    sys.stdout.write("\n")
