"""Conformance reports: JSON (with a schema and a verifier), JUnit XML and a text summary.

A report holds what is needed to trust and compare it: the suite and data versions, moe_hal and
plugin versions, the environment (python, torch, the libraries the plugins declare, every
``MOE_HAL_*`` variable), and one *run* per backend: the backend (plugin, distribution, version, execution mode —
interpreted and emulated runs say so), the device and its hardware-DB entry, the dispatcher's
explanations, the waivers used, and per case and path its status, reasons, checks and metrics.

Verdicts of a run: ``conformant`` (every must-pass result is pass or not_applicable),
``conformant with waivers`` (some results are expected failures with reasons), ``non-conformant``
(a fail, error or skipped result; with ``strict`` also an unexpected pass or a stale waiver), and
``unavailable`` (the backend cannot run on this machine: nothing was tested). Fuzz results are
reported but never enter the verdict.
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import json
import os
import platform
import sys
from collections import Counter
from typing import Any, Iterable
from xml.etree import ElementTree as ET

from .suite import STATUSES

SCHEMA_VERSION = 1
KIND = "moe_hal.conformance.report"
REPORT_SCHEMA = "report.schema.json"
CONFORMANT, WITH_WAIVERS, NONCONFORMANT, UNAVAILABLE = (
    "conformant",
    "conformant with waivers",
    "non-conformant",
    "unavailable",
)
#: The verdicts of runs that could run, best first (``overall_verdict`` takes the worst).
VERDICTS = (CONFORMANT, WITH_WAIVERS, NONCONFORMANT)


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _packages() -> list[str]:
    """The libraries whose versions a report records: the core's and those plugins declare
    (``moe_hal_environment``); the plugins' own distributions are in the plugin records."""
    from .. import sysinfo

    _, declared = sysinfo.plugin_declarations()
    return ["numpy", "safetensors", "pluggy", "hypothesis", *sorted(declared)]


def environment() -> dict[str, Any]:
    """Python, platform, library versions (read from metadata, nothing imported) and ``MOE_HAL_*``."""
    import torch

    return {
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "torch_threads": torch.get_num_threads(),
        "packages": {d: _version(d) for d in _packages()},
        "moe_hal_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("MOE_HAL_")},
    }


def plugins_record() -> list[dict[str, Any]]:
    from .. import plugins

    host = plugins.host().ensure_loaded()
    return [host.plugins[n].as_dict() for n in sorted(host.plugins)]


def backend_record(target: Any) -> dict[str, Any]:
    spec = target.spec
    out: dict[str, Any] = {"name": target.name, "mode": target.mode or None, "registered": target.registered}
    if target.backend is not None:
        out["class"] = f"{type(target.backend).__module__}.{type(target.backend).__qualname__}"
    if spec is not None:
        out.update(
            {
                "vendor": spec.vendor,
                "tier": spec.tier,
                "priority": spec.priority,
                "impl": spec.impl,
                "plugin": spec.plugin,
                "distribution": spec.distribution,
                "version": spec.version,
                "api_version": spec.api_version,
                "deterministic": spec.deterministic,
                "graph_capturable": spec.graph_capture_report(),
            }
        )
    return out


def device_record(target: Any) -> dict[str, Any]:
    info = target.device_info
    out: dict[str, Any] = {
        "device": str(target.device),
        "type": info.type,
        "index": info.index,
        "label": info.label,
        "hw_id": info.hw_id,
        "features": sorted(info.features),
        "seen": info.seen,
        "hwdb": None,
    }
    if info.hw_id:
        try:
            from .. import hwdb

            entry = hwdb.get(info.hw_id)
            out["hwdb"] = {
                "id": entry.id,
                "name": entry.name,
                "vendor": entry.vendor,
                "architecture": entry.architecture,
                "path": os.path.basename(entry.path),
            }
        except Exception as exc:  # noqa: BLE001 - the report must still be written
            out["hwdb"] = {"id": info.hw_id, "error": f"{type(exc).__name__}: {exc}"}
    return out


def verdict(results: Iterable[dict[str, Any]], available: bool, strict: bool, stale: int) -> str:
    """The verdict of one run from its case results (dicts as in the report)."""
    if not available:
        return UNAVAILABLE
    counted = [r for r in results if r["tier"] != "fuzz"]
    statuses = Counter(r["status"] for r in counted)
    if statuses["fail"] or statuses["error"] or statuses["skipped"]:
        return NONCONFORMANT
    if strict and (statuses["xpass"] or stale):
        return NONCONFORMANT
    if statuses["xfail"] or statuses["xpass"]:
        return WITH_WAIVERS
    return CONFORMANT


