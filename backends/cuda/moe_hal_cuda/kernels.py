"""The Triton kernels: M-grouped contiguous, M-grouped masked and K-grouped GEMM.

Every kernel computes ``a @ b.T`` products with fp32 accumulation and casts once when storing.
Operands are bf16, fp16 or fp8 e4m3; fp8 operands carry block scales, read in one of two physical
formats chosen by the ``SCALES`` constexpr (values named in :mod:`moe_hal_cuda.scales`):

* ``SCALES_NONE`` (0): plain 16-bit operands.
* ``SCALES_FP32`` (1): SM90 — fp32 scales, activation side MN-major with a TMA-aligned stride
  (:func:`moe_hal.quant.tma_align_mn_major`), weight side ``[G, ceil(N/bn), ceil(K/128)]``.
* ``SCALES_UE8M0`` (2): SM100 — int32 words holding four UE8M0 exponent bytes, little-endian
  along K, MN-major (:func:`moe_hal.quant.pack_ue8m0`); weight scales broadcast to one per row
  of ``b``. The kernels decode the byte of K-block ``kb`` as ``(word >> 8 * (kb % 4)) & 0xFF``
  and rebuild the fp32 ``2 ** (byte - 127)`` by putting the byte in the exponent field.

With scales, each ``BLOCK_K`` step (which divides 128, the scale block along K) is one
``tl.dot`` whose fp32 result is multiplied by the row scale of ``a`` and the column scale of ``b``
before it joins the accumulator — DeepGEMM's promotion of fp8 partial sums into fp32 registers.

**Interpreter.** :func:`moe_hal_cuda.mode.configure_triton` runs before ``triton`` decorates
anything here, so ``MOE_HAL_CUDA_INTERPRET=1`` makes every kernel below interpreted. The
interpreter computes bf16 arithmetic on raw bit patterns (reference/torch_and_cuda_peers.md
§3.3), so when :data:`INTERPRET` is true the ``INTERPRET`` constexpr upcasts operands to fp32
right after loading; on a GPU it is false and the tensor cores get bf16/fp16/fp8 operands. The
interpreter's fp32->bf16 store truncates instead of rounding to nearest (1 ulp at most).

Indexing uses int64 wherever a product of an index and a stride can pass 2**31 (expert weights of
DeepSeek-V3 size exceed it summed over experts).
"""

from __future__ import annotations

from . import mode

INTERPRET: bool = mode.configure_triton()

import triton  # noqa: E402 - TRITON_INTERPRET must be set before triton decorates the kernels
import triton.language as tl  # noqa: E402


@triton.jit
def _swizzle(pid, num_tiles, num_n, GROUP_M: tl.constexpr):
    """Map a linear program id to (row tile, column tile) in grouped order: GROUP_M consecutive
    row tiles sweep all column tiles together, so the B columns they share stay in L2."""
    per_band = GROUP_M * num_n
    band = pid // per_band
    first = band * GROUP_M
    height = tl.minimum(num_tiles - first, GROUP_M)
    tile = first + (pid % per_band) % height
    n_tile = (pid % per_band) // height
    return tile, n_tile


