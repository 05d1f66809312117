"""moe_hal.ep: expert parallelism over torch.distributed, tested on gloo.

Multi-process: one spawn per world size (2, 3, 4) runs every case of ``tests/ep_cases.py`` on every
rank (each rank checks itself against the single-process result); each case is reported as its own
test. In-process: a one-rank gloo group for argument errors, transports and the plugin hook.
"""

from __future__ import annotations

import functools
import time
import types

import pytest
import torch
import torch.distributed as dist

import moe_hal
from moe_hal import ep, plugins, routing
from moe_hal.ep.transport import AllToAllSingle
from moe_hal.errors import (
    ArgumentError,
    DTypeError,
    EPCapacityError,
    LayoutError,
    ShapeError,
    SpawnError,
    TransportUnavailableError,
)
from moe_hal.hookspecs import hookimpl

from . import ep_cases

WORLD_SIZES = (2, 3, 4)
#: Hard bound on one spawn (it takes ~25-50 s on 2 idle cores; the margin is for a loaded CI host).
SPAWN_TIMEOUT_S = 240


@functools.cache
def _spawn_results(world: int) -> list[dict]:
    return ep.spawn_local(ep_cases.run_cases, world, timeout_s=SPAWN_TIMEOUT_S, collective_timeout_s=20)


@pytest.mark.parametrize("case", ep_cases.CASES)
@pytest.mark.parametrize("world", WORLD_SIZES)
def test_every_rank_matches_the_single_process_result(world, case):
    per_rank = _spawn_results(world)
    failures = {rank: out[case] for rank, out in enumerate(per_rank) if out.get(case, "case not run")}
    assert not failures, "\n".join(f"--- rank {r}:\n{text}" for r, text in failures.items())


def test_ep_ops_do_not_grow_with_the_rank_count():
    per_rank = ep.spawn_local(ep_cases.ops_by_group_size, 4, timeout_s=SPAWN_TIMEOUT_S, collective_timeout_s=20)
    for rank, modes in enumerate(per_rank):
        for mode, (four, two) in modes.items():
            assert two > 0 and abs(four - two) <= ep_cases.OPS_SLACK, (rank, mode, four, two)


def test_a_crashed_rank_fails_every_rank_within_the_timeout():
    start = time.monotonic()
    with pytest.raises(SpawnError) as info:
        ep.spawn_local(ep_cases.crash_on_one_rank, 2, timeout_s=90, collective_timeout_s=20)
    assert time.monotonic() - start < 90
    assert set(info.value.failures) == {0, 1}
    assert "injected failure on rank 1" in info.value.failures[1]
    assert info.value.failures[0]  # the peer reports its own error (closed connection / timeout)


# -- in process: a one-rank gloo group -----------------------------------------------------------


@pytest.fixture(scope="module")
def world1():
    assert not dist.is_initialized()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_epgroup_default_placement_is_contiguous_blocks(world1):
    g = ep.EPGroup(None, 5)
    assert g.placement == (0,) * 5 and g.local_experts == (0, 1, 2, 3, 4) and g.world_size == 1


def test_epgroup_refuses_bad_placements(world1):
    with pytest.raises(LayoutError, match="placement"):
        ep.EPGroup(None, 3, placement=[0, 0])
    with pytest.raises(LayoutError, match=r"placement\[1\]"):
        ep.EPGroup(None, 3, placement=[0, 1, 0])
    with pytest.raises(ArgumentError, match="num_experts"):
        ep.EPGroup(None, 0)


