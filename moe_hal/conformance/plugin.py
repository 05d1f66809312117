"""pytest plugin that runs the conformance suite on one backend, for vendors' CI.

Enable it explicitly (it is deliberately not registered under ``pytest11``, so it never loads into
unrelated pytest runs); it works from an installed wheel, without a checkout::

    pytest -p moe_hal.conformance.plugin --pyargs moe_hal.conformance \\
        --moe-backend NAME [--moe-tier smoke|full|sweep|fuzz] [--moe-manifest xfails.yaml] \\
        [--moe-strict] [--moe-report out.json] [--junitxml junit.xml]

Every option is also an ini setting (``moe_backend = myvendor`` in ``pytest.ini``, or under
``[tool.pytest.ini_options]`` in ``pyproject.toml``); a command-line option overrides it. With no
backend configured the conformance tests are skipped, not errors, so the plugin can stay enabled
in a project's configuration.

Each case and path is one test (``test_case[<case id>:<path>]``): not-applicable cases are skipped
with their reason codes, expected failures from the vendor's manifests are xfailed with their
reasons, and ``--moe-report`` writes the same JSON report as ``moe-hal conformance run``. Importing
this module imports nothing beyond pytest; the suite loads when the session starts.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

_SESSION = pytest.StashKey["ConformanceSession"]()


#: ini settings: name -> (help, type, default); each has the command-line option --moe-<name>.
_INI = {
    "moe_backend": ("backend to test (a registered name)", "string", ""),
    "moe_tier": ("smoke, full, sweep or fuzz; comma-separated", "string", "full"),
    "moe_manifest": ("expected-failure manifests, one per line", "linelist", []),
    "moe_strict": ("unexpected passes and stale expected-failure entries fail the run", "bool", False),
    "moe_report": ("write the JSON conformance report here", "string", ""),
    "moe_device": ("torch device to test on", "string", ""),
    "moe_case": ("only case ids matching these shell patterns, one per line", "linelist", []),
    "moe_suite_version": ("refuse to run unless the installed suite has this version", "string", ""),
}


def _setting(config: pytest.Config, name: str) -> Any:
    """The command-line option when given, else the ini setting (else its default)."""
    given = config.getoption(name)
    if given not in (None, [], False):
        return given
    value = config.getini(name)
    return value if value not in ("", None) else (given if given is not None else _INI[name][2])


def pytest_addoption(parser: pytest.Parser) -> None:
    for name, (text, kind, default) in _INI.items():
        parser.addini(name, f"moe_hal conformance: {text}", type=kind, default=default)
    group = parser.getgroup("moe_hal", "moe_hal conformance suite")
    group.addoption("--moe-backend", help="backend to test (a registered name; ini: moe_backend)")
    group.addoption("--moe-tier", help="smoke, full (default), sweep or fuzz; comma-separated (ini: moe_tier)")
    group.addoption(
        "--moe-manifest",
        action="append",
        default=[],
        metavar="YAML",
        help="expected-failure manifest (in addition to those the plugins ship); repeatable",
    )
    group.addoption(
        "--moe-strict", action="store_true", help="unexpected passes and stale expected-failure entries fail the run"
    )
    group.addoption("--moe-report", metavar="PATH", help="write the JSON conformance report here")
    group.addoption("--moe-device", help="torch device to test on (default: the backend's own, else the CPU)")
    group.addoption(
        "--moe-case",
        action="append",
        default=[],
        metavar="PATTERN",
        help="only case ids matching this shell pattern; repeatable",
    )
    group.addoption("--moe-suite-version", help="refuse to run unless the installed suite has this version")


#: Why the conformance tests skip when no backend is configured.
UNCONFIGURED = (
    "no backend configured: pass --moe-backend NAME or set moe_backend = NAME in the pytest "
    "configuration (`moe-hal info` lists the registered backends)"
)


def pytest_configure(config: pytest.Config) -> None:
    name = _setting(config, "moe_backend")
    if not name:
        config.stash[_SESSION] = None  # the conformance tests skip with UNCONFIGURED
        return
    if "," in name or name.strip() == "all":
        raise pytest.UsageError(
            f"moe_hal.conformance.plugin: --moe-backend takes one backend name, got {name!r} "
            "(run pytest once per backend, or use `moe-hal conformance run --backend all`)"
        )
    config.stash[_SESSION] = ConformanceSession(config)


def pytest_report_header(config: pytest.Config) -> list[str]:
    state = config.stash[_SESSION]
    return [f"moe_hal conformance: {UNCONFIGURED}"] if state is None else state.header()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "moe_conformance_item" in metafunc.fixturenames:
        state = metafunc.config.stash[_SESSION]
        if state is None:
            metafunc.parametrize("moe_conformance_item", [None], ids=["unconfigured"])
            return
        items = state.items()
        metafunc.parametrize("moe_conformance_item", items, ids=[f"{c.id}:{p}" for c, p in items])


@pytest.fixture(scope="session")
def moe_conformance(request: pytest.FixtureRequest) -> "ConformanceSession":
    """The conformance session of this pytest run (the test skips when no backend is configured)."""
    state = request.config.stash[_SESSION]
    if state is None:
        pytest.skip(UNCONFIGURED)
    return state


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    state = config.stash.get(_SESSION, None)
    if state is None:
        return
    waived = [r for r in state.results if r.status in ("xfail", "xpass")]
    if waived:
        terminalreporter.section("moe_hal conformance: waived cases")
        for r in waived:
            note = "passes now: remove its waiver" if r.status == "xpass" else "fails as expected"
            terminalreporter.line(f"{r.id} [{r.path}]: {note} ({r.waiver['reason']})")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    state = session.config.stash.get(_SESSION, None)
    if state is not None:
        state.finish()


class ConformanceSession:
    """Plans the run on first use, runs items for the tests, writes the report at the end."""

    def __init__(self, config: pytest.Config):
        self.config = config
        self._plan: Any = None
        self.results: list[Any] = []
        self.start = time.perf_counter()

    @property
    def plan(self):
        if self._plan is None:
            from ..errors import ConformanceError
            from . import session
            from . import suite as suite_mod

            def opt(name: str) -> Any:
                return _setting(self.config, name)

            suite = suite_mod.load()
            wanted = opt("moe_suite_version")
            if wanted and wanted != suite.version:
                raise pytest.UsageError(f"--moe-suite-version {wanted}: the installed suite is {suite.version}")
            try:
                self._plan = session.plan(
                    opt("moe_backend"),
                    [opt("moe_tier")],
                    device=opt("moe_device") or None,
                    manifests=opt("moe_manifest"),
                    strict=opt("moe_strict"),
                    cases=opt("moe_case"),
                    suite=suite,
                )
            except ConformanceError as exc:
                raise pytest.UsageError(str(exc)) from None
        return self._plan

    @property
    def runner(self):
        return self.plan.runners[0]

    def header(self) -> list[str]:
        import os

        from .. import __version__

        target = self.runner.target
        spec = target.spec
        lines = [
            f"moe_hal {__version__} conformance suite {self.plan.suite.version} "
            f"({self.plan.suite.data_version[:19]}...), tiers {','.join(self.plan.tiers)}",
            f"backend {target.name}"
            + (
                f" from {spec.distribution} {spec.version} (plugin {spec.plugin})"
                if spec is not None and spec.distribution
                else ""
            )
            + (f", mode {target.mode.upper()}" if target.mode else "")
            + f", device {target.device_info.label}",
        ]
        if not target.available:
            lines.append("backend UNAVAILABLE: " + "; ".join(str(r) for r in target.reasons))
        for src in self.runner.waivers.sources:
            lines.append(f"expected failures: {src['path']} ({'applies' if src.get('applies') else 'other backend'})")
        env = {k: v for k, v in sorted(os.environ.items()) if k.startswith("MOE_HAL_")}
        lines.append("MOE_HAL_* environment: " + (", ".join(f"{k}={v}" for k, v in env.items()) or "(none)"))
        return lines

    def items(self) -> list[tuple[Any, str]]:
        return list(self.plan.items[0])

    def check_available(self) -> None:
        target = self.runner.target
        if not target.available:
            pytest.fail(
                f"backend {target.name!r} cannot run here: " + "; ".join(str(r) for r in target.reasons), pytrace=False
            )

    def check(self, item: tuple[Any, str], node: pytest.Item | None = None) -> None:
        """Run one case on one path and turn its status into the pytest outcome; ``node`` (the
        test) lets a waived case that now passes be reported as XPASS."""
        case, path = item
        result = self.runner.run_case(case, path)
        self.results.append(result)
        self._outcome(result, node)

    def fuzz(self) -> None:
        if "fuzz" not in self.plan.tiers:
            pytest.skip("the fuzz tier was not requested (--moe-tier fuzz)")
        from . import session, sweep

        runner = self.runner
        result = sweep.fuzz(
            runner.run_case, lambda c: [p for _, p in runner.items([c])], self.plan.fuzz_examples, session.fuzz_result
        )
        self.results.append(result)
        self._outcome(result)

    def _outcome(self, result: Any, node: pytest.Item | None = None) -> None:
        status = result.status
        if status == "not_applicable":
            codes = ", ".join(r["code"] for r in result.reasons)
            pytest.skip(f"not applicable [{codes}]: {result.message}")
        if status == "skipped":
            pytest.skip(result.message)
        if status == "xfail":
            pytest.xfail(f"{result.waiver['reason']} ({result.waiver['source']}); {result.message}")
        if status == "xpass" and self.runner.strict:
            pytest.fail(result.message, pytrace=False)
        if status == "xpass" and node is not None:  # passes although waived: pytest reports XPASS
            node.add_marker(
                pytest.mark.xfail(
                    reason=f"waived ({result.waiver['reason']}) but passes now: remove the waiver", strict=False
                )
            )
        if status in ("fail", "error"):
            text = result.message + (f"\n{result.traceback}" if result.traceback else "")
            pytest.fail(text, pytrace=False)

    def finish(self) -> None:
        path = _setting(self.config, "moe_report")
        if not path or self._plan is None:
            return
        from . import report

        run = report.run_record(self.runner, self.results, self.plan.tiers, time.perf_counter() - self.start)
        report.write_json(report.build(self.plan.suite, [run], self.plan.tiers, self.plan.sweep), path)
