"""Compare two conformance reports case by case: status changes and metric drift.

Two machines running the same backend, or two backends on one machine: runs are paired by backend
name when both reports hold that backend, or taken as they are when each report has a single run
(or the caller names them). For every ``(case id, path)`` in either run the comparison lists a
status change, a case present in only one run, and value metrics (``max_err_over_bound``,
``calc_diff``, ``max_abs_err``) that moved by more than ``drift`` times. It also lists differences
in the headers: suite and data versions, moe_hal and backend versions, execution mode, device.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import ConformanceError

#: Metrics compared for drift, with the magnitude below which changes are noise.
DRIFT_METRICS = {"max_err_over_bound": 1e-3, "calc_diff": 1e-12, "max_abs_err": 1e-9}
#: Status changes that are regressions (from the first report to the second).
_GOOD = {"pass", "not_applicable", "xpass"}
_BAD = {"fail", "error", "skipped", "xfail"}


@dataclass
class CaseDiff:
    key: str
    status_a: str | None
    status_b: str | None
    drift: dict[str, tuple[Any, Any]] = field(default_factory=dict)

    @property
    def status_changed(self) -> bool:
        return self.status_a != self.status_b

    @property
    def regression(self) -> bool:
        return self.status_a in _GOOD and (self.status_b in _BAD or self.status_b is None)

    def as_dict(self) -> dict[str, Any]:
        return {
            "case": self.key,
            "status_a": self.status_a,
            "status_b": self.status_b,
            "regression": self.regression,
            "drift": {k: {"a": a, "b": b} for k, (a, b) in self.drift.items()},
        }


@dataclass
class RunComparison:
    name_a: str
    name_b: str
    header: dict[str, tuple[Any, Any]]
    cases: list[CaseDiff]
    verdicts: tuple[str, str]

    @property
    def regressions(self) -> list[CaseDiff]:
        return [c for c in self.cases if c.regression]

    def as_dict(self) -> dict[str, Any]:
        return {
            "backend_a": self.name_a,
            "backend_b": self.name_b,
            "verdict_a": self.verdicts[0],
            "verdict_b": self.verdicts[1],
            "header": {k: {"a": a, "b": b} for k, (a, b) in self.header.items()},
            "cases": [c.as_dict() for c in self.cases],
            "regressions": len(self.regressions),
        }


def _pairs(a: dict[str, Any], b: dict[str, Any], backend_a: str | None, backend_b: str | None):
    runs_a = {r["backend"]["name"]: r for r in a["runs"]}
    runs_b = {r["backend"]["name"]: r for r in b["runs"]}
    if backend_a or backend_b:
        name_a = backend_a or backend_b
        name_b = backend_b or backend_a
        for name, runs, which in ((name_a, runs_a, "first"), (name_b, runs_b, "second")):
            if name not in runs:
                raise ConformanceError(f"the {which} report has no run of backend {name!r} (it has {sorted(runs)})")
        return [(runs_a[name_a], runs_b[name_b])]
    common = sorted(set(runs_a) & set(runs_b))
    if common:
        return [(runs_a[n], runs_b[n]) for n in common]
    if len(runs_a) == 1 and len(runs_b) == 1:
        return [(next(iter(runs_a.values())), next(iter(runs_b.values())))]
    raise ConformanceError(f"no backend in common ({sorted(runs_a)} vs {sorted(runs_b)}); name the runs to compare")


def _header(a: dict[str, Any], b: dict[str, Any], ra: dict[str, Any], rb: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    fields = {
        "suite_version": (a["suite"]["version"], b["suite"]["version"]),
        "data_version": (a["suite"]["data_version"], b["suite"]["data_version"]),
        "moe_hal_version": (a["moe_hal_version"], b["moe_hal_version"]),
        "torch": (a["environment"]["torch"], b["environment"]["torch"]),
        "backend": (ra["backend"]["name"], rb["backend"]["name"]),
        "backend_version": (ra["backend"].get("version"), rb["backend"].get("version")),
        "mode": (ra["backend"].get("mode"), rb["backend"].get("mode")),
        "device": (ra["device"]["label"], rb["device"]["label"]),
        "hw_id": (ra["device"]["hw_id"], rb["device"]["hw_id"]),
        "tiers": (",".join(ra["tiers"]), ",".join(rb["tiers"])),
    }
    return {k: v for k, v in fields.items() if v[0] != v[1]}


def _drift(ma: dict[str, Any], mb: dict[str, Any], factor: float) -> dict[str, tuple[Any, Any]]:
    out = {}
    for key, floor in DRIFT_METRICS.items():
        x, y = ma.get(key), mb.get(key)
        if x is None or y is None:
            continue
        hi, lo = max(x, y), min(x, y)
        if hi > floor and hi > factor * max(lo, floor):
            out[key] = (x, y)
    return out


def compare(
    a: dict[str, Any], b: dict[str, Any], drift: float = 2.0, backend_a: str | None = None, backend_b: str | None = None
) -> list[RunComparison]:
    """Compare reports ``a`` and ``b`` (loaded JSON); one :class:`RunComparison` per paired run.
    Only cases whose status changed, that exist in one run only, or whose metrics drifted by more
    than ``drift`` times are listed."""
    if drift <= 1.0:
        raise ConformanceError(f"drift: expected a factor > 1, got {drift}")
    out = []
    for ra, rb in _pairs(a, b, backend_a, backend_b):
        ca = {f"{c['id']} [{c['path']}]": c for c in ra["cases"]}
        cb = {f"{c['id']} [{c['path']}]": c for c in rb["cases"]}
        diffs = []
        for key in list(ca) + [k for k in cb if k not in ca]:
            x, y = ca.get(key), cb.get(key)
            d = CaseDiff(key, x["status"] if x else None, y["status"] if y else None)
            if x and y:
                d.drift = _drift(x.get("metrics") or {}, y.get("metrics") or {}, drift)
            if d.status_changed or d.drift:
                diffs.append(d)
        out.append(
            RunComparison(
                ra["backend"]["name"],
                rb["backend"]["name"],
                _header(a, b, ra, rb),
                diffs,
                (ra["summary"]["verdict"], rb["summary"]["verdict"]),
            )
        )
    return out


def render(comparisons: list[RunComparison], console: Any, label_a: str = "A", label_b: str = "B") -> None:
    """Print comparisons as tables; every piece of data is literal text (``[direct]`` stays)."""
    from ..cli import render as out

    for comp in comparisons:
        console.print(
            out.join(
                (comp.name_a, "bold"),
                f" ({label_a}, {comp.verdicts[0]}) vs ",
                (comp.name_b, "bold"),
                f" ({label_b}, {comp.verdicts[1]})",
            )
        )
        if comp.header:
            rows = [(key, x, y) for key, (x, y) in comp.header.items()]
            console.print(
                out.table("differences in the environment", ("field", label_a, label_b), rows, key=("field",))
            )
        if not comp.cases:
            console.print("  every case has the same status; no metric drifted")
            continue
        rows = [
            (
                d.key,
                d.status_a or "(absent)",
                d.status_b or "(absent)",
                ", ".join(f"{k} {_fmt(x)} -> {_fmt(y)}" for k, (x, y) in d.drift.items()),
            )
            for d in comp.cases
        ]
        console.print(
            out.table(
                f"{len(comp.cases)} case(s) differ, {len(comp.regressions)} regression(s)",
                ("case [path]", label_a, label_b, "metric drift"),
                rows,
                key=("case [path]",),
                row_styles=["red" if d.regression else None for d in comp.cases],
            )
        )


def _fmt(v: Any) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)
