"""The CPU emulator of torch_npu on its own, against independent per-expert float64 products.

These tests pin the documented semantics the backends rely on (the sources in ``moe_hal_ascend.cann_rules``):
group_list types, group_type, split_item, transposed-weight detection, empty groups, unwritten
rows, fp32 accumulation, G-B fp8 and the validation the real operator performs.
"""

from __future__ import annotations

import math

import pytest
import torch
from ascend_helpers import SOC_910B, SOC_910C, SOC_950

from moe_hal_ascend import cann_rules, emulator
from moe_hal_ascend.emulator import AclnnError, npu_grouped_matmul

GMM = dict(group_type=0, split_item=3)


def per_expert(x: torch.Tensor, w_kn: torch.Tensor, sizes: list[int], order: list[int] | None = None) -> torch.Tensor:
    """float64 ``[sum(sizes), N]``: rows laid back to back, range i multiplied by ``w_kn[order[i]]``."""
    order = list(range(len(sizes))) if order is None else order
    out, row = [], 0
    for e, size in zip(order, sizes):
        out.append(x[row : row + size].double() @ w_kn[e].double())
        row += size
    return torch.cat(out) if out else torch.zeros(0, w_kn.shape[-1], dtype=torch.float64)


def lists_for(sizes: list[int]) -> dict[int, torch.Tensor]:
    """The same grouping in group_list_type 0, 1 and 2 (type 2 lists non-zero groups first)."""
    cumsum = torch.tensor(sizes, dtype=torch.int64).cumsum(0)
    pairs = sorted(((e, s) for e, s in enumerate(sizes)), key=lambda p: p[1] == 0)
    return {0: cumsum, 1: torch.tensor(sizes, dtype=torch.int64), 2: torch.tensor(pairs, dtype=torch.int64)}


def within_one_ulp(y: torch.Tensor, exact: torch.Tensor) -> bool:
    """Every element of ``y`` is within one ulp of the float64 ``exact`` at y's precision."""
    eps = torch.finfo(y.dtype).eps
    return bool(((y.double() - exact).abs() <= eps * exact.abs() + 1e-30).all())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_group_list_types_and_weight_views_agree_with_per_expert_products(gen, dtype):
    sizes = [5, 0, 17, 1, 0, 9]
    m, k, n = sum(sizes) + 7, 48, 24  # 7 rows past the groups stay unwritten
    x = torch.randn(m, k, generator=gen).to(dtype)
    w_nk = torch.randn(len(sizes), n, k, generator=gen).to(dtype)
    exact = per_expert(x, w_nk.transpose(1, 2), sizes)
    covered = sum(sizes)
    for weight in (w_nk.transpose(1, 2), w_nk.transpose(1, 2).contiguous()):  # transposed view / ND [E, K, N]
        for glt, gl in lists_for(sizes).items():
            if glt == 2:
                continue  # type 2 needs quantized operands
            y = npu_grouped_matmul([x], [weight], group_list=gl, group_list_type=glt, **GMM)
            assert len(y) == 1 and y[0].shape == (m, n) and y[0].dtype == dtype
            if dtype == torch.float32:  # fp32 products round too: the usual K * eps bound
                bound = k * torch.finfo(dtype).eps * per_expert(x.abs(), w_nk.abs().transpose(1, 2), sizes)
                assert bool(((y[0][:covered].double() - exact).abs() <= bound).all())
            else:  # bf16/fp16 products are exact in fp32: one rounding
                assert within_one_ulp(y[0][:covered], exact)
            assert torch.isnan(y[0][covered:]).all()


def test_fp32_accumulation_with_a_single_rounding(gen):
    # Products of bf16 values accumulated in bf16 would drift far beyond one ulp at K = 4096.
    x = torch.randn(8, 4096, generator=gen).bfloat16()
    w = torch.randn(1, 4096, 16, generator=gen).bfloat16()
    y = npu_grouped_matmul([x], [w], group_list=torch.tensor([8]), **GMM)[0]
    assert within_one_ulp(y, x.double() @ w[0].double())