def test_dispatch_refuses_bad_arguments_naming_them(world1):
    g = ep.EPGroup(None, 4)
    x, ids = torch.ones(3, 8), torch.zeros(3, 2, dtype=torch.int64)
    with pytest.raises(ArgumentError, match="capacity"):
        ep.dispatch(x, ids, None, g, mode="capacity")
    with pytest.raises(ArgumentError, match="capacity"):
        ep.dispatch(x, ids, None, g, mode="exact", capacity=4)
    with pytest.raises(ArgumentError, match="mode"):
        ep.dispatch(x, ids, None, g, mode="ragged")
    with pytest.raises(ArgumentError, match="overflow"):
        ep.dispatch(x, ids, None, g, mode="capacity", capacity=4, overflow="ignore")
    with pytest.raises(LayoutError, match="alignment"):
        ep.dispatch(x, ids, None, g, alignment=0)
    with pytest.raises(LayoutError, match=r"topk_ids\[1, 0\]"):
        ep.dispatch(x, torch.tensor([[0, 1], [7, 1], [0, 1]]), None, g)
    with pytest.raises(DTypeError, match="group"):
        ep.dispatch(x, ids, None, "world")
    with pytest.raises(ShapeError, match=r"x.*at least one feature.*\(3, 0\)"):
        ep.dispatch(torch.ones(3, 0), ids, None, g)
    d = ep.dispatch(x, ids, None, g, alignment=1)
    with pytest.raises(ShapeError, match="expert_out"):
        ep.combine(torch.ones(d.layout.num_rows + 1, 4), d)
    with pytest.raises(ShapeError, match=r"expert_out.*at least one feature"):
        ep.combine(torch.ones(d.layout.num_rows, 0), d)


def test_capacity_overflow_names_expert_rank_count_and_capacity(world1):
    g = ep.EPGroup(None, 4)
    ids = torch.tensor([[2, 0], [2, 1], [2, 0]])
    with pytest.raises(EPCapacityError) as info:
        ep.dispatch(torch.ones(3, 8), ids, None, g, mode="capacity", capacity=2)
    e = info.value
    assert (e.expert, e.rank, e.owner, e.count, e.capacity) == (2, 0, 0, 3, 2)
    d = ep.dispatch(torch.ones(3, 8), ids, None, g, mode="capacity", capacity=2, overflow="drop")
    assert int(d.dropped) == 1 and d.layout.masked_m.tolist() == [2, 1, 2, 0]


def test_one_rank_matches_routing_in_both_modes(world1, gen):
    g = ep.EPGroup(None, 6)
    x = torch.randn(20, 16, generator=gen)
    ids = torch.randint(-1, 6, (20, 3), generator=gen)
    w = torch.rand(20, 3, generator=gen)
    b = torch.randn(6, 8, 16, generator=gen)
    ref = routing.dispatch(x, ids, 6, alignment=8, topk_weights=w)
    want = routing.combine(moe_hal.grouped_gemm(ref.a, b, ref.layout), ref)
    d = ep.dispatch(x, ids, w, g, alignment=8)
    assert torch.equal(d.a, ref.a) and d.layout == ref.layout
    torch.testing.assert_close(ep.combine(moe_hal.grouped_gemm(d.a, b, d.layout), d), want)
    dc = ep.dispatch(x, ids, w, g, mode="capacity", capacity=20)
    torch.testing.assert_close(ep.combine(torch.bmm(dc.a, b.transpose(1, 2)), dc), want)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("chunk_tokens", [3, None])
def test_combine_sums_in_fixed_order_across_chunks(world1, gen, monkeypatch, dtype, chunk_tokens):
    from moe_hal.ep import exchange

    T, k, C = 10, 3, 8
    if chunk_tokens is not None:  # several token chunks in the weighted sum, the last one short
        monkeypatch.setattr(exchange, "_SUM_CHUNK_BYTES", 4 * C * chunk_tokens)
    g = ep.EPGroup(None, 4)
    x = torch.randn(T, C, generator=gen).to(dtype)
    ids = torch.randint(-1, 4, (T, k), generator=gen)
    w = torch.rand(T, k, generator=gen)
    for mode, kw in (("exact", {"alignment": 1}), ("capacity", {"capacity": T * k})):
        d = ep.dispatch(x, ids, w, g, mode=mode, **kw)
        y = ep.combine(d.a * 2, d)  # each slot's row is 2 * x[t]
        # fp32 products, added j = 0, 1, 2 in order; -1 slots contribute 0
        terms = [torch.where(ids[:, j, None] >= 0, w[:, j, None] * (2 * x).float(), 0.0) for j in range(k)]
        want = ((terms[0] + terms[1]) + terms[2]).to(dtype)
        assert torch.equal(y, want), mode