def run_record(runner: Any, results: list[Any], tiers: list[str], duration_s: float) -> dict[str, Any]:
    """One backend's part of the report."""
    target = runner.target
    cases = [r.as_dict() for r in results]
    selected = [(r.id, r.path) for r in results]
    stale = runner.waivers.stale(selected)
    counts = Counter(r["status"] for r in cases)
    record = {
        "backend": backend_record(target),
        "device": device_record(target),
        "available": target.available,
        "unavailable_reasons": [r.as_dict() for r in target.reasons],
        "dispatcher_path": target.registered,
        "strict": runner.strict,
        "tiers": list(tiers),
        "selection": runner.selections,
        "waivers": runner.waivers.as_dict(selected),
        "cases": cases,
        "summary": {
            "counts": {s: counts.get(s, 0) for s in STATUSES},
            "total": len(cases),
            "duration_s": round(duration_s, 3),
            "verdict": verdict(cases, target.available, runner.strict, len(stale)),
        },
    }
    if not target.registered and target.available:
        record["dispatcher_note"] = (
            "the backend instance is not the one registered under its name, so the "
            "dispatcher path cannot force it and was not run"
        )
    return record


def overall_verdict(runs: list[dict[str, Any]]) -> str:
    """The worst verdict over the runs that could run; ``unavailable`` when none could."""
    ran = [r["summary"]["verdict"] for r in runs if r["summary"]["verdict"] != UNAVAILABLE]
    return max(ran, key=VERDICTS.index) if ran else UNAVAILABLE