def test_group_list_type_2_follows_the_listed_order(gen, emulate):
    emulate(SOC_950)
    sizes = {2: 6, 0: 3, 3: 0, 1: 0}  # listed order: expert 2 first, then 0
    pairs = torch.tensor(list(sizes.items()), dtype=torch.int64)
    m, k, n = 12, 256, 128
    x = torch.randn(m, k, generator=gen).to(torch.float8_e4m3fn)
    w = torch.randn(4, k, n, generator=gen).to(torch.float8_e4m3fn)
    ones_x = torch.ones(m, 2)
    ones_w = torch.ones(4, 2, 1)
    y = npu_grouped_matmul(
        [x],
        [w],
        group_list=pairs,
        group_list_type=2,
        scale=[ones_w],
        per_token_scale=[ones_x],
        output_dtype=torch.float32,
        **GMM,
    )[0]
    exact = per_expert(x.float(), w.float(), [6, 3], order=[2, 0])
    torch.testing.assert_close(y[:9].double(), exact, rtol=1e-6, atol=1e-4)
    assert torch.isnan(y[9:]).all()


def test_group_list_types_0_1_2_are_equivalent(gen, emulate):
    # type 2 is legal only for quantized operands (full quantization on the 950): compare all
    # three there, bit for bit, on a grouping with empty groups (listed last for type 2).
    emulate(SOC_950)
    sizes = [7, 0, 12, 1, 0]
    m, k, n = sum(sizes) + 4, 256, 128
    x = torch.randn(m, k, generator=gen).to(torch.float8_e4m3fn)
    w = torch.randn(len(sizes), k, n, generator=gen).to(torch.float8_e4m3fn)
    quant = dict(
        scale=[torch.rand(len(sizes), 2, 1, generator=gen) + 0.5],
        per_token_scale=[torch.rand(m, 2, generator=gen) + 0.5],
        output_dtype=torch.bfloat16,
    )
    ys = {
        glt: npu_grouped_matmul([x], [w], group_list=gl, group_list_type=glt, **quant, **GMM)[0]
        for glt, gl in lists_for(sizes).items()
    }
    covered = sum(sizes)
    assert torch.equal(ys[0][:covered], ys[1][:covered]) and torch.equal(ys[0][:covered], ys[2][:covered])
    assert all(torch.isnan(y[covered:]).all() for y in ys.values())
    for glt, gl in lists_for(sizes).items():
        ranges = emulator.decode_group_list(gl.tolist(), glt, len(sizes), m)
        assert sorted((r.expert, r.start, r.count) for r in ranges if r.count) == [(0, 0, 7), (2, 7, 12), (3, 19, 1)]


@pytest.mark.parametrize("split_item", [0, 1])
def test_split_items_0_and_1_are_refused_for_a_single_3d_weight(gen, split_item):
    # SplitMSingleXSingleWeightSingleY (ops-transformer): one x, one 3-D weight -> split_item 2/3 only.
    x = torch.randn(9, 8, generator=gen).bfloat16()
    w = torch.randn(3, 8, 5, generator=gen).bfloat16()
    with pytest.raises(AclnnError, match="split_item_single_weight") as info:
        npu_grouped_matmul([x], [w], group_list=torch.tensor([3, 3, 7]), group_type=0, split_item=split_item)
    assert "aclnn_grouped_matmul.cpp" in str(info.value)


def test_group_type_2_groups_along_k(gen):
    k_sizes = [4, 0, 9, 2]
    t, m, n = sum(k_sizes) + 3, 6, 5
    a = torch.randn(t, m, generator=gen).bfloat16()  # [K, M] storage, passed transposed
    b = torch.randn(t, n, generator=gen).bfloat16()
    gl = torch.tensor(k_sizes, dtype=torch.int64).cumsum(0)
    y = npu_grouped_matmul([a.t()], [b], group_list=gl, group_type=2, split_item=3)[0]
    assert y.shape == (4, m, n)
    start = 0
    for g, size in enumerate(k_sizes):
        if size:
            exact = a[start : start + size].double().T @ b[start : start + size].double()
            assert within_one_ulp(y[g], exact)
        else:
            assert torch.isnan(y[g]).all()  # an empty K group's output is never written
        start += size
    with pytest.raises(AclnnError, match="must be transposed"):
        npu_grouped_matmul([a.t().contiguous()], [b], group_list=gl, group_type=2, split_item=3)
    with pytest.raises(AclnnError, match="split_item_split_k"):
        npu_grouped_matmul([a.t()], [b], group_list=gl, group_type=2, split_item=0)


