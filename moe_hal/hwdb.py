"""The hardware database: what each accelerator is, how to recognise it, and how fast it is.

One YAML file per accelerator lives in the top-level ``hwdb/`` directory (installed as the data
package ``moe_hal.data.hwdb``) and is validated against ``hwdb/schema.json`` with ``jsonschema``.
Every number in a file is a *quantity*, ``{value, unit, basis, source, note?, date?, method?,
tool?}``; the loader converts units to SI when asked (``Quantity.si``). A second kind of file, an
*overlay* (``overlay_of: <id>``), adds measured values to an existing entry; ``hwdb/measured/`` holds
the ones written by ``bench/calibrate.py``. Extra files and directories come from ``MOE_HAL_HWDB``
(``os.pathsep``-separated) and from plugins through :func:`add_overlay`. See ``docs/hwdb.md``.

Nothing is read at import time; the database is built on first use and cached until
:func:`reload`, a change of ``MOE_HAL_HWDB`` or a new overlay. torch, torch_npu and cuda-python are
imported only inside :func:`match`, for the device type being matched.
"""

from __future__ import annotations

import copy
import datetime
import importlib.resources
import json
import os
import platform
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import yaml

from .errors import ArgumentError, HardwareDBError

__all__ = [
    "DTYPES",
    "HardwareEntry",
    "Match",
    "Quantity",
    "add_overlay",
    "all",
    "get",
    "match",
    "match_cpu",
    "match_cuda",
    "match_npu",
    "reload",
    "validate",
]

#: Environment variable naming extra YAML files or directories, separated by ``os.pathsep``.
ENV_VAR = "MOE_HAL_HWDB"

#: Dtype names understood by :meth:`HardwareEntry.peak_flops`, in the order tables show them.
DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8", "fp4", "int8")

# Spellings accepted for those names (moe_hal.dtypes names and torch names among them).
_DTYPE_ALIASES = {
    "float32": "fp32", "float": "fp32",
    "bfloat16": "bf16",
    "float16": "fp16", "half": "fp16",
    "fp8_e4m3": "fp8", "fp8_e5m2": "fp8", "float8_e4m3fn": "fp8", "float8_e5m2": "fp8", "e4m3": "fp8",
    "fp4_e2m1": "fp4", "float4_e2m1fn_x2": "fp4",
}

# Factor from each unit the schema allows to its SI base (FLOP/s, OP/s, B/s, B, Hz, W, count).
_UNIT_SCALE = {
    "count": 1.0,
    "GFLOPS": 1e9, "TFLOPS": 1e12, "PFLOPS": 1e15,
    "GOPS": 1e9, "TOPS": 1e12, "POPS": 1e15,
    "GB/s": 1e9, "TB/s": 1e12,
    "B": 1.0, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12,
    "KiB": 2.0**10, "MiB": 2.0**20, "GiB": 2.0**30, "TiB": 2.0**40,
    "MHz": 1e6, "GHz": 1e9,
    "W": 1.0,
}

_QUANTITY_KEYS = frozenset({"value", "unit"})


@dataclass(frozen=True)
class Quantity:
    """One number of an entry, with its unit and where it comes from.

    ``basis`` is one of ``datasheet``, ``whitepaper``, ``secondary``, ``derived``, ``measured``;
    ``date``, ``method`` and ``tool`` are set for measured values.
    """

    value: float
    unit: str
    basis: str
    source: str
    note: str | None = None
    date: str | None = None
    method: str | None = None
    tool: str | None = None

    @property
    def si(self) -> float:
        """The value in SI base units: FLOP/s, OP/s, bytes/s, bytes, Hz, W or a plain count."""
        return self.value * _UNIT_SCALE[self.unit]

    @classmethod
    def from_mapping(cls, node: dict[str, Any]) -> Quantity:
        return cls(
            value=node["value"],
            unit=node["unit"],
            basis=node["basis"],
            source=node["source"],
            note=node.get("note"),
            date=node.get("date"),
            method=node.get("method"),
            tool=node.get("tool"),
        )


def _is_quantity(node: Any) -> bool:
    return isinstance(node, dict) and _QUANTITY_KEYS <= node.keys()


