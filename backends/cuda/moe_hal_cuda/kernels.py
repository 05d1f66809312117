"""The Triton kernels: M-grouped contiguous, M-grouped masked and K-grouped GEMM.

Every kernel computes ``a @ b.T`` products with fp32 accumulation and casts once when storing.
Operands are bf16, fp16 or fp8 e4m3; fp8 operands carry block scales (one per 128 along K),
read in one of two physical formats chosen by the ``SCALES`` constexpr (values named in
:mod:`moe_hal_cuda.scales`):

* ``SCALES_NONE`` (0): plain 16-bit operands, ``tl.dot``.
* ``SCALES_FP32`` (1): SM90 — fp32 scales, activation side MN-major with a TMA-aligned stride
  (:func:`moe_hal.quant.tma_align_mn_major`), weight side ``[G, ceil(N/bn), ceil(K/128)]``. Each
  ``BLOCK_K`` step (a divisor of 128) is one ``tl.dot`` (wgmma) whose fp32 result is multiplied by
  the row scale of ``a`` and the column scale of ``b`` before it joins the accumulator —
  DeepGEMM's promotion of fp8 partial sums into fp32 registers (Hopper has no block-scaled MMA).
* ``SCALES_UE8M0`` (2): SM100 — int32 words holding four UE8M0 exponent bytes, little-endian
  along K, MN-major (:func:`moe_hal.quant.pack_ue8m0`); weight scales broadcast to one per row of
  ``b``. The kernels pick byte ``kb % 4`` of word ``kb // 4`` and hand it, repeated over the four
  32-wide sub-blocks of the 128-wide scale block, to ``tl.dot_scaled`` — on sm100a the hardware
  block-scaled MMA (``tcgen05.mma ... kind::mxf8f6f4.block_scale``), accumulator in TMEM.

**Schedules without the host.** No kernel needs a host-built table, so no launch reads a device
value on the host or waits for a copy:

* contiguous: each program finds its row tile by scanning the layout's device ``psum`` (chunks of
  ``GROUP_CHUNK`` groups, vectorised); a group's rows run from ``align(psum[g-1])`` to
  ``align(psum[g])`` (the last group to the end of ``a``), so the tiles cover every row once and
  rows past ``psum[g]`` are stored as zeros. The grid is the host's upper bound
  ``cdiv(num_rows, BLOCK_M) + G`` row tiles; programs past the real count return at once.
* masked: a persistent grid (a few programs per SM) walks the tiles that exist,
  ``sum_g cdiv(masked_m[g], BLOCK_M)`` of them, read from the device — work follows the real rows,
  not ``max_m``.
* K-grouped: one program per (group, row tile, column tile); group bounds come from the device.

**Interpreter.** :func:`moe_hal_cuda.mode.configure_triton` runs before ``triton`` decorates
anything here, so ``MOE_HAL_CUDA_INTERPRET=1`` makes every kernel below interpreted. The
interpreter computes bf16 arithmetic on raw bit patterns (triton-lang/triton issues #5424 and
#11584; backends/cuda/docs/cuda-backend.md, "Interpreter mode"), so when :data:`INTERPRET` is true the ``INTERPRET`` constexpr upcasts 16-bit and SM90 fp8
operands to fp32 right after loading (``tl.dot_scaled`` takes the fp8 bytes as they are); on a
GPU it is false and the tensor cores get bf16/fp16/fp8 operands. The interpreter's fp32->bf16
store truncates instead of rounding to nearest (1 ulp at most).

Layout-dependent scalars (group count, rows, alignment, ``max_m``) are not specialised
(``do_not_specialize``): a new routing never compiles a new variant. Indexing uses int64 wherever
a product of an index and a stride can pass 2**31 (expert weights of DeepSeek-V3 size exceed it
summed over experts).
"""

from __future__ import annotations

from . import mode

INTERPRET: bool = mode.configure_triton()

import triton  # noqa: E402 - TRITON_INTERPRET must be set before triton decorates the kernels
import triton.language as tl  # noqa: E402 - after the environment set-up above, which must come first
from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: E402, F401 - for launch.py, imported here after the set-up