def build(
    suite: Any, runs: list[dict[str, Any]], tiers: list[str], sweep: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The full report for ``runs`` (from :func:`run_record`)."""
    from .. import __version__, plugins

    return {
        "schema_version": SCHEMA_VERSION,
        "kind": KIND,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "suite": {
            "version": suite.version,
            "data_version": suite.data_version,
            "generator_version": suite.generator_version,
            "reference": suite.raw["reference"],
            "tiers": list(tiers),
            "sweep": sweep,
            "mustpass": len(suite.mustpass()),
        },
        "moe_hal_version": __version__,
        "plugins": plugins_record(),
        "plugin_failures": [f.as_dict() for f in plugins.host().failures()],
        "environment": environment(),
        "runs": runs,
        "verdict": overall_verdict(runs),
    }


def write_json(report: dict[str, Any], path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(report, fh, indent=1, sort_keys=False, allow_nan=False, default=str)
        fh.write("\n")


def load_json(path: str) -> dict[str, Any]:
    from ..errors import ConformanceError

    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, json.JSONDecodeError) as exc:
        raise ConformanceError(f"{path}: cannot read a conformance report: {exc}") from None
    if not isinstance(data, dict) or data.get("kind") != KIND:
        raise ConformanceError(f"{path}: not a moe_hal conformance report (kind != {KIND!r})")
    return data


# -- JUnit XML ---------------------------------------------------------------------------------------


def junit_xml(report: dict[str, Any]) -> str:
    """JUnit XML: one ``testsuite`` per backend run, one ``testcase`` per case and path."""
    root = ET.Element("testsuites", name="moe_hal conformance")
    totals = Counter()
    for run in report["runs"]:
        name = run["backend"]["name"]
        suite_el = ET.SubElement(root, "testsuite", name=f"moe_hal.conformance[{name}]")
        props = ET.SubElement(suite_el, "properties")
        for key, value in (
            ("suite_version", report["suite"]["version"]),
            ("data_version", report["suite"]["data_version"]),
            ("moe_hal_version", report["moe_hal_version"]),
            ("backend_version", run["backend"].get("version") or ""),
            ("mode", run["backend"].get("mode") or ""),
            ("device", run["device"]["label"]),
            ("verdict", run["summary"]["verdict"]),
        ):
            ET.SubElement(props, "property", name=key, value=str(value))
        counts = Counter()
        if not run["available"]:
            tc = ET.SubElement(suite_el, "testcase", classname=f"moe_hal.conformance.{name}", name="backend available")
            reasons = "; ".join(f"[{r['code']}] {r['message']}" for r in run["unavailable_reasons"])
            ET.SubElement(tc, "skipped", message=f"backend {name!r} is unavailable here: {reasons}")
            counts.update(tests=1, skipped=1)
        for case in run["cases"]:
            tc = ET.SubElement(
                suite_el,
                "testcase",
                classname=f"moe_hal.conformance.{name}",
                name=f"{case['id']} [{case['path']}]",
                time=f"{case['duration_s']:.6f}",
            )
            counts["tests"] += 1
            status, message = case["status"], case.get("message", "")
            if status == "fail" or (status == "xpass" and run["strict"]):
                el = ET.SubElement(tc, "failure", message=message[:500])
                el.text = json.dumps(case["checks"], indent=1, default=str)
                counts["failures"] += 1
            elif status == "error":
                el = ET.SubElement(tc, "error", message=message[:500])
                el.text = case.get("traceback", "")
                counts["errors"] += 1
            elif status in ("not_applicable", "skipped"):
                ET.SubElement(tc, "skipped", message=message[:500] or status)
                counts["skipped"] += 1
            elif status == "xfail":
                ET.SubElement(tc, "skipped", message=f"expected failure: {case['waiver']['reason']}"[:500])
                counts["skipped"] += 1
        for key in ("tests", "failures", "errors", "skipped"):
            suite_el.set(key, str(counts.get(key, 0)))
        suite_el.set("time", f"{run['summary']['duration_s']:.3f}")
        totals.update(counts)
    for key in ("tests", "failures", "errors", "skipped"):
        root.set(key, str(totals.get(key, 0)))
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def write_junit(report: dict[str, Any], path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(junit_xml(report))


# -- verification ------------------------------------------------------------------------------------


def verify(report: dict[str, Any], suite: Any = None) -> list[str]:
    """Problems with a report's internal consistency (empty: consistent): schema, summary counts,
    verdicts, waivers with reasons, no duplicate results, every must-pass case present when the
    full tier ran. With ``suite``, also that the report was made with that suite's version/data."""
    import jsonschema

    from .suite import _read_text, default_root

    problems: list[str] = []
    schema = json.loads(_read_text(default_root(), REPORT_SCHEMA))
    for err in sorted(jsonschema.Draft202012Validator(schema).iter_errors(report), key=lambda e: list(e.path))[:10]:
        problems.append(f"schema: {'/'.join(map(str, err.path)) or '<root>'}: {err.message}")
    if problems:
        return problems
    if suite is not None:
        if report["suite"]["version"] != suite.version:
            problems.append(f"suite version {report['suite']['version']} != installed {suite.version}")
        if report["suite"]["data_version"] != suite.data_version:
            problems.append("data_version differs from the installed suite's manifest")
    for run in report["runs"]:
        name = run["backend"]["name"]
        cases = run["cases"]
        counts = Counter(c["status"] for c in cases)
        for status, n in run["summary"]["counts"].items():
            if counts.get(status, 0) != n:
                problems.append(f"{name}: summary says {n} {status}, the cases have {counts.get(status, 0)}")
        if run["summary"]["total"] != len(cases):
            problems.append(f"{name}: summary total {run['summary']['total']} != {len(cases)} cases")
        keys = [(c["id"], c["path"]) for c in cases]
        dupes = sorted({k for k in keys if keys.count(k) > 1})
        if dupes:
            problems.append(f"{name}: duplicate results {dupes[:3]}")
        for c in cases:
            if c["status"] in ("xfail", "xpass") and not (c.get("waiver") or {}).get("reason", "").strip():
                problems.append(f"{name}: {c['id']} [{c['path']}] is {c['status']} without a waiver reason")
        expected = verdict(cases, run["available"], run["strict"], len(run["waivers"]["stale"]))
        if run["summary"]["verdict"] != expected:
            problems.append(f"{name}: verdict {run['summary']['verdict']!r} but the results give {expected!r}")
        if suite is not None and run["available"] and "full" in run["tiers"]:
            present = {c["id"] for c in cases if c["path"] in ("direct", "library")}
            missing = [cid for cid in suite.mustpass() if cid not in present]
            if missing:
                problems.append(f"{name}: {len(missing)} must-pass case(s) missing, e.g. {missing[0]}")
    if report["verdict"] != overall_verdict(report["runs"]):
        problems.append(f"overall verdict {report['verdict']!r} != {overall_verdict(report['runs'])!r}")
    return problems


# -- text --------------------------------------------------------------------------------------------


def summary_lines(report: dict[str, Any]) -> list[str]:
    """One line per backend run plus the overall verdict."""
    lines = []
    for run in report["runs"]:
        b = run["backend"]
        mode = b.get("mode")
        label = b["name"] + (f" ({mode.upper()})" if mode and mode != "native" else "")
        if not run["available"]:
            reasons = "; ".join(f"[{r['code']}] {r['message']}" for r in run["unavailable_reasons"])
            lines.append(f"{label}: unavailable on {run['device']['label']}: {reasons}")
            continue
        c = run["summary"]["counts"]
        parts = [f"{c[s]} {s}" for s in STATUSES if c[s]]
        lines.append(
            f"{label} on {run['device']['label']}: {run['summary']['verdict']} "
            f"({', '.join(parts)}; {run['summary']['duration_s']:.1f} s)"
        )
    lines.append(
        f"verdict: {report['verdict']} (suite {report['suite']['version']}, "
        f"tiers {', '.join(report['suite']['tiers'])})"
    )
    if "fuzz" in report["suite"]["tiers"]:
        lines.append("fuzz results are reported but never part of the verdict")
    return lines