class HardwareEntry:
    """One validated accelerator entry, with the measured values of any overlays merged in.

    ``raw`` is the validated YAML mapping (``measured`` includes overlay values); ``path`` is the
    file the entry came from and ``measured_paths`` the overlay files that added measured values.
    """

    def __init__(self, raw: dict[str, Any], path: str, measured_paths: tuple[str, ...] = ()):
        self.raw = raw
        self.path = path
        self.measured_paths = measured_paths
        self.id: str = raw["id"]
        self.vendor: str = raw["vendor"]
        self.name: str = raw["name"]
        self.architecture: str = raw["architecture"]
        self.aliases: tuple[str, ...] = tuple(raw.get("aliases", ()))
        self.features: frozenset[str] = frozenset(raw["features"])

    def __repr__(self) -> str:
        return f"HardwareEntry({self.id!r}, {self.path!r})"

    def quantity(self, path: str) -> Quantity | None:
        """The quantity at a dotted ``path`` such as ``"memory.bandwidth"`` or
        ``"measured.matmul.bf16"``; None when the entry does not give it or gives it as unknown
        (``value: null``). A path that leads to something other than a quantity is an error."""
        node: Any = self.raw
        for part in path.split("."):
            if not isinstance(node, dict) or _is_quantity(node):
                raise ArgumentError("path", "a dotted path to a quantity of the entry", path)
            node = node.get(part)
            if node is None:
                return None
        if not _is_quantity(node):
            raise ArgumentError("path", "a dotted path to a quantity of the entry", path,
                                f"{path!r} holds {type(node).__name__}")
        return None if node["value"] is None else Quantity.from_mapping(node)

    def quantities(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """Every quantity mapping in the entry as ``(dotted path, mapping)``, unknown ones included."""

        def walk(node: Any, prefix: str) -> Iterator[tuple[str, dict[str, Any]]]:
            if _is_quantity(node):
                yield prefix, node
            elif isinstance(node, dict):
                for key, child in node.items():
                    yield from walk(child, f"{prefix}.{key}" if prefix else key)

        return walk(self.raw, "")

    def _first(self, *paths: str) -> Quantity | None:
        for path in paths:
            found = self.quantity(path)
            if found is not None:
                return found
        return None

    def peak_flops(self, dtype: str, *, measured: bool = True) -> float | None:
        """Dense peak rate in FLOP/s (OP/s for int8) for ``dtype`` (one of :data:`DTYPES`, or a
        moe_hal/torch dtype name such as ``"fp8_e4m3"`` or ``torch.bfloat16``). With ``measured``,
        a measured matmul rate is preferred over the spec figure. None when unknown."""
        name = _canonical_dtype(dtype)
        paths = ([f"measured.matmul.{name}"] if measured else []) + [f"peak_dense.{name}"]
        found = self._first(*paths)
        return None if found is None else found.si

    def mem_bandwidth(self, *, measured: bool = True) -> float | None:
        """Memory bandwidth in bytes/s: the measured read bandwidth first (with ``measured``),
        else the spec figure. None when unknown."""
        paths = (["measured.read_bandwidth"] if measured else []) + ["memory.bandwidth"]
        found = self._first(*paths)
        return None if found is None else found.si

    @property
    def num_cores(self) -> int | None:
        """SMs (NVIDIA), AI (cube) cores (Ascend) or CPU cores; a measured count first.
        None for ``cpu-generic``, whose core count depends on the machine."""
        found = self._first("measured.units", "compute.units")
        return None if found is None else int(found.value)

    @property
    def mma_min_m(self) -> int | None:
        """Smallest M one matrix instruction handles efficiently (Hopper wgmma 64, Ascend cube 16)."""
        found = self.quantity("compute.mma_min_m")
        return None if found is None else int(found.value)

    @property
    def l2_bytes(self) -> int | None:
        """L2 cache size in bytes (a measured size first)."""
        found = self._first("measured.l2", "on_chip.l2")
        return None if found is None else int(found.si)

    @property
    def smem_per_core_bytes(self) -> int | None:
        """Shared memory per SM in bytes (None where the device has no such memory, e.g. Ascend,
        whose per-core buffers are ``on_chip.l1_per_unit``/``ub_per_unit``/...)."""
        found = self.quantity("on_chip.smem_per_unit")
        return None if found is None else int(found.si)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready view: the entry mapping plus where it came from and the figures the
        library derives from it."""
        return {
            "id": self.id,
            "path": self.path,
            "measured_paths": list(self.measured_paths),
            "derived": {
                "num_cores": self.num_cores,
                "mma_min_m": self.mma_min_m,
                "l2_bytes": self.l2_bytes,
                "smem_per_core_bytes": self.smem_per_core_bytes,
                "mem_bandwidth_bytes_per_s": self.mem_bandwidth(),
                "peak_flops": {d: self.peak_flops(d) for d in DTYPES},
            },
            "entry": self.raw,
        }


@dataclass(frozen=True)
class Match:
    """Result of recognising a device: the entry, or None with the reason nothing matched."""

    entry: HardwareEntry | None
    seen: str
    reason: str | None = None

    @property
    def id(self) -> str | None:
        return None if self.entry is None else self.entry.id

    @property
    def features(self) -> frozenset[str]:
        return frozenset() if self.entry is None else self.entry.features

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "seen": self.seen, "reason": self.reason}


def _canonical_dtype(dtype: Any) -> str:
    key = str(dtype).strip().lower().removeprefix("torch.")
    key = _DTYPE_ALIASES.get(key, key)
    if key not in DTYPES:
        raise ArgumentError("dtype", f"one of {list(DTYPES)} (or a torch/moe_hal spelling)", dtype)
    return key


# --------------------------------------------------------------------------------------------
# Loading and validation


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


def _parse_uncached(text: str, path: str) -> _Document:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise HardwareDBError(path, "", f"malformed YAML{where}: {problem}") from None
    if not isinstance(data, dict):
        raise HardwareDBError(path, "", f"expected a mapping at the top level, got {type(data).__name__}")
    data = _dates_to_text(data)
    errors = list(_validator().iter_errors(data))
    if errors:
        field, message = _error_location(_pick_error(errors))
        raise HardwareDBError(path, field, message)
    _check_patterns(data, path)
    return _Document(data, path)


def _check_patterns(data: dict[str, Any], path: str) -> None:
    """Checks the schema cannot express: regexes compile, SM-count matching has a count."""
    recognition = data.get("recognition", {})
    for kind, key in (("cuda", "name_pattern"), ("cuda", "name_exclude"),
                      ("npu", "soc_name_pattern"), ("cpu", "model_pattern")):
        pattern = recognition.get(kind, {}).get(key)
        if pattern is not None:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise HardwareDBError(path, f"recognition.{kind}.{key}", f"invalid regular expression: {exc}") from None
    if recognition.get("cuda", {}).get("require_sm_count") and data["compute"]["units"]["value"] is None:
        raise HardwareDBError(path, "recognition.cuda.require_sm_count",
                              "needs a known compute.units value to compare with")


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
                raise HardwareDBError(doc.path, "id", f"duplicate id {entry_id!r}: already defined in {entries[entry_id].path}")
            entries[entry_id] = doc
            for i, name in enumerate([entry_id, *doc.data.get("aliases", ())]):
                if name in names and names[name][0] != entry_id:
                    owner, owner_file = names[name]
                    field = "id" if i == 0 else f"aliases.{i - 1}"
                    raise HardwareDBError(doc.path, field, f"name {name!r} is already used by {owner!r} in {owner_file}")
                names[name] = (entry_id, doc.path)

        measured: dict[str, dict[str, Any]] = {k: copy.deepcopy(d.data.get("measured", {})) for k, d in entries.items()}
        measured_paths: dict[str, list[str]] = {k: [] for k in entries}
        for doc in docs:
            target = doc.data.get("overlay_of")
            if target is None:
                continue
            if target not in entries:
                raise HardwareDBError(doc.path, "overlay_of", f"no entry with id {target!r}; known ids: {', '.join(sorted(entries))}")
            merged = measured[target]
            for key, value in doc.data["measured"].items():
                if key == "matmul":
                    merged.setdefault("matmul", {}).update(copy.deepcopy(value))
                else:
                    merged[key] = copy.deepcopy(value)
            measured_paths[target].append(doc.path)

        self.by_id: dict[str, HardwareEntry] = {}
        for entry_id, doc in entries.items():
            raw = copy.deepcopy(doc.data)
            if measured[entry_id]:
                raw["measured"] = measured[entry_id]
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
    # Plugins may contribute entries (moe_hal_hardware_db); discovery is re-entrant, so the
    # overlays a plugin registers during discovery see the database built so far.
    from . import plugins

    plugins.host().ensure_loaded()
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

    The whole database is rebuilt and validated at once, so a malformed file or a duplicate id
    raises :class:`~moe_hal.errors.HardwareDBError` here (naming the file, the field and
    ``origin``) and the overlay is not kept.
    """
    entry = (Path(path).expanduser(), f"plugin {origin}")
    with _lock:
        _plugin_overlays.append(entry)
        try:
            _db()
        except Exception:
            _plugin_overlays.remove(entry)
            _cache["db"] = None
            raise


def all() -> list[HardwareEntry]:  # noqa: A001 - the contract names it hwdb.all()
    """Every entry, overlays included, sorted by id."""
    db = _db()
    return [db.by_id[k] for k in sorted(db.by_id)]


def get(id_or_alias: str) -> HardwareEntry:
    """The entry with this id or alias (case-insensitive).

    Raises :class:`~moe_hal.errors.ArgumentError` naming the known ids when there is none.
    """
    db = _db()
    found = db.by_name.get(str(id_or_alias).strip().lower())
    if found is None:
        raise ArgumentError("hw", f"a hardware-DB id or alias, one of: {', '.join(sorted(db.by_id))}", repr(id_or_alias))
    return found


# --------------------------------------------------------------------------------------------
# Matching


def _decide(candidates: list[HardwareEntry], seen: str, rejected: list[str], kind: str) -> Match:
    if len(candidates) == 1:
        return Match(candidates[0], seen, None)
    if len(candidates) > 1:
        ids = ", ".join(e.id for e in candidates)
        files = "; ".join(f"{e.id}: {e.path}" for e in candidates)
        return Match(None, seen, f"ambiguous: {len(candidates)} entries match ({ids}); "
                                 f"make their recognition patterns exclusive ({files})")
    reason = f"no hardware-DB entry recognises this {kind} device"
    if rejected:
        reason += ": " + "; ".join(rejected)
    else:
        reason += f"; add one with {ENV_VAR} (see docs/hwdb.md)"
    return Match(None, seen, reason)


def match_cuda(name: str, major: int, minor: int, sm_count: int | None = None) -> Match:
    """Recognise a CUDA device from its properties (as ``torch.cuda.get_device_properties``
    reports them). Pure: no device is touched, so faked values can be passed."""
    seen = f"{name} (cc {major}.{minor}" + (f", {sm_count} SMs)" if sm_count is not None else ")")
    cc = f"{major}.{minor}"
    candidates, rejected = [], []
    for entry in all():
        rule = entry.raw["recognition"].get("cuda")
        if rule is None or not re.search(rule["name_pattern"], name, re.IGNORECASE):
            continue
        if "name_exclude" in rule and re.search(rule["name_exclude"], name, re.IGNORECASE):
            continue
        if rule["compute_capability"] != cc:
            rejected.append(f"{entry.id} matches the name but has compute capability {rule['compute_capability']}, not {cc}")
            continue
        units = entry.quantity("compute.units")
        if rule.get("require_sm_count") and sm_count is not None and units is not None and sm_count != units.value:
            rejected.append(f"{entry.id} matches the name but has {int(units.value)} SMs, not {sm_count} "
                            "(a MIG slice or a different board?)")
            continue
        candidates.append(entry)
    return _decide(candidates, seen, rejected, "CUDA")


def match_npu(soc_name: str, soc_version: int | None = None) -> Match:
    """Recognise an Ascend NPU from its SoC name (``torch.npu.get_device_name``) and, when given,
    ``torch_npu.npu.get_soc_version()``. Pure: faked values can be passed."""
    seen = soc_name + (f" (soc_version {soc_version})" if soc_version is not None else "")
    candidates, rejected = [], []
    for entry in all():
        rule = entry.raw["recognition"].get("npu")
        if rule is None or not re.fullmatch(rule["soc_name_pattern"], soc_name.strip()):
            continue
        versions = rule.get("soc_versions")
        if soc_version is not None and versions and soc_version not in versions:
            rejected.append(f"{entry.id} matches the SoC name but expects soc_version in {versions}, not {soc_version}")
            continue
        candidates.append(entry)
    return _decide(candidates, seen, rejected, "NPU")


def match_cpu(model: str | None = None, logical_cpus: int | None = None) -> Match:
    """Recognise the CPU: an entry whose ``model_pattern`` finds ``model``, else the generic
    CPU entry. Without arguments, describes this machine's CPU."""
    if model is None:
        model = _cpu_model()
    if logical_cpus is None:
        logical_cpus = os.cpu_count()
    seen = model + (f" ({logical_cpus} logical CPUs)" if logical_cpus else "")
    specific, generic = [], []
    for entry in all():
        rule = entry.raw["recognition"].get("cpu")
        if rule is None:
            continue
        pattern = rule.get("model_pattern")
        if pattern is None:
            generic.append(entry)
        elif re.search(pattern, model, re.IGNORECASE):
            specific.append(entry)
    return _decide(specific or generic, seen, [], "CPU")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "cpu model") and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def _cuda_properties(index: int | None) -> tuple[str, int, int, int | None]:
    """(name, major, minor, SM count) of a CUDA device: from torch, else from cuda-python (a torch
    build without CUDA on a machine with a driver). Raises when neither can answer."""
    try:
        import torch

        if index is None:
            index = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        return props.name, props.major, props.minor, props.multi_processor_count
    except Exception as torch_error:  # no CUDA build, no driver, bad index: try the driver API
        try:
            from cuda.bindings import driver

            def check(result):
                err, *values = result
                if err != driver.CUresult.CUDA_SUCCESS:
                    raise RuntimeError(f"CUDA driver error {err}")
                return values[0] if len(values) == 1 else values

            check(driver.cuInit(0))
            device = check(driver.cuDeviceGet(index or 0))
            raw_name = check(driver.cuDeviceGetName(64, device))
            attr = driver.CUdevice_attribute
            major = check(driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device))
            minor = check(driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device))
            sms = check(driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device))
            name = raw_name.split(b"\0", 1)[0].decode()
            return name, int(major), int(minor), int(sms)
        except Exception:
            raise torch_error from None


