"""DeepGEMM's own test structure (v2.6.1 ``tests/generators.py`` and ``tests/test_{fp8_fp4,bf16}.py``),
re-created at small sizes and run through the shim on moe_hal backends.

Generators follow DeepGEMM's: per-group M (or K) = ``expected * U(0.7, 1.3)``, segments aligned to
``get_mk_alignment_for_contiguous_layout()`` with -1 padding rows (zeroed in ``a``), psum layouts,
masked -> psum with gaps left uninitialised (here: NaN, the worst case), K-grouped variants with an
empty group and an unaligned first group. Operands are cast with DeepGEMM's casts
(``per_token_cast_to_fp8`` etc.) and compared with ``calc_diff`` against a reference computed from
the unquantized inputs, with DeepGEMM's thresholds: 1e-3 fp8, 1e-5 bf16.

Scale rules: ``"sm90"`` (fp32 scales, recipe (1, 128, 128)) and ``"sm100"`` (UE8M0 scales,
``arch_major=10``, the floor/packing path). Backends come from ``MOE_HAL_COMPAT_BACKENDS``
(default ``reference,torch``); ``test_deepgemm_cases_on_plugin_backends`` re-runs this file with the
CUDA backends under the Triton interpreter and the Ascend backend on its emulator.
"""

from __future__ import annotations

import os
import random
import warnings

import pytest
import torch

import moe_hal.compat.deep_gemm as dg
from moe_hal.conformance.tolerances import calc_diff

BACKENDS = os.environ.get("MOE_HAL_COMPAT_BACKENDS", "reference,torch").split(",")
#: Smaller shapes for interpreted/emulated backends.
SMALL = os.environ.get("MOE_HAL_COMPAT_SMALL") == "1"
FP8_DIFF, BF16_DIFF = 1e-3, 1e-5
N, K = (32, 256) if SMALL else (48, 384)
#: Alignments per backend: the CUDA kernels' K-grouped fp8 path takes 128-token scale blocks only.
ALIGNMENTS = (224,) if SMALL else (128, 224, 96)
K_GROUPED = {"cuda_sm90": [(128, 128)], "cuda_sm100": [(128, 128)]}
#: Scale rules per backend: each CUDA backend under its own architecture's rules, others under both.
ARCHS = {"cuda_sm90": ("sm90",), "cuda_sm100": ("sm100",)}
PAIRS = [(backend, arch) for backend in BACKENDS for arch in ARCHS.get(backend, ("sm90", "sm100"))]


@pytest.fixture(autouse=True)
def _settings(request):
    saved = dg.settings.snapshot()
    random.seed(0)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fallback/dequantization path notices
        yield
    dg.settings.restore(saved)


def _use(backend: str, arch: str) -> bool:
    """Apply backend and scale rules; returns use_ue8m0 (DeepGEMM's get_ue8m0_usage)."""
    dg.set_backend(backend)
    dg.set_arch_major(10 if arch == "sm100" else 9)
    return arch == "sm100"


def _grouped_cast(x: torch.Tensor, ue8m0: bool, block: bool):
    casts = [(dg.per_block_cast_to_fp8 if block else dg.per_token_cast_to_fp8)(x[i], ue8m0) for i in range(x.shape[0])]
    return torch.stack([c[0] for c in casts]), torch.stack([c[1] for c in casts])


# -- M-grouped contiguous (generate_m_grouped_contiguous) ------------------------------------------------
def _m_grouped_contiguous(num_groups, expected_m, use_psum):
    alignment = dg.get_mk_alignment_for_contiguous_layout()
    actual = [int(expected_m * random.uniform(0.7, 1.3)) for _ in range(num_groups)]
    aligned = [dg.align(m, alignment) for m in actual]
    m = sum(aligned)
    a = torch.randn(m, K, dtype=torch.bfloat16)
    b = torch.randn(num_groups, N, K, dtype=torch.bfloat16)
    layout = torch.empty(num_groups if use_psum else m, dtype=torch.int32)
    ref = torch.randn(m, N, dtype=torch.bfloat16)
    start = 0
    for i, (actual_m, aligned_m) in enumerate(zip(actual, aligned)):
        end, aligned_end = start + actual_m, start + aligned_m
        if use_psum:
            layout[i] = end
        else:
            layout[start:end], layout[end:aligned_end] = i, -1
        a[end:aligned_end] = 0
        ref[start:aligned_end] = a[start:aligned_end] @ b[i].t()
        start = aligned_end
    return m, a, b, layout, ref


