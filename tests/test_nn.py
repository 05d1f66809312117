"""moe_hal.nn: the router, the grouped SwiGLU experts and the MoE layer against plain per-expert
PyTorch, and against real transformers MoE blocks (Mixtral, Qwen3-MoE, DeepSeek-V3) built from
tiny random configs, forward and weight gradients, eager and compiled."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import moe_hal
from moe_hal.errors import ArgumentError, CapacityError, GradientError
from moe_hal.nn import GroupedExperts, MoE, TopKRouter, expert_weights

from .conftest import calc_diff, randn

pytestmark = pytest.mark.filterwarnings("ignore::moe_hal.errors.PathWarning")


def loop_moe(x, weights, ids, w13, w2, b13=None, b2=None):
    """Per-token, per-slot SwiGLU experts in float64: the obvious definition."""
    x, w13, w2 = x.double(), w13.double(), w2.double()
    inter = w2.shape[2]
    y = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            h = x[t] @ w13[e].T + (0 if b13 is None else b13[e].double())
            out = (F.silu(h[:inter]) * h[inter:]) @ w2[e].T + (0 if b2 is None else b2[e].double())
            y[t] += float(weights[t, j].detach()) * out
    return y


# -- router ---------------------------------------------------------------------------------------------
def test_softmax_router_is_topk_of_softmax_renormalised(gen):
    router = TopKRouter(16, 6, 2)
    x = randn(gen, 9, 16)
    w, ids, logits = router(x)
    probs = (x @ router.weight.T).softmax(-1)
    want_w, want_ids = probs.topk(2, dim=-1)
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(w, want_w / want_w.sum(-1, keepdim=True))
    assert logits.dtype == w.dtype == torch.float32


def test_sigmoid_group_limited_router_picks_from_the_best_groups_and_weights_by_scores(gen):
    router = TopKRouter(
        16, 8, 2, score="sigmoid", n_group=4, topk_group=2, correction_bias=True, routed_scaling_factor=2.5
    )
    with torch.no_grad():
        router.correction_bias.copy_(torch.tensor([5.0, 0, 0, 0, 0, 0, 0, 5.0]))  # experts 0 and 7 always win
    x = randn(gen, 7, 16)
    w, ids, logits = router(x)
    assert torch.equal(ids.sort(-1).values, torch.tensor([[0, 7]] * 7))
    scores = logits.sigmoid().gather(1, ids)
    torch.testing.assert_close(w, 2.5 * scores / scores.sum(-1, keepdim=True))


def test_group_limited_routing_never_leaves_the_chosen_groups(gen):
    router = TopKRouter(16, 16, 4, score="sigmoid", n_group=4, topk_group=1)
    _, ids, _ = router(randn(gen, 50, 16))
    groups = ids // 4
    assert bool((groups == groups[:, :1]).all())


def test_router_rejects_inconsistent_arguments():
    with pytest.raises(ArgumentError, match="score"):
        TopKRouter(8, 4, 2, score="relu")
    with pytest.raises(ArgumentError, match="n_group"):
        TopKRouter(8, 6, 2, n_group=4, topk_group=1)
    with pytest.raises(ArgumentError, match="topk_group"):
        TopKRouter(8, 8, 4, n_group=4, topk_group=1)
    with pytest.raises(ArgumentError, match="top_k"):
        TopKRouter(8, 4, 5)


# -- experts and MoE --------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout,alignment", [("contiguous", 1), ("contiguous", 8), ("masked", 1), ("auto", 4)])
@pytest.mark.parametrize("bias", [False, True])
def test_moe_equals_per_expert_loop(gen, layout, alignment, bias):
    torch.manual_seed(0)
    moe = MoE(
        TopKRouter(16, 5, 2),
        GroupedExperts(5, 16, 12, bias=bias),
        layout=layout,
        alignment=alignment,
        masked_capacity=16,
    )
    if bias:
        with torch.no_grad():
            moe.experts.b13.normal_()
            moe.experts.b2.normal_()
    x = randn(gen, 11, 16)
    y = moe(x)
    w, ids, _ = moe.router(x)
    want = loop_moe(x, w, ids, moe.experts.w13, moe.experts.w2, moe.experts.b13, moe.experts.b2)
    torch.testing.assert_close(y.double(), want, rtol=1e-5, atol=1e-5)
    assert torch.equal(moe.tokens_per_expert, torch.bincount(ids.flatten(), minlength=5))


def test_moe_weight_gradients_match_the_loop_in_float64_on_the_reference_backend(gen, monkeypatch):
    monkeypatch.setenv("MOE_HAL_BACKEND", "reference")
    torch.manual_seed(0)
    moe = MoE(TopKRouter(8, 4, 2, dtype=torch.float64), GroupedExperts(4, 8, 6, dtype=torch.float64), alignment=4)
    x = randn(gen, 6, 8, dtype=torch.float64).requires_grad_()
    params = (x, moe.router.weight, moe.experts.w13, moe.experts.w2)
    got = torch.autograd.grad(moe(x).square().sum(), params)

    def loop(x, wr, w13, w2):
        probs = (x @ wr.T).softmax(-1)
        wt, ids = probs.topk(2, dim=-1)
        wt = wt / wt.sum(-1, keepdim=True)
        y = torch.zeros_like(x)
        for t in range(x.shape[0]):
            for j in range(2):
                h = w13[ids[t, j]] @ x[t]
                y[t] = y[t] + wt[t, j] * (w2[ids[t, j]] @ (F.silu(h[:6]) * h[6:]))
        return y

    want = torch.autograd.grad(loop(*params).square().sum(), params)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_moe_reads_its_routing_on_the_host_once_per_step_and_fills_main_grad(gen, monkeypatch, compiled):
    """The dispatch's device psum serves both grouped GEMMs and their backward products: one host
    read per forward + backward; experts with fp32 main_grad buffers get their gradients there."""
    from torch._dynamo.testing import CompileCounterWithBackend

    from moe_hal.layouts import SegmentLayout

    torch.manual_seed(0)
    moe = MoE(TopKRouter(16, 5, 2), GroupedExperts(5, 16, 12), alignment=4)
    x = randn(gen, 11, 16)
    expected = torch.autograd.grad(moe(x).square().sum(), (moe.experts.w13, moe.experts.w2))
    for w in (moe.experts.w13, moe.experts.w2):
        w.main_grad = torch.zeros_like(w, dtype=torch.float32)
    reads, original = [0], SegmentLayout.from_psum.__func__

    def counting(cls, *args, **kwargs):
        reads[0] += 1
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(SegmentLayout, "from_psum", classmethod(counting))
    counter = CompileCounterWithBackend("aot_eager")
    run = torch.compile(moe, backend=counter, fullgraph=True) if compiled else moe
    run(x).square().sum().backward()
    assert reads[0] == 1
    assert moe.experts.w13.grad is None and moe.experts.w2.grad is None
    for w, want in zip((moe.experts.w13, moe.experts.w2), expected):
        torch.testing.assert_close(w.main_grad, want, rtol=1e-5, atol=1e-6)
    assert counter.frame_count == (1 if compiled else 0)


@pytest.mark.parametrize("layout", ["contiguous", "masked", "auto"])
@pytest.mark.parametrize("shape", [(0, 8), (2, 0, 8)])
def test_moe_on_an_empty_batch_returns_empty_output_and_gradients(layout, shape):
    # An empty micro-batch (or a rank whose batch is empty): zero rows out, zero rows of gradient,
    # and the parameters still get (zero) gradients, as a plain nn.Linear stack would give.
    torch.manual_seed(0)
    moe = MoE(TopKRouter(8, 5, 3), GroupedExperts(5, 8, 4), layout=layout, masked_capacity=4)
    x = torch.zeros(shape, requires_grad=True)
    y = moe(x)
    assert y.shape == shape and y.dtype == x.dtype
    y.sum().backward()
    assert x.grad.shape == shape
    assert moe.experts.w13.grad is None or not moe.experts.w13.grad.any()


def test_masked_layout_refuses_more_tokens_than_its_capacity(gen):
    moe = MoE(TopKRouter(8, 4, 2), GroupedExperts(4, 8, 6), layout="masked", masked_capacity=4)
    with pytest.raises(CapacityError, match="masked_capacity"):
        moe(randn(gen, 5, 8))


def test_auto_layout_switches_on_the_token_count(gen):
    moe = MoE(TopKRouter(8, 4, 2), GroupedExperts(4, 8, 6), layout="auto", masked_capacity=4)
    assert isinstance(moe.dispatch(randn(gen, 3, 8), torch.tensor([[0, 1]] * 3)).layout, moe_hal.MaskedLayout)
    assert isinstance(moe.dispatch(randn(gen, 5, 8), torch.tensor([[0, 1]] * 5)).layout, moe_hal.PsumLayout)


def test_fp8_prepared_experts_are_close_and_forward_only(gen):
    torch.manual_seed(0)
    experts = GroupedExperts(3, 128, 128)
    moe = MoE(TopKRouter(128, 3, 2), experts)
    x = randn(gen, 10, 128)
    with torch.no_grad():
        want = moe(x)
        experts.prepare_fp8()
        got = moe(x)
    assert calc_diff(got, want) < 5e-3  # two fp8 GEMMs, each input quantized, bf16 between
    with pytest.raises(GradientError, match="fp8"):
        moe(x.requires_grad_())
    experts.drop_fp8()
    moe(x).sum().backward()


def test_expert_weights_reads_every_checkpoint_layout(gen):
    e, h, i = 3, 8, 5
    w13, w2 = randn(gen, e, 2 * i, h), randn(gen, e, h, i)
    fused = {"experts.gate_up_proj": w13, "experts.down_proj": w2}
    qwen = {
        f"experts.{k}.{n}.weight": t
        for k in range(e)
        for n, t in (("gate_proj", w13[k, :i]), ("up_proj", w13[k, i:]), ("down_proj", w2[k]))
    }
    mixtral = {
        f"experts.{k}.{n}.weight": t
        for k in range(e)
        for n, t in (("w1", w13[k, :i]), ("w3", w13[k, i:]), ("w2", w2[k]))
    }
    for sd in (fused, qwen, mixtral):
        got13, got2 = expert_weights(sd, e)
        assert torch.equal(got13, w13) and torch.equal(got2, w2)
    del mixtral["experts.2.w3.weight"]
    with pytest.raises(ArgumentError, match="experts.2.w3.weight"):
        expert_weights(mixtral, e)


# -- transformers blocks ----------------------------------------------------------------------------------
def _hf_block(name: str):
    transformers = pytest.importorskip("transformers")  # the test extra installs it; skip only these tests
    torch.manual_seed(0)
    if name == "mixtral":
        from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

        block = MixtralSparseMoeBlock(
            transformers.MixtralConfig(hidden_size=32, intermediate_size=16, num_local_experts=4, num_experts_per_tok=2)
        )
        params = {"gate.weight": "router.weight"}
    elif name == "qwen3_moe":
        from transformers.models.qwen3_moe.modeling_qwen3_moe import (
            Qwen3MoeSparseMoeBlock,
        )

        block = Qwen3MoeSparseMoeBlock(
            transformers.Qwen3MoeConfig(
                hidden_size=32, moe_intermediate_size=16, num_experts=6, num_experts_per_tok=2, norm_topk_prob=False
            )
        )
        params = {"gate.weight": "router.weight"}
    else:
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE

        block = DeepseekV3MoE(
            transformers.DeepseekV3Config(
                hidden_size=32,
                moe_intermediate_size=16,
                n_routed_experts=8,
                num_experts_per_tok=2,
                n_group=4,
                topk_group=2,
                n_shared_experts=1,
                routed_scaling_factor=2.5,
            )
        )
        params = {
            "shared_experts.gate_proj.weight": "shared_expert.gate_proj.weight",
            "shared_experts.down_proj.weight": "shared_expert.down_proj.weight",
        }
    for p in block.parameters():
        torch.nn.init.normal_(p, std=0.3)
    for b in block.buffers():
        if b.is_floating_point():
            b.normal_(std=0.1)
    params.update({"experts.gate_up_proj": "experts.w13", "experts.down_proj": "experts.w2"})
    return block.eval(), params


HF_BLOCKS = ("mixtral", "qwen3_moe", "deepseek_v3")


def _check_equal_to_hf(block, moe, names, x, dy, rtol, atol, grad_diff=None):
    """Forward elementwise; weight gradients elementwise, or (bf16, where sums of many rounded
    products differ in order) by DeepGEMM's calc_diff below ``grad_diff``."""
    y_hf = block(x)
    y = moe(x)
    torch.testing.assert_close(y, y_hf, rtol=rtol, atol=atol)
    hf_params, our_params = dict(block.named_parameters()), dict(moe.named_parameters())
    hf = torch.autograd.grad(y_hf, [hf_params[k] for k in names], dy)
    ours = torch.autograd.grad(y, [our_params[v] for v in names.values()], dy)
    for name, g_hf, g in zip(names, hf, ours):
        assert g.dtype == g_hf.dtype, name
        if grad_diff is None:
            torch.testing.assert_close(g, g_hf, rtol=rtol, atol=atol, msg=lambda m, name=name: f"{name}: {m}")
        else:
            assert calc_diff(g, g_hf) < grad_diff, (name, calc_diff(g, g_hf))