def _npu_properties(index: int | None) -> tuple[str, int | None]:
    import torch
    import torch_npu  # noqa: F401 - registers torch.npu

    if index is None:
        index = torch.npu.current_device()
    name = torch.npu.get_device_name(index)
    try:
        version = int(torch_npu.npu.get_soc_version())
    except Exception:  # older torch_npu without get_soc_version: the name alone decides
        version = None
    return name, version


def _device_parts(device: Any) -> tuple[str, int | None]:
    if isinstance(device, str):
        kind, _, index = device.strip().partition(":")
        return kind.lower(), int(index) if index.strip().isdigit() else None
    kind = getattr(device, "type", None)
    if kind is None:
        raise ArgumentError("device", "a torch.device or a device string such as 'cuda:0'", repr(device))
    return kind, getattr(device, "index", None)


def match(device: Any) -> Match:
    """Recognise ``device`` (a ``torch.device`` or a string like ``"cuda:0"``, ``"npu"``,
    ``"cpu"``). Never raises for a device it does not know: the result then has ``entry=None``,
    ``seen`` says what was observed and ``reason`` why nothing matched. A malformed database
    file still raises :class:`~moe_hal.errors.HardwareDBError`."""
    kind, index = _device_parts(device)
    if kind == "cpu":
        return match_cpu()
    if kind == "cuda":
        try:
            name, major, minor, sms = _cuda_properties(index)
        except Exception as exc:
            return Match(None, f"cuda:{0 if index is None else index}", f"could not read the device properties: {exc}")
        return match_cuda(name, major, minor, sms)
    if kind == "npu":
        try:
            name, version = _npu_properties(index)
        except Exception as exc:
            return Match(None, f"npu:{0 if index is None else index}", f"could not read the device properties: {exc}")
        return match_npu(name, version)
    return Match(None, str(device), f"the hardware DB has no entries for device type {kind!r}")

