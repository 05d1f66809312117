"""Generated tiers: ``sweep`` (seeded shapes, nothing stored) and ``fuzz`` (hypothesis).

Both draw GEMM problems from the same space — every operation and precision, 1-8 groups with
empty ones, alignments 1-128, odd N and K, b in either memory order, masked_m from 0 to max_m,
K-grouped with and without ``c`` — and check them exactly like stored cases, against goldens the
oracle computes in-process. A sweep case's id carries its index and the sweep seed, so a failure
is reproduced with ``--tier sweep --sweep-seed S --case ID``. Fuzz results are reported but never
count towards the verdict: hypothesis draws differ between runs.
"""

from __future__ import annotations

from typing import Any, Callable

from .generate import Stream
from .suite import GEMM_CHECKS, Case, tolerance_class_for

_DTYPES = ("fp32", "bf16", "fp16", "fp8_fp32", "fp8_ue8m0")
_ALIGNMENTS = (1, 4, 16, 32, 128)


def make_case(params: dict[str, Any], tier: str, case_id: str) -> Case:
    """A generated GEMM case from drawn ``params`` (op, dtype, out_fp32, groups, counts or
    masked_m, alignment, n, k, m, max_m, b_major, with_c, seed, kblock_exponents)."""
    op, dtype = params["op"], params["dtype"]
    fp8 = dtype.startswith("fp8")
    signature: dict[str, Any] = {"dtype": "fp8_e4m3" if fp8 else dtype}
    if fp8:
        signature["scale_format"] = dtype.removeprefix("fp8_")
        signature["out_dtype"] = "fp32" if params["out_fp32"] else "bf16"
    else:
        signature["out_dtype"] = "fp32" if params["out_fp32"] else dtype
    if op != "k_grouped":
        signature["b_major"] = "k" if fp8 else params["b_major"]
    groups = len(params["counts"])
    if op == "contiguous":
        problem = {
            "groups": groups,
            "counts": params["counts"],
            "alignment": params["alignment"],
            "n": params["n"],
            "k": params["k"],
        }
    elif op == "masked":
        problem = {
            "groups": groups,
            "masked_m": [min(c, params["max_m"]) for c in params["counts"]],
            "max_m": params["max_m"],
            "n": params["n"],
            "k": params["k"],
        }
    else:
        problem = {
            "groups": groups,
            "counts": params["counts"],
            "alignment": params["alignment"],
            "m": params["m"],
            "n": params["n"],
            "c": params["with_c"],
        }
    checks = [
        c
        for c in GEMM_CHECKS
        if not (c == "padding_zero" and op != "contiguous")
        and not (c == "masked_zero" and op != "masked")
        and not (c == "in_place_c" and not problem.get("c"))
    ]
    generator: dict[str, Any] = {"seed": params["seed"]}
    if fp8:
        generator["kblock_exponents"] = list(params["kblock_exponents"])
    return Case(
        id=case_id,
        op=op,
        tier=tier,
        since="generated",
        tags=("generated",),
        signature=signature,
        problem=problem,
        generator=generator,
        tolerance=tolerance_class_for(signature),
        checks=tuple(checks),
    )


def _pick(stream: Stream, options: tuple) -> Any:
    return options[int(stream.integers(1, len(options))[0])]


def _int(stream: Stream, low: int, high: int) -> int:
    return low + int(stream.integers(1, high - low + 1)[0])


def sweep_cases(seed: int, count: int) -> list[Case]:
    """``count`` reproducible GEMM cases drawn from ``seed``."""
    cases = []
    for i in range(count):
        s = Stream(seed, f"sweep:{i}")
        op = _pick(s, ("contiguous", "masked", "k_grouped"))
        dtype = _pick(s, _DTYPES)
        groups = _int(s, 1, 8)
        counts = [0 if _int(s, 0, 3) == 0 else _int(s, 1, 40) for _ in range(groups)]
        params = {
            "op": op,
            "dtype": dtype,
            "out_fp32": _int(s, 0, 2) == 0,
            "counts": counts,
            "alignment": _pick(s, _ALIGNMENTS),
            "n": _int(s, 1, 96),
            "k": _int(s, 1, 300 if dtype.startswith("fp8") else 160),
            "m": _int(s, 1, 48),
            "max_m": _int(s, 1, 48),
            "b_major": _pick(s, ("k", "n")),
            "with_c": _int(s, 0, 1) == 1,
            "seed": seed * 1000 + i,
            "kblock_exponents": [_int(s, 0, 12) - 6 for _ in range(3)],
        }
        cases.append(make_case(params, "sweep", f"sweep/{op}/{dtype}/{i:03d}@{seed}"))
    return cases


def fuzz_strategy():
    """A hypothesis strategy of generated GEMM cases (same space as the sweep)."""
    from hypothesis import strategies as st

    @st.composite
    def cases(draw):
        op = draw(st.sampled_from(("contiguous", "masked", "k_grouped")))
        dtype = draw(st.sampled_from(_DTYPES))
        counts = draw(st.lists(st.integers(0, 40), min_size=1, max_size=8))
        fp8 = dtype.startswith("fp8")
        params = {
            "op": op,
            "dtype": dtype,
            "out_fp32": draw(st.booleans()),
            "counts": counts,
            "alignment": draw(st.sampled_from(_ALIGNMENTS)),
            "n": draw(st.integers(1, 96)),
            "k": draw(st.integers(1, 300 if fp8 else 160)),
            "m": draw(st.integers(1, 48)),
            "max_m": draw(st.integers(1, 48)),
            "b_major": draw(st.sampled_from(("k", "n"))),
            "with_c": draw(st.booleans()),
            "seed": draw(st.integers(0, 2**31 - 1)),
            "kblock_exponents": draw(st.lists(st.integers(-6, 6), min_size=1, max_size=4)),
        }
        return make_case(params, "fuzz", f"fuzz/{op}/{dtype}/{params['seed']}@hypothesis")

    return cases()


def fuzz(
    run_case: Callable[[Case, str], Any],
    paths: Callable[[Case], list[str]],
    examples: int,
    case_result: Callable[..., Any],
):
    """Run hypothesis over generated cases; returns one result (status pass/fail) describing the
    smallest failing case hypothesis found, if any. Never part of the verdict."""
    from hypothesis import HealthCheck, given, settings

    seen: dict[str, Any] = {"examples": 0, "last": None}

    @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck), print_blob=False)
    @given(case=fuzz_strategy())
    def prop(case: Case) -> None:
        seen["examples"] += 1
        for path in paths(case):
            result = run_case(case, path)
            if result.status in ("fail", "error"):
                seen["last"] = (case, result)
                raise AssertionError(result.message)

    try:
        prop()
    except AssertionError:
        case, result = seen["last"]
        return case_result(
            f"fuzz/gemm@{examples}",
            "fail",
            f"hypothesis found a failing case after {seen['examples']} examples: {result.message} "
            f"(problem {case.problem}, signature {case.signature}, generator {case.generator})",
            {"examples": seen["examples"]},
        )
    return case_result(f"fuzz/gemm@{examples}", "pass", "", {"examples": seen["examples"]})
