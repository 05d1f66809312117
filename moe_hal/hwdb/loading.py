"""Loading and validating the hardware database: YAML files, the schema, overlays and the cache.

One YAML file per accelerator lives in the top-level ``hwdb/`` directory (installed as the data
package ``moe_hal.data.hwdb``) and is validated against ``hwdb/schema.json`` with ``jsonschema``.
An *overlay* file (``overlay_of: <id>``) adds measured values or achieved efficiency to an
existing entry; ``hwdb/measured/`` holds the ones ``bench/calibrate.py`` measured and the fits
``moe-hal model calibrate`` wrote (``<id>.published-fit.yaml``). Extra files and directories come
from ``MOE_HAL_HWDB`` (``os.pathsep``-separated) and from plugins through :func:`add_overlay`,
which the plugin host calls when it discovers them. This module never discovers plugins itself.
"""

from __future__ import annotations

import copy
import datetime
import importlib.resources
import json
import math
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from re import _constants as _sre  # a regex's structure has no public API
from re import _parser as _sre_parser
from typing import Any

import yaml

from ..errors import ArgumentError, HardwareDBError
from .entry import HardwareEntry

#: Environment variable naming extra YAML files or directories, separated by ``os.pathsep``.
ENV_VAR = "MOE_HAL_HWDB"


@dataclass(frozen=True)
class _Document:
    """A parsed, schema-valid YAML file."""

    data: dict[str, Any]
    path: str


_schema_validator = None


def _validator():
    """The compiled schema validator (built on first use: jsonschema is slow to import)."""
    global _schema_validator
    if _schema_validator is None:
        import jsonschema

        text = importlib.resources.files("moe_hal.data.hwdb").joinpath("schema.json").read_text("utf-8")
        schema = json.loads(text)
        jsonschema.Draft202012Validator.check_schema(schema)
        _schema_validator = jsonschema.Draft202012Validator(schema)
    return _schema_validator