# -- transports and the plugin hook --------------------------------------------------------------


class CountingTransport(AllToAllSingle):
    """The built-in collectives, counted (proves the hook's transport is the one that runs)."""

    calls = 0

    def all_to_all(self, out, inp, out_splits, in_splits, group):
        type(self).calls += 1
        super().all_to_all(out, inp, out_splits, in_splits, group)

    def all_gather(self, out, inp, group):
        type(self).calls += 1
        super().all_gather(out, inp, group)

    def start_all_gather(self, out, inp, group):
        type(self).calls += 1
        return super().start_all_gather(out, inp, group)

    def start_all_to_all(self, out, inp, out_splits, in_splits, group):
        type(self).calls += 1
        return super().start_all_to_all(out, inp, out_splits, in_splits, group)


FAKE = ep.TransportSpec(
    name="fake_graph",
    impl=f"{__name__}:CountingTransport",
    modes=frozenset({"exact"}),
    process_group_backends=("gloo",),
    needs_host_sync=True,
    graph_safe=True,
    priority=10,
    description="test transport",
)


@pytest.fixture
def transport_plugin(world1):
    plugin = types.ModuleType("fake_ep_plugin")
    broken = types.ModuleType("broken_ep_plugin")

    @hookimpl
    def moe_hal_ep_transports(register):
        register(FAKE)

    @hookimpl
    def moe_hal_ep_transports_broken(register):  # the broken plugin's implementation
        raise RuntimeError("transport probe crashed")

    plugin.moe_hal_ep_transports = moe_hal_ep_transports
    broken.moe_hal_ep_transports = moe_hal_ep_transports_broken
    pm = plugins.host().ensure_loaded().pm
    pm.register(plugin, name="fake_ep_plugin")
    pm.register(broken, name="broken_ep_plugin")
    ep.transport._reset()
    yield
    pm.unregister(name="fake_ep_plugin")
    pm.unregister(name="broken_ep_plugin")
    ep.transport._reset()


def test_builtin_transport_declares_its_promises(world1):
    g = ep.EPGroup(None, 2)
    sel = ep.select(g, "capacity")
    assert sel.name == "all_to_all_single"
    assert sel.spec.needs_host_sync is False and sel.spec.graph_safe is False
    assert "needs_host_sync=False, graph_safe=False" in sel.explain()
    assert "fake_vendor_link: [process_group_backend]" in sel.explain()  # the test vendor's, via the hook
    with pytest.raises(TransportUnavailableError, match="not_graph_safe"):
        ep.select(g, "exact", graph=True)


def test_a_transport_without_the_start_methods_blocks_in_the_collectives(world1):
    class Blocking(ep.Transport):  # only the two required collectives
        def all_to_all(self, out, inp, out_splits, in_splits, group):
            out.copy_(inp + 2)  # marks that this method ran

        def all_gather(self, out, inp, group):
            out.copy_(inp + 1)  # marks that this method ran

    out = torch.zeros(2, dtype=torch.int64)
    pending = Blocking(FAKE).start_all_gather(out, torch.tensor([3, 4]), dist.group.WORLD)
    assert out.tolist() == [4, 5]  # already complete
    pending.wait()
    rows = torch.zeros(2, 3, dtype=torch.uint8)
    pending = Blocking(FAKE).start_all_to_all(rows, torch.ones(2, 3, dtype=torch.uint8), [2], [2], dist.group.WORLD)
    assert rows.tolist() == [[3] * 3] * 2  # already complete
    pending.wait()


def test_plugin_transports_are_ranked_and_explained(transport_plugin):
    g = ep.EPGroup(None, 4)
    assert ep.select(g, "exact").name == "fake_graph"  # higher priority
    sel = ep.select(g, "capacity")
    assert sel.name == "all_to_all_single"
    text = sel.explain()
    assert "fake_graph: [mode]" in text and "needs_host_sync" in text
    assert "broken_ep_plugin" in text and "transport probe crashed" in text
    assert ep.select(g, "exact", graph=True).name == "fake_graph"
    assert ep.select(g, "exact", transport="all_to_all_single").name == "all_to_all_single"
    with pytest.raises(ArgumentError, match="transport"):
        ep.select(g, "exact", transport="nope")


