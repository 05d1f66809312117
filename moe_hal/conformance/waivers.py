"""Expected-failure manifests (waivers) that vendors ship for their backends.

A manifest is YAML validated against ``expected_failures.schema.json``: ``entries`` of
``{id, path?, kind, reason, issue?}`` where ``id`` is a case id or a shell-style pattern and the
reason is mandatory. Sources: the ``moe_hal_conformance_manifest`` hook of every plugin, for the
backend under test, plus files given on the command line. A failing case an entry matches becomes
``xfail``; a passing one ``xpass``. Entries that match no selected case are *stale* and reported.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import yaml

from ..errors import ConformanceError
from .suite import _read_text, default_root

SCHEMA = "expected_failures.schema.json"


@dataclass(frozen=True)
class Waiver:
    pattern: str
    kind: str
    reason: str
    path: str | None = None
    issue: str = ""
    source: str = ""

    def matches(self, case_id: str, path: str) -> bool:
        return (self.path is None or self.path == path) and fnmatch.fnmatchcase(case_id, self.pattern)

    def as_dict(self) -> dict[str, Any]:
        out = {"id": self.pattern, "kind": self.kind, "reason": self.reason, "source": self.source}
        if self.path:
            out["path"] = self.path
        if self.issue:
            out["issue"] = self.issue
        return out


@dataclass
class WaiverSet:
    """The waivers that apply to one backend, and which of them were used."""

    waivers: list[Waiver] = field(default_factory=list)
    sources: list[dict[str, Any]] = field(default_factory=list)
    matched: dict[Waiver, list[str]] = field(default_factory=dict)

    def match(self, case_id: str, path: str) -> Waiver | None:
        """The first waiver matching the case on ``path`` (recorded as matched)."""
        for w in self.waivers:
            if w.matches(case_id, path):
                self.matched.setdefault(w, []).append(f"{case_id} [{path}]")
                return w
        return None

    def stale(self, selected: Iterable[tuple[str, str]]) -> list[Waiver]:
        """Waivers that match none of the selected ``(case id, path)`` pairs."""
        selected = list(selected)
        return [w for w in self.waivers if not any(w.matches(cid, p) for cid, p in selected)]

    def as_dict(self, selected: Iterable[tuple[str, str]]) -> dict[str, Any]:
        return {
            "sources": self.sources,
            "entries": [dict(w.as_dict(), matched=self.matched.get(w, [])) for w in self.waivers],
            "stale": [w.as_dict() for w in self.stale(selected)],
        }


def parse(text: str, source: str, backend: str | None = None) -> tuple[list[Waiver], dict[str, Any]]:
    """Waivers of one manifest (``source`` names it in messages). A manifest whose ``backend``
    names another backend contributes nothing."""
    import jsonschema

    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConformanceError(f"{source}: not valid YAML: {exc}") from None
    schema = json.loads(_read_text(default_root(), SCHEMA))
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(raw), key=lambda e: list(e.path))
    if errors:
        e = errors[0]
        where = "/".join(str(p) for p in e.path) or "<root>"
        hint = (
            " (every expected failure needs a non-empty reason)" if "reason" in e.message or "reason" in where else ""
        )
        raise ConformanceError(f"{source}: {where}: {e.message}{hint}")
    info = {
        "path": source,
        "sha256": hashlib.sha256(text.encode()).hexdigest(),
        "backend": raw.get("backend"),
        "suite_version": raw.get("suite_version"),
    }
    if backend is not None and raw.get("backend") not in (None, backend):
        info["applies"] = False
        return [], info
    info["applies"] = True
    waivers = [
        Waiver(e["id"], e["kind"], e["reason"].strip(), e.get("path"), e.get("issue", ""), source)
        for e in raw.get("entries") or []
    ]
    return waivers, info


def for_backend(backend: str, files: Iterable[str | Path] = (), use_plugins: bool = True) -> WaiverSet:
    """Waivers for ``backend`` from the plugins' hook and from ``files``."""
    out = WaiverSet()
    sources: list[tuple[str, str]] = []
    if use_plugins:
        from .. import plugins

        sources += [(p, plugin) for p, plugin in plugins.host().conformance_manifests(backend)]
    sources += [(str(f), "") for f in files]
    for path, plugin in sources:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConformanceError(
                f"expected-failure manifest {path}{' of plugin ' + plugin if plugin else ''} cannot be read: {exc}"
            ) from None
        waivers, info = parse(text, path, backend)
        info["plugin"] = plugin
        out.waivers.extend(waivers)
        out.sources.append(info)
    return out