#: Groups scanned per vector step when a program looks for its tile.
GROUP_CHUNK = 128


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
def _fp32_scale(ptr, idx, kb, stride_idx, stride_k, mask):
    """SM90 fp32 scales of K-block ``kb`` for the rows ``idx`` (0 where ``mask`` is false)."""
    return tl.load(ptr + idx * stride_idx + kb * stride_k, mask=mask, other=0.0)


@triton.jit
def _ue8m0_bytes(ptr, idx, kb, stride_idx, stride_k, mask, BLOCK_K: tl.constexpr):
    """SM100 UE8M0 exponents of K-block ``kb`` for the rows ``idx``, as ``tl.dot_scaled`` wants
    them: uint8 ``[len(idx), BLOCK_K // 32]`` (one byte per 32 elements along K; the 128-wide
    scale block repeats its byte). Rows outside ``mask`` get 127 (a scale of 1)."""
    word = tl.load(ptr + idx * stride_idx + (kb // 4) * stride_k, mask=mask, other=127)
    exponent = ((word >> ((kb % 4) * 8)) & 0xFF).to(tl.uint8)
    return tl.broadcast_to(exponent[:, None], (idx.shape[0], BLOCK_K // 32))


@triton.jit
def _load_b(
    b_src,
    g,
    n0,
    k0,
    N,
    K,
    stride_bg,
    stride_bn,
    stride_bk,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    B_TMA: tl.constexpr,
):
    """One K step of group ``g``'s weight as the MMA's right operand, ``b[k0:+BLOCK_K, n0:+BLOCK_N]``
    (zeros past N and K). ``B_TMA``: 0 — ``b_src`` points at ``[G, N, K]`` with the strides
    given (masked loads, pipelined by cp.async); 1 — ``b_src`` is a TMA descriptor of the K-major
    ``[G, N, K]`` weight, block ``[1, BLOCK_N, BLOCK_K]``; 2 — a TMA descriptor of the N-major
    weight viewed as ``[G, K, N]``, block ``[1, BLOCK_K, BLOCK_N]``."""
    if B_TMA == 1:
        b = b_src.load([g, n0, k0])
        b = tl.reshape(b, (BLOCK_N, BLOCK_K)).T
    elif B_TMA == 2:
        b = b_src.load([g, k0, n0])
        b = tl.reshape(b, (BLOCK_K, BLOCK_N))
    else:
        cols = n0 + tl.arange(0, BLOCK_N)
        ks = k0 + tl.arange(0, BLOCK_K)
        b = tl.load(
            b_src + g.to(tl.int64) * stride_bg + cols[None, :] * stride_bn + ks[:, None] * stride_bk,
            mask=(cols < N)[None, :] & (ks < K)[:, None],
            other=0.0,
        )
    return b


@triton.jit
def _accumulate(
    acc,
    a,
    b,
    k0,
    sa_ptr,
    sa_idx,
    sa_stride_idx,
    sa_stride_k,
    sa_mask,
    sb_ptr,
    sb_idx,
    sb_stride_idx,
    sb_stride_k,
    sb_mask,
    SCALES: tl.constexpr,
    BLOCK_K: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """``acc += a @ b`` for one K step ``a[BM, BK] @ b[BK, BN]``, scaled per 128-wide K-block."""
    if SCALES == 2:
        kb = k0 // 128
        sa = _ue8m0_bytes(sa_ptr, sa_idx, kb, sa_stride_idx, sa_stride_k, sa_mask, BLOCK_K)
        sb = _ue8m0_bytes(sb_ptr, sb_idx, kb, sb_stride_idx, sb_stride_k, sb_mask, BLOCK_K)
        acc = tl.dot_scaled(a, sa, "e4m3", b, sb, "e4m3", acc)
    else:
        if INTERPRET:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        if SCALES == 0:
            acc = tl.dot(a, b, acc)
        else:
            kb = k0 // 128
            sa = _fp32_scale(sa_ptr, sa_idx, kb, sa_stride_idx, sa_stride_k, sa_mask)
            sb = _fp32_scale(sb_ptr, sb_idx, kb, sb_stride_idx, sb_stride_k, sb_mask)
            acc += tl.dot(a, b) * sa[:, None] * sb[None, :]
    return acc


@triton.jit(do_not_specialize=["num_groups", "alignment", "num_rows", "sb_rows"])
def contiguous_kernel(
    a_src,
    b_src,
    out_ptr,
    sa_ptr,
    sb_ptr,
    psum_ptr,
    num_groups,
    alignment,
    num_rows,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bg,
    stride_bn,
    stride_bk,
    stride_om,
    stride_on,
    stride_sa_m,
    stride_sa_k,
    stride_sb_g,
    stride_sb_n,
    stride_sb_k,
    sb_rows,
    SCALES: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    GROUP_CHUNK: tl.constexpr,
    A_TMA: tl.constexpr,
    B_TMA: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """M-grouped contiguous: ``out[r] = a[r] @ b[group(r)].T``; rows of no group get zeros.

    ``psum``: int32 ``[G]`` on the device, the exclusive end row of each group (DeepGEMM's psum);
    group ``g`` starts at ``align(psum[g-1], alignment)``. Program ``p`` takes row tile ``t`` (in
    grouped order): the ``t``-th ``BLOCK_M`` chunk of the concatenated group spans (see the
    module docstring). ``sb_rows``: rows of ``b`` per weight scale (128 or 1; a runtime
    value, so both weight recipes share one compiled variant). ``a_src``: a pointer to
    ``a[num_rows, K]`` or, when ``A_TMA``, a TMA descriptor of it with block ``[BLOCK_M, BLOCK_K]``
    (rows past the tile's group are read and their results dropped); ``b_src``: see
    :func:`_load_b`.
    """
    num_n = (N + BLOCK_N - 1) // BLOCK_N
    bound = (num_rows + BLOCK_M - 1) // BLOCK_M + num_groups
    tile, n_tile = _swizzle(tl.program_id(0), bound, num_n, GROUP_M)
    # Locate row tile `tile`: scan the groups, GROUP_CHUNK at a time, counting their row tiles.
    seen = 0
    g_plus_one = 0
    row0 = 0
    group_end = 0
    span_end = 0
    for c0 in range(0, num_groups, GROUP_CHUNK):
        gs = c0 + tl.arange(0, GROUP_CHUNK)
        ok = gs < num_groups
        prev = tl.load(psum_ptr + gs - 1, mask=ok & (gs > 0), other=0)
        ends = tl.load(psum_ptr + gs, mask=ok, other=0)
        starts = (prev + alignment - 1) // alignment * alignment
        spans = tl.where(gs == num_groups - 1, num_rows, (ends + alignment - 1) // alignment * alignment)
        tiles = tl.where(ok, (spans - starts + BLOCK_M - 1) // BLOCK_M, 0)
        inclusive = tl.cumsum(tiles, 0) + seen
        hit = ok & (inclusive > tile) & (inclusive - tiles <= tile)
        g_plus_one += tl.sum(tl.where(hit, gs + 1, 0))
        row0 += tl.sum(tl.where(hit, starts + (tile - (inclusive - tiles)) * BLOCK_M, 0))
        group_end += tl.sum(tl.where(hit, ends, 0))
        span_end += tl.sum(tl.where(hit, spans, 0))
        seen += tl.sum(tiles)
    if g_plus_one == 0:  # past the last real tile
        return
    g64 = (g_plus_one - 1).to(tl.int64)
    rows = row0 + tl.arange(0, BLOCK_M)
    row_in_span = rows < span_end
    row_ok = rows < group_end
    rows64 = rows.to(tl.int64)
    cols = n_tile * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    sb_base = sb_ptr + g64 * stride_sb_g
    sb_idx = cols // sb_rows
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_steps = (K + BLOCK_K - 1) // BLOCK_K * (row0 < group_end).to(tl.int32)  # padding-only tiles skip
    for step in range(0, k_steps):
        k0 = step * BLOCK_K
        if A_TMA:
            a = a_src.load([row0, k0])
        else:
            ks = k0 + tl.arange(0, BLOCK_K)
            a = tl.load(
                a_src + rows64[:, None] * stride_am + ks[None, :] * stride_ak,
                mask=row_ok[:, None] & (ks < K)[None, :],
                other=0.0,
            )
        b = _load_b(
            b_src, g_plus_one - 1, n_tile * BLOCK_N, k0, N, K, stride_bg, stride_bn, stride_bk, BLOCK_N, BLOCK_K, B_TMA
        )
        acc = _accumulate(
            acc,
            a,
            b,
            k0,
            sa_ptr,
            rows64,
            stride_sa_m,
            stride_sa_k,
            row_ok,
            sb_base,
            sb_idx,
            stride_sb_n,
            stride_sb_k,
            col_ok,
            SCALES,
            BLOCK_K,
            INTERPRET,
        )
    acc = tl.where(row_ok[:, None], acc, 0.0)
    out = out_ptr + rows64[:, None] * stride_om + cols[None, :] * stride_on
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=row_in_span[:, None] & col_ok[None, :])


@triton.jit(do_not_specialize=["num_groups", "max_m", "sb_rows"])
def masked_kernel(
    a_src,
    b_src,
    out_ptr,
    sa_ptr,
    sb_ptr,
    masked_m_ptr,
    num_groups,
    max_m,
    N,
    K,
    stride_ag,
    stride_am,
    stride_ak,
    stride_bg,
    stride_bn,
    stride_bk,
    stride_og,
    stride_om,
    stride_on,
    stride_sa_g,
    stride_sa_m,
    stride_sa_k,
    stride_sb_g,
    stride_sb_n,
    stride_sb_k,
    sb_rows,
    SCALES: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_CHUNK: tl.constexpr,
    A_TMA: tl.constexpr,
    B_TMA: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """M-grouped masked: ``out[g, r] = a[g, r] @ b[g].T`` for ``r < masked_m[g]`` (clamped to
    ``[0, max_m]``); other rows are never stored to.

    Persistent: the programs share the ``sum_g cdiv(masked_m[g], BLOCK_M) * cdiv(N, BLOCK_N)``
    tiles that exist, read from the device ``masked_m`` (contiguous int32 ``[G]``), tile ``t``
    going to program ``t % num_programs``. No host synchronisation, so the launch can be captured
    in a CUDA graph and replayed with new ``masked_m`` values. ``a_src``: a pointer to
    ``a[G, max_m, K]`` or, when ``A_TMA``, a TMA descriptor of it with block
    ``[1, BLOCK_M, BLOCK_K]`` (rows past ``masked_m[g]`` are read, never stored); ``b_src``: see
    :func:`_load_b`.
    """
    num_n = (N + BLOCK_N - 1) // BLOCK_N
    total = 0
    for c0 in range(0, num_groups, GROUP_CHUNK):
        gs = c0 + tl.arange(0, GROUP_CHUNK)
        valid = tl.load(masked_m_ptr + gs, mask=gs < num_groups, other=0)
        valid = tl.minimum(tl.maximum(valid, 0), max_m)
        total += tl.sum((valid + BLOCK_M - 1) // BLOCK_M * num_n)
    for t in range(tl.program_id(0), total, tl.num_programs(0)):
        seen = 0
        g_plus_one = 0
        first = 0
        rows_valid = 0
        for c0 in range(0, num_groups, GROUP_CHUNK):
            gs = c0 + tl.arange(0, GROUP_CHUNK)
            ok = gs < num_groups
            valid = tl.load(masked_m_ptr + gs, mask=ok, other=0)
            valid = tl.minimum(tl.maximum(valid, 0), max_m)
            tiles = (valid + BLOCK_M - 1) // BLOCK_M * num_n
            inclusive = tl.cumsum(tiles, 0) + seen
            hit = ok & (inclusive > t) & (inclusive - tiles <= t)
            g_plus_one += tl.sum(tl.where(hit, gs + 1, 0))
            first += tl.sum(tl.where(hit, inclusive - tiles, 0))
            rows_valid += tl.sum(tl.where(hit, valid, 0))
            seen += tl.sum(tiles)
        g64 = (g_plus_one - 1).to(tl.int64)
        local = t - first
        rows = (local // num_n) * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = rows < rows_valid
        cols = (local % num_n) * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < N
        sa_base = sa_ptr + g64 * stride_sa_g
        sb_base = sb_ptr + g64 * stride_sb_g
        sb_idx = cols // sb_rows
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            if A_TMA:
                a = a_src.load([g_plus_one - 1, (local // num_n) * BLOCK_M, k0])
                a = tl.reshape(a, (BLOCK_M, BLOCK_K))
            else:
                ks = k0 + tl.arange(0, BLOCK_K)
                a = tl.load(
                    a_src + g64 * stride_ag + rows[:, None] * stride_am + ks[None, :] * stride_ak,
                    mask=row_ok[:, None] & (ks < K)[None, :],
                    other=0.0,
                )
            b = _load_b(
                b_src,
                g_plus_one - 1,
                (local % num_n) * BLOCK_N,
                k0,
                N,
                K,
                stride_bg,
                stride_bn,
                stride_bk,
                BLOCK_N,
                BLOCK_K,
                B_TMA,
            )
            acc = _accumulate(
                acc,
                a,
                b,
                k0,
                sa_base,
                rows,
                stride_sa_m,
                stride_sa_k,
                row_ok,
                sb_base,
                sb_idx,
                stride_sb_n,
                stride_sb_k,
                col_ok,
                SCALES,
                BLOCK_K,
                INTERPRET,
            )
        out = out_ptr + g64 * stride_og + rows[:, None] * stride_om + cols[None, :] * stride_on
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _k_grouped_edge(
    acc,
    a_ptr,
    b_ptr,
    t0,
    start,
    end,
    rows,
    row_ok,
    cols,
    col_ok,
    stride_at,
    stride_am,
    stride_bt,
    stride_bn,
    sa_ptr,
    stride_sa_m,
    stride_sa_k,
    sb_ptr,
    stride_sb_n,
    stride_sb_k,
    SCALES: tl.constexpr,
    BLOCK_K: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """The partial first or last step of a group in the K-grouped loop: tokens
    ``[t0, t0 + BLOCK_K)`` of the MN-major operands, those outside the group's ``[start, end)``
    masked (the mask is constant along MN, so the loads are vectorised). Outside the pipelined
    loop: the tiles reach shared memory through registers (for SM90 fp8 transposed there to the
    K-major layout wgmma reads). Named ``edge_*`` so that the compile check's rule for the
    pipelined ``a``/``b`` skips them."""
    ts = t0 + tl.arange(0, BLOCK_K)
    t_ok = (ts >= start) & (ts < end)
    ts64 = ts.to(tl.int64)
    edge_a = tl.load(
        a_ptr + ts64[:, None] * stride_at + rows[None, :] * stride_am,
        mask=t_ok[:, None] & row_ok[None, :],
        other=0.0,
    )
    edge_b = tl.load(
        b_ptr + ts64[:, None] * stride_bt + cols[None, :] * stride_bn,
        mask=t_ok[:, None] & col_ok[None, :],
        other=0.0,
    )
    return _accumulate(
        acc,
        tl.trans(edge_a),
        edge_b,
        t0,
        sa_ptr,
        rows,
        stride_sa_m,
        stride_sa_k,
        row_ok,
        sb_ptr,
        cols,
        stride_sb_n,
        stride_sb_k,
        col_ok,
        SCALES,
        BLOCK_K,
        INTERPRET,
    )


@triton.jit(do_not_specialize=["has_c"])
def k_grouped_kernel(
    a_ptr,
    b_ptr,
    a_src,
    b_src,
    c_ptr,
    out_ptr,
    sa_ptr,
    sb_ptr,
    bounds_ptr,
    M,
    N,
    stride_at,
    stride_am,
    stride_bt,
    stride_bn,
    stride_src_at,
    stride_src_am,
    stride_src_bt,
    stride_src_bn,
    stride_cg,
    stride_cm,
    stride_cn,
    stride_og,
    stride_om,
    stride_on,
    stride_sa_m,
    stride_sa_k,
    stride_sb_n,
    stride_sb_k,
    stride_bounds,
    has_c,
    SCALES: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    TOKEN_MAJOR: tl.constexpr,
    A_TMA: tl.constexpr,
    B_TMA: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """K-grouped: ``out[g] = (c[g] if has_c else 0) + a[s_g:e_g].T @ b[s_g:e_g]`` (``has_c`` is a
    runtime flag: one compiled variant serves both).

    ``a[T, M]``, ``b[T, N]``; group ``g`` owns tokens ``[bounds[0, g], bounds[1, g])`` (device
    int32 ``[2, G]``, row stride ``stride_bounds``). Every ``(g, row tile, column tile)`` is a
    program, empty groups included, so an empty group stores ``c[g]`` or zeros. ``out`` may be
    ``c``. Scales are one per 128 tokens and column, absolute along T.

    The token loop runs in steps of ``BLOCK_K`` (a divisor of 128) aligned to multiples of
    ``BLOCK_K``, so no step straddles two scale blocks: a group's whole steps read ``a_src`` /
    ``b_src`` with no token mask (TMA descriptors when ``A_TMA`` / ``B_TMA``, else pointers with
    the ``stride_src_*`` strides; pipelined), its partial first
    and last step read ``a_ptr`` / ``b_ptr`` with the tokens outside the group masked
    (:func:`_k_grouped_edge`; not pipelined, two steps per group) — a token mask in the whole
    steps would stop TMA (a box cannot mask) and, on token-major operands, the vectorised copies.
    ``TOKEN_MAJOR`` (SM90 fp8, whose wgmma reads only K-major operands): the sources are
    token-major copies of ``a`` and ``b`` (token stride 1), so the MMA gets K-major operands.
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
    start = tl.load(bounds_ptr + g)
    end = tl.load(bounds_ptr + stride_bounds + g)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if has_c != 0:
        c = tl.load(
            c_ptr + g64 * stride_cg + rows[:, None] * stride_cm + cols[None, :] * stride_cn,
            mask=row_ok[:, None] & col_ok[None, :],
            other=0.0,
        )
        acc += c.to(tl.float32)
    whole_lo = (start + BLOCK_K - 1) // BLOCK_K  # first whole step, in steps
    whole_hi = end // BLOCK_K  # one past the last whole step
    if start % BLOCK_K != 0:  # partial first step (the whole group when it fits in one step)
        acc = _k_grouped_edge(
            acc, a_ptr, b_ptr, (start // BLOCK_K) * BLOCK_K, start, end, rows, row_ok, cols, col_ok,
            stride_at, stride_am, stride_bt, stride_bn, sa_ptr, stride_sa_m, stride_sa_k, sb_ptr,
            stride_sb_n, stride_sb_k, SCALES, BLOCK_K, INTERPRET,
        )  # fmt: skip
    m0 = (tile % m_tiles) * BLOCK_M
    n0 = n_tile * BLOCK_N
    rows64 = rows.to(tl.int64)
    cols64 = cols.to(tl.int64)
    for step in range(whole_lo, whole_hi):
        # Whole step: tokens [t0, t0 + BLOCK_K) all in the group; tiles [BLOCK_K, BM] and
        # [BLOCK_K, BN] (a TMA source is seen [MN, T] when TOKEN_MAJOR, else [T, MN]).
        t0 = step * BLOCK_K
        ts = (t0 + tl.arange(0, BLOCK_K)).to(tl.int64)
        if A_TMA and TOKEN_MAJOR:
            a = tl.trans(a_src.load([m0, t0]))
        elif A_TMA:
            a = a_src.load([t0, m0])
        else:
            a = tl.load(
                a_src + ts[:, None] * stride_src_at + rows64[None, :] * stride_src_am, mask=row_ok[None, :], other=0.0
            )
        if B_TMA and TOKEN_MAJOR:
            b = tl.trans(b_src.load([n0, t0]))
        elif B_TMA:
            b = b_src.load([t0, n0])
        else:
            b = tl.load(
                b_src + ts[:, None] * stride_src_bt + cols64[None, :] * stride_src_bn, mask=col_ok[None, :], other=0.0
            )
        acc = _accumulate(
            acc, tl.trans(a), b, t0, sa_ptr, rows, stride_sa_m, stride_sa_k, row_ok, sb_ptr, cols,
            stride_sb_n, stride_sb_k, col_ok, SCALES, BLOCK_K, INTERPRET,
        )  # fmt: skip
    if (end % BLOCK_K != 0) & (whole_hi >= whole_lo):  # partial last step, unless it was the first
        acc = _k_grouped_edge(
            acc, a_ptr, b_ptr, whole_hi * BLOCK_K, start, end, rows, row_ok, cols, col_ok,
            stride_at, stride_am, stride_bt, stride_bn, sa_ptr, stride_sa_m, stride_sa_k, sb_ptr,
            stride_sb_n, stride_sb_k, SCALES, BLOCK_K, INTERPRET,
        )  # fmt: skip
    out = out_ptr + g64 * stride_og + rows[:, None] * stride_om + cols[None, :] * stride_on
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])
