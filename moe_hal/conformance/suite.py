"""The case manifest: loading, validation and access to the stored golden data.

The manifest (``conformance/manifest.yaml`` in the repository, ``moe_hal.data.conformance`` once
installed) lists every stored case with a stable versioned id, its tier, tags, operation,
signature, problem, generator, tolerance class, checks and data file with its sha256. It is
validated against ``manifest.schema.json`` (JSON Schema) and then semantically (ids unique, checks
known for the operation, tolerance class matching the signature). ``data_version`` is the sha256 of
the manifest text: it changes whenever a case, a hash or a tolerance class changes.

This module imports neither torch nor safetensors until data is read.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import yaml

from ..backend import OPS
from ..errors import ConformanceError

DATA_PACKAGE = "moe_hal.data.conformance"
MANIFEST = "manifest.yaml"
MANIFEST_SCHEMA = "manifest.schema.json"

#: The grouped-GEMM operations (the API's, defined once in moe_hal.backend).
GEMM_OPS = OPS
#: Library transforms checked byte for byte; they run on the backend's device.
LIBRARY_OPS = (
    "quantize_fp8",
    "tma_align_mn_major",
    "pack_ue8m0",
    "pack_ue8m0x2",
    "layout_indices",
    "routing_dispatch",
    "routing_dispatch_masked",
)
#: Backend-provided transforms (optional ``Backend.physical_scales``).
BACKEND_TRANSFORM_OPS = ("physical_scales",)
OPS = GEMM_OPS + LIBRARY_OPS + BACKEND_TRANSFORM_OPS

#: Checks each kind of operation may list.
GEMM_CHECKS = (
    "shape",
    "values",
    "padding_zero",
    "sentinel",
    "masked_zero",
    "inputs_unchanged",
    "determinism",
    "in_place_c",
)
TRANSFORM_CHECKS = ("bytes", "strides")
TIERS = ("smoke", "full", "sweep", "fuzz")
#: Statuses of a case result, in report order.
STATUSES = ("pass", "fail", "error", "not_applicable", "xfail", "xpass", "skipped")
STORED_TIERS = ("smoke", "full")

_ID = re.compile(r"^[a-z0-9_]+(/[a-z0-9_.+-]+)+@[0-9]+$")


@dataclass(frozen=True)
class Case:
    """One conformance case. ``tier`` is ``smoke`` or ``full`` for stored cases (smoke cases are
    part of the full tier), ``sweep``/``fuzz`` for generated ones (``file`` is then None)."""

    id: str
    op: str
    tier: str
    since: str
    tags: tuple[str, ...]
    signature: dict[str, Any]
    problem: dict[str, Any]
    generator: dict[str, Any]
    tolerance: str | None
    checks: tuple[str, ...]
    file: str | None = None
    sha256: str | None = None
    note: str = ""

    @property
    def is_gemm(self) -> bool:
        return self.op in GEMM_OPS

    @property
    def paths(self) -> tuple[str, ...]:
        """How the case runs: GEMMs directly on the backend and through the dispatcher; library
        transforms through the public function; backend transforms on the backend."""
        if self.is_gemm:
            return ("direct", "dispatcher")
        if self.op in BACKEND_TRANSFORM_OPS:
            return ("direct",)
        return ("library",)

    def in_tier(self, tier: str) -> bool:
        if tier == "full":
            return self.tier in STORED_TIERS
        return self.tier == tier

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "op": self.op,
            "tier": self.tier,
            "since": self.since,
            "tags": list(self.tags),
            "signature": self.signature,
            "problem": self.problem,
            "tolerance": self.tolerance,
            "checks": list(self.checks),
        }


@dataclass
class Suite:
    """A loaded manifest. ``root`` is the directory (or resource) holding ``manifest.yaml``."""

    root: Any
    text: str
    raw: dict[str, Any]
    cases: list[Case]
    _verified: dict[str, bytes] = field(default_factory=dict, repr=False)

    @property
    def version(self) -> str:
        return str(self.raw["suite_version"])

    @property
    def data_version(self) -> str:
        """sha256 of the manifest text (it holds every data file's sha256)."""
        return "sha256:" + hashlib.sha256(self.text.encode()).hexdigest()

    @property
    def generator_version(self) -> int:
        return int(self.raw["generator_version"])

    @property
    def sentinel(self) -> dict[str, int]:
        """Bit pattern pre-filled into ``out``, per output dtype name (NaN payloads)."""
        return {k: int(v) for k, v in self.raw["sentinel"].items()}

    @property
    def tolerance_classes(self) -> dict[str, dict[str, Any]]:
        return self.raw["tolerance_classes"]

    @property
    def sweep(self) -> dict[str, Any]:
        return self.raw["sweep"]

    def case(self, case_id: str) -> Case:
        for c in self.cases:
            if c.id == case_id:
                return c
        raise ConformanceError(f"no conformance case {case_id!r} in suite {self.version}")

    def select(self, tiers: Iterable[str]) -> list[Case]:
        """Stored cases of the given tiers (``full`` includes ``smoke``), in manifest order."""
        tiers = list(tiers)
        return [c for c in self.cases if any(c.in_tier(t) for t in tiers)]

    def mustpass(self) -> list[str]:
        """Ids of the full tier: the list a conformant run must cover."""
        return [c.id for c in self.cases]

    # -- data ---------------------------------------------------------------------------------
    def data_bytes(self, case: Case) -> bytes:
        """The bytes of the case's data file, verified against the manifest's sha256."""
        if case.file is None:
            raise ConformanceError(f"case {case.id} has no stored data")
        hit = self._verified.get(case.file)
        if hit is not None:
            return hit
        try:
            blob = (self.root / case.file).read_bytes()
        except (FileNotFoundError, OSError) as exc:
            raise ConformanceError(
                f"case {case.id}: data file {case.file} is missing ({exc}); "
                "run `moe-hal conformance regen` in a checkout"
            ) from None
        digest = hashlib.sha256(blob).hexdigest()
        if digest != case.sha256:
            raise ConformanceError(
                f"case {case.id}: {case.file} has sha256 {digest}, the manifest says "
                f"{case.sha256}; the stored data does not match the suite"
            )
        self._verified[case.file] = blob
        return blob

    def tensors(self, case: Case) -> dict[str, Any]:
        """The stored tensors of a case (CPU torch tensors), checked against the manifest's hash.
        Generated (sweep, fuzz) cases have none: :func:`moe_hal.conformance.build.tensors` builds
        theirs."""
        if case.file is None:
            raise ConformanceError(
                f"case {case.id} is generated and has no stored tensors (moe_hal.conformance.build.tensors builds them)"
            )
        from safetensors.torch import load

        return load(self.data_bytes(case))


def _read_text(root: Any, name: str) -> str:
    try:
        return (root / name).read_text(encoding="utf-8")
    except (FileNotFoundError, OSError) as exc:
        raise ConformanceError(f"cannot read {name} of the conformance suite at {root}: {exc}") from None


def default_root() -> Any:
    """The installed suite: the ``moe_hal.data.conformance`` package resources."""
    return importlib.resources.files(DATA_PACKAGE)


def load(path: str | Path | None = None) -> Suite:
    """Load and validate the manifest at ``path`` (a ``manifest.yaml`` file or its directory);
    default: the installed suite. Raises :class:`~moe_hal.errors.ConformanceError`."""
    if path is None:
        root = default_root()
    else:
        p = Path(path)
        root = p.parent if p.is_file() else p
    text = _read_text(root, MANIFEST)
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConformanceError(f"{MANIFEST}: not valid YAML: {exc}") from None
    validate_manifest(raw)
    cases = [_case(entry, raw) for entry in raw["cases"]]
    return Suite(root, text, raw, cases)


def validate_manifest(raw: Any) -> None:
    """JSON-Schema validation plus the rules a schema cannot express."""
    import jsonschema

    schema = json.loads(_read_text(default_root(), MANIFEST_SCHEMA))
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(raw), key=lambda e: list(e.path))
    if errors:
        e = errors[0]
        where = "/".join(str(p) for p in e.path) or "<root>"
        raise ConformanceError(f"{MANIFEST}: {where}: {e.message}")
    seen: set[str] = set()
    classes = raw["tolerance_classes"]
    for i, entry in enumerate(raw["cases"]):
        cid = entry["id"]
        where = f"{MANIFEST}: cases[{i}] ({cid})"
        if not _ID.match(cid):
            raise ConformanceError(f"{where}: id must look like 'op/variant/name@version'")
        if cid in seen:
            raise ConformanceError(f"{where}: duplicate id")
        seen.add(cid)
        allowed = GEMM_CHECKS if entry["op"] in GEMM_OPS else TRANSFORM_CHECKS
        bad = sorted(set(entry["checks"]) - set(allowed))
        if bad:
            raise ConformanceError(
                f"{where}: checks {bad} do not apply to op {entry['op']!r} (allowed: {list(allowed)})"
            )
        if entry["op"] in GEMM_OPS:
            tol = entry.get("tolerance")
            if tol not in classes:
                raise ConformanceError(f"{where}: tolerance class {tol!r} is not defined (known: {sorted(classes)})")
            expected = tolerance_class_for(entry["signature"])
            if tol != expected:
                raise ConformanceError(
                    f"{where}: tolerance class {tol!r} does not match the signature (expected {expected!r})"
                )
            _check_problem(entry, where)


