"""Test utilities the core ships for the plugins' own test suites, so that a plugin's tests keep
working when the plugin lives in a repository of its own: checks every backend should pass,
written once.

* :func:`only_plugins` — discover only the named plugins inside a block (e.g. to test one
  plugin's hooks without the others answering first).
* :func:`check_gradients` — gradients of :func:`moe_hal.grouped_gemm` through a backend against
  float64 gradients from the reference backend, for the contiguous, masked and K-grouped layouts.
* :class:`CountOps` — count the aten ops a block runs (an accelerator launches about one kernel
  per op, so a count that grows with the problem's structure is a launch-overhead problem).
"""

from __future__ import annotations

import collections
import contextlib
import os
from collections.abc import Callable, Iterator, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from . import api, plugins
from .layouts import ContiguousLayout, KGroupedLayout, MaskedLayout

__all__ = ["CountOps", "check_gradients", "only_plugins"]


@contextlib.contextmanager
def only_plugins(*names: str) -> Iterator[None]:
    """Inside the block, plugin discovery finds only ``names`` (``MOE_HAL_PLUGINS``); on exit the
    variable is restored and the plugins are discovered again."""
    previous = os.environ.get("MOE_HAL_PLUGINS")
    os.environ["MOE_HAL_PLUGINS"] = ",".join(names)
    plugins.reload()
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("MOE_HAL_PLUGINS", None)
        else:
            os.environ["MOE_HAL_PLUGINS"] = previous
        plugins.reload()


def _grads(fn: Callable[..., torch.Tensor], inputs: Sequence[torch.Tensor], dy: torch.Tensor, **kw) -> tuple:
    """``(y, dy/da, dy/db)`` of ``y = fn(*inputs, **kw)`` for the output gradient ``dy``."""
    leaves = [x.detach().clone().requires_grad_() for x in inputs]
    y = fn(*leaves, **kw)
    return (y, *torch.autograd.grad(y, leaves, dy.to(y.dtype)))


def check_gradients(
    backend: str,
    dtype: torch.dtype,
    generator: torch.Generator,
    rtol: float,
    atol: float,
    atol_per_magnitude: float = 0.0,
) -> None:
    """Assert that the output and the gradients of ``a`` and ``b`` of
    :func:`moe_hal.grouped_gemm` with ``backend=backend`` match the float64 reference backend.

    Three small problems, G = 3 with an empty group: contiguous (group sizes 5, 0, 9, alignment 16,
    K = 64, N = 32), masked (``a [3, 8, 64]``, ``masked_m = [3, 0, 8]``) and K-grouped (group sizes
    5, 0, 9, alignment 16, M = 32, N = 64). Operands are drawn from ``generator`` in fp32 and cast to
    ``dtype`` (results must come back in ``dtype``); the same values in float64 give the expected
    results. Each comparison allows ``rtol`` and ``atol + atol_per_magnitude * max|expected|``.
    """
    lay = ContiguousLayout.from_counts([5, 0, 9], alignment=16)
    mlay = MaskedLayout(torch.tensor([3, 0, 8], dtype=torch.int32), 8)
    klay = KGroupedLayout.from_counts([5, 0, 9], alignment=16)
    gen = generator
    cases = [
        (torch.randn(lay.num_rows, 64, generator=gen), torch.randn(3, 32, 64, generator=gen), lay),
        (torch.randn(3, 8, 64, generator=gen), torch.randn(3, 32, 64, generator=gen), mlay),
        (torch.randn(klay.num_rows, 32, generator=gen), torch.randn(klay.num_rows, 64, generator=gen), klay),
    ]
    for a, b, layout in cases:

        def run(a, b, be, layout=layout):
            return api.grouped_gemm(a, b, layout, backend=be)

        dy = torch.randn(run(a.double(), b.double(), "reference").shape, generator=gen)
        want = _grads(run, (a.double(), b.double()), dy, be="reference")
        got = _grads(run, (a.to(dtype), b.to(dtype)), dy, be=backend)
        for g, w in zip(got, want):
            assert g.dtype == dtype, f"{backend} {layout.op}: {g.dtype} result for {dtype} operands"
            torch.testing.assert_close(
                g.double(), w, rtol=rtol, atol=atol + atol_per_magnitude * float(w.detach().abs().max())
            )


class CountOps(TorchDispatchMode):
    """Counts the aten ops run inside ``with CountOps() as count:`` — views and other metadata ops
    included — by name in ``count.ops`` (a :class:`collections.Counter`); ``count.total`` is their
    sum. Ops an autograd backward runs on the same thread are counted too."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()

    @property
    def total(self) -> int:
        return sum(self.ops.values())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))