@pytest.mark.parametrize("backend, arch", PAIRS)
@pytest.mark.parametrize("dtype", ["fp8", "bf16"])
@pytest.mark.parametrize("use_psum", [False, True])
def test_m_grouped_contiguous(backend, arch, dtype, use_psum):
    ue8m0 = _use(backend, arch)
    for alignment in ALIGNMENTS:
        dg.set_mk_alignment_for_contiguous_layout(alignment)
        for num_groups, expected_m in ((3, 40),) if SMALL else ((4, 40), (2, 150)):
            for nn in (False, True) if num_groups == 4 else (False,):  # the alias test: nn with b.mT
                m, a, b, layout, ref = _m_grouped_contiguous(num_groups, expected_m, use_psum)
                d = torch.full((m, N), float("nan"), dtype=torch.bfloat16)
                if dtype == "fp8":
                    qa = dg.per_token_cast_to_fp8(a, ue8m0)
                    qb = _grouped_cast(b, ue8m0, block=True)
                    fn = dg.m_grouped_fp8_gemm_nn_contiguous if nn else dg.m_grouped_fp8_gemm_nt_contiguous
                    fn(
                        qa,
                        (qb[0].mT, qb[1].mT) if nn else qb,
                        d,
                        layout,
                        use_psum_layout=use_psum,
                        disable_ue8m0_cast=not ue8m0,
                    )
                else:
                    fn = dg.m_grouped_bf16_gemm_nn_contiguous if nn else dg.m_grouped_bf16_gemm_nt_contiguous
                    fn(a, b.mT.contiguous() if nn else b, d, layout, use_psum_layout=use_psum)
                threshold = FP8_DIFF if dtype == "fp8" else BF16_DIFF
                if use_psum:
                    for j in range(num_groups):
                        start = 0 if j == 0 else dg.align(int(layout[j - 1]), alignment)
                        diff = calc_diff(d[start : int(layout[j])], ref[start : int(layout[j])])
                        assert diff < threshold, (backend, alignment, j, diff)
                        padding = d[int(layout[j]) : dg.align(int(layout[j]), alignment)]
                        assert bool((padding == 0).all())  # check_fp8_fp4_psum_zero_padding
                else:
                    diff = calc_diff(d, ref)
                    assert diff < threshold, (backend, alignment, diff)


# -- M-grouped masked (generate_m_grouped_masked), and masked -> psum ---------------------------------------
def _masked_to_psum(x: torch.Tensor, psum: torch.Tensor) -> torch.Tensor:
    """Rows of ``[G, max_m, ...]`` laid out by ``psum``; gap rows hold NaN (DeepGEMM leaves them
    uninitialised to prove they are never read)."""
    num_groups, max_m = x.shape[:2]
    out = torch.empty((num_groups * max_m, *x.shape[2:]), dtype=x.dtype)
    out.view(torch.uint8).fill_(0x7F) if x.dtype == torch.float8_e4m3fn else out.fill_(float("nan"))
    last = 0
    for i in range(num_groups):
        out[last : int(psum[i])] = x[i, : int(psum[i]) - last]
        last = dg.align(int(psum[i]), dg.get_mk_alignment_for_contiguous_layout())
    return out


