"""``moe_hal.grouped_gemm`` against its peers on one :class:`moe_hal.workloads.Case`.

The peers are ``torch.nn.functional.grouped_mm`` called directly (what a user holding offsets
writes) and a per-expert ``torch.mm`` loop writing into a preallocated output. :func:`prepare`
puts a case's operands on a device and builds the calls; :func:`time_case` times each of them with
a :class:`moe_hal.timing.Timer` and checks that moe_hal computed what the loop computed.
Used by ``moe-hal bench`` and ``bench/bench_overhead.py``; it reports, it never asserts a speed.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

from .timing import Timer
from .workloads import Case

#: Names of the timed calls, moe_hal first.
MOE_HAL, GROUPED_MM, MM_LOOP = "moe_hal", "torch.grouped_mm", "torch.mm loop"


@dataclass
class Prepared:
    """The operands of one case on the device (``args``: ``(a, b)``, quantized for fp8), its
    layout, and the calls to time by name."""

    args: tuple
    layout: Any
    calls: dict[str, Callable[[], Any]] = field(default_factory=dict)


def prepare(case: Case, device: Any, backend: str | None = None, peers: bool = True, seed: int = 0) -> Prepared:
    """Random operands for ``case`` on ``device`` (weights scaled by ``1/sqrt(K)``) and the calls
    computing it: moe_hal on ``backend`` (None: its selection), and with ``peers`` (not for fp8,
    which they lack) torch grouped_mm and the mm loop.

    Shapes: contiguous ``a [rows, K]``, ``b [G, N, K]``; masked ``a [G, max_m, K]``; k_grouped
    ``a [tokens, m]``, ``b [tokens, N]`` -> ``[G, m, N]``."""
    import torch
    import torch.nn.functional as F

    import moe_hal
    from moe_hal.quant import quantize_fp8

    gen = torch.Generator(device=device).manual_seed(seed)
    fp8 = case.dtype == "fp8"
    tdtype = torch.bfloat16 if fp8 else moe_hal.dtypes.parse(case.dtype)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=device, dtype=tdtype)

    G = len(case.counts)
    if case.op == "contiguous":
        layout = moe_hal.ContiguousLayout.from_counts(case.counts, alignment=case.alignment)
        a, b = randn(layout.num_rows, case.k), randn(G, case.n, case.k) / case.k**0.5
        ends = layout.aligned_ends_on(device)
    elif case.op == "masked":
        masked_m = torch.tensor(case.counts, dtype=torch.int32, device=device)
        mean = max(1, round(sum(case.counts) / G))
        layout = moe_hal.MaskedLayout(masked_m, case.max_m, expected_m=min(mean, case.max_m))
        a, b = randn(G, case.max_m, case.k), randn(G, case.n, case.k) / case.k**0.5
    else:
        layout = moe_hal.KGroupedLayout.from_counts(case.counts, alignment=1)
        a, b = randn(layout.num_rows, case.m), randn(layout.num_rows, case.n) / max(1, layout.num_rows) ** 0.5
        ends = layout.psum_on(device)
    prep = Prepared((a, b), layout)
    if fp8:
        prep.args = (quantize_fp8(a, block=(1, 128)), quantize_fp8(b, block=(128, 128)))
    op_a, op_b = prep.args
    prep.calls[MOE_HAL] = lambda: moe_hal.grouped_gemm(op_a, op_b, layout, backend=backend)
    if not peers or fp8:
        return prep

    if case.op == "contiguous":
        prep.calls[GROUPED_MM] = lambda: F.grouped_mm(a, b.transpose(-2, -1), offs=ends)
        loop_out = torch.zeros(layout.num_rows, case.n, device=device, dtype=tdtype)
        segments = [(g, s, e) for g, s, e in layout.segments() if e > s]

        def loop() -> torch.Tensor:
            for g, s, e in segments:
                torch.mm(a[s:e], b[g].t(), out=loop_out[s:e])
            return loop_out
    elif case.op == "masked":
        prep.calls[GROUPED_MM] = lambda: F.grouped_mm(a, b.transpose(-2, -1))
        loop_out = torch.zeros(G, case.max_m, case.n, device=device, dtype=tdtype)
        valid = [(g, c) for g, c in enumerate(case.counts) if c]

        def loop() -> torch.Tensor:
            for g, c in valid:
                torch.mm(a[g, :c], b[g].t(), out=loop_out[g, :c])
            return loop_out
    else:
        prep.calls[GROUPED_MM] = lambda: F.grouped_mm(a.t(), b, offs=ends)
        loop_out = torch.zeros(G, case.m, case.n, device=device, dtype=tdtype)
        segments = list(layout.segments())

        def loop() -> torch.Tensor:
            for g, s, e in segments:
                if e > s:
                    torch.mm(a[s:e].t(), b[s:e], out=loop_out[g])
                else:
                    loop_out[g].zero_()
            return loop_out

    prep.calls[MM_LOOP] = loop
    return prep


def time_case(
    case: Case, device: Any, timer: Timer, *, backend: str | None = None, peers: bool = True, seed: int = 0
) -> dict[str, Any]:
    """One row of a benchmark report: the case, the backend moe_hal selected (``backend``,
    ``mode``, ``path``), ``times`` per call (:meth:`Timer.__call__`, or ``{"error": ...}`` for a
    call that raised), ``speedup_vs`` each peer (peer time / moe_hal time, medians) and
    ``max_rel_diff_vs_loop``. A case that cannot be prepared or selected has ``error`` and no
    times; warnings moe_hal raises on the way (path changes) land in ``warnings``."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        row = _time_case(case, device, timer, backend, peers, seed)
    messages = list(dict.fromkeys(str(w.message) for w in caught))
    if messages:
        row["warnings"] = messages
    return row