def test_group_type_minus_1_is_independent_matmuls(gen):
    xs = [torch.randn(3, 4, generator=gen).bfloat16(), torch.randn(2, 6, generator=gen).bfloat16()]
    ws = [torch.randn(4, 5, generator=gen).bfloat16(), torch.randn(5, 6, generator=gen).bfloat16().t()]
    ys = npu_grouped_matmul(xs, ws, group_type=-1, split_item=0)
    for x, w, y in zip(xs, ws, ys):
        assert within_one_ulp(y, x.double() @ w.double())
    with pytest.raises(AclnnError, match="split_item_no_split"):
        npu_grouped_matmul(xs, ws, group_type=-1, split_item=3)
    with pytest.raises(AclnnError, match="group_list must be None"):
        npu_grouped_matmul(xs, ws, group_type=-1, group_list=torch.tensor([1, 2]))


def test_g_b_fp8_matches_the_dequantized_product(gen, emulate):
    emulate(SOC_950)
    m, k, n = 10, 300, 200  # partial K and N blocks
    x = (torch.randn(m, k, generator=gen) * 4).to(torch.float8_e4m3fn)
    w = (torch.randn(2, k, n, generator=gen) * 4).to(torch.float8_e4m3fn)
    xs = torch.rand(m, math.ceil(k / 128), generator=gen) + 0.5
    ws = torch.rand(2, math.ceil(k / 128), math.ceil(n / 128), generator=gen) + 0.5
    y = npu_grouped_matmul(
        [x], [w], scale=[ws], per_token_scale=[xs], group_list=torch.tensor([4, 10]), output_dtype=torch.bfloat16, **GMM
    )[0]
    x_deq = x.double() * xs.double().repeat_interleave(128, 1)[:, :k]
    w_deq = w.double() * ws.double().repeat_interleave(128, 1)[:, :k].repeat_interleave(128, 2)[..., :n]
    exact = torch.cat([x_deq[:4] @ w_deq[0], x_deq[4:] @ w_deq[1]])
    assert within_one_ulp(y, exact)


def test_format_cast_records_nz_and_the_op_checks_it(gen, emulate):
    w = torch.randn(2, 8, 4, generator=gen).bfloat16()
    nz = emulator.npu_format_cast(w, 29)
    assert emulator.get_npu_format(nz) == 29 and emulator.get_npu_format(w) == 2
    assert torch.equal(nz, w)
    x = torch.randn(5, 8, generator=gen).bfloat16()
    y = npu_grouped_matmul([x], [nz], group_list=torch.tensor([2, 5]), **GMM)[0]
    assert torch.equal(y, npu_grouped_matmul([x], [w], group_list=torch.tensor([2, 5]), **GMM)[0])
    with pytest.raises(AclnnError, match="float32"):
        nz32 = emulator.npu_format_cast(w.float(), 29)
        npu_grouped_matmul([x.float()], [nz32], group_list=torch.tensor([2, 5]), **GMM)
    with pytest.raises(AclnnError, match="nz_k_n_one"):
        thin = emulator.npu_format_cast(torch.randn(2, 8, 1).bfloat16(), 29)
        npu_grouped_matmul([x], [thin], group_list=torch.tensor([2, 5]), **GMM)


# -- validation: the errors the real operator raises ---------------------------------------------------
def _call(x=None, w=None, gl=None, **kwargs):
    x = torch.randn(6, 8).bfloat16() if x is None else x
    w = torch.randn(2, 8, 4).bfloat16() if w is None else w
    gl = torch.tensor([2, 6]) if gl is None else gl
    args = dict(GMM, group_list=gl)
    args.update(kwargs)
    return npu_grouped_matmul([x], [w], **args)


