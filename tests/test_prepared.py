"""The prepared-weight cache: reuse, invalidation on in-place change, weak lifetime, byte budget."""

from __future__ import annotations

import gc
import warnings
import weakref

import pytest
import torch

from moe_hal import notices
from moe_hal.errors import ArgumentError, DTypeError, PathWarning
from moe_hal.prepared import ENV_MAX_BYTES, PreparedCache, parse_bytes, prepared_cache
from moe_hal.quant import quantize_fp8


class Counter:
    """A build function that counts its calls."""

    def __init__(self, fn=lambda w: w.to(torch.float64) * 2):
        self.calls = 0
        self.fn = fn

    def __call__(self, source):
        self.calls += 1
        return self.fn(source)


@pytest.fixture
def cache(monkeypatch):
    monkeypatch.delenv(ENV_MAX_BYTES, raising=False)
    notices.reset()
    return PreparedCache()


def test_builds_once_and_reuses(cache):
    w = torch.randn(4, 8, 16)
    build = Counter()
    first = cache.get("b", w, "double", build)
    assert cache.get("b", w, "double", build) is first
    assert build.calls == 1
    assert torch.equal(first, w.double() * 2)
    s = cache.stats()
    assert s["entries"] == 1 and s["hits"] == 1 and s["misses"] == 1
    assert s["bytes"] == 4 * 8 * 16 * 8 and s["backends"] == {"b": {"entries": 1, "bytes": 4 * 8 * 16 * 8}}


def test_fresh_views_with_the_same_geometry_hit(cache):
    w = torch.randn(3, 16, 8)  # a user's [G, K, N] passed as w.transpose(1, 2)
    build = Counter(lambda v: v.contiguous().clone())
    first = cache.get("b", w.transpose(1, 2), "nk", build)
    assert cache.get("b", w.transpose(1, 2), "nk", build) is first
    assert build.calls == 1
    cache.get("b", w, "nk", build)  # different strides: a different entry
    assert build.calls == 2


def test_backends_and_kinds_are_separate(cache):
    w = torch.randn(2, 4, 4)
    cache.get("x", w, "k1", lambda t: t.clone())
    cache.get("x", w, "k2", lambda t: t.double())
    cache.get("y", w, "k1", lambda t: t.half())
    s = cache.stats()
    assert s["entries"] == 3
    assert s["backends"] == {"x": {"entries": 2, "bytes": 32 * 4 + 32 * 8}, "y": {"entries": 1, "bytes": 32 * 2}}
    cache.clear("x")
    assert cache.stats()["backends"] == {"y": {"entries": 1, "bytes": 64}}
    cache.clear()
    assert cache.stats()["entries"] == 0 and cache.stats()["bytes"] == 0


def test_in_place_change_invalidates(cache):
    w = torch.nn.Parameter(torch.zeros(2, 3))
    build = Counter(lambda t: t.detach().clone())
    assert torch.equal(cache.get("b", w, "copy", build), torch.zeros(2, 3))
    with torch.no_grad():
        w.add_(1)
    assert torch.equal(cache.get("b", w, "copy", build), torch.ones(2, 3))
    assert build.calls == 2 and cache.stats()["invalidations"] == 1 and cache.stats()["entries"] == 1
    plain = torch.zeros(4)
    cache.get("b", plain, "copy", build)
    plain[1] = 5.0  # indexing writes bump the version too
    assert cache.get("b", plain, "copy", build)[1] == 5.0


def test_quantized_source_invalidates_on_scale_change(cache):
    q = quantize_fp8(torch.randn(2, 128, 256), block=(128, 128))
    build = Counter(lambda src: src.dequantize())
    first = cache.get("b", q, "deq", build)
    assert cache.get("b", q, "deq", build) is first
    q.scale.mul_(2)
    second = cache.get("b", q, "deq", build)
    assert build.calls == 2 and torch.equal(second, first * 2)


def test_freed_source_frees_its_entry(cache):
    w = torch.randn(64, 64)
    value = cache.get("b", w, "copy", lambda t: t.clone())
    value_ref = weakref.ref(value)
    del value
    view = w.t()
    del w
    gc.collect()
    assert cache.stats()["entries"] == 1  # a view keeps the storage alive
    del view
    gc.collect()
    assert cache.stats()["entries"] == 0 and cache.stats()["bytes"] == 0
    assert value_ref() is None  # the prepared form is freed too


def test_discard_after_writes_the_version_counter_cannot_see(cache):
    w = torch.nn.Parameter(torch.zeros(3))
    build = Counter(lambda t: t.detach().clone())
    cache.get("b", w, "copy", build)
    w.data.copy_(torch.ones(3))  # bypasses w's version counter
    assert torch.equal(cache.get("b", w, "copy", build), torch.zeros(3))  # documented: stale
    assert cache.discard(w) == 1
    assert torch.equal(cache.get("b", w, "copy", build), torch.ones(3))


