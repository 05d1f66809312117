"""One conformance session: pick the backends, the cases and the waivers; run; build the report."""

from __future__ import annotations

import fnmatch
import time
from dataclasses import dataclass
from typing import Any, Iterable, Protocol, Sequence

from ..errors import ConformanceError
from . import report as report_mod
from . import suite as suite_mod
from . import sweep as sweep_mod
from .runner import CaseResult, Runner, Target
from .suite import TIERS, Case, Suite
from .waivers import for_backend


class Progress(Protocol):
    """What :func:`run` tells a progress display."""

    def start(self, total: int) -> None: ...

    def step(self, backend: str, result: CaseResult) -> None: ...


def backend_names(spec: str | Sequence[str]) -> list[str]:
    """``"all"`` (every registered backend, sorted), one name, a comma list or a sequence."""
    from .. import plugins

    if isinstance(spec, str):
        if spec.strip() == "all":
            return sorted(plugins.host().ensure_loaded().specs)
        names = [n.strip() for n in spec.split(",") if n.strip()]
    else:
        names = list(spec)
    if not names:
        raise ConformanceError("backend: expected 'all', a backend name or a comma-separated list")
    return names


def check_tiers(tiers: Iterable[str]) -> list[str]:
    out = []
    for t in tiers:
        for part in str(t).split(","):
            part = part.strip()
            if part not in TIERS:
                raise ConformanceError(f"tier: expected one of {list(TIERS)}, got {part!r}")
            if part not in out:
                out.append(part)
    return out or ["full"]


def select_cases(
    suite: Suite,
    tiers: list[str],
    patterns: Iterable[str] = (),
    sweep_seed: int | None = None,
    sweep_count: int | None = None,
) -> list[Case]:
    """Stored cases of the tiers plus the generated sweep, filtered by id patterns (fnmatch)."""
    cases = suite.select([t for t in tiers if t in suite_mod.STORED_TIERS])
    if "sweep" in tiers:
        seed = suite.sweep["seed"] if sweep_seed is None else sweep_seed
        count = suite.sweep["cases"] if sweep_count is None else sweep_count
        cases += sweep_mod.sweep_cases(seed, count)
    patterns = list(patterns)
    if patterns:
        cases = [c for c in cases if any(fnmatch.fnmatchcase(c.id, p) for p in patterns)]
    return cases


@dataclass
class Plan:
    """What one session will run: a runner per backend and the (case, path) items of each."""

    suite: Suite
    tiers: list[str]
    runners: list[Runner]
    items: list[list[tuple[Case, str]]]
    fuzz_examples: int
    sweep: dict[str, Any] | None

    @property
    def total(self) -> int:
        return sum(len(i) for i in self.items) + (len(self.runners) if "fuzz" in self.tiers else 0)


def plan(
    backend: Any = "all",
    tiers: Iterable[str] = ("full",),
    *,
    device: str | None = None,
    manifests: Iterable[str] = (),
    strict: bool = False,
    cases: Iterable[str] = (),
    suite: Suite | None = None,
    sweep_seed: int | None = None,
    sweep_count: int | None = None,
    fuzz_examples: int | None = None,
    use_plugin_manifests: bool = True,
) -> Plan:
    """Resolve backends (names or :class:`~moe_hal.Backend` instances), cases and waivers."""
    from ..backend import Backend

    suite = suite or suite_mod.load()
    tiers = check_tiers(tiers)
    if "fuzz" in tiers:
        import importlib.util

        if importlib.util.find_spec("hypothesis") is None:
            raise ConformanceError(
                "the fuzz tier needs hypothesis, which is not installed "
                "(pip install 'moe-hal[test]'); the other tiers do not"
            )
    chosen = select_cases(suite, tiers, cases, sweep_seed, sweep_count)
    if not chosen and "fuzz" not in tiers:
        raise ConformanceError(f"no case matches tiers {tiers} and patterns {list(cases)}")
    backends = (
        [backend]
        if isinstance(backend, Backend)
        else (backend if isinstance(backend, (list, tuple)) else backend_names(backend))
    )
    manifests = list(manifests)
    runners, items = [], []
    for b in backends:
        target = Target.resolve(b, device)
        waivers = for_backend(target.name, manifests, use_plugin_manifests)
        runner = Runner(target, suite, waivers, strict)
        runners.append(runner)
        items.append(runner.items(chosen) if target.available else [])
    sweep = None
    if "sweep" in tiers:
        sweep = {
            "seed": suite.sweep["seed"] if sweep_seed is None else sweep_seed,
            "cases": suite.sweep["cases"] if sweep_count is None else sweep_count,
        }
    examples = suite.sweep.get("fuzz_examples", 25) if fuzz_examples is None else fuzz_examples
    return Plan(suite, tiers, runners, items, examples, sweep)


def execute(p: Plan, progress: Progress | None = None) -> dict[str, Any]:
    """Run a plan and return the report."""
    if progress:
        progress.start(p.total)
    runs = []
    for runner, items in zip(p.runners, p.items):
        start = time.perf_counter()
        results = []
        for case, path in items:
            result = runner.run_case(case, path)
            results.append(result)
            if progress:
                progress.step(runner.target.name, result)
        if "fuzz" in p.tiers and runner.target.available:
            result = sweep_mod.fuzz(
                runner.run_case, lambda c, r=runner: [path for _, path in r.items([c])], p.fuzz_examples, fuzz_result
            )
            results.append(result)
            if progress:
                progress.step(runner.target.name, result)
        runs.append(report_mod.run_record(runner, results, p.tiers, time.perf_counter() - start))
    return report_mod.build(p.suite, runs, p.tiers, p.sweep)


def fuzz_result(case_id: str, status: str, message: str, metrics: dict[str, Any]) -> CaseResult:
    """The one result the fuzz tier reports per backend."""
    return CaseResult(
        case_id, "direct", "gemm", "fuzz", status, message=message, metrics=metrics, tags=("generated", "hypothesis")
    )


def run(
    backend: Any = "all", tiers: Iterable[str] = ("full",), *, progress: Progress | None = None, **options: Any
) -> dict[str, Any]:
    """Run the conformance suite and return the report (a JSON-ready dict).

    ``backend``: ``"all"``, a name, a comma list, a list of names, or a :class:`~moe_hal.Backend`
    instance (its dispatcher path runs only when it is the instance registered under its name).
    ``tiers``: any of ``smoke``, ``full``, ``sweep``, ``fuzz``. Options: ``device``, ``manifests``
    (expected-failure files), ``strict``, ``cases`` (id patterns), ``suite``, ``sweep_seed``,
    ``sweep_count``, ``fuzz_examples``, ``use_plugin_manifests``.
    """
    return execute(plan(backend, tiers, **options), progress)


def summary(report: dict[str, Any]) -> str:
    """A few lines: per backend its verdict and counts, then the overall verdict."""
    return "\n".join(report_mod.summary_lines(report))