def _dates_to_text(node: Any) -> Any:
    """YAML turns unquoted ``2026-10-28`` into a date; the schema wants the ISO text."""
    if isinstance(node, dict):
        return {k: _dates_to_text(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_dates_to_text(v) for v in node]
    if isinstance(node, (datetime.date, datetime.datetime)):
        return node.isoformat()
    return node


def _error_location(error) -> tuple[str, str]:
    """(dotted field path, message) for a jsonschema error, naming the offending key itself for
    missing-key and unknown-key errors."""
    parts = [str(p) for p in error.absolute_path]
    message = error.message
    if error.validator == "required" and isinstance(error.instance, dict):
        missing = [k for k in error.validator_value if k not in error.instance]
        if missing:
            parts.append(missing[0])
            message = f"required field {missing[0]!r} is missing"
    elif error.validator in ("additionalProperties", "unevaluatedProperties"):
        unexpected = re.findall(r"'([^']+)'", message.split("(", 1)[-1])
        if unexpected:
            parts.append(unexpected[0])
            message = f"unknown key {unexpected[0]!r}"
    return ".".join(parts), message


def _pick_error(errors: list) -> Any:
    # A failing subschema drops its annotations, so a missing or invalid field also produces
    # spurious "unevaluated properties" errors beside the real one: report the real one first,
    # and the deepest (most specific) among those.
    return min(errors, key=lambda e: (e.validator == "unevaluatedProperties", -len(e.absolute_path)))


# Parsed files by (path, text): YAML parsing dominates load time, and a reload after changing
# MOE_HAL_HWDB should not re-parse the files that did not change.
_parsed: dict[tuple[str, str], _Document] = {}


def _parse(text: str, path: str) -> _Document:
    key = (path, text)
    if key not in _parsed:
        _parsed[key] = _parse_uncached(text, path)
    return _parsed[key]


#: Largest hardware-DB file accepted (the built-in ones are a few KiB).
MAX_FILE_BYTES = 1 << 20
#: Deepest nesting of mappings and sequences accepted (the schema needs six levels).
MAX_DEPTH = 32
#: Longest recognition pattern accepted, and most repeats (``*``, ``+``, ``{m,n}``) in one.
MAX_PATTERN_CHARS, MAX_PATTERN_REPEATS = 256, 3


class _BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that cannot be made to work without bound: an alias may name only a
    scalar (the database aliases source texts; an alias to a mapping or sequence is how a small
    file expands exponentially — the "billion laughs" — or refers to itself), and nesting deeper
    than :data:`MAX_DEPTH` is refused before Python's recursion limit is reached."""

    _depth = 0

    def fetch_flow_collection_start(self, TokenClass):
        # The scanner tracks every open flow collection ([ or {) per token: quadratic in their
        # nesting, so it is cut short here, before the composer would see the depth.
        if self.flow_level >= MAX_DEPTH:
            raise yaml.scanner.ScannerError(None, None, f"nesting deeper than {MAX_DEPTH} levels", self.get_mark())
        super().fetch_flow_collection_start(TokenClass)

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            target = self.anchors.get(event.anchor)
            if target is not None and not isinstance(target, yaml.ScalarNode):
                raise yaml.composer.ComposerError(
                    None,
                    None,
                    f"alias *{event.anchor} names a {target.id}; only scalars (such as source texts) may be aliased",
                    event.start_mark,
                )
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise yaml.composer.ComposerError(
                    None, None, f"nesting deeper than {MAX_DEPTH} levels", self.peek_event().start_mark
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _parse_uncached(text: str, path: str) -> _Document:
    if len(text) > MAX_FILE_BYTES:
        raise HardwareDBError(path, "", f"file too large: {len(text)} characters (at most {MAX_FILE_BYTES})")
    try:
        data = yaml.load(text, Loader=_BoundedLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise HardwareDBError(path, "", f"malformed YAML{where}: {problem}") from None
    except Exception as exc:  # noqa: BLE001 - e.g. ValueError for an impossible date: still the file's fault
        raise HardwareDBError(path, "", f"malformed YAML: {type(exc).__name__}: {exc}") from None
    if not isinstance(data, dict):
        raise HardwareDBError(path, "", f"expected a mapping at the top level, got {type(data).__name__}")
    _check_finite(data, [], path)
    data = _dates_to_text(data)
    errors = list(_validator().iter_errors(data))
    if errors:
        field, message = _error_location(_pick_error(errors))
        raise HardwareDBError(path, field, message)
    _check_patterns(data, path)
    return _Document(data, path)


def _check_finite(node: Any, where: list[str], path: str) -> None:
    """NaN and infinities (YAML ``.nan``, ``.inf``) are never meaningful in the database; JSON
    Schema cannot say so (NaN compares false with every bound), so they are refused here."""
    if isinstance(node, float) and not math.isfinite(node):
        raise HardwareDBError(path, ".".join(where), f"expected a finite number, got {node}")
    if isinstance(node, dict):
        for key, value in node.items():
            _check_finite(value, [*where, str(key)], path)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            _check_finite(value, [*where, str(i)], path)


def _check_patterns(data: dict[str, Any], path: str) -> None:
    """Checks the schema cannot express: recognition patterns compile and cannot backtrack
    catastrophically (see :func:`_pattern_problem`), SM-count matching has a count."""
    recognition = data.get("recognition", {})
    for kind, rule in recognition.items():
        if not isinstance(rule, dict):
            continue
        for key, pattern in rule.items():
            if not (key.endswith("pattern") or key.endswith("exclude")) or not isinstance(pattern, str):
                continue
            try:
                problem = _pattern_problem(pattern)
            except (re.error, RecursionError, OverflowError) as exc:
                problem = f"invalid regular expression: {exc}"
            if problem:
                raise HardwareDBError(path, f"recognition.{kind}.{key}", problem)
    if recognition.get("cuda", {}).get("require_sm_count") and data["compute"]["units"]["value"] is None:
        raise HardwareDBError(
            path, "recognition.cuda.require_sm_count", "needs a known compute.units value to compare with"
        )


def _pattern_problem(pattern: str) -> str | None:
    """Why ``pattern`` may not be used for recognition, or None. Matching runs on every call's
    first use of a device, so a pattern must not backtrack catastrophically: no repeat inside a
    repeat, no alternation inside a repeat (``(a+)+``, ``(a|a)*``), no back-references, at most
    :data:`MAX_PATTERN_REPEATS` repeats and :data:`MAX_PATTERN_CHARS` characters. Names are
    matched on their first :data:`~moe_hal.hwdb.matching.MAX_NAME_CHARS` characters, so what
    remains is polynomial in a bounded length."""
    if len(pattern) > MAX_PATTERN_CHARS:
        return f"a regular expression of at most {MAX_PATTERN_CHARS} characters, got {len(pattern)}"
    repeats = 0

    def walk(items, inside_repeat: bool) -> str | None:
        nonlocal repeats
        for op, arg in items:
            if op in (_sre.MAX_REPEAT, _sre.MIN_REPEAT, _sre.POSSESSIVE_REPEAT):
                low, high, sub = arg
                if high > 1:
                    if inside_repeat:
                        return "nested repeats (such as (a+)+) backtrack catastrophically"
                    repeats += 1
                problem = walk(sub, inside_repeat or high > 1)
            elif op is _sre.BRANCH:
                if inside_repeat:
                    return "an alternation inside a repeat (such as (a|b)*) may backtrack catastrophically"
                problem = next((p for p in (walk(b, inside_repeat) for b in arg[1]) if p), None)
            elif op is _sre.SUBPATTERN:
                problem = walk(arg[-1], inside_repeat)
            elif op in (_sre.ASSERT, _sre.ASSERT_NOT):
                problem = walk(arg[1], inside_repeat)
            elif op in (_sre.GROUPREF, _sre.GROUPREF_EXISTS):
                problem = "back-references are not allowed"
            else:
                problem = None
            if problem:
                return problem
        return None

    problem = walk(_sre_parser.parse(pattern), False)
    if problem is None and repeats > MAX_PATTERN_REPEATS:
        problem = f"at most {MAX_PATTERN_REPEATS} repeats, got {repeats}"
    return problem


def _yaml_files_in(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.is_file() and p.suffix in (".yaml", ".yml"))


def _read_builtin() -> list[_Document]:
    root = importlib.resources.files("moe_hal.data.hwdb")
    docs = []
    for folder in (root, root.joinpath("measured")):
        if not folder.is_dir():
            continue
        for item in sorted(folder.iterdir(), key=lambda t: t.name):
            if item.is_file() and item.name.endswith((".yaml", ".yml")):
                docs.append(_parse(item.read_text("utf-8"), str(item)))
    return docs


def _read_overlay(location: Path, origin: str) -> list[_Document]:
    label = f"{location} [{origin}]"
    if location.is_dir():
        files = _yaml_files_in(location)
    elif location.is_file():
        files = [location]
    else:
        raise HardwareDBError(label, "", "no such file or directory")
    docs = []
    for file in files:
        try:
            text = file.read_text("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise HardwareDBError(f"{file} [{origin}]", "", f"cannot read: {exc}") from None
        docs.append(_parse(text, f"{file} [{origin}]"))
    return docs


class _Database:
    """All entries by id, with overlays applied; built once per configuration."""

    def __init__(self, docs: list[_Document]):
        entries: dict[str, _Document] = {}
        names: dict[str, tuple[str, str]] = {}  # id or alias -> (entry id, file)
        for doc in docs:
            if "overlay_of" in doc.data:
                continue
            entry_id = doc.data["id"]
            if entry_id in entries:
                raise HardwareDBError(
                    doc.path, "id", f"duplicate id {entry_id!r}: already defined in {entries[entry_id].path}"
                )
            entries[entry_id] = doc
            for i, name in enumerate([entry_id, *doc.data.get("aliases", ())]):
                if name in names and names[name][0] != entry_id:
                    owner, owner_file = names[name]
                    field = "id" if i == 0 else f"aliases.{i - 1}"
                    raise HardwareDBError(
                        doc.path, field, f"name {name!r} is already used by {owner!r} in {owner_file}"
                    )
                names[name] = (entry_id, doc.path)

        measured: dict[str, dict[str, Any]] = {k: copy.deepcopy(d.data.get("measured", {})) for k, d in entries.items()}
        achieved: dict[str, dict[str, Any]] = {k: copy.deepcopy(d.data.get("achieved", {})) for k, d in entries.items()}
        measured_paths: dict[str, list[str]] = {k: [] for k in entries}
        for doc in docs:
            target = doc.data.get("overlay_of")
            if target is None:
                continue
            if target not in entries:
                raise HardwareDBError(
                    doc.path, "overlay_of", f"no entry with id {target!r}; known ids: {', '.join(sorted(entries))}"
                )
            merged = measured[target]
            for key, value in doc.data.get("measured", {}).items():
                if key == "matmul":
                    merged.setdefault("matmul", {}).update(copy.deepcopy(value))
                else:
                    merged[key] = copy.deepcopy(value)
            # achieved figures merge per implementation and figure (per dtype and family for compute)
            for impl, figures in doc.data.get("achieved", {}).items():
                mine = achieved[target].setdefault(impl, {})
                for key, value in figures.items():
                    if key == "compute":
                        for dtype, families in value.items():
                            mine.setdefault("compute", {}).setdefault(dtype, {}).update(copy.deepcopy(families))
                    else:
                        mine[key] = copy.deepcopy(value)
            measured_paths[target].append(doc.path)

        self.by_id: dict[str, HardwareEntry] = {}
        for entry_id, doc in entries.items():
            raw = copy.deepcopy(doc.data)
            if measured[entry_id]:
                raw["measured"] = measured[entry_id]
            if achieved[entry_id]:
                raw["achieved"] = achieved[entry_id]
            self.by_id[entry_id] = HardwareEntry(raw, doc.path, tuple(measured_paths[entry_id]))
        self.by_name = {name: self.by_id[entry_id] for name, (entry_id, _) in names.items()}


_lock = threading.RLock()
_plugin_overlays: list[tuple[Path, str]] = []
_cache: dict[str, Any] = {"key": None, "db": None}


def _env_overlays() -> list[tuple[Path, str]]:
    value = os.environ.get(ENV_VAR, "")
    return [(Path(p).expanduser(), ENV_VAR) for p in value.split(os.pathsep) if p.strip()]


def _build(overlays: list[tuple[Path, str]]) -> _Database:
    docs = _read_builtin()
    for location, origin in overlays:
        docs.extend(_read_overlay(location, origin))
    return _Database(docs)


def _db() -> _Database:
    # Pure data: the built-in files, the overlays registered so far (the plugin host registers the
    # plugins' ones when it discovers them) and MOE_HAL_HWDB. Nothing here discovers plugins.
    with _lock:
        # Plugins first, then the user's MOE_HAL_HWDB, so the user's measured values win.
        overlays = [*_plugin_overlays, *_env_overlays()]
        key = tuple(overlays)
        if _cache["db"] is None or _cache["key"] != key:
            _cache["db"] = _build(overlays)
            _cache["key"] = key
        return _cache["db"]


def reload(*, forget_overlays: bool = False) -> None:
    """Drop the cached database so the next call re-reads every file (a file whose text did not
    change is not parsed again). With ``forget_overlays``, also forget the overlays registered
    through :func:`add_overlay` (for tests)."""
    with _lock:
        _cache["db"] = None
        _cache["key"] = None
        if forget_overlays:
            _plugin_overlays.clear()


def validate(path: str | os.PathLike) -> None:
    """Check one YAML file (or every ``*.yaml`` of a directory) against the schema and against
    the database it would join: the same checks as loading it through ``MOE_HAL_HWDB``, without
    registering it. Raises :class:`~moe_hal.errors.HardwareDBError` naming the file and field."""
    _build([*_plugin_overlays, *_env_overlays(), (Path(path).expanduser(), "validate")])


def add_overlay(path: str | os.PathLike, origin: str) -> None:
    """Add a YAML file or a directory of them (from a plugin named ``origin``) to the database.

    The built-in files and the plugins' overlays are rebuilt and validated at once, so a malformed
    file or a duplicate id raises :class:`~moe_hal.errors.HardwareDBError` here (naming the file,
    the field and ``origin``) and the overlay is not kept. ``MOE_HAL_HWDB`` is left out of this
    check: a malformed file there is the user's, reported wherever the database is used, not
    blamed on the plugin.
    """
    entry = (Path(path).expanduser(), f"plugin {origin}")
    with _lock:
        _plugin_overlays.append(entry)
        try:
            _build(list(_plugin_overlays))
        except Exception:
            _plugin_overlays.remove(entry)
            raise
        finally:
            _cache["db"] = None


def all() -> list[HardwareEntry]:  # noqa: A001 - public name hwdb.all() mirrors dict-like access
    """Every entry, overlays included, sorted by id. Entries that plugins contribute are included
    once the plugins have been discovered (see :func:`moe_hal.match_device`)."""
    db = _db()
    return [db.by_id[k] for k in sorted(db.by_id)]


def get(id_or_alias: str) -> HardwareEntry:
    """The entry with this id or alias (case-insensitive).

    Raises :class:`~moe_hal.errors.ArgumentError` naming the known ids when there is none.
    """
    db = _db()
    found = db.by_name.get(str(id_or_alias).strip().lower())
    if found is None:
        raise ArgumentError(
            "hw", f"a hardware-DB id or alias, one of: {', '.join(sorted(db.by_id))}", repr(id_or_alias)
        )
    return found
