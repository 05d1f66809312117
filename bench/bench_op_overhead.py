"""Host overhead the custom-op path (``torch.ops.moe_hal.*``) adds to a plain ``moe_hal.grouped_gemm``.

``moe_hal.grouped_gemm`` runs the checked path (:func:`moe_hal.execution.run`) directly when no
gradient, autocast or compiled graph is involved; otherwise it goes through the ``torch.library``
ops (:mod:`moe_hal.ops`). This script times, at tiny sizes where the call is all host overhead, in
one process and interleaved:

* ``direct``: ``moe_hal.execution.run(a, b, layout)``, the checked path itself,
* ``plain``: ``moe_hal.grouped_gemm(a, b, layout)`` with nothing requiring grad (the direct path
  plus the API's decision, ``api_added_us = plain - direct``),
* ``op_graph``: the layout's op ``torch.ops.moe_hal.grouped_gemm_<layout>`` on the already
  flattened arguments, nothing requiring grad, as a compiled graph calls it: the dispatcher, the
  Autograd kernel's no-grad branch and finding the host layout again (``graph_added_us =
  op_graph - direct``),
* ``floor``: a custom op with the schema of the layout's op whose Python kernel does nothing
  (registered here, namespace ``moe_hal_bench``): what any ``torch.library`` op with a Python
  kernel and that schema costs to call, which no change inside moe_hal's code removes (called as
  ``moe_hal.ops.call`` calls its op, with the same arguments, as is ``dispatched``),
* ``direct_then_floor``: ``direct`` and then ``floor``, one after the other (not nested),
* ``dispatched``: a custom op with the same schema whose Python Autograd kernel (with the keyset,
  as moe_hal's) runs ``direct``'s call on the host layout and returns its result: the dispatcher
  around the same checked work, without anything of moe_hal's op path,
* ``op``: the API call through the custom op (``moe_hal.ops.call``), nothing requiring grad:
  flattening the layout, the Autograd kernel's checks and the eager kernel around the checked
  path (``added_us = op - plain``),
* ``op_autograd``: the op with operands that require grad (records the backward node; the
  backward itself is not timed),
* ``direct_timed`` / ``dispatched_timed``: ``direct``'s call timing itself, called directly and
  from inside the Autograd kernel of an op like ``dispatched`` (the rows themselves are not
  reported on; ``work_inside_extra_us`` is how much longer the same checked work takes inside
  the op's kernel, under the dispatcher's C frames, than called directly),

for the contiguous (host layout and :class:`~moe_hal.PsumLayout`), masked and K-grouped layouts.
Where the op path's time goes, every term measured (``added_us = dispatch_us + own_us -
api_added_us`` exactly):

* ``dispatch_us = dispatched - direct``: the dispatcher's round trip around the work, of which
  ``floor`` is the bare call and ``pair_extra_us = direct_then_floor - direct - floor`` what the
  two code paths cost more run one after the other than each alone (caches and branch predictors
  shared between them: no line of code to remove),
* ``own_us = op - dispatched``: moe_hal's own Python on the op path,
* ``api_added_us = plain - direct``: the API's path decision, which ``op`` (called directly)
  skips.

Times are this thread's CPU time by default (``--clock thread``), which a shared,
oversubscribed machine disturbs less than wall time. Never run as a test.

    python bench/bench_op_overhead.py [--json bench/results/op_overhead_cpu.json] [--repeats 15]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import warnings

import torch

import moe_hal
from moe_hal import execution, ops
from moe_hal.timing import CLOCKS, host_seconds_per_call, machine_record, warmup_calls

STATISTICS = {"median": statistics.median, "min": min}


@functools.cache
def _bench_lib() -> torch.library.Library:
    """The ``moe_hal_bench`` namespace of this script's ops (they live as long as the Library)."""
    return torch.library.Library("moe_hal_bench", "DEF")


@functools.cache
def noop_op(layout: str):
    """A custom op with the schema of ``torch.ops.moe_hal.grouped_gemm_<layout>`` and a Python
    kernel that returns ``a``: the dispatcher's own cost for such an op (the ``floor`` row)."""
    lib = _bench_lib()
    lib.define(f"noop_{layout}" + ops.SCHEMAS[layout])
    lib.impl(f"noop_{layout}", lambda a, *args: a, "CompositeExplicitAutograd")
    return getattr(torch.ops.moe_hal_bench, f"noop_{layout}").default


def dispatched_op(name: str, layout: str, work):
    """A custom op ``moe_hal_bench.<name>`` with the schema of moe_hal's op for ``layout`` whose
    Autograd kernel (with the keyset, as moe_hal's) returns ``work()``: the dispatcher around
    ``work`` alone."""
    lib = _bench_lib()
    lib.define(name + ops.SCHEMAS[layout])
    lib.impl(name, lambda keyset, *args: work(), "Autograd", with_keyset=True)
    return getattr(torch.ops.moe_hal_bench, name).default


