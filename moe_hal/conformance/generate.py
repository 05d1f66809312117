"""Pinned input generation for conformance cases.

Every random number comes from :class:`Stream`, a counter-based SplitMix64 generator written out
here with numpy integer arithmetic, so the inputs depend only on the case's seed and this file —
not on torch's or numpy's random-number implementations, which may change between releases. The
stream of each tensor is keyed by the case seed and the tensor's name, so adding a tensor to a
case never changes the others. Values are produced in float64 by IEEE-exact operations and rounded
once to the operand dtype; fp8 operands are quantized by :func:`moe_hal.conformance.oracle.quantize`.

Changing anything that alters the generated values requires bumping :data:`GENERATOR_VERSION`
(the manifest records it) and regenerating the stored data.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

GENERATOR_VERSION = 1

_MASK = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15


def _mix(z: np.ndarray) -> np.ndarray:
    """SplitMix64 output function on uint64 arrays (wrap-around arithmetic)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


class Stream:
    """Counter-based random stream for one named tensor of one case."""

    def __init__(self, seed: int, name: str):
        start = (int(seed) * _GAMMA + zlib.crc32(name.encode())) & _MASK
        self._state = int(_mix(np.array([start], dtype=np.uint64))[0])
        self._drawn = 0

    def bits(self, n: int) -> np.ndarray:
        """``n`` uint64 draws."""
        counter = np.arange(self._drawn + 1, self._drawn + n + 1, dtype=np.uint64)
        self._drawn += n
        return _mix(np.uint64(self._state) + counter * np.uint64(_GAMMA))

    def uniform(self, shape: Sequence[int]) -> np.ndarray:
        """float64 in [0, 1) with 53 random bits (exact)."""
        n = int(np.prod(shape)) if len(shape) else 1
        return ((self.bits(n) >> np.uint64(11)).astype(np.float64) * 2.0**-53).reshape(shape)

    def normal(self, shape: Sequence[int]) -> np.ndarray:
        """Approximately standard normal: the standardised sum of four uniforms (bounded by 2*sqrt(3))."""
        u = self.uniform((4, *shape))
        return (u[0] + u[1] + u[2] + u[3] - 2.0) * 1.7320508075688772

    def integers(self, n: int, high: int) -> np.ndarray:
        """``n`` ints in [0, high)."""
        return (self.bits(n) % np.uint64(high)).astype(np.int64)


@dataclass
class GeneratorSpec:
    """How a case's values are drawn (the manifest's ``generator`` mapping).

    ``dist``: ``normal`` or ``uniform`` (in [-1, 1)); ``scale``: multiplies every value.
    ``outliers``: ``{count, magnitude}``: that many elements of each operand multiplied by
    ``magnitude``. ``kblock_exponents``: fp8 only, operand values in reduction block ``i`` are
    multiplied by ``2 ** e[i % len(e)]`` so per-block scales differ. ``zero_blocks``: fp8 only,
    the fraction of scale blocks whose values are all zero. ``nonfinite``: explicit
    ``[operand, index..., "nan" | "inf" | "-inf"]`` entries.
    """

    seed: int
    dist: str = "normal"
    scale: float = 1.0
    outliers: dict[str, float] = field(default_factory=dict)
    kblock_exponents: tuple[int, ...] = ()
    zero_blocks: float = 0.0
    nonfinite: tuple[tuple[Any, ...], ...] = ()

    @classmethod
    def from_mapping(cls, m: dict[str, Any]) -> "GeneratorSpec":
        return cls(
            seed=int(m["seed"]),
            dist=m.get("dist", "normal"),
            scale=float(m.get("scale", 1.0)),
            outliers=dict(m.get("outliers", {})),
            kblock_exponents=tuple(m.get("kblock_exponents", ())),
            zero_blocks=float(m.get("zero_blocks", 0.0)),
            nonfinite=tuple(tuple(x) for x in m.get("nonfinite", ())),
        )


def values(gen: GeneratorSpec, name: str, shape: Sequence[int]) -> np.ndarray:
    """float64 values for operand ``name`` of ``shape`` (outliers and non-finite entries applied)."""
    stream = Stream(gen.seed, name)
    if gen.dist == "normal":
        x = stream.normal(shape)
    elif gen.dist == "uniform":
        x = stream.uniform(shape) * 2.0 - 1.0
    else:
        raise ValueError(f"generator.dist: expected 'normal' or 'uniform', got {gen.dist!r}")
    x = x * gen.scale
    count = int(gen.outliers.get("count", 0))
    if count and x.size:
        flat = x.reshape(-1)
        picks = Stream(gen.seed, name + ":outliers").integers(count, flat.size)
        flat[picks] = flat[picks] * float(gen.outliers.get("magnitude", 100.0))
    for entry in gen.nonfinite:
        operand, *index, kind = entry
        if operand == name:
            x[tuple(int(i) for i in index)] = {"nan": np.nan, "inf": np.inf, "-inf": -np.inf}[kind]
    return x


def shape_blocks(x: np.ndarray, gen: GeneratorSpec, name: str, block: tuple[int, int], k_axis: int) -> np.ndarray:
    """Apply the fp8 shaping of ``gen`` to float64 ``x`` before quantization: per-reduction-block
    exponents along ``k_axis`` (-1 or -2) and all-zero scale blocks."""
    x = x.copy()
    rows, cols = x.shape[-2:]
    br, bc = block
    if gen.kblock_exponents:
        size = bc if k_axis == -1 else br
        length = cols if k_axis == -1 else rows
        for i in range(-(-length // size)):
            factor = 2.0 ** gen.kblock_exponents[i % len(gen.kblock_exponents)]
            sl = slice(i * size, (i + 1) * size)
            if k_axis == -1:
                x[..., :, sl] *= factor
            else:
                x[..., sl, :] *= factor
    if gen.zero_blocks:
        sr, sc = -(-rows // br), -(-cols // bc)
        lead = x.shape[:-2]
        pick = Stream(gen.seed, name + ":zero_blocks").uniform((*lead, sr, sc)) < gen.zero_blocks
        for idx in zip(*np.nonzero(pick)):
            *g, i, j = idx
            x[(*g, slice(i * br, (i + 1) * br), slice(j * bc, (j + 1) * bc))] = 0.0
    return x


def power_of_two_scales(
    gen: GeneratorSpec, name: str, shape: Sequence[int], low: int = -20, high: int = 10
) -> np.ndarray:
    """float32 powers of two ``2**e`` with ``e`` drawn uniformly from [low, high]."""
    e = Stream(gen.seed, name).integers(int(np.prod(shape)), high - low + 1) + low
    return np.ldexp(np.ones(e.shape, dtype=np.float32), e.astype(np.int32)).astype(np.float32).reshape(shape)


def topk_ids(gen: GeneratorSpec, name: str, tokens: int, k: int, num_experts: int, skip_fraction: float) -> np.ndarray:
    """int32 ``[T, k]`` distinct experts per token, skewed towards low ids (``floor(u**2 * E)``);
    a ``skip_fraction`` of the slots are -1 (non-local experts)."""
    stream = Stream(gen.seed, name)
    out = np.empty((tokens, k), dtype=np.int32)
    for t in range(tokens):
        chosen: list[int] = []
        while len(chosen) < k:
            e = int(stream.uniform((1,))[0] ** 2 * num_experts)
            if e not in chosen:
                chosen.append(e)
        out[t] = chosen
    skip = Stream(gen.seed, name + ":skip").uniform((tokens, k)) < skip_fraction
    out[skip] = -1
    return out
