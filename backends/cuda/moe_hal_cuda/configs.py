"""Kernel launch configurations: a fixed table, no runtime autotuning.

The tile height ``BLOCK_M`` is chosen per call by the performance model's advisor
(:func:`moe_hal.perf.advise` / :func:`~moe_hal.perf.advise_decode`) among the heights this table
offers for the call's operation; everything else (``BLOCK_N``, ``BLOCK_K``, warps, pipeline
stages, the L2 swizzle group) is looked up here by ``(arch, dtype class, BLOCK_M)``.

Where the numbers come from: the shapes follow the public Triton grouped-GEMM designs this
project studied (torch inductor's ``triton_mm_grouped`` template prunes BLOCK_M by average rows
per group — pytorch/pytorch ``torch/_inductor/kernel/templates/triton_mm_grouped.py.jinja``, torch 2.13.0;
vLLM's ``fused_moe`` defaults use BLOCK_K = 128 for block-fp8 and 4 warps / 3-4 stages —
vllm-project/vllm ``vllm/model_executor/layers/fused_moe/fused_moe.py``, ``get_default_config``)
and the shared-memory budget of one SM (227 KiB on
SM90/SM100: stages x (BM + BN) x BK x bytes per element must fit), adjusted until every entry
compiles for its target without register spills and with both MMA operands fed by async copies
(``backends/cuda/scripts/compile_check.py``, run in CI, fails otherwise). They have **not** been
tuned on hardware: ``backends/cuda/scripts/gpu_check.py`` times every entry on the device and
reports the best fixed tile against the advisor's choice.

``BLOCK_K`` of an fp8 entry divides 128, the scale block along K, so that one K step never
straddles two scales.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

ARCHS = ("sm90", "sm100")

#: Tile heights offered to the advisor per operation. Contiguous and K-grouped calls carry many
#: rows per group; masked decode calls carry few, so smaller heights are offered there.
HEIGHTS: dict[str, tuple[int, ...]] = {
    "contiguous": (64, 128, 256),
    "masked": (16, 32, 64, 128),
    "k_grouped": (64, 128),
}


@dataclass(frozen=True)
class KernelConfig:
    """One Triton launch configuration. ``group_m``: tiles of consecutive rows that share a band
    of the grid, so that their B columns stay in L2 (the classic grouped-order swizzle)."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    group_m: int = 8

    @property
    def tile(self) -> tuple[int, int]:
        return (self.block_m, self.block_n)

    def label(self) -> str:
        return f"BM={self.block_m} BN={self.block_n} BK={self.block_k} warps={self.num_warps} stages={self.num_stages}"

    def as_dict(self) -> dict:
        return asdict(self)


def _table() -> dict[tuple[str, str, int], KernelConfig]:
    # (arch, dtype class) -> {BLOCK_M: (BLOCK_N, BLOCK_K, warps, stages)}. Every entry compiles
    # without register spills for every call the backends launch with it, and feeds both MMA
    # operands through async copies (backends/cuda/scripts/compile_check.py checks both in CI).
    # Why entries differ by arch: SM90 fp8 scales each K step's wgmma result in registers
    # (a second accumulator-sized tile), so its fp8 tiles are half as wide as SM100's, whose
    # block-scaled MMA keeps the accumulator in TMEM; SM100's TMEM-to-register epilogue of an fp32
    # output needs 8 warps (or a narrower tile) to stay within 255 registers per thread.
    rows = {
        ("sm90", "16bit"): {
            16: (64, 128, 4, 4),
            32: (64, 64, 4, 4),
            64: (128, 64, 4, 4),
            128: (256, 64, 8, 3),
            256: (128, 64, 8, 3),
        },
        # No 256-row fp8 tile on SM90: on the H200 it was the slowest fp8 tile of every contiguous
        # call timed (bench/results/gpu_check_h200.json, fp8_tile_sweep), up to 2.1x the best.
        ("sm90", "fp8"): {
            16: (64, 128, 4, 4),
            32: (64, 128, 4, 4),
            64: (128, 128, 4, 4),
            128: (64, 128, 4, 4),
        },
        ("sm100", "16bit"): {
            16: (64, 128, 4, 4),
            32: (64, 128, 4, 4),
            64: (128, 64, 8, 4),
            128: (128, 64, 8, 4),
            256: (64, 64, 8, 3),
        },
        # 128+ rows only: smaller tiles would not get the block-scaled MMA (see candidates()).
        ("sm100", "fp8"): {
            128: (128, 128, 8, 4),
            256: (128, 128, 8, 3),
        },
    }
    return {
        (arch, cls, bm): KernelConfig(bm, bn, bk, warps, stages)
        for (arch, cls), entries in rows.items()
        for bm, (bn, bk, warps, stages) in entries.items()
    }


TABLE: dict[tuple[str, str, int], KernelConfig] = _table()


def dtype_class(dtype_name: str) -> str:
    """``"fp8"`` for ``fp8_e4m3`` operands, ``"16bit"`` for bf16/fp16."""
    return "fp8" if dtype_name.startswith("fp8") else "16bit"


def lookup(arch: str, dtype_name: str, block_m: int) -> KernelConfig:
    """The table entry for ``(arch, dtype class, block_m)``; KeyError names what exists."""
    key = (arch, dtype_class(dtype_name), block_m)
    if key not in TABLE:
        have = sorted(bm for (a, c, bm) in TABLE if a == arch and c == key[1])
        raise KeyError(f"no kernel config for {key}; BLOCK_M in {have}")
    return TABLE[key]


#: Rows below which SM100's block-scaled MMA (tcgen05 ``kind::mxf8f6f4.block_scale``, M = 128)
#: cannot serve a tile: Triton would lower ``tl.dot_scaled`` to a bf16 MMA on operands rescaled in
#: registers. The SM100 fp8 rows of the table start here, so no call gets a software-scaled tile
#: (the compile check fails if an SM100 fp8 variant lacks the block-scaled MMA).
SM100_BLOCK_SCALED_MIN_ROWS = 128

#: The tile height used when the advisor cannot answer, per operation (the nearest height the
#: table has for the call's architecture and dtype is taken).
DEFAULT_HEIGHT = {"contiguous": 128, "masked": 64, "k_grouped": 128}


def candidates(arch: str, dtype_name: str, op: str) -> list[KernelConfig]:
    """Every configuration the advisor may choose from for ``op``: the heights :data:`HEIGHTS`
    offers that the table has for ``(arch, dtype class)`` — SM100 fp8 has 128+ rows only, masked
    decode included (a 128-row tile of a few real rows: the decode call is bound by the weights'
    bandwidth, not by the MMA)."""
    cls = dtype_class(dtype_name)
    return [TABLE[(arch, cls, bm)] for bm in HEIGHTS[op] if (arch, cls, bm) in TABLE]


def default(arch: str, dtype_name: str, op: str) -> KernelConfig:
    """The candidate whose height is nearest :data:`DEFAULT_HEIGHT` (the fallback tile)."""
    return min(candidates(arch, dtype_name, op), key=lambda c: abs(c.block_m - DEFAULT_HEIGHT[op]))