def cases(gen: torch.Generator) -> dict[str, tuple]:
    """name -> (a, b, layout, c) at the tiny size of bench_overhead.py (8 groups, 16 x 16)."""
    counts = [2, 5, 3, 9, 4, 6, 2, 7]
    lay = moe_hal.ContiguousLayout.from_counts(counts, alignment=1)
    klay = moe_hal.KGroupedLayout.from_counts(counts, alignment=1)
    mlay = moe_hal.MaskedLayout(torch.tensor(counts, dtype=torch.int32), 9, check=False)
    a = torch.randn(lay.num_rows, 16, generator=gen)
    b = torch.randn(8, 16, 16, generator=gen)
    return {
        "contiguous": (a, b, lay, None),
        "contiguous_psum_layout": (a, b, moe_hal.PsumLayout(lay.psum, "contiguous", 1), None),
        "masked": (torch.randn(8, 9, 16, generator=gen), b, mlay, None),
        "k_grouped_c": (a, torch.randn(lay.num_rows, 16, generator=gen), klay, torch.randn(8, 16, 16, generator=gen)),
    }


def measure(name: str, a, b, lay, c, iters: int, repeats: int, clock, statistic) -> dict:
    ag, bg = a.clone().requires_grad_(), b.clone().requires_grad_()
    groups, op_name, alignment, _ = ops.layout_args(lay, a.device)
    # the op's arguments as moe_hal.ops.call passes them (trailing defaults left out), through
    # the same entry (moe_hal.ops.eager_entry), for the ops timed against it
    args = (a, b, groups) + (() if c is None else (c,))  # every case here has alignment 1
    floor = ops.eager_entry(noop_op(op_name))
    op = ops.OPS[op_name]
    fns = {
        "op_graph": lambda: op(*args),
        "floor": lambda: floor(*args),
        "op": lambda: ops.call(a, b, lay, c=c),
        "op_autograd": lambda: ops.call(ag, bg, lay, c=c),
    }
    if not isinstance(lay, moe_hal.PsumLayout):  # a PsumLayout always takes the op path
        fns["plain"] = lambda: moe_hal.grouped_gemm(a, b, lay, c=c)
        fns["direct"] = lambda: execution.run(a, b, lay, c=c)
        fns["direct_then_floor"] = lambda: (fns["direct"](), fns["floor"]())
        dispatched = ops.eager_entry(dispatched_op(f"dispatched_{name}", op_name, fns["direct"]))
        fns["dispatched"] = lambda: dispatched(*args)
        # direct's call timed by itself, called directly and inside an op's kernel
        work = {"outside": [], "inside": []}
        fns["direct_timed"] = _timed(fns["direct"], clock, work["outside"])
        inside = ops.eager_entry(dispatched_op(f"inside_{name}", op_name, _timed(fns["direct"], clock, work["inside"])))
        fns["dispatched_timed"] = lambda: inside(*args)
    t = host_seconds_per_call(fns, iters=iters, repeats=repeats, clock=clock, statistic=statistic)
    host = lay.to_host(a.shape[0]) if isinstance(lay, moe_hal.PsumLayout) else lay
    row = {"case": name, "backend": moe_hal.select(a, b, host, c=c).name, **{f"{k}_us": v * 1e6 for k, v in t.items()}}
    if "plain" in t:
        row["api_added_us"] = (t["plain"] - t["direct"]) * 1e6
        row["graph_added_us"] = (t["op_graph"] - t["direct"]) * 1e6
        row["dispatch_us"] = (t["dispatched"] - t["direct"]) * 1e6
        row["pair_extra_us"] = (t["direct_then_floor"] - t["direct"] - t["floor"]) * 1e6
        row["own_us"] = (t["op"] - t["dispatched"]) * 1e6
        row["added_us"] = (t["op"] - t["plain"]) * 1e6
        row["added_autograd_us"] = (t["op_autograd"] - t["plain"]) * 1e6
        per_round = {k: _per_round(v, iters, statistic) for k, v in work.items()}
        row["work_inside_extra_us"] = (per_round["inside"] - per_round["outside"]) * 1e6
    return row


def _timed(fn, clock, samples: list[float]):
    """``fn`` that also appends the clock time of each of its calls to ``samples``."""

    def timed():
        t0 = clock()
        result = fn()
        samples.append(clock() - t0)
        return result

    return timed


def _per_round(samples: list[float], iters: int, statistic) -> float:
    """``statistic`` over the rounds of :func:`host_seconds_per_call` (warm-up calls first, then
    ``iters`` calls per round) of the mean time per call in each round."""
    timed = samples[warmup_calls(iters) :]
    return statistic([sum(timed[i : i + iters]) / iters for i in range(0, len(timed), iters)])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=15, help="timing rounds (median over them)")
    p.add_argument("--iters", type=int, default=2000, help="calls per round")
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: host overhead, not throughput)")
    p.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="thread",
        help="wall time, or this thread's CPU time (default: steadier on a shared, oversubscribed host)",
    )
    p.add_argument(
        "--stat",
        choices=("median", "min"),
        default="median",
        help="per-call time over the rounds: median, or min (the least disturbed round; differences of a few "
        "microseconds stay visible on a loaded host)",
    )
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = p.parse_args(argv)
    clock = CLOCKS[args.clock]
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore", moe_hal.errors.MoeHalWarning)
    gen = torch.Generator().manual_seed(0)
    results = [
        measure(name, *args_, iters=args.iters, repeats=args.repeats, clock=clock, statistic=STATISTICS[args.stat])
        for name, args_ in cases(gen).items()
    ]
    for r in results:
        text = "  ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items())
        print(text)
    if args.json:
        meta = {
            **machine_record(),
            "clock": args.clock,
            "stat": args.stat,
            "command": "python bench/bench_op_overhead.py "
            f"--repeats {args.repeats} --iters {args.iters} --threads {args.threads} --clock {args.clock} "
            f"--stat {args.stat}",
        }
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
