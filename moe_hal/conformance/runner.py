"""Running conformance cases on one backend.

:class:`Target` resolves what is tested: a registered backend name or a :class:`~moe_hal.Backend`
instance (tests run deliberately wrong ones), the device it runs on and its execution mode. A
backend whose software or device is unusable here (``is_available``/``check_device`` reasons) is
*unavailable*: nothing runs and the run cannot be conformant. A case the backend's declared
capabilities reject (its signature matrix or ``unsupported()``) is *not applicable*, with the
reasons.

:class:`Runner` runs one case on one path and returns a :class:`CaseResult`:

* ``direct`` — ``backend.run(problem, out)`` with ``out=None`` (shape/dtype/strides, values, rows of
  no group zero, masked rows zero), then with ``out`` pre-filled with the sentinel (the call returns
  ``out``; every element written, or rows past ``masked_m`` untouched), then for K-grouped calls
  with ``c`` in place (``out is c``); the two results must be bitwise equal when the backend
  declares itself deterministic; inputs must be unmodified.
* ``dispatcher`` — ``moe_hal.grouped_gemm(..., backend=name)`` (the production path): the same
  checks on its result, and bitwise equality with the direct result for deterministic backends.
* ``library`` — library transforms on the backend's device, compared byte for byte.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from ..errors import ConformanceError
from . import checks
from .checks import CheckOutcome
from .suite import BACKEND_TRANSFORM_OPS, GEMM_OPS, Case, Suite
from .waivers import WaiverSet


@dataclass
class CaseResult:
    """The outcome of one case on one path."""

    id: str
    path: str
    op: str
    tier: str
    status: str
    message: str = ""
    reasons: list[dict[str, Any]] = field(default_factory=list)
    checks: list[CheckOutcome] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    duration_s: float = 0.0
    tags: tuple[str, ...] = ()
    waiver: dict[str, Any] | None = None
    raw_status: str = ""
    traceback: str = ""

    @property
    def key(self) -> str:
        return f"{self.id} [{self.path}]"

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "path": self.path,
            "op": self.op,
            "tier": self.tier,
            "tags": list(self.tags),
            "status": self.status,
            "duration_s": round(self.duration_s, 6),
            "metrics": self.metrics,
            "checks": [c.as_dict() for c in self.checks],
        }
        if self.message:
            out["message"] = self.message
        if self.reasons:
            out["reasons"] = self.reasons
        if self.waiver:
            out["waiver"] = self.waiver
            out["raw_status"] = self.raw_status
        if self.traceback:
            out["traceback"] = self.traceback
        return out


@dataclass
class Target:
    """A backend under test on a device. ``available`` is False (with ``reasons``) when it cannot
    run here at all; ``registered`` says whether the dispatcher can force it by name."""

    name: str
    backend: Any
    spec: Any
    device: Any
    device_info: Any
    mode: str
    available: bool
    reasons: list[Any]
    registered: bool

    @classmethod
    def resolve(cls, backend: Any, device: str | None = None) -> "Target":
        """``backend``: a registered name or a :class:`~moe_hal.Backend` instance."""
        from .. import plugins
        from ..backend import Backend, Reason

        host = plugins.host().ensure_loaded()
        if isinstance(backend, Backend):
            inst, name = backend, backend.name
            registered = host.specs.get(name) is not None and host.backend(name)[0] is inst
        elif isinstance(backend, str):
            name = backend
            if name not in host.specs:
                return cls._unavailable(
                    name,
                    None,
                    [Reason("unknown_backend", "no installed plugin provides this backend", set(host.specs), name)],
                    device,
                )
            blocking = list(host.spec_reasons.get(name, []))  # name conflicts, API version mismatch
            inst, err = host.backend(name) if not blocking else (None, None)
            if inst is None:
                return cls._unavailable(name, host.specs[name], blocking or [err], device)
            registered = True
        else:
            raise ConformanceError(
                f"backend: expected a backend name or a moe_hal.Backend, got {type(backend).__name__}"
            )
        dev, info, reasons = _pick_device(inst, device)
        if reasons:
            return cls(name, inst, inst.spec, dev, info, "", False, reasons, registered)
        mode = _guarded(lambda: inst.execution_mode(info), inst.NATIVE)
        return cls(name, inst, inst.spec, dev, info, mode, True, [], registered)

    @classmethod
    def _unavailable(cls, name: str, spec: Any, reasons: list[Any], device: str | None) -> "Target":
        import torch

        from ..selection import device_info

        dev = torch.device(device or "cpu")
        return cls(name, None, spec, dev, device_info(dev), "", False, reasons, False)


def _guarded(fn: Callable[[], Any], default: Any) -> Any:
    try:
        return fn()
    except Exception:  # noqa: BLE001 - a probe must not break the run
        return default


def _pick_device(inst: Any, device: str | None):
    """The device to test ``inst`` on: the given one, else the first of its declared device types
    this machine has that it accepts (the CPU last, for interpreter or emulator modes)."""
    import torch

    from ..backend import Reason
    from ..selection import device_info

    if device is not None:
        candidates = [device]
    else:
        declared = [d for d in inst.spec.device_types if d != "*"]
        candidates = [d for d in declared if _has_device(d)] + (["cpu"] if "cpu" not in declared else [])
        if not candidates:
            candidates = ["cpu"]
    first: tuple[Any, Any, list[Any]] | None = None
    for cand in candidates:
        dev = torch.device(cand)
        info = device_info(dev)
        reasons = []
        for what, fn in (
            ("is_available", inst.is_available),
            ("check_device", lambda info=info: inst.check_device(info)),
        ):
            try:
                reasons.extend(fn() or [])
            except Exception as exc:  # noqa: BLE001 - a backend's probe that raises is reported as its reason
                reasons.append(Reason("probe_failed", f"{inst.name}.{what}() raised {type(exc).__name__}: {exc}"))
        if not reasons:
            return dev, info, []
        if first is None:
            first = (dev, info, reasons)
    assert first is not None
    return first


def _has_device(kind: str) -> bool:
    import torch

    if kind == "cpu":
        return True
    module = getattr(torch, kind, None)
    probe = getattr(module, "is_available", None)
    try:
        return bool(probe()) if callable(probe) else False
    except Exception:  # noqa: BLE001 - a device module that cannot answer means no such device
        return False


class Runner:
    """Runs cases of ``suite`` on ``target``, applying ``waivers``."""

    def __init__(self, target: Target, suite: Suite, waivers: WaiverSet | None = None, strict: bool = False):
        self.target = target
        self.suite = suite
        self.waivers = waivers or WaiverSet()
        self.strict = strict
        self.selections: dict[str, dict[str, Any]] = {}
        self._direct: dict[str, Any] = {}
        self._tolerances: dict[str, Any] = {}

    # -- selection of work ---------------------------------------------------------------------
    def items(self, cases: Iterable[Case]) -> list[tuple[Case, str]]:
        """``(case, path)`` pairs to run; the dispatcher path needs a registered backend."""
        out = []
        for case in cases:
            for path in case.paths:
                if path == "dispatcher" and not self.target.registered:
                    continue
                out.append((case, path))
        return out

    # -- one case --------------------------------------------------------------------------------
    def run_case(self, case: Case, path: str) -> CaseResult:
        """Run ``case`` on ``path``; never raises for a backend's failure."""
        result = CaseResult(case.id, path, case.op, case.tier, "pass", tags=case.tags)
        start = time.perf_counter()
        if not self.target.available:
            result.status = "skipped"
            result.reasons = [r.as_dict() for r in self.target.reasons]
            result.message = f"{case.id} [{path}]: backend {self.target.name!r} is unavailable here"
        else:
            try:
                if case.op in GEMM_OPS:
                    self._gemm(case, path, result)
                elif case.op in BACKEND_TRANSFORM_OPS:
                    self._physical_scales(case, result)
                else:
                    self._library(case, result)
            except _Stage as stage:
                self._error(result, stage.what, stage.__cause__)
            except Exception as exc:  # noqa: BLE001 - e.g. a backend returning something unusable
                self._error(result, "checking the result", exc)
            if result.status == "pass" and any(c.failed for c in result.checks):
                result.status = "fail"
                result.message = "; ".join(
                    f"{case.id} [{path}]: check '{c.name}' failed" + (f" ({c.run})" if c.run else "") + f": {c.message}"
                    for c in result.checks
                    if c.failed
                )
        result.duration_s = time.perf_counter() - start
        self._apply_waiver(result)
        return result

    @staticmethod
    def _error(result: CaseResult, what: str, exc: BaseException) -> None:
        result.status = "error"
        result.checks = [c for c in result.checks if c.failed]
        result.message = f"{result.key}: {what} raised {type(exc).__name__}: {exc}"
        result.traceback = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-4000:]

    def _apply_waiver(self, result: CaseResult) -> None:
        if result.status not in ("pass", "fail", "error"):
            return
        waiver = self.waivers.match(result.id, result.path)
        if waiver is None:
            return
        result.raw_status = result.status
        result.waiver = waiver.as_dict()
        result.status = "xpass" if result.status == "pass" else "xfail"
        if result.status == "xpass" and self.strict:
            result.message = (
                f"{result.key}: passed although an expected-failure entry ({waiver.pattern}, "
                f"{waiver.source}) says it fails; remove the entry (--strict)"
            )

    # -- GEMM cases --------------------------------------------------------------------------------
    def _tolerance(self, case: Case):
        from .tolerances import ToleranceClass

        if case.tolerance not in self._tolerances:
            self._tolerances[case.tolerance] = ToleranceClass.from_mapping(
                case.tolerance, self.suite.tolerance_classes[case.tolerance]
            )
        return self._tolerances[case.tolerance]

    def _gemm(self, case: Case, path: str, result: CaseResult) -> None:
        from ..problem import Problem
        from .build import GemmSpec, gemm_call

        target = self.target
        spec = GemmSpec.from_case(case)
        with _stage("loading the case data"):
            call = gemm_call(spec, self._tensors(case), target.device)
        with _stage("building the problem (a suite or library bug)"):
            problem = Problem.build(call.a, call.b, call.layout(), c=call.c, out_dtype=call.out_dtype)
        reasons = self._capability_reasons(problem)
        if reasons:
            result.status = "not_applicable"
            result.reasons = [r.as_dict() for r in reasons]
            result.message = f"{case.id} [{path}]: not applicable: " + "; ".join(str(r) for r in reasons)
            return
        ctx = _GemmContext(case, spec, call, self._tolerance(case), self.suite.sentinel[spec.out_dtype], target.device)
        before = {n: checks.fingerprint(t) for n, t in call.inputs().items()}
        if path == "direct":
            self._direct_runs(ctx, result)
        else:
            self._dispatcher_run(ctx, result)
        if "inputs_unchanged" in case.checks:
            after = {n: checks.fingerprint(t) for n, t in call.inputs().items()}
            result.checks.append(checks.inputs_unchanged(before, after, "all runs"))
        values = [c for c in result.checks if c.name == "values" and c.metrics]
        if values:
            result.metrics = _worst(values)

    def _capability_reasons(self, problem) -> list[Any]:
        from ..backend import Reason

        inst = self.target.backend
        reasons = list(inst.spec.signature_reasons(problem))
        if not reasons:
            try:
                reasons = list(inst.unsupported(problem) or [])
            except Exception as exc:  # noqa: BLE001 - re-raised as the stage that failed
                raise _Stage("backend.unsupported()") from exc
        return [r if isinstance(r, Reason) else Reason("unsupported", str(r)) for r in reasons]

    def _direct_runs(self, ctx: "_GemmContext", result: CaseResult) -> None:
        import torch

        from ..problem import Problem

        inst, call, case = self.target.backend, ctx.call, ctx.case
        kw = dict(c=call.c, out_dtype=call.out_dtype)
        with _stage("backend.run(problem, None)"):
            first = inst.run(Problem.build(call.a, call.b, call.layout(), **kw), None)
        result.checks += ctx.check_output(first, "out=None", allocated=True)
        first_cpu = first.detach().cpu() if isinstance(first, torch.Tensor) else None
        if "sentinel" in case.checks:
            out = checks.fill_sentinel(
                torch.empty(ctx.spec.out_shape, dtype=call.out_dtype, device=ctx.device), ctx.sentinel
            )
            with _stage("backend.run(problem, out) with a sentinel-filled out"):
                returned = inst.run(Problem.build(call.a, call.b, call.layout(), out=out, **kw), out)
            if "shape" in case.checks:
                result.checks.append(checks.returns_out(returned, out, "out=sentinel"))
            second = out.detach().cpu()
            result.checks += ctx.check_output(second, "out=sentinel", allocated=False)
            if "determinism" in case.checks:
                result.checks.append(
                    self._determinism(
                        ctx, first_cpu, second, "out=None vs out=sentinel", "differ between two identical calls"
                    )
                )
        if "in_place_c" in case.checks and call.c is not None:
            acc = call.c.clone()
            with _stage("backend.run(problem, c) accumulating in place"):
                returned = inst.run(
                    Problem.build(call.a, call.b, call.layout(), c=acc, out=acc, out_dtype=call.out_dtype), acc
                )
            result.checks.append(checks.returns_out(returned, acc, "out=c"))
            result.checks += ctx.check_output(acc.detach().cpu(), "out=c", allocated=False, only_values=True)
        if first_cpu is not None and self.target.spec.deterministic:
            self._direct[case.id] = first_cpu

    def _dispatcher_run(self, ctx: "_GemmContext", result: CaseResult) -> None:
        import moe_hal

        from ..errors import BackendUnavailableError

        call, name = ctx.call, self.target.name
        kw = dict(c=call.c, out_dtype=call.out_dtype)
        try:
            selection = moe_hal.select(call.a, call.b, call.layout(), backend=name, **kw)
        except BackendUnavailableError as exc:
            result.status = "error"
            result.reasons = [
                r.as_dict() if hasattr(r, "as_dict") else {"code": "unknown", "message": str(r)} for r in exc.reasons
            ]
            result.message = (
                f"{ctx.case.id} [dispatcher]: the dispatcher refuses the forced backend although "
                f"its declared capabilities accept the call: " + "; ".join(map(str, exc.reasons))
            )
            return
        self.selections.setdefault(
            selection.problem,
            {"selected": selection.name, "how": selection.how, "mode": selection.mode, "explain": selection.explain()},
        )
        if selection.name != name:
            result.checks.append(checks.failed("dispatch", f"forcing {name!r} selected {selection.name!r}", "select"))
            return
        with _stage(f"moe_hal.grouped_gemm(..., backend={name!r})"):
            out = moe_hal.grouped_gemm(call.a, call.b, call.layout(), backend=name, **kw)
        out_cpu = out.detach().cpu() if hasattr(out, "detach") else out
        result.checks += ctx.check_output(out, "dispatcher out=None", allocated=True)
        direct = self._direct.get(ctx.case.id)
        if "determinism" in ctx.case.checks and direct is not None and hasattr(out_cpu, "shape"):
            result.checks.append(
                self._determinism(
                    ctx, direct, out_cpu, "dispatcher vs direct", "differ between the dispatcher and the direct call"
                )
            )

    def _determinism(self, ctx: "_GemmContext", x: Any, y: Any, run: str, what: str) -> CheckOutcome:
        if not self.target.spec.deterministic:
            return checks.not_checked("determinism", "the backend does not declare deterministic=True", run)
        if x is None or tuple(x.shape) != tuple(y.shape) or x.dtype != y.dtype:
            return checks.not_checked("determinism", "an output has the wrong shape or dtype", run)
        return checks.bitwise_equal(x, y, ctx.written_region(), "determinism", what, run)

    # -- transforms ---------------------------------------------------------------------------------------
    def _library(self, case: Case, result: CaseResult) -> None:
        import torch

        from .. import quant, routing
        from ..layouts import ContiguousLayout

        dev = self.target.device
        golden = self._tensors(case)
        p = case.problem
        problems: list[str] = []
        layout_problems: list[str] = []
        with _stage(f"moe_hal {case.op}"):
            if case.op == "layout_indices":
                lay = ContiguousLayout.from_counts(p["counts"], alignment=p["alignment"], num_rows=p.get("num_rows"))
                problems += _exact(
                    [
                        ("m_indices()", lay.m_indices(dev), golden["golden.m_indices"]),
                        ("psum", lay.psum, golden["golden.psum"]),
                    ]
                )
            elif case.op in ("tma_align_mn_major", "pack_ue8m0", "pack_ue8m0x2"):
                fn = getattr(quant, case.op)
                i = 0
                while f"scale.{i}" in golden:
                    out = fn(golden[f"scale.{i}"].to(dev))
                    layout, data = checks.strided_layout(f"{case.op}(scale.{i})", out, golden, f"golden.{i}")
                    layout_problems += layout
                    problems += data
                    i += 1
            elif case.op == "quantize_fp8":
                for fmt in ("fp32", "ue8m0"):
                    q = quant.quantize_fp8(golden["x"].to(dev), tuple(p["block"]), ue8m0=fmt == "ue8m0")
                    problems += _exact(
                        [
                            (f"quantize_fp8(ue8m0={fmt == 'ue8m0'}).data", q.data, golden[f"golden.{fmt}.data"]),
                            (f"quantize_fp8(ue8m0={fmt == 'ue8m0'}).scale", q.scale, golden[f"golden.{fmt}.scale"]),
                        ]
                    )
                    if q.scale_format != fmt or tuple(q.block) != tuple(p["block"]):
                        problems.append(
                            f"quantize_fp8(ue8m0={fmt == 'ue8m0'}): scale_format {q.scale_format!r}, "
                            f"block {q.block} (expected {fmt!r}, {tuple(p['block'])})"
                        )
            elif case.op == "routing_dispatch":
                d = routing.dispatch(
                    golden["hidden"].to(dev), golden["topk_ids"].to(dev), p["num_experts"], alignment=p["alignment"]
                )
                problems += _exact(
                    [
                        ("layout.counts", d.layout.counts, golden["golden.counts"]),
                        ("layout.psum", d.layout.psum, golden["golden.psum"]),
                        ("row_of_slot", d.row_of_slot, golden["golden.row_of_slot"]),
                        ("slot_of_row", d.slot_of_row, golden["golden.slot_of_row"]),
                        ("a", d.a, golden["golden.a"]),
                    ]
                )
            elif case.op == "routing_dispatch_masked":
                md = routing.dispatch_masked(
                    golden["hidden"].to(dev), golden["topk_ids"].to(dev), p["num_experts"], p["max_m"], overflow="drop"
                )
                problems += _exact(
                    [
                        ("layout.masked_m", md.layout.masked_m, golden["golden.masked_m"]),
                        ("row_of_slot", md.row_of_slot, golden["golden.row_of_slot"]),
                        ("slot_of_row", md.slot_of_row, golden["golden.slot_of_row"]),
                        ("a", md.a, golden["golden.a"]),
                        ("dropped", torch.tensor([md.dropped], dtype=torch.int64), golden["golden.dropped"]),
                    ]
                )
            else:
                raise ConformanceError(f"no runner for op {case.op!r}")
        self._transform_checks(case, result, problems, layout_problems)

    def _tensors(self, case: Case) -> dict[str, Any]:
        from .build import tensors  # numpy and the generators load only when a case runs

        return tensors(self.suite, case)

    def _physical_scales(self, case: Case, result: CaseResult) -> None:
        from ..backend import Reason
        from ..quant import QuantizedTensor

        inst = self.target.backend
        fp8 = any("fp8_e4m3" in s.dtypes for s in inst.spec.signatures)
        if not inst.has_physical_scales() or not fp8:
            why = (
                Reason("dtype_unsupported", "the backend declares no fp8 signature", {"fp8_e4m3"}, None)
                if not fp8
                else Reason("physical_scales_absent", "the backend exposes no physical_scales(q, role)")
            )
            result.status = "not_applicable"
            result.reasons = [why.as_dict()]
            result.message = f"{case.id} [direct]: not applicable: {why}"
            return
        golden = self._tensors(case)
        dev = self.target.device
        q = QuantizedTensor(golden["a.data"].to(dev), golden["a.scale"].to(dev), (1, 128), "ue8m0")
        with _stage(f"backend.physical_scales(q, {case.problem['role']!r})"):
            out = inst.physical_scales(q, case.problem["role"])
        prefix = {"float32": "golden.tma", "int32": "golden.ue8m0", "int16": "golden.ue8m0x2"}.get(
            str(out.dtype).removeprefix("torch.")
        )
        if prefix is None:
            self._transform_checks(
                case,
                result,
                [
                    f"physical_scales returned {out.dtype}; expected float32 (SM90), "
                    "int32 (SM100 UE8M0) or int16 (Ascend 950 UE8M0x2)"
                ],
                [],
            )
            return
        layout, data = checks.strided_layout(
            f"physical_scales(q, 'a') [{prefix.removeprefix('golden.')}]", out, golden, prefix
        )
        self._transform_checks(case, result, data, layout)
        result.metrics = {"format": prefix.removeprefix("golden.")}

    def _transform_checks(
        self, case: Case, result: CaseResult, problems: list[str], layout_problems: list[str]
    ) -> None:
        if "strides" in case.checks:
            result.checks.append(
                checks.failed("strides", "; ".join(layout_problems)) if layout_problems else checks.passed("strides")
            )
        elif layout_problems:
            problems = layout_problems + problems
        result.checks.append(checks.failed("bytes", "; ".join(problems)) if problems else checks.passed("bytes"))