@pytest.mark.parametrize(
    "kwargs, rule",
    [
        (dict(w=torch.randn(2, 7, 4).bfloat16()), "k_match"),
        (dict(gl=torch.tensor([2, 6], dtype=torch.int32)), "group_list_tensor"),
        (dict(gl=torch.tensor([2, 6, 6])), "group_list_tensor"),
        (dict(gl=torch.tensor([[0, 2], [1, 4]]), group_list_type=2), "group_list_type"),
        (dict(group_type=1), "group_type"),
        (dict(act_type=5), "act_type"),
        (dict(output_dtype=torch.float32), "output_dtype_nonquant"),
        (dict(x=torch.randn(8, 6).bfloat16().t()), "x_not_transposed"),
        # K = 1 with the strides of a column-major view: torch calls it contiguous, CANN "transposed"
        (
            dict(x=torch.randn(1, 8).bfloat16().t(), w=torch.randn(2, 1, 4).bfloat16(), gl=torch.tensor([2, 8])),
            "x_not_transposed",
        ),
        (dict(x=torch.randn(6, 8, dtype=torch.float16)), "dtype_a2a3"),
        (
            dict(
                x=torch.randn(6, 8).to(torch.float8_e4m3fn),
                w=torch.randn(2, 8, 4).to(torch.float8_e4m3fn),
                output_dtype=torch.bfloat16,
            ),
            "dtype_a2a3",
        ),
    ],
)
def test_parameter_errors_name_the_rule_and_its_source(kwargs, rule):
    with pytest.raises(AclnnError) as info:
        _call(**kwargs)
    assert info.value.rule == rule and info.value.code == emulator.ACLNN_ERR_PARAM_INVALID
    assert "161002" in str(info.value) and cann_rules.RULES[rule].source in str(info.value)


@pytest.mark.parametrize(
    "gl, glt",
    [
        (torch.tensor([4, 2]), 0),  # decreasing ends
        (torch.tensor([2, 7]), 0),  # more rows than x has
        (torch.tensor([3, -1]), 1),  # a negative count
    ],
)
def test_group_list_values_are_never_validated_only_undefined(gl, glt):
    # The host cannot read a device tensor: CANN checks the group list's shape and dtype, never its
    # values. Values the kernel cannot make sense of leave the output undefined (all NaN here).
    y = _call(gl=gl, group_list_type=glt)[0]
    assert torch.isnan(y).all()


def test_transposition_is_read_from_strides_including_batch_strides(gen):
    w = torch.randn(2, 4, 8, generator=gen).bfloat16()  # [E, N, K]
    spec = emulator.TensorSpec.of
    assert emulator.is_transposed(spec(w.transpose(1, 2)))
    # the same last-two strides with a batch stride that does not follow: not "transposed" to CANN
    padded = torch.randn(2, 5, 8, generator=gen).bfloat16()[:, :4].transpose(1, 2)
    assert padded.stride()[-2:] == (1, 8) and not emulator.is_transposed(spec(padded))
    # size-1 dims count: [G, 1, Kb] transposed to [G, Kb, 1] has strides (Kb, 1, Kb), "transposed"
    assert emulator.is_transposed(spec(torch.zeros(3, 1, 4).transpose(1, 2)))
    assert emulator.is_transposed(spec(torch.zeros(3, 4, 1).transpose(1, 2)))


def test_limits_on_groups_and_inner_dimensions():
    with pytest.raises(AclnnError, match="more than 1024"):
        _call(w=torch.zeros(1025, 8, 1).bfloat16(), gl=torch.zeros(1025, dtype=torch.int64))
    with pytest.raises(AclnnError, match="inner_axis"):
        _call(
            x=torch.zeros(2, 65536).bfloat16(),
            w=torch.zeros(1, 1, 65536).bfloat16().transpose(1, 2),
            gl=torch.tensor([2]),
        )
    with pytest.raises(AclnnError, match="inner_axis"):
        _call(x=torch.zeros(2, 4).bfloat16(), w=torch.zeros(1, 4, 65536).bfloat16(), gl=torch.tensor([2]))
    _call(x=torch.zeros(2, 4).bfloat16(), w=torch.zeros(1, 4, 65535).bfloat16(), gl=torch.tensor([2]))