@pytest.mark.parametrize("backend, arch", PAIRS)
@pytest.mark.parametrize("dtype", ["fp8", "bf16"])
@pytest.mark.parametrize("use_psum", [False, True])
def test_m_grouped_masked(backend, arch, dtype, use_psum):
    ue8m0 = _use(backend, arch)
    max_m = 128 if SMALL else 256
    for num_groups, expected_m in ((3, 20),) if SMALL else ((4, 20), (2, 90)):
        dg.set_arch_major(10)
        dg.set_mk_alignment_for_contiguous_layout(
            dg.get_theoretical_mk_alignment_for_contiguous_layout(int(expected_m * 1.2))
        )
        dg.set_arch_major(10 if ue8m0 else 9)
        a = torch.randn(num_groups, max_m, K, dtype=torch.bfloat16)
        b = torch.randn(num_groups, N, K, dtype=torch.bfloat16)
        d = torch.full((num_groups, max_m, N), 7.0, dtype=torch.bfloat16)
        ref = torch.einsum("gmk,gnk->gmn", a, b)
        masked_m = torch.tensor(
            [int(expected_m * random.uniform(0.7, 1.3)) for _ in range(num_groups)], dtype=torch.int32
        )
        psum, end = [], 0
        for j in range(num_groups):
            end = (0 if j == 0 else dg.align(end, dg.get_mk_alignment_for_contiguous_layout())) + int(masked_m[j])
            psum.append(end)
        psum = torch.tensor(psum, dtype=torch.int32)
        if dtype == "fp8":
            qa, qb = _grouped_cast(a, ue8m0, block=False), _grouped_cast(b, ue8m0, block=True)
            for j in range(num_groups):
                qa[1][j, int(masked_m[j]) :] = 0  # DeepGEMM zeroes SFA rows past masked_m
        expected_m_hint = int(expected_m * 1.2)
        if use_psum:
            d = _masked_to_psum(d, psum)
            if dtype == "fp8":
                dg.m_grouped_fp8_gemm_nt_contiguous(
                    (_masked_to_psum(qa[0], psum), _masked_to_psum(qa[1], psum)),
                    qb,
                    d,
                    psum,
                    use_psum_layout=True,
                    disable_ue8m0_cast=not ue8m0,
                    expected_m_for_psum_layout=expected_m_hint,
                )
            else:
                dg.m_grouped_bf16_gemm_nt_contiguous(
                    _masked_to_psum(a, psum),
                    b,
                    d,
                    psum,
                    use_psum_layout=True,
                    expected_m_for_psum_layout=expected_m_hint,
                )
        elif dtype == "fp8":
            dg.fp8_m_grouped_gemm_nt_masked(qa, qb, d, masked_m, expected_m_hint, disable_ue8m0_cast=not ue8m0)
        else:
            dg.bf16_m_grouped_gemm_nt_masked(a, b, d, masked_m, expected_m_hint)
        threshold = FP8_DIFF if dtype == "fp8" else BF16_DIFF
        for j in range(num_groups):
            rows = int(masked_m[j])
            if use_psum:
                start = 0 if j == 0 else dg.align(int(psum[j - 1]), dg.get_mk_alignment_for_contiguous_layout())
                got = d[start : int(psum[j])]
            else:
                got = d[j, :rows]
                assert bool((d[j, rows:] == 7).all())  # rows past masked_m are never written
            assert calc_diff(got, ref[j, :rows]) < threshold, (backend, j)


# -- K-grouped (generate_k_grouped_contiguous / _psum) --------------------------------------------------------
def _k_grouped_cast(x: torch.Tensor, groups, ue8m0: bool, gran_k: int):
    """DeepGEMM's k_grouped_per_channel_cast_to_fp8: each group cast on its own (zero-padded to
    gran_k), scale rows concatenated group after group."""
    data = torch.zeros(x.shape, dtype=torch.float8_e4m3fn)
    scales = []
    for start, end in groups:
        if end == start:
            continue
        padded = torch.zeros(dg.align(end - start, gran_k), x.shape[1], dtype=x.dtype)
        padded[: end - start] = x[start:end]
        q, sf = dg.per_channel_cast_to_fp8(padded, ue8m0, gran_k)
        data[start:end] = q[: end - start]
        scales.append(sf)
    return data, torch.cat(scales) if scales else torch.empty(0, x.shape[1])