def _exact(items: list[tuple[str, Any, Any]]) -> list[str]:
    out = []
    for name, actual, expected in items:
        problem = checks.exact_bytes(name, actual.detach().cpu(), expected)
        if problem:
            out.append(problem)
    return out


def _worst(values: list[CheckOutcome]) -> dict[str, Any]:
    """The worst metrics over the value checks of a case (what the report shows per case)."""
    keys = ("max_abs_err", "max_rel_err", "max_err_over_bound", "calc_diff", "mismatch_fraction")
    out: dict[str, Any] = {}
    for key in keys:
        vals = [c.metrics.get(key) for c in values if c.metrics.get(key) is not None]
        out[key] = max(vals) if vals else None
    out["mismatches"] = max(c.metrics.get("mismatches", 0) for c in values)
    out["numel"] = values[0].metrics.get("numel")
    return out


class _Stage(Exception):
    """Carries the name of the step that raised (the cause is chained)."""

    def __init__(self, what: str):
        super().__init__(what)
        self.what = what


class _stage:
    """Context manager: re-raise any exception as :class:`_Stage` naming the step."""

    def __init__(self, what: str):
        self.what = what

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc is not None and not isinstance(exc, (_Stage, KeyboardInterrupt)) and isinstance(exc, Exception):
            raise _Stage(self.what) from exc
        return False