def test_inference_tensors_are_cached(cache):
    with torch.inference_mode():
        w = torch.randn(4)
    build = Counter(lambda t: t.clone())
    assert cache.get("b", w, "copy", build) is cache.get("b", w, "copy", build)
    assert build.calls == 1


def test_lru_eviction_under_a_budget(cache):
    ws = [torch.randn(256) for _ in range(4)]  # 1 KiB fp32 results each
    cache.set_max_bytes(2 * 1024)
    for w in ws[:2]:
        cache.get("b", w, "copy", lambda t: t.clone())
    cache.get("b", ws[0], "copy", lambda t: t.clone())  # touch 0: 1 is now the oldest
    cache.get("b", ws[2], "copy", lambda t: t.clone())
    s = cache.stats()
    assert s["entries"] == 2 and s["bytes"] == 2048 and s["evictions"] == 1
    build = Counter(lambda t: t.clone())
    cache.get("b", ws[0], "copy", build)
    assert build.calls == 0  # 0 survived
    cache.get("b", ws[1], "copy", build)
    assert build.calls == 1  # 1 was evicted
    cache.set_max_bytes("1KiB")
    assert cache.stats()["entries"] == 1
    cache.set_max_bytes(None)
    assert cache.max_bytes is None


def test_result_larger_than_the_budget_is_not_cached(cache):
    cache.set_max_bytes(100)
    build = Counter(lambda t: t.clone())
    with pytest.warns(PathWarning, match="budget"):
        cache.get("b", torch.randn(64), "copy", build)
    assert cache.stats()["entries"] == 0 and cache.stats()["uncached"] == 1


def test_budget_from_the_environment(cache, monkeypatch):
    monkeypatch.setenv(ENV_MAX_BYTES, "1KiB")
    assert cache.max_bytes == 1024
    ws = [torch.randn(256) for _ in range(3)]
    for w in ws:
        cache.get("b", w, "copy", lambda t: t.clone())
    assert cache.stats()["entries"] == 1
    cache.set_max_bytes(10**6)  # the setter wins
    assert cache.max_bytes == 10**6
    cache.reset_max_bytes()
    monkeypatch.setenv(ENV_MAX_BYTES, "lots")
    with pytest.raises(ArgumentError, match=ENV_MAX_BYTES):
        cache.get("b", ws[0], "copy", lambda t: t.clone())


def test_parse_bytes():
    assert parse_bytes("8000000000") == 8 * 10**9
    assert parse_bytes("8e9") == 8 * 10**9
    assert parse_bytes("512MiB") == 512 * 2**20
    assert parse_bytes("8GB") == parse_bytes("8g") == 8 * 10**9
    assert parse_bytes(" 1.5 KiB ") == 1536
    with pytest.raises(ArgumentError):
        parse_bytes("-1")


def test_results_aliasing_the_source_are_not_cached(cache):
    w = torch.randn(4, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a pure alias is silent
        assert cache.get("b", w, "same", lambda t: t.contiguous()) is w
    assert cache.stats()["entries"] == 0
    with pytest.warns(PathWarning, match="views of its source"):
        out = cache.get("b", w, "mixed", lambda t: (t, t.double()))
    assert out[0] is w and cache.stats()["entries"] == 0


def test_failing_build_caches_nothing(cache):
    def boom(_):
        raise RuntimeError("no")

    with pytest.raises(RuntimeError, match="no"):
        cache.get("b", torch.ones(2), "k", boom)
    assert cache.stats()["entries"] == 0


def test_non_tensor_results_count_zero_bytes(cache):
    w = torch.ones(3)
    meta = cache.get("b", w, "meta", lambda t: {"tile": 128, "shape": tuple(t.shape)})
    assert cache.get("b", w, "meta", lambda t: None) is meta
    assert cache.stats()["bytes"] == 0


def test_argument_errors(cache):
    w = torch.ones(2)
    with pytest.raises(ArgumentError, match="backend"):
        cache.get("", w, "k", lambda t: t)
    with pytest.raises(ArgumentError, match="kind"):
        cache.get("b", w, 3, lambda t: t)
    with pytest.raises(ArgumentError, match="build"):
        cache.get("b", w, "k", None)
    with pytest.raises(DTypeError, match="source"):
        cache.get("b", [1.0], "k", lambda t: t)
    with pytest.raises(ArgumentError, match="max_bytes"):
        cache.set_max_bytes(-1)


def test_global_instance():
    assert isinstance(prepared_cache, PreparedCache)
