"""Property-based differential tests: every CPU-runnable backend computes what the float64
reference computes, on the awkward cases — strided ``masked_m``, N = 1, K = 1, T = 1, ``b`` in any
memory order (K-major, N-major, neither), empty groups — and never writes masked rows past
``masked_m``.

In this process the native CPU backends run (``torch``, and ``fake_vendor`` when installed).
:func:`test_interpreted_and_emulated_backends_agree` runs the same properties in child processes
with the CUDA backends' Triton kernels interpreted and the Ascend backends on their emulator
(those modes must be chosen before their libraries are imported). Explicit examples pin the cases
the issue named; hypothesis adds random ones.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import moe_hal
from moe_hal import errors

#: Backends to compare, from the environment (the child process sets it); else the native ones.
BACKENDS_VAR = "MOE_HAL_DIFFERENTIAL_BACKENDS"
NATIVE = ("torch", "fake_vendor")
SENTINEL = -512.0  # exact in every dtype compared
EXAMPLES = int(os.environ.get("MOE_HAL_DIFFERENTIAL_EXAMPLES", "25"))


def _backends() -> list[str]:
    wanted = os.environ.get(BACKENDS_VAR)
    names = wanted.split(",") if wanted else NATIVE
    known = {s.name for s in moe_hal.backends()}
    return [n for n in names if n in known]


DIFF_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
dims = st.sampled_from([1, 2, 3, 5, 8, 16, 24])
dtypes = st.sampled_from([torch.float32, torch.bfloat16])


def _tensor(gen: torch.Generator, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(shape, generator=gen).to(dtype)


def _weights(gen, g: int, n: int, k: int, dtype, order: str, step: int) -> torch.Tensor:
    """``b[G, N, K]`` in memory order ``order``: ``k`` (K contiguous), ``n`` (a view of [G, K, N]) or
    ``strided`` (neither: every ``step``-th element along both N and K)."""
    if order == "k":
        return _tensor(gen, (g, n, k), dtype)
    if order == "n":
        return _tensor(gen, (g, k, n), dtype).transpose(1, 2)
    return _tensor(gen, (g, n * step, k * (step + 1)), dtype)[:, ::step, :: step + 1]


def _masked_m(values: list[int], form: str) -> torch.Tensor:
    """int32 ``[G]`` with the given values, contiguous, stride 2, or (all equal) an expanded scalar."""
    if form == "expanded":
        return torch.tensor([values[0]], dtype=torch.int32).expand(len(values))
    if form == "strided":
        return torch.tensor([v for v in values for _ in (0, 1)], dtype=torch.int32)[::2]
    return torch.tensor(values, dtype=torch.int32)


def _close(got: torch.Tensor, want: torch.Tensor, k: int, label: str) -> None:
    got, want = got.double(), want.double()
    scale = max(1.0, float(want.abs().max()) if want.numel() else 1.0)
    tol = (2e-2 if got.dtype != torch.float32 else 1e-4) * scale
    assert torch.allclose(got, want, rtol=2e-2, atol=tol), f"{label}: max error {float((got - want).abs().max())}"


def _compare(a, b, layout, k_reduction: int, sentinel_shape: tuple[int, ...], dtype, **kw) -> None:
    want = moe_hal.grouped_gemm(a, b, layout, backend="reference", **kw)
    ran = 0
    for name in _backends():
        out = torch.full(sentinel_shape, SENTINEL, dtype=dtype)
        try:
            got = moe_hal.grouped_gemm(a, b, layout, out=out, backend=name, **kw)
        except errors.BackendUnavailableError:
            continue  # a refusal with reasons is allowed; a wrong answer is not
        ran += 1
        assert got is out
        if isinstance(layout, moe_hal.MaskedLayout):
            rows = torch.arange(out.shape[1])[None, :, None] < layout.masked_m.long()[:, None, None]
            untouched = out.masked_select(~rows)
            assert bool((untouched == SENTINEL).all()), f"{name} wrote rows past masked_m"
            _close(out.masked_select(rows), want.masked_select(rows), k_reduction, name)
        else:
            _close(out, want, k_reduction, name)
    _ran.append(ran)


_ran: list[int] = []


@pytest.fixture
def some_backend_runs():
    """After the property ran: some backend ran some example (a property that skipped every
    example, because every backend refused, would have tested nothing)."""
    _ran.clear()
    yield
    assert _backends(), f"none of the backends {os.environ.get(BACKENDS_VAR) or NATIVE} is installed"
    assert any(_ran), "no backend could run any generated case: the property tested nothing"


BF16 = torch.bfloat16


@pytest.mark.filterwarnings("ignore::moe_hal.errors.MoeHalWarning")
@DIFF_SETTINGS
@given(
    counts=st.lists(st.integers(0, 9), min_size=1, max_size=4),
    n=dims,
    k=dims,
    dtype=dtypes,
    order=st.sampled_from(["k", "n", "strided"]),
    step=st.integers(1, 2),
    alignment=st.sampled_from([1, 4, 8]),
    seed=st.integers(0, 2**16),
)
@example(counts=[3, 0, 5], n=1, k=16, dtype=BF16, order="n", step=1, alignment=1, seed=0)  # N = 1, N-major b
@example(counts=[3, 0, 5], n=8, k=1, dtype=BF16, order="k", step=1, alignment=4, seed=1)  # K = 1
@example(counts=[4, 2], n=8, k=16, dtype=BF16, order="strided", step=2, alignment=1, seed=2)  # b neither K- nor N-major
@pytest.mark.usefixtures("some_backend_runs")
def test_contiguous_backends_agree(counts, n, k, dtype, order, step, alignment, seed):
    gen = torch.Generator().manual_seed(seed)
    lay = moe_hal.ContiguousLayout.from_counts(counts, alignment=alignment)
    a = _tensor(gen, (lay.num_rows, k), dtype)
    b = _weights(gen, len(counts), n, k, dtype, order, step)
    _compare(a, b, lay, k, (lay.num_rows, n), dtype)


@pytest.mark.filterwarnings("ignore::moe_hal.errors.MoeHalWarning")
@DIFF_SETTINGS
@given(
    values=st.lists(st.integers(0, 8), min_size=1, max_size=4),
    max_m=st.sampled_from([1, 3, 8]),
    n=dims,
    k=dims,
    dtype=dtypes,
    order=st.sampled_from(["k", "n", "strided"]),
    step=st.integers(1, 2),
    form=st.sampled_from(["contiguous", "strided", "expanded"]),
    seed=st.integers(0, 2**16),
)
@example(values=[2, 2, 2, 2], max_m=4, n=8, k=16, dtype=BF16, order="k", step=1, form="expanded", seed=0)
@example(values=[3, 0, 1], max_m=4, n=8, k=16, dtype=BF16, order="k", step=1, form="strided", seed=1)
@example(values=[1, 2], max_m=3, n=1, k=1, dtype=BF16, order="n", step=1, form="contiguous", seed=2)  # N = K = 1
@example(values=[2, 1], max_m=3, n=8, k=16, dtype=BF16, order="strided", step=2, form="strided", seed=3)
@pytest.mark.usefixtures("some_backend_runs")
def test_masked_backends_agree_and_never_write_past_masked_m(values, max_m, n, k, dtype, order, step, form, seed):
    values = [min(v, max_m) for v in values]
    if form == "expanded":
        values = [values[0]] * len(values)
    groups = len(values)
    gen = torch.Generator().manual_seed(seed)
    lay = moe_hal.MaskedLayout(_masked_m(values, form), max_m)
    a = _tensor(gen, (groups, max_m, k), dtype)
    b = _weights(gen, groups, n, k, dtype, order, step)
    _compare(a, b, lay, k, (groups, max_m, n), dtype)


@pytest.mark.filterwarnings("ignore::moe_hal.errors.MoeHalWarning")
@DIFF_SETTINGS
@given(
    counts=st.lists(st.integers(0, 6), min_size=1, max_size=4),
    m=dims,
    n=dims,
    dtype=dtypes,
    a_transposed=st.booleans(),
    b_transposed=st.booleans(),
    with_c=st.booleans(),
    seed=st.integers(0, 2**16),
)
@example(counts=[1], m=8, n=8, dtype=BF16, a_transposed=True, b_transposed=False, with_c=False, seed=0)  # T = 1
@example(counts=[1], m=2, n=1, dtype=torch.float32, a_transposed=True, b_transposed=False, with_c=False, seed=0)
@example(counts=[0, 3, 2], m=1, n=1, dtype=BF16, a_transposed=False, b_transposed=True, with_c=True, seed=1)
@example(counts=[2, 0], m=8, n=16, dtype=BF16, a_transposed=True, b_transposed=True, with_c=False, seed=2)
@pytest.mark.usefixtures("some_backend_runs")
def test_k_grouped_backends_agree(counts, m, n, dtype, a_transposed, b_transposed, with_c, seed):
    gen = torch.Generator().manual_seed(seed)
    lay = moe_hal.KGroupedLayout.from_counts(counts)
    t = lay.num_rows
    a = _tensor(gen, (m, t), dtype).t() if a_transposed else _tensor(gen, (t, m), dtype)
    b = _tensor(gen, (n, t), dtype).t() if b_transposed else _tensor(gen, (t, n), dtype)
    kw = {"c": _tensor(gen, (len(counts), m, n), dtype)} if with_c else {}
    _compare(a, b, lay, max(t, 1), (len(counts), m, n), dtype, **kw)


CHILD_MODES = [
    pytest.param(
        "cuda_sm90,cuda_sm100", {"MOE_HAL_CUDA_INTERPRET": "1", "MOE_HAL_PLUGINS": "cuda"}, id="interpreted-cuda"
    ),
    pytest.param(
        "ascend,ascend_950", {"MOE_HAL_ASCEND_EMULATE": "1", "MOE_HAL_PLUGINS": "ascend"}, id="emulated-ascend"
    ),
]


@pytest.mark.skipif(bool(os.environ.get(BACKENDS_VAR)), reason="runs only in the parent process")
@pytest.mark.parametrize("backends,env", CHILD_MODES)
def test_interpreted_and_emulated_backends_agree(backends, env):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MOE_HAL_") and k != "TRITON_INTERPRET"}
    env = {**clean, **env, BACKENDS_VAR: backends, "MOE_HAL_DIFFERENTIAL_EXAMPLES": "3"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            str(Path(__file__)),
            "-k",
            "backends_agree and not interpreted",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert "3 passed" in done.stdout, done.stdout[-2000:]