@pytest.mark.parametrize("layout", ["contiguous", "masked"])
@pytest.mark.parametrize("name", HF_BLOCKS)
def test_from_hf_matches_the_transformers_block_fp32(gen, name, layout):
    block, names = _hf_block(name)
    moe = MoE.from_hf(block, layout=layout, alignment=4, masked_capacity=16)
    x = randn(gen, 2, 5, 32)
    _check_equal_to_hf(block, moe, names, x, randn(gen, 2, 5, 32), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", HF_BLOCKS)
def test_from_hf_matches_the_transformers_block_bf16(gen, name):
    block, names = _hf_block(name)
    block = block.to(torch.bfloat16)
    moe = MoE.from_hf(block)
    x = randn(gen, 3, 4, 32, dtype=torch.bfloat16)
    _check_equal_to_hf(
        block, moe, names, x, randn(gen, 3, 4, 32, dtype=torch.bfloat16), rtol=3e-2, atol=3e-2, grad_diff=1e-3
    )


@pytest.mark.parametrize("name", HF_BLOCKS)
def test_compiled_from_hf_matches_the_transformers_block(gen, name):
    from torch._dynamo.testing import CompileCounterWithBackend

    block, names = _hf_block(name)
    moe = MoE.from_hf(block, alignment=4)
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(moe, backend=counter, fullgraph=True, dynamic=True)
    for tokens in (5, 7):
        x = randn(gen, 1, tokens, 32)
        y_hf = block(x)
        y = compiled(x)
        torch.testing.assert_close(y, y_hf, rtol=1e-5, atol=1e-5)
        dy = randn(gen, 1, tokens, 32)
        hf_params, our_params = dict(block.named_parameters()), dict(moe.named_parameters())
        hf = torch.autograd.grad(y_hf, [hf_params[k] for k in names], dy)
        ours = torch.autograd.grad(y, [our_params[v] for v in names.values()], dy)
        for g, g_hf in zip(ours, hf):
            torch.testing.assert_close(g, g_hf, rtol=1e-5, atol=1e-5)
    assert counter.frame_count <= 2


def test_nn_from_hf_is_moe_from_hf(gen):
    import moe_hal.nn

    block, _ = _hf_block("qwen3_moe")
    moe = moe_hal.nn.from_hf(block, alignment=4)
    assert isinstance(moe, MoE) and moe.alignment == 4
    x = randn(gen, 1, 5, 32)
    torch.testing.assert_close(moe(x), MoE.from_hf(block, alignment=4)(x), rtol=0, atol=0)


def test_from_hf_refuses_a_gated_shared_expert():
    block, _ = _hf_block("mixtral")
    block.shared_expert_gate = torch.nn.Linear(32, 1)
    with pytest.raises(ArgumentError, match="shared_expert_gate"):
        MoE.from_hf(block)