def tolerance_class_for(signature: dict[str, Any]) -> str:
    """Name of the tolerance class for a GEMM signature: ``<input>_<output>`` (``fp8`` for any
    fp8 scale format)."""
    dtype = "fp8" if signature["dtype"] == "fp8_e4m3" else signature["dtype"]
    return f"{dtype}_{signature['out_dtype']}"


def _check_problem(entry: dict[str, Any], where: str) -> None:
    p, op = entry["problem"], entry["op"]
    if op == "masked":
        if len(p["masked_m"]) != p["groups"]:
            raise ConformanceError(
                f"{where}: problem.masked_m has {len(p['masked_m'])} entries for {p['groups']} groups"
            )
        if any(m < 0 or m > p["max_m"] for m in p["masked_m"]):
            raise ConformanceError(f"{where}: problem.masked_m must lie in [0, max_m]")
    elif len(p["counts"]) != p["groups"]:
        raise ConformanceError(f"{where}: problem.counts has {len(p['counts'])} entries for {p['groups']} groups")


def _case(entry: dict[str, Any], raw: dict[str, Any]) -> Case:
    data = entry.get("data") or {}
    return Case(
        id=entry["id"],
        op=entry["op"],
        tier=entry["tier"],
        since=str(entry["since"]),
        tags=tuple(entry.get("tags", ())),
        signature=dict(entry.get("signature", {})),
        problem=dict(entry["problem"]),
        generator=dict(entry.get("generator", {})),
        tolerance=entry.get("tolerance"),
        checks=tuple(entry["checks"]),
        file=data.get("file"),
        sha256=data.get("sha256"),
        note=entry.get("note", ""),
    )
