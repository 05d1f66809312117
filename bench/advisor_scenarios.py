"""Which tile the advisor picks for DeepSeek-V3 expert GEMMs, and how many tiles it calls equivalent.

    python bench/advisor_scenarios.py [--hw h200] [--dtype fp8] [--no-achieved]

36 scenarios: the two expert GEMMs of DeepSeek-V3 (gate+up N 4096 / K 7168, down N 7168 / K 2048;
hidden 7168, moe_intermediate 2048, 256 experts top-8: deepseek-ai/DeepSeek-V3 config.json) on 32
local experts (EP8), for uniform, Zipf(0.8) and Zipf(1.2) routing of 512 .. 16384 tokens, ranked
over BM in {64, 128, 256} x BN 128 (perf.DEFAULT_TILES). Prints each pick, the tiles within the
tie band (perf.TIE_BAND) and a count per BM; writes nothing. The model only, no device.
"""

from __future__ import annotations

import argparse
import collections
import sys


def main(argv: list[str] | None = None) -> int:
    from moe_hal import perf

    parser = argparse.ArgumentParser(prog="bench/advisor_scenarios.py")
    parser.add_argument("--hw", default="nvidia-h200-sxm")
    parser.add_argument("--dtype", default="fp8")
    parser.add_argument("--no-achieved", action="store_true", help="the model without achieved efficiency")
    args = parser.parse_args(argv)
    hw = perf.resolve_hardware(args.hw, achieved=not args.no_achieved)
    picks: collections.Counter = collections.Counter()
    ties = 0
    for n, k in ((4096, 7168), (7168, 2048)):
        for dist in ("uniform", "zipf:0.8", "zipf:1.2"):
            for tokens in (512, 1024, 2048, 4096, 8192, 16384):
                counts = perf.synthetic_counts(dist, tokens, 32, 8, seed=0)
                advice = perf.advise(counts, n, k, hw, args.dtype)
                picks[advice.tile[0]] += 1
                ties += len(advice.equivalent) > 1
                equivalent = ", ".join(f"{e.block_m}x{e.block_n}" for e in advice.equivalent)
                print(
                    f"N={n:5} K={k:5} {dist:9} tokens={tokens:6}: {advice.tile[0]}x{advice.tile[1]} "
                    f"({advice.best.t_predicted * 1e6:8.1f} us); within {perf.TIE_BAND:.0%}: {equivalent}"
                )
    total = sum(picks.values())
    print(
        f"{args.hw} {args.dtype}{' (no achieved efficiency)' if args.no_achieved else ''}: "
        + ", ".join(f"BM={bm} in {c} of {total}" for bm, c in sorted(picks.items()))
        + f"; more than one tile equivalent in {ties} of {total}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