@triton.jit
def _scale(ptr, idx, kb, stride_idx, stride_k, mask, SCALES: tl.constexpr):
    """Scales of K-block ``kb`` for the rows ``idx`` (fp32 vector; 0 where ``mask`` is false)."""
    if SCALES == 2:
        word = tl.load(ptr + idx * stride_idx + (kb // 4) * stride_k, mask=mask, other=0)
        exponent = (word >> ((kb % 4) * 8)) & 0xFF
        return (exponent << 23).to(tl.float32, bitcast=True)
    else:
        return tl.load(ptr + idx * stride_idx + kb * stride_k, mask=mask, other=0.0)


@triton.jit
def _accumulate(acc, a, b, k0, sa_ptr, sa_idx, sa_stride_idx, sa_stride_k, sa_mask,
                sb_ptr, sb_idx, sb_stride_idx, sb_stride_k, sb_mask,
                SCALES: tl.constexpr, INTERPRET: tl.constexpr):
    """``acc += a @ b`` for one K step; with scales, ``acc += (a @ b) * sa[:, None] * sb[None, :]``."""
    if INTERPRET:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    if SCALES == 0:
        acc = tl.dot(a, b, acc)
    else:
        kb = k0 // 128
        sa = _scale(sa_ptr, sa_idx, kb, sa_stride_idx, sa_stride_k, sa_mask, SCALES)
        sb = _scale(sb_ptr, sb_idx, kb, sb_stride_idx, sb_stride_k, sb_mask, SCALES)
        acc += tl.dot(a, b) * sa[:, None] * sb[None, :]
    return acc


@triton.jit
def contiguous_kernel(
    a_ptr, b_ptr, out_ptr, sa_ptr, sb_ptr,
    tile_group_ptr, tile_start_ptr, tile_end_ptr, m_indices_ptr,
    num_tiles, num_rows, N, K,
    stride_am, stride_ak, stride_bg, stride_bn, stride_bk, stride_om, stride_on,
    stride_sa_m, stride_sa_k, stride_sb_g, stride_sb_n, stride_sb_k,
    SB_ROWS: tl.constexpr, SCALES: tl.constexpr, USE_SCHEDULE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """M-grouped contiguous: ``out[r] = a[r] @ b[group(r)].T``; rows of no group get zeros.

    Row tiles come either from a host-built schedule (``USE_SCHEDULE``: per tile its group, first
    row and end row; gap tiles have group -1) or from the device ``m_indices`` (tile ``t`` covers
    rows ``[t*BLOCK_M, (t+1)*BLOCK_M)``, its group is the largest id among them, and rows whose
    id differs are no-group rows; the host guarantees ``BLOCK_M`` divides the alignment, so a tile
    never holds two groups). ``SB_ROWS``: rows of ``b`` per weight scale (128 or 1).
    """
    num_n = (N + BLOCK_N - 1) // BLOCK_N
    tile, n_tile = _swizzle(tl.program_id(0), num_tiles, num_n, GROUP_M)
    if USE_SCHEDULE:
        g = tl.load(tile_group_ptr + tile)
        row0 = tl.load(tile_start_ptr + tile)
        row_end = tl.load(tile_end_ptr + tile)
        rows = row0 + tl.arange(0, BLOCK_M)
        row_in_tile = rows < row_end
        row_ok = row_in_tile
    else:
        rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
        row_in_tile = rows < num_rows
        ids = tl.load(m_indices_ptr + rows, mask=row_in_tile, other=-1)
        g = tl.max(ids, axis=0)
        row_ok = ids == g
    rows64 = rows.to(tl.int64)
    cols = n_tile * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    g_safe = tl.maximum(g, 0).to(tl.int64)
    b_base = b_ptr + g_safe * stride_bg
    sb_base = sb_ptr + g_safe * stride_sb_g
    sb_idx = cols // SB_ROWS
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_steps = (K + BLOCK_K - 1) // BLOCK_K * (g >= 0).to(tl.int32)  # gap tiles skip the products
    for step in range(0, k_steps):
        k0 = step * BLOCK_K
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        a = tl.load(a_ptr + rows64[:, None] * stride_am + ks[None, :] * stride_ak,
                    mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(b_base + cols[None, :] * stride_bn + ks[:, None] * stride_bk,
                    mask=col_ok[None, :] & k_ok[:, None], other=0.0)
        acc = _accumulate(acc, a, b, k0, sa_ptr, rows64, stride_sa_m, stride_sa_k, row_ok,
                          sb_base, sb_idx, stride_sb_n, stride_sb_k, col_ok, SCALES, INTERPRET)
    out = out_ptr + rows64[:, None] * stride_om + cols[None, :] * stride_on
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=row_in_tile[:, None] & col_ok[None, :])


@triton.jit
def masked_kernel(
    a_ptr, b_ptr, out_ptr, sa_ptr, sb_ptr, masked_m_ptr,
    max_m, N, K,
    stride_ag, stride_am, stride_ak, stride_bg, stride_bn, stride_bk, stride_og, stride_om, stride_on,
    stride_sa_g, stride_sa_m, stride_sa_k, stride_sb_g, stride_sb_n, stride_sb_k,
    SB_ROWS: tl.constexpr, SCALES: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """M-grouped masked: ``out[g, r] = a[g, r] @ b[g].T`` for ``r < masked_m[g]``.

    The grid covers every ``(g, row tile, column tile)`` from host-known sizes (G, max_m, N);
    each program reads ``masked_m[g]`` on the device and returns at once when its row tile starts
    at or past it. Rows ``>= masked_m[g]`` are never stored to. No host synchronisation, so the
    launch can be captured in a CUDA graph and replayed with new ``masked_m`` values.
    """
    m_tiles = (max_m + BLOCK_M - 1) // BLOCK_M
    num_n = (N + BLOCK_N - 1) // BLOCK_N
    num_tiles = tl.num_programs(0) // num_n
    tile, n_tile = _swizzle(tl.program_id(0), num_tiles, num_n, GROUP_M)
    g = tile // m_tiles
    row0 = (tile % m_tiles) * BLOCK_M
    valid = tl.minimum(tl.load(masked_m_ptr + g), max_m)
    if row0 >= valid:
        return
    g64 = g.to(tl.int64)
    rows = row0 + tl.arange(0, BLOCK_M)
    row_ok = rows < valid
    cols = n_tile * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    a_base = a_ptr + g64 * stride_ag
    b_base = b_ptr + g64 * stride_bg
    sa_base = sa_ptr + g64 * stride_sa_g
    sb_base = sb_ptr + g64 * stride_sb_g
    sb_idx = cols // SB_ROWS
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        a = tl.load(a_base + rows[:, None] * stride_am + ks[None, :] * stride_ak,
                    mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(b_base + cols[None, :] * stride_bn + ks[:, None] * stride_bk,
                    mask=col_ok[None, :] & k_ok[:, None], other=0.0)
        acc = _accumulate(acc, a, b, k0, sa_base, rows, stride_sa_m, stride_sa_k, row_ok,
                          sb_base, sb_idx, stride_sb_n, stride_sb_k, col_ok, SCALES, INTERPRET)
    out = out_ptr + g64 * stride_og + rows[:, None] * stride_om + cols[None, :] * stride_on
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def k_grouped_kernel(
    a_ptr, b_ptr, c_ptr, out_ptr, sa_ptr, sb_ptr, starts_ptr, ends_ptr,
    M, N,
    stride_at, stride_am, stride_bt, stride_bn,
    stride_cg, stride_cm, stride_cn, stride_og, stride_om, stride_on,
    stride_sa_m, stride_sa_k, stride_sb_n, stride_sb_k,
    HAS_C: tl.constexpr, SCALES: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """K-grouped: ``out[g] = (c[g] if HAS_C else 0) + a[s_g:e_g].T @ b[s_g:e_g]``.

    ``a[T, M]``, ``b[T, N]``; group ``g`` owns tokens ``[starts[g], ends[g])`` (device int32).
    Every ``(g, row tile, column tile)`` is a program, empty groups included, so an empty group
    stores ``c[g]`` or zeros. With scales (one per 128 tokens and column, absolute along T), the
    token loop starts at a multiple of ``BLOCK_K`` (a divisor of 128) so that one step never
    straddles two scale blocks; tokens outside the group are masked. ``out`` may be ``c``.
    """
    m_tiles = (M + BLOCK_M - 1) // BLOCK_M
    num_n = (N + BLOCK_N - 1) // BLOCK_N
    num_tiles = tl.num_programs(0) // num_n
    tile, n_tile = _swizzle(tl.program_id(0), num_tiles, num_n, GROUP_M)
    g = tile // m_tiles
    g64 = g.to(tl.int64)
    rows = (tile % m_tiles) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    cols = n_tile * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    start = tl.load(starts_ptr + g)
    end = tl.load(ends_ptr + g)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if HAS_C:
        c = tl.load(c_ptr + g64 * stride_cg + rows[:, None] * stride_cm + cols[None, :] * stride_cn,
                    mask=row_ok[:, None] & col_ok[None, :], other=0.0)
        acc += c.to(tl.float32)
    first = start
    if SCALES != 0:
        first = (start // BLOCK_K) * BLOCK_K
    for t0 in range(first, end, BLOCK_K):
        ts = t0 + tl.arange(0, BLOCK_K)
        t_ok = (ts >= start) & (ts < end)
        ts64 = ts.to(tl.int64)
        a = tl.load(a_ptr + ts64[:, None] * stride_at + rows[None, :] * stride_am,
                    mask=t_ok[:, None] & row_ok[None, :], other=0.0)
        b = tl.load(b_ptr + ts64[:, None] * stride_bt + cols[None, :] * stride_bn,
                    mask=t_ok[:, None] & col_ok[None, :], other=0.0)
        acc = _accumulate(acc, tl.trans(a), b, t0, sa_ptr, rows, stride_sa_m, stride_sa_k, row_ok,
                          sb_ptr, cols, stride_sb_n, stride_sb_k, col_ok, SCALES, INTERPRET)
    out = out_ptr + g64 * stride_og + rows[:, None] * stride_om + cols[None, :] * stride_on
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])