def _k_grouped_case(real_ks, alignment, use_psum, m, n):
    if use_psum:
        ends, prev = [], 0
        for k in real_ks:
            prev = dg.align(prev, alignment) + k
            ends.append(prev)
        total = dg.align(ends[-1], alignment)
        groups = [(e - k, e) for e, k in zip(ends, real_ks)]
        layout = torch.tensor(ends, dtype=torch.int32)
    else:
        ks = [dg.align(k, alignment) for k in real_ks]
        total, groups, start = sum(ks), [], 0
        for k in ks:
            groups.append((start, start + k))
            start += k
        layout = torch.tensor(ks, dtype=torch.int32)
    a = torch.zeros(total, m, dtype=torch.bfloat16)
    b = torch.zeros(total, n, dtype=torch.bfloat16)
    c = torch.randn(len(real_ks), m, n) * 32
    ref = c.double().clone()
    for g, (start, end) in enumerate(groups):
        a[start:end] = torch.randn(end - start, m).bfloat16()
        b[start:end] = torch.randn(end - start, n).bfloat16()
        ref[g] += a[start:end].double().T @ b[start:end].double()
    return a, b, c, ref, layout, groups, [dg.align(k, alignment) for k in real_ks]


@pytest.mark.parametrize("backend, arch", PAIRS)
@pytest.mark.parametrize("dtype", ["fp8", "bf16"])
def test_k_grouped_contiguous(backend, arch, dtype):
    ue8m0 = _use(backend, arch)
    m, n = 32, 48
    options = K_GROUPED.get(backend, [(128, 128), (128, 160), (32, 224), (128, 224)])
    if arch == "sm90":
        options = [(128, 128)]  # SM90: gran_k 128 at alignment 128 only (DeepGEMM's list)
    psum_options = (False, True) if arch == "sm100" else (False,)
    for num_groups, expected_k in ((3, 150),) if SMALL else ((4, 200),):
        real = [max(1, int(expected_k * random.uniform(0.7, 1.3))) for _ in range(num_groups)]
        for use_psum in psum_options:
            for gran_k, alignment in options:
                dg.set_mk_alignment_for_contiguous_layout(alignment)
                variants = [list(real), list(real)]
                variants[1][random.randrange(num_groups)] = 0  # an empty group
                if use_psum and variants[0][0] > 1:
                    variants[0][0] -= random.randint(1, min(alignment - 1, variants[0][0] - 1))
                for real_ks in variants:
                    a, b, c, ref, layout, groups, aligned_ks = _k_grouped_case(real_ks, alignment, use_psum, m, n)
                    d = c  # d is c: accumulate
                    if dtype == "bf16":
                        dg.k_grouped_bf16_gemm_tn_contiguous(a, b, d, aligned_ks, layout, c, use_psum_layout=use_psum)
                        threshold = BF16_DIFF
                    else:
                        qa = _k_grouped_cast(a, groups, ue8m0, gran_k)
                        qb = _k_grouped_cast(b, groups, ue8m0, gran_k)
                        if arch == "sm90":  # K-major, flattened per group
                            qa, qb = _k_major(qa, aligned_ks), _k_major(qb, aligned_ks)
                            fn = dg.k_grouped_fp8_gemm_nt_contiguous
                        else:
                            fn = dg.k_grouped_fp8_gemm_tn_contiguous
                        ks_cpu = None if use_psum and real_ks is variants[0] else aligned_ks  # unsynced psum path
                        fn(qa, qb, d, ks_cpu, layout, c, recipe=(1, 1, gran_k), use_psum_layout=use_psum)
                        threshold = FP8_DIFF
                    diff = calc_diff(d, ref)
                    assert diff < threshold, (backend, arch, gran_k, alignment, use_psum, real_ks, diff)


def _k_major(x, ks):
    """SM90's K-grouped operand: each group's ``[MN, K_g]`` block K-major, flattened; sf transposed."""
    data, sf = x
    flat, start = [], 0
    for k in ks:
        flat.append(data[start : start + k].T.reshape(-1))
        start += k
    return torch.cat(flat), sf.T