def _time_case(case: Case, device: Any, timer: Timer, backend: str | None, peers: bool, seed: int) -> dict[str, Any]:
    import moe_hal

    row: dict[str, Any] = {
        "name": case.name,
        "source": case.source,
        "op": case.op,
        "dtype": case.dtype,
        "n": case.n,
        "k": case.k,
        "m": case.m,
        "max_m": case.max_m,
        "dist": case.dist,
        "num_groups": len(case.counts),
        "rows": sum(case.counts),
        "counts": case.counts,
    }
    try:
        prep = prepare(case, device, backend, peers, seed)
        sel = moe_hal.select(*prep.args, prep.layout, backend=backend)
    except Exception as exc:  # noqa: BLE001 - recorded per case: one failing case must not end a one-shot GPU run
        row["error"] = f"{type(exc).__name__}: {exc}"
        return row
    row["backend"] = sel.name
    row["mode"] = sel.mode
    row["path"] = sel.chosen.path
    times: dict[str, Any] = {}
    outputs: dict[str, Any] = {}
    for name, fn in prep.calls.items():
        try:
            times[name] = timer(fn)
            outputs[name] = fn()
        except Exception as exc:  # noqa: BLE001 - recorded: a peer that rejects a shape is a result, not a crash
            times[name] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
    row["times"] = times
    if "error" in times[MOE_HAL]:
        row["error"] = "the moe_hal call failed: " + times[MOE_HAL]["error"]
    ref = outputs.get(MM_LOOP)
    got = outputs.get(MOE_HAL)
    if ref is not None and got is not None:
        # a sanity check of the timed result, not a conformance test
        scale = ref.float().abs().max().clamp_min(1e-30)
        row["max_rel_diff_vs_loop"] = float(((got.float() - ref.float()).abs().max() / scale).item())
    t = times.get(MOE_HAL, {}).get("median")
    for peer in (GROUPED_MM, MM_LOOP):
        tp = times.get(peer, {}).get("median")
        if t and tp:
            row.setdefault("speedup_vs", {})[peer] = tp / t
    del prep, outputs, ref, got
    return row