def test_nz_weights_on_the_950_need_32_byte_aligned_k_and_n(gen, emulate):
    emulate(SOC_950)
    x = torch.randn(5, 24, generator=gen).bfloat16()
    dense = torch.randn(2, 24, 32, generator=gen).bfloat16()  # K = 48 bytes: not 32-byte aligned
    with pytest.raises(AclnnError, match="nz_align_950"):
        npu_grouped_matmul([x], [emulator.npu_format_cast(dense, 29)], group_list=torch.tensor([2, 5]), **GMM)
    emulate(SOC_910B)
    npu_grouped_matmul([x], [emulator.npu_format_cast(dense, 29)], group_list=torch.tensor([2, 5]), **GMM)


def test_soc_guard_refuses_fp8_casts_without_fp8_and_fp8_gathers_everywhere(emulate):
    x = torch.randn(4, 8).to(torch.float8_e4m3fn)
    for soc in (SOC_910B, SOC_950):
        emulate(soc)
        with emulator.soc_guard():
            with pytest.raises(AclnnError, match="index_select_fp8"):
                x.index_select(0, torch.tensor([1, 0]))
            x.view(torch.uint8).index_select(0, torch.tensor([1, 0]))
            if soc == SOC_910B:
                with pytest.raises(AclnnError, match="cast_fp8"):
                    x.float()
            else:
                x.float()


def test_one_entry_counts_list_is_an_a2_a3_restriction(emulate):
    x, w = torch.ones(3, 4).bfloat16(), torch.ones(1, 4, 2).bfloat16()
    for soc in (SOC_910B, SOC_910C):
        emulate(soc)
        with pytest.raises(AclnnError, match="length 1"):
            npu_grouped_matmul([x], [w], group_list=torch.tensor([3]), group_list_type=1, **GMM)
        npu_grouped_matmul([x], [w], group_list=torch.tensor([3]), group_list_type=0, **GMM)
    emulate(SOC_950)
    y = npu_grouped_matmul([x], [w], group_list=torch.tensor([3]), group_list_type=1, **GMM)[0]
    assert torch.equal(y, torch.full((3, 2), 4.0).bfloat16())


def test_type_2_lists_non_zero_groups_first_and_tuning_config_is_not_on_950(gen, emulate):
    emulate(SOC_950)
    x = torch.randn(4, 128, generator=gen).to(torch.float8_e4m3fn)
    w = torch.randn(2, 128, 128, generator=gen).to(torch.float8_e4m3fn)
    quant = dict(scale=[torch.ones(2, 1, 1)], per_token_scale=[torch.ones(4, 1)], output_dtype=torch.bfloat16)
    # non-zero groups must come first, but the host cannot see values: the output is undefined
    y = npu_grouped_matmul([x], [w], group_list=torch.tensor([[0, 0], [1, 4]]), group_list_type=2, **quant, **GMM)
    assert torch.isnan(y[0]).all()
    with pytest.raises(AclnnError, match="tuning_config"):
        _call(tuning_config=[4])
    with pytest.raises(AclnnError, match=r"scale shape must be"):
        npu_grouped_matmul([x], [w], group_list=torch.tensor([4, 4]), **dict(quant, scale=[torch.ones(2, 1, 2)]), **GMM)


def test_arguments_the_emulator_does_not_model_are_refused_by_name():
    with pytest.raises(NotImplementedError, match="bias"):
        _call(bias=[torch.zeros(2, 4)])
    with pytest.raises(NotImplementedError, match="List"):
        _call(gl=[2, 6])
    with pytest.raises(NotImplementedError, match="int8"):
        _call(x=torch.ones(6, 8, dtype=torch.int8), w=torch.ones(2, 8, 4, dtype=torch.int8))