# -- DeepGEMM's layout tests (test_layout.py): byte-identical scale layouts ----------------------------------------
def _packed_reference(sf: torch.Tensor) -> torch.Tensor:
    """Our own statement of DeepGEMM's packed layout: exponent bytes, four per int32 little-endian
    along K (zero past SK), rows MN-major with stride align(MN, 4)."""
    lead, (mn, sk) = sf.shape[:-2], sf.shape[-2:]
    words = dg.ceil_div(sk, 4)
    exponents = torch.zeros(*lead, mn, words * 4, dtype=torch.int64)
    exponents[..., :sk] = (sf.contiguous().view(torch.int32).to(torch.int64) >> 23) & 0xFF
    value = sum(exponents[..., j::4] << (8 * j) for j in range(4))
    value = torch.where(value >= 2**31, value - 2**32, value).to(torch.int32)
    aligned = dg.get_tma_aligned_size(mn, 4)
    storage = torch.zeros(*lead, words, aligned, dtype=torch.int32)
    storage[..., :mn] = value.mT
    return storage.mT[..., :mn, :]


#: A cover of DeepGEMM's enumerate_sf_layout (mn in 4096/4097/8192, k in 128/7168/7296, 1-4 groups,
#: gran_k 32/128) that keeps the CPU time small.
SF_SHAPES = [(4097, 7296, 1, 128), (4096, 128, 4, 32), (8192, 128, 2, 128), (4097, 128, 2, 32)]


@pytest.mark.parametrize("use_ue8m0", [False, True])
@pytest.mark.parametrize("with_transpose", [True, False])
@pytest.mark.parametrize("mn, k, num_groups, gran_k", SF_SHAPES if not SMALL else [(97, 384, 2, 32)])
def test_sf_layouts_are_byte_identical(use_ue8m0, with_transpose, mn, k, num_groups, gran_k):
    x = torch.randn(num_groups * mn, k, dtype=torch.bfloat16)
    _, sf = dg.per_token_cast_to_fp8(x, use_ue8m0=use_ue8m0, gran_k=gran_k)
    sf = sf if num_groups == 1 else sf.view(num_groups, mn, -1)
    sf = sf if with_transpose else sf.transpose(-1, -2).contiguous().transpose(-1, -2)
    if use_ue8m0:
        packed, expected = dg.get_mn_major_tma_aligned_packed_ue8m0_tensor(sf), _packed_reference(sf)
        assert packed.shape == expected.shape and packed.stride() == expected.stride()
        assert torch.equal(packed, expected)
    else:
        aligned = dg.get_mn_major_tma_aligned_tensor(sf)
        tma_mn, sf_k = dg.get_tma_aligned_size(mn, 4), dg.ceil_div(k, gran_k)
        assert aligned.shape[-2:] == (mn, sf_k) and aligned.stride()[-2:] == (1, tma_mn)
        if num_groups > 1:
            assert aligned.stride(0) == tma_mn * sf_k
        assert torch.equal(aligned, sf)


@pytest.mark.parametrize("gran_k", [32, 128])
def test_k_grouped_sf_layout_is_byte_identical(gran_k):
    mn, num_groups, avg_k = (96, 4, 384) if SMALL else (4096, 8, 384)
    ks = [dg.align(int(random.uniform(0.7, 1.3) * avg_k), gran_k) for _ in range(num_groups)]
    _, sf = dg.per_channel_cast_to_fp8(torch.randn(sum(ks), mn, dtype=torch.bfloat16), True, gran_k)
    packed = dg.get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(
        sf, torch.tensor(ks, dtype=torch.int32), ks, gran_k, gran_k
    )
    packed_groups = packed.split([dg.ceil_div(k, gran_k * 4) for k in ks])
    for i, group_sf in enumerate(sf.split([k // gran_k for k in ks])):
        assert torch.equal(packed_groups[i], _packed_reference(group_sf.T).T), i


def test_fp8_casts_match_deepgemm_formula_bytes():
    x = torch.randn(64, 640, dtype=torch.bfloat16)
    q, sf = dg.per_token_cast_to_fp8(x, use_ue8m0=False)
    view = x.float().view(64, 5, 128)
    expected_sf = view.abs().amax(-1).clamp(min=1e-4) / 448.0
    expected = (view * (1.0 / expected_sf.unsqueeze(-1))).to(torch.float8_e4m3fn).view(64, 640)
    assert torch.equal(sf, expected_sf) and torch.equal(q.view(torch.uint8), expected.view(torch.uint8))
