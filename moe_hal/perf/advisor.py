"""The tile advisor: rank the tiles a backend can launch by the model's prediction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from ..checks import positive_int
from ..errors import ArgumentError
from .model import Call, Estimate

#: Tiles :func:`advise` ranks when a backend declares none: BM in {64, 128, 256} with BN = 128.
DEFAULT_TILES: tuple[tuple[int, int], ...] = ((64, 128), (128, 128), (256, 128))


#: Predictions within this fraction of the best are equivalent: the model's own out-of-sample
#: error on published measurements (leave-one-source-out, bench/results/model_validation_published.json:
#: median 11.0% over 957 cases; a Hopper source's median up to 50.3% (torchao PR #3342's FP8
#: kernels on the H100 PCIe), a Blackwell source's up to 20.0% (Liger Kernel PR #1380's bf16 GEMMs
#: on the B200), an Ada source's up to 76.3% (vLLM PR #6677's L40S calls)) rounded up to a
#: whole percent. Inside the band the ranking is a tie-break, not a prediction; on devices
#: with few published timings the model's error is wider than the band.
TIE_BAND = 0.12


@dataclass(frozen=True)
class Advice:
    """Tiles ranked best first by :func:`advise`. ``reason`` says in words why the first won.
    ``equivalent``: the tiles (the best included) predicted within :data:`TIE_BAND` of the best,
    which the model cannot tell apart."""

    ranked: tuple[Estimate, ...]
    reason: str

    @property
    def best(self) -> Estimate:
        return self.ranked[0]

    @property
    def equivalent(self) -> tuple[Estimate, ...]:
        limit = self.best.t_predicted * (1 + TIE_BAND)
        return tuple(e for e in self.ranked if e.t_predicted <= limit)

    @property
    def tile(self) -> tuple[int, int]:
        """``(block_m, block_n)`` of the best tile."""
        return self.best.tile

    def as_dict(self) -> dict[str, Any]:
        return {
            "tile": list(self.tile),
            "reason": self.reason,
            "tie_band": TIE_BAND,
            "equivalent": [list(e.tile) for e in self.equivalent],
            "ranked": [e.as_dict() for e in self.ranked],
        }


def rank_key(est: Estimate) -> tuple:
    """Sort key of :func:`advise`, smallest first. In order: predicted time (to the picosecond);
    compute time (more headroom when memory time decides); fewer waves; fuller last wave;
    smaller ``BM + BN``; smaller ``BM * BN``; smaller ``BM``."""
    return (
        round(est.t_predicted, 12),
        round(est.t_compute, 12),
        est.waves,
        -est.wave_efficiency,
        est.block_m + est.block_n,
        est.block_m * est.block_n,
        est.block_m,
    )


def advise(
    counts: Sequence[int],
    n: int,
    k: int | None = None,
    hw: Any = None,
    dtype: str = "bf16",
    tiles: Iterable[tuple[int, int]] = DEFAULT_TILES,
    **options: Any,
) -> Advice:
    """Rank the tiles ``[(block_m, block_n), ...]`` a backend can launch for this call and pick
    the best by :func:`rank_key`. ``options`` are passed to :func:`estimate` (``op``, ``m``,
    ``out_dtype``, ``streams_all_experts``, ...)."""
    tile_list = _tiles(tiles)
    call = Call.build(counts, n, k, hw, dtype, **options)
    ranked = tuple(sorted((call.estimate(bm, bn) for bm, bn in tile_list), key=rank_key))
    return Advice(ranked, _reason(ranked))


def advise_decode(
    max_m: int,
    expected_m: int | None,
    num_groups: int,
    n: int,
    k: int,
    hw: Any = None,
    dtype: str = "bf16",
    tiles: Iterable[tuple[int, int]] = DEFAULT_TILES,
    **options: Any,
) -> Advice:
    """Tile advice when only the device holds the histogram (masked decode under CUDA graphs).

    Every one of ``num_groups`` groups is assumed to hold ``expected_m`` rows (``max_m`` when
    no hint is given, the worst case), which makes every term closed-form. The ranking then
    follows a closed-form shortcut: when ``expected_m <= M*`` the call is bound by
    weight streaming, every tile predicts the same time and the tie-break on compute time picks
    the smallest BM the MMA does not round up (a BM below ``mma_min_m`` costs ``mma_min_m``
    rows, so it only wins when it also has no more waves); above ``M*`` the BM that wastes the
    fewest padded rows at the fewest waves wins.
    """
    max_m = positive_int(max_m, "max_m")
    num_groups = positive_int(num_groups, "num_groups")
    if expected_m is None:
        rows = max_m
    else:
        rows = positive_int(expected_m, "expected_m")
        if rows > max_m:
            raise ArgumentError("expected_m", f"<= max_m ({max_m})", expected_m)
    options.setdefault("op", "masked")
    advice = advise([rows] * num_groups, n, k, hw, dtype, tiles, max_m=max_m, **options)
    regime = (
        "expected_m <= M*: weight streaming bounds every tile"
        if rows <= advice.best.ridge_m
        else "expected_m > M*: compute-bound, padding and waves decide"
    )
    return Advice(advice.ranked, f"{regime} (M* = {advice.best.ridge_m:.0f} rows); {advice.reason}")


def advise_problem(problem: Any, hw: Any, tiles: Iterable[tuple[int, int]] = DEFAULT_TILES, **options: Any) -> Advice:
    """Tile advice for a validated :class:`moe_hal.Problem`, without a device sync: contiguous
    and K-grouped calls read the host-side counts of their layout; a masked call uses
    :func:`advise_decode` with the layout's ``max_m`` and ``expected_m``. Backends resolve ``hw``
    once (:func:`resolve_hardware`) and pass the :class:`Hardware`; one call costs tens of
    microseconds of Python per tile for tens of groups."""
    layout = problem.layout
    dtype, out_dtype = problem.in_dtype, problem.out_dtype_name
    if problem.op == "masked":
        return advise_decode(
            layout.max_m,
            layout.expected_m,
            problem.num_groups,
            problem.n,
            problem.k,
            hw,
            dtype,
            tiles,
            out_dtype=out_dtype,
            **options,
        )
    if problem.op == "k_grouped":
        return advise(
            layout.counts_list,
            problem.n,
            None,
            hw,
            dtype,
            tiles,
            op="k_grouped",
            m=problem.m,
            out_dtype=out_dtype,
            accumulate=problem.c is not None,
            **options,
        )
    return advise(layout.counts_list, problem.n, problem.k, hw, dtype, tiles, out_dtype=out_dtype, **options)


def _reason(ranked: Sequence[Estimate]) -> str:
    best = ranked[0]
    text = (
        f"{best.block_m}x{best.block_n}: predicted {best.t_predicted * 1e6:.1f} us "
        f"({best.bound}-bound; roofline {best.t_roofline * 1e6:.1f} us)"
    )
    if len(ranked) == 1:
        return text + "; the only tile offered"
    tied = [e for e in ranked[1:] if e.t_predicted <= best.t_predicted * (1 + TIE_BAND)]
    if tied:
        names = ", ".join(f"{e.block_m}x{e.block_n} ({e.t_predicted * 1e6:.1f} us)" for e in tied)
        text += (
            f"; equivalent within the model's error (+-{TIE_BAND:.0%}): {names}, so the choice among "
            f"them is a tie-break"
        )
    second = ranked[1]
    if round(second.t_predicted, 12) > round(best.t_predicted, 12):
        return text + f"; next {second.block_m}x{second.block_n} at {second.t_predicted * 1e6:.1f} us"
    names = ("compute time", "waves", "last-wave utilisation", "BM+BN", "BM*BN", "BM")
    a, b = rank_key(best)[1:], rank_key(second)[1:]
    why = next((name for name, x, y in zip(names, a, b) if x != y), "tile order")
    return text + f"; ties with {second.block_m}x{second.block_n} on predicted time, broken by {why}"


def _tiles(tiles: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    try:
        out = [tuple(t) for t in tiles]
    except TypeError:
        raise ArgumentError("tiles", "an iterable of (block_m, block_n) pairs", tiles) from None
    if not out:
        raise ArgumentError("tiles", "at least one (block_m, block_n) pair", [])
    for t in out:
        if len(t) != 2:
            raise ArgumentError("tiles", "(block_m, block_n) pairs", t)
        positive_int(t[0], "block_m")
        positive_int(t[1], "block_n")
    return list(dict.fromkeys(out))  # duplicates would only repeat a row
