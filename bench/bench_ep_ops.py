"""Count the torch ops one expert-parallel dispatch + combine runs, forward and backward.

An accelerator launches about one kernel per op, so on a GPU or NPU the host cost of
:func:`moe_hal.ep.dispatch` + :func:`moe_hal.ep.combine` grows with their op count, whatever the
bytes moved. This script spawns ``W`` local gloo ranks (:func:`moe_hal.ep.spawn_local`), routes
``--tokens`` tokens per rank to ``--topk`` of ``E`` experts and counts the aten ops of one
dispatch + combine + backward with :class:`moe_hal.testing.CountOps` (views and other metadata
ops included; the collectives' own work is not an aten op), for every ``W`` in ``--worlds`` and
``E`` in ``--experts``, in both modes. The code path is the same on every device type, except
combine's weighted sum, which on the CPU runs token chunk by token chunk (there its op count grows
with tokens x features; the defaults fit in one chunk; an accelerator runs one). Rank 0's count is
reported (another rank's may differ by a few ops: a gather into zero rows is skipped). Not a
timing: it runs on any machine.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from moe_hal import ep, timing
from moe_hal.testing import CountOps

#: rows of this many features: the count does not depend on the width
HIDDEN = 64


def _count(rank: int, world: int, experts: int, tokens: int, topk: int, mode: str) -> dict:
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(tokens, HIDDEN, generator=gen, requires_grad=True)
    ids = torch.stack([torch.randperm(experts, generator=gen)[:topk] for _ in range(tokens)])
    w = torch.rand(tokens, topk, generator=gen, requires_grad=True)
    group = ep.EPGroup(None, experts)
    options = {"capacity": tokens * topk} if mode == "capacity" else {}
    d = ep.dispatch(x, ids, w, group, mode=mode, **options)  # warm-up: scratch buffers, plugin discovery
    ep.combine(d.a * 2.0, d).sum().backward()
    with CountOps() as forward:
        d = ep.dispatch(x, ids, w, group, mode=mode, **options)
        y = ep.combine(d.a * 2.0, d)
    with CountOps() as backward:
        y.sum().backward()
    return {
        "forward": forward.total,
        "backward": backward.total,
        "total": forward.total + backward.total,
        "most_common": forward.ops.most_common(5),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worlds", default="2,4", help="world sizes, comma-separated (default 2,4)")
    p.add_argument("--experts", default="16,64,256", help="expert counts, comma-separated (default 16,64,256)")
    p.add_argument("--tokens", type=int, default=64, help="tokens per rank (default 64)")
    p.add_argument("--topk", type=int, default=8, help="experts per token (default 8)")
    p.add_argument("--json", metavar="FILE", help="write the counts as JSON")
    args = p.parse_args(argv)
    rows = []
    for world in (int(w) for w in args.worlds.split(",")):
        for experts in (int(e) for e in args.experts.split(",")):
            if experts < args.topk:
                p.error(f"--experts {experts} is below --topk {args.topk}")
            for mode in ("exact", "capacity"):
                counts = ep.spawn_local(_count, world, (experts, args.tokens, args.topk, mode))[0]
                rows.append({"world": world, "experts": experts, "mode": mode, **counts})
                print(
                    f"W={world:<2} E={experts:<4} {mode:<8}  aten ops: forward {counts['forward']:>5}, "
                    f"backward {counts['backward']:>5}, total {counts['total']:>5}",
                    flush=True,
                )
    if args.json:
        record = {
            "benchmark": "bench/bench_ep_ops.py",
            "command": "python " + " ".join(["bench/bench_ep_ops.py", *(argv if argv is not None else sys.argv[1:])]),
            "what": "aten ops (views included) of one moe_hal.ep dispatch + combine (forward) and its backward, rank 0",
            "config": {"tokens_per_rank": args.tokens, "topk": args.topk, "hidden": HIDDEN},
            "machine": timing.machine_record(),
            "rows": rows,
        }
        with open(args.json, "w") as f:
            json.dump(record, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