@dataclass
class _GemmContext:
    """One GEMM case's data and the regions its contracts constrain."""

    case: Case
    spec: Any
    call: Any
    tolerance: Any
    sentinel: int
    device: Any

    def group_rows(self):
        """bool mask broadcastable to the output: True where an element belongs to a group's rows."""
        import torch

        s = self.spec
        if s.op == "contiguous":
            ids = torch.full((s.num_rows,), -1, dtype=torch.int64)
            from .oracle import segment_starts

            for g, (start, count) in enumerate(zip(segment_starts(s.counts, s.alignment), s.counts)):
                ids[start : start + count] = g
            return (ids >= 0)[:, None]
        if s.op == "masked":
            rows = torch.arange(s.max_m)
            return (rows[None, :] < torch.tensor(s.masked_m)[:, None])[..., None]
        return torch.ones((1, 1, 1), dtype=torch.bool)

    def written_region(self):
        """Elements a call writes: every element, except masked rows past ``masked_m``."""
        import torch

        if self.spec.op == "masked":
            return self.group_rows()
        return torch.ones((1,) * len(self.spec.out_shape), dtype=torch.bool)

    def accumulation_length(self):
        import torch

        s = self.spec
        if s.op == "k_grouped":
            return torch.tensor([max(c, 1) for c in s.counts], dtype=torch.float64)[:, None, None]
        return float(max(s.k, 1))

    def check_output(self, out: Any, run: str, allocated: bool, only_values: bool = False) -> list[CheckOutcome]:
        """The checks the case lists for one output (``allocated``: the call allocated it)."""
        import torch

        from .tolerances import compare

        case, s = self.case, self.spec
        found: list[CheckOutcome] = []
        if allocated and "shape" in case.checks:
            found.append(checks.shape(out, s.out_shape, self.call.out_dtype, self.device, run))
            if found[-1].failed:
                return found
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(s.out_shape):
            found.append(checks.failed("shape", f"output is not a tensor of shape {s.out_shape}", run))
            return found
        out = out.detach().cpu()
        rows = self.group_rows()
        if "values" in case.checks:
            cmp = compare(
                out,
                self.call.golden,
                self.call.magnitude,
                self.accumulation_length(),
                self.tolerance,
                rows.expand(s.out_shape),
            )
            found.append(
                checks.failed("values", cmp.message, run, cmp.metrics)
                if not cmp.ok
                else checks.passed("values", run, cmp.metrics)
            )
        if only_values:
            return found
        if s.op == "contiguous" and "padding_zero" in case.checks:
            found.append(checks.zero_rows(out, ~rows, run))
        if s.op == "masked" and allocated and "masked_zero" in case.checks:
            found.append(
                checks.zero_rows(
                    out, ~rows, run, "masked_zero", "past masked_m are not zero in an output the call allocated"
                )
            )
        if not allocated and "sentinel" in case.checks:
            if s.op == "masked":
                found.append(checks.untouched(out, self.sentinel, ~rows, run))
            else:
                found.append(checks.all_written(out, self.sentinel, run))
        return found
