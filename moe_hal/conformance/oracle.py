"""The suite's own oracle: plain numpy implementations of everything the conformance cases check.

Nothing here calls moe_hal's kernels, layouts or quantizer: golden data must come from an
implementation independent of every backend under test (the ``reference`` backend included,
which :mod:`moe_hal.conformance.regen` cross-checks against this module).

Products are accumulated in float64 in a fixed order (``k = 0, 1, ...`` one elementwise multiply
and one add at a time), never through BLAS: IEEE-754 makes every such step correctly rounded on
every machine, so regenerating the goldens reproduces them bit for bit. Byte-level layouts
(fp8 codes, UE8M0 packing, TMA-aligned strides) are written out from their definitions with
integer arithmetic.

Arrays are numpy; shapes follow :mod:`moe_hal.problem` (``b`` is always the logical ``[G, N, K]``).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

FP8_MAX = 448.0
#: DeepGEMM's amax floor for an all-zero block (see moe_hal.quant.AMAX_FLOOR; restated, not imported).
AMAX_FLOOR = 1e-4


# -- fp8 e4m3fn -----------------------------------------------------------------------------------


def _e4m3_table() -> np.ndarray:
    """float64 value of each of the 256 e4m3fn codes (NaN for 0x7F and 0xFF; there is no inf)."""
    values = np.empty(256, dtype=np.float64)
    for code in range(256):
        sign = -1.0 if code & 0x80 else 1.0
        exponent = (code >> 3) & 0xF
        mantissa = code & 0x7
        if exponent == 0xF and mantissa == 0x7:
            values[code] = np.nan
        elif exponent == 0:
            values[code] = sign * (mantissa / 8.0) * 2.0**-6
        else:
            values[code] = sign * (1.0 + mantissa / 8.0) * 2.0 ** (exponent - 7)
    return values


E4M3 = _e4m3_table()
#: Non-negative finite values in code order 0x00..0x7E (monotonic in the code).
_E4M3_POSITIVE = E4M3[:0x7F]


def e4m3_decode(codes: np.ndarray) -> np.ndarray:
    """float64 values of uint8 e4m3fn codes."""
    return E4M3[codes.astype(np.uint8)]


def e4m3_encode(x: np.ndarray) -> np.ndarray:
    """uint8 e4m3fn codes of float32 values already within ``[-448, 448]``: round to nearest,
    ties to the even code; the sign of zero is kept; NaN gives 0x7F."""
    x = np.asarray(x, dtype=np.float32)
    mag = np.abs(x).astype(np.float64)
    hi = np.searchsorted(_E4M3_POSITIVE, mag, side="left").clip(0, 0x7E)
    lo = (hi - 1).clip(0, 0x7E)
    d_hi = np.abs(_E4M3_POSITIVE[hi] - mag)
    d_lo = np.abs(mag - _E4M3_POSITIVE[lo])
    pick_lo = (d_lo < d_hi) | ((d_lo == d_hi) & (lo % 2 == 0))
    code = np.where(pick_lo, lo, hi).astype(np.uint8)
    code = np.where(np.signbit(x), code | 0x80, code).astype(np.uint8)
    return np.where(np.isnan(x), np.uint8(0x7F), code).astype(np.uint8)


def ceil_pow2(scale: np.ndarray) -> np.ndarray:
    """float32 scales rounded up to powers of two through their bits: exponent byte plus one when
    the mantissa is non-zero, clamped to [1, 254] (DeepGEMM's ``ceil_to_ue8m0``)."""
    bits = np.asarray(scale, dtype=np.float32).view(np.uint32).astype(np.int64)
    exponent = (bits >> 23) & 0xFF
    exponent = exponent + ((bits & 0x7FFFFF) != 0)
    exponent = exponent.clip(1, 254)
    return (exponent.astype(np.uint32) << 23).view(np.float32)


def quantize(x: np.ndarray, block: tuple[int, int], ue8m0: bool) -> tuple[np.ndarray, np.ndarray]:
    """Block fp8 quantization over the last two dims, in float32 like DeepGEMM's recipe:
    ``scale = max(amax, 1e-4) / 448`` per block (optionally rounded up to a power of two), then
    ``code = e4m3(clamp(x / scale, -448, 448))``. Returns (uint8 codes shaped like x, float32 scales)."""
    x = np.asarray(x, dtype=np.float32)
    *lead, rows, cols = x.shape
    br, bc = block
    sr, sc = -(-rows // br), -(-cols // bc)
    scale = np.empty((*lead, sr, sc), dtype=np.float32)
    codes = np.empty(x.shape, dtype=np.uint8)
    floor = np.float32(AMAX_FLOOR)
    for i in range(sr):
        for j in range(sc):
            blk = x[..., i * br : (i + 1) * br, j * bc : (j + 1) * bc]
            amax = np.abs(blk).max(axis=(-2, -1)) if blk.size else np.zeros(lead, np.float32)
            s = (np.maximum(amax, floor) / np.float32(FP8_MAX)).astype(np.float32)
            if ue8m0:
                s = ceil_pow2(s)
            scale[..., i, j] = s
            q = (blk / np.asarray(s, np.float32)[..., None, None]).astype(np.float32)
            q = np.clip(q, np.float32(-FP8_MAX), np.float32(FP8_MAX))
            codes[..., i * br : (i + 1) * br, j * bc : (j + 1) * bc] = e4m3_encode(q)
    return codes, scale


def expand_scale(scale: np.ndarray, block: tuple[int, int], shape: Sequence[int]) -> np.ndarray:
    """Scales repeated per block up to ``shape`` (the data's shape)."""
    rows, cols = shape[-2:]
    s = np.repeat(scale, block[0], axis=-2)[..., :rows, :]
    return np.repeat(s, block[1], axis=-1)[..., :cols]


def dequantize(codes: np.ndarray, scale: np.ndarray, block: tuple[int, int]) -> np.ndarray:
    """float64 ``e4m3(code) * scale`` per block (exact: 4-bit by 24-bit significands)."""
    return e4m3_decode(codes) * expand_scale(scale.astype(np.float64), block, codes.shape)


# -- grouped products ------------------------------------------------------------------------------


def segment_starts(counts: Sequence[int], alignment: int) -> list[int]:
    """First row of each group: group g starts at ``align(end of g-1, alignment)``."""
    starts, end = [], 0
    for c in counts:
        start = -(-end // alignment) * alignment
        starts.append(start)
        end = start + c
    return starts


def aligned_rows(counts: Sequence[int], alignment: int) -> int:
    """``align(end of the last group, alignment)``: the default row count of a layout."""
    starts = segment_starts(counts, alignment)
    end = starts[-1] + counts[-1] if starts else 0
    return -(-end // alignment) * alignment


def _dot_rows(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``a[R, K] @ w[N, K].T`` in float64, accumulated over k in order with separate rounded
    multiplies and adds (no BLAS, no fused multiply-add)."""
    acc = np.zeros((a.shape[0], w.shape[0]), dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        for k in range(a.shape[1]):
            acc += np.multiply.outer(a[:, k], w[:, k])
    return acc


def contiguous(a: np.ndarray, b: np.ndarray, counts: Sequence[int], alignment: int, num_rows: int) -> np.ndarray:
    """``out[num_rows, N]``: rows of group g are ``a[r] @ b[g].T``; rows of no group are 0."""
    out = np.zeros((num_rows, b.shape[1]), dtype=np.float64)
    for g, (start, count) in enumerate(zip(segment_starts(counts, alignment), counts)):
        if count:
            out[start : start + count] = _dot_rows(a[start : start + count], b[g])
    return out


def masked(a: np.ndarray, b: np.ndarray, masked_m: Sequence[int]) -> np.ndarray:
    """``out[G, max_m, N]``: rows below ``masked_m[g]`` are ``a[g, r] @ b[g].T``; the others 0."""
    groups, max_m, _ = a.shape
    out = np.zeros((groups, max_m, b.shape[1]), dtype=np.float64)
    for g, rows in enumerate(masked_m):
        if rows:
            out[g, :rows] = _dot_rows(a[g, :rows], b[g])
    return out


def k_grouped(a: np.ndarray, b: np.ndarray, counts: Sequence[int], alignment: int, c: np.ndarray | None) -> np.ndarray:
    """``out[G, M, N] = c[g] + sum over the group's tokens t (in order) of outer(a[t], b[t])``."""
    groups = len(counts)
    out = np.zeros((groups, a.shape[1], b.shape[1]), dtype=np.float64) if c is None else c.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        for g, (start, count) in enumerate(zip(segment_starts(counts, alignment), counts)):
            for t in range(start, start + count):
                out[g] += np.multiply.outer(a[t], b[t])
    return out


# -- layouts and indices ---------------------------------------------------------------------------


def m_indices(counts: Sequence[int], alignment: int, num_rows: int) -> np.ndarray:
    """int32 ``[num_rows]``: the group of each row, -1 on rows of no group."""
    out = np.full(num_rows, -1, dtype=np.int32)
    for g, (start, count) in enumerate(zip(segment_starts(counts, alignment), counts)):
        out[start : start + count] = g
    return out


def psum(counts: Sequence[int], alignment: int) -> np.ndarray:
    """int32 ``[G]``: exclusive end row of each group (DeepGEMM's psum)."""
    return np.array([s + c for s, c in zip(segment_starts(counts, alignment), counts)], dtype=np.int32)


def dispatch(topk_ids: np.ndarray, num_experts: int, alignment: int) -> dict[str, np.ndarray]:
    """Contiguous routing by straightforward loops: expert g's segment holds its slots in
    increasing flat slot order ``t * k + j``; ids of -1 are skipped."""
    tokens, k = topk_ids.shape
    slots: list[list[int]] = [[] for _ in range(num_experts)]
    for t in range(tokens):
        for j in range(k):
            e = int(topk_ids[t, j])
            if e >= 0:
                slots[e].append(t * k + j)
    counts = [len(s) for s in slots]
    starts = segment_starts(counts, alignment)
    rows = aligned_rows(counts, alignment)
    slot_of_row = np.full(rows, -1, dtype=np.int64)
    row_of_slot = np.full(tokens * k, -1, dtype=np.int64)
    for e in range(num_experts):
        for i, s in enumerate(slots[e]):
            slot_of_row[starts[e] + i] = s
            row_of_slot[s] = starts[e] + i
    return {
        "counts": np.array(counts, dtype=np.int32),
        "psum": psum(counts, alignment),
        "row_of_slot": row_of_slot.reshape(tokens, k),
        "slot_of_row": slot_of_row,
    }


def dispatch_masked(topk_ids: np.ndarray, num_experts: int, max_m: int) -> dict[str, np.ndarray]:
    """Masked routing with the ``drop`` policy: each expert keeps its first ``max_m`` slots in flat
    slot order; row ``m`` of expert g is flat row ``g * max_m + m``."""
    tokens, k = topk_ids.shape
    filled = [0] * num_experts
    slot_of_row = np.full((num_experts, max_m), -1, dtype=np.int64)
    row_of_slot = np.full(tokens * k, -1, dtype=np.int64)
    dropped = 0
    for t in range(tokens):
        for j in range(k):
            e = int(topk_ids[t, j])
            if e < 0:
                continue
            if filled[e] == max_m:
                dropped += 1
                continue
            slot_of_row[e, filled[e]] = t * k + j
            row_of_slot[t * k + j] = e * max_m + filled[e]
            filled[e] += 1
    return {
        "masked_m": np.array(filled, dtype=np.int32),
        "row_of_slot": row_of_slot.reshape(tokens, k),
        "slot_of_row": slot_of_row,
        "dropped": np.array([dropped], dtype=np.int64),
    }


def gather_rows(hidden: np.ndarray, slot_of_row: np.ndarray, k: int) -> np.ndarray:
    """Rows of ``hidden`` (any dtype) picked by source token ``slot // k``; zero where the slot is -1."""
    flat = slot_of_row.reshape(-1)
    out = np.zeros((flat.size, hidden.shape[1]), dtype=hidden.dtype)
    for r, s in enumerate(flat):
        if s >= 0:
            out[r] = hidden[s // k]
    return out.reshape(*slot_of_row.shape, hidden.shape[1])


# -- physical scale layouts --------------------------------------------------------------------------
# Each returns (span, shape, strides): ``span`` is the flat storage from the first to the last
# element of the strided result, padding included, exactly as the bytes must be.


def _strided(values: np.ndarray, mn_stride: int, dtype) -> tuple[np.ndarray, tuple[int, ...], tuple[int, ...]]:
    """Lay ``values[.., MN, C]`` out MN-major with column stride ``mn_stride`` (zeros in padding)."""
    lead = values.shape[:-2]
    mn, cols = values.shape[-2:]
    groups = int(np.prod(lead)) if lead else 1
    group_stride = mn_stride * cols
    strides = ((group_stride,) if lead else ()) + (1, mn_stride)
    storage = np.zeros(groups * group_stride, dtype=dtype)
    flat_values = values.reshape(groups, mn, cols)
    for g in range(groups):
        for c in range(cols):
            base = g * group_stride + c * mn_stride
            storage[base : base + mn] = flat_values[g, :, c]
    if values.size == 0:
        return storage[:0], tuple(values.shape), strides
    last = (groups - 1) * group_stride + (cols - 1) * mn_stride + (mn - 1)
    return storage[: last + 1], tuple(values.shape), strides


def _exponent_bytes(scale: np.ndarray) -> np.ndarray:
    return ((np.asarray(scale, np.float32).view(np.uint32) >> 23) & 0xFF).astype(np.int64)


def _pack(exponents: np.ndarray, per_word: int) -> np.ndarray:
    """Little-endian along the last dim: byte j of word i is exponents[..., per_word * i + j]."""
    sk = exponents.shape[-1]
    words = -(-sk // per_word)
    out = np.zeros((*exponents.shape[:-1], words), dtype=np.int64)
    for i in range(words):
        for j in range(per_word):
            if per_word * i + j < sk:
                out[..., i] |= exponents[..., per_word * i + j] << (8 * j)
    bits = 8 * per_word
    return np.where(out >= 2 ** (bits - 1), out - 2**bits, out)


def tma_align_mn_major(scale: np.ndarray):
    """SM90: fp32 ``[.., MN, SK]`` MN-major, column stride ``align(MN, 4)``."""
    mn = scale.shape[-2]
    return _strided(scale.astype(np.float32), -(-mn // 4) * 4, np.float32)


def pack_ue8m0(scale: np.ndarray):
    """SM100: int32 words of four UE8M0 exponents, MN-major, column stride ``align(MN, 4)``."""
    mn = scale.shape[-2]
    return _strided(_pack(_exponent_bytes(scale), 4).astype(np.int32), -(-mn // 4) * 4, np.int32)


def pack_ue8m0x2(scale: np.ndarray):
    """Ascend 950 port: int16 words of two UE8M0 exponents, MN-major, column stride MN."""
    mn = scale.shape[-2]
    return _strided(_pack(_exponent_bytes(scale), 2).astype(np.int16), mn, np.int16)