def test_transports_are_matched_against_the_backend_serving_the_tensors_device(transport_plugin):
    # torch names a group made with a device map by the map ("cpu:gloo"; "cpu:gloo,cuda:nccl" is
    # what init_process_group() without a backend makes on a CUDA machine): a transport declared
    # for "gloo" must still run on its CPU tensors
    g = ep.EPGroup(dist.new_group([0], backend="cpu:gloo"), 4)
    assert g.backend == "cpu:gloo" and g.backend_for("cpu") == "gloo"
    sel = ep.select(g, "exact")
    assert sel.name == "fake_graph" and sel.pg_backend == "gloo"
    assert "process group backend 'gloo' for cpu tensors" in sel.explain()
    CountingTransport.calls = 0
    x = torch.arange(8.0).view(2, 4)
    d = ep.dispatch(x, torch.tensor([[0], [3]]), torch.ones(2, 1), g, alignment=1)
    assert torch.equal(ep.combine(d.a, d), x) and CountingTransport.calls > 0
    with pytest.raises(ArgumentError, match=r"device.*cpu:gloo.*cuda"):
        g.backend_for("cuda")  # the map serves no CUDA tensors
    with pytest.raises(ArgumentError, match="device"):
        ep.select(g, "exact", device="cuda")
    with pytest.raises(ArgumentError, match="device"):
        g.backend_for("not-a-device")
    assert ep.EPGroup(None, 4).backend_for("cuda") == "gloo"  # one name serves every device


def test_dispatch_moves_data_through_the_selected_transport(transport_plugin):
    g = ep.EPGroup(None, 4)
    CountingTransport.calls = 0
    x = torch.arange(12.0).view(3, 4)
    d = ep.dispatch(x, torch.tensor([[3], [0], [3]]), None, g, alignment=1)
    y = ep.combine(d.a * 2, d)
    # dispatch's count all-gather and combine's status all-gather; on one rank no row leaves the
    # rank, so no all-to-all runs (rows moved by the all-to-all: the multi-process cases)
    assert d.transport == "fake_graph" and CountingTransport.calls == 2
    assert torch.equal(y, 2 * x)


@pytest.mark.parametrize(
    "argv,option",
    [
        (["--ep", "0"], "--ep"),  # 0 used to run the single-process job instead
        (["--ep-mode", "capacity"], "--ep-mode"),  # without --ep it used to be ignored
        (["--ep-timeout", "5"], "--ep-timeout"),
        (["--ep", "2", "--ep-timeout", "-1"], "--ep-timeout"),
    ],
)
def test_cli_run_ep_refuses_options_that_would_be_ignored_or_invalid(argv, option, monkeypatch, capsys):
    from moe_hal.cli import main

    monkeypatch.setenv("MOE_HAL_PLUGINS", "")
    assert main(["run", *argv, "--tokens", "96", "--n", "32", "--k", "128", "--repeat", "0"]) == 2
    err = capsys.readouterr().err
    assert f"{option}: expected" in err and "Traceback" not in err


def test_cli_run_ep_verifies_against_one_process(tmp_path, monkeypatch, capsys):
    from moe_hal.cli import main

    monkeypatch.setenv("MOE_HAL_PLUGINS", "")
    out = tmp_path / "ep.json"
    assert (
        main(["run", "--ep", "2", "--tokens", "96", "--n", "32", "--k", "128", "--repeat", "0", "--out", str(out)]) == 0
    )
    printed = capsys.readouterr().out
    assert "verified against the single-process result" in printed
    import json

    r = json.loads(out.read_text())
    assert r["verified"] and [x["tokens"] for x in r["ranks"]] == [48, 48]
    assert sum(sum(x["received_from"]) for x in r["ranks"]) == sum(x["slots_routed"] for x in r["ranks"])
