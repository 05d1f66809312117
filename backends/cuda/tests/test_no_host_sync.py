"""The launch path reads nothing from the device: a CPU-side test that fails on any operation that
would make the host wait for a CUDA device (issue 12: every MoE step has a new routing, so a
sync per new layout stalls every step and makes the call uncapturable).

The operands live on the ``meta`` device, which plays the GPU: host tuples and CPU tensors stay
readable, device tensors are not. The backend's plan, operand preparation and launch run with the
Triton kernels replaced by a recorder, under a torch function mode that raises on every
operation that would synchronise the host with that device: reading a device tensor's values
(``item``, ``tolist``, ``bool``/``int``/``float``, ``cpu``, ``numpy``), value-dependent output
shapes on the device (``nonzero``, ``masked_select``, ``unique``, ``repeat_interleave`` by a tensor
without ``output_size``, ...), and copies between devices without ``non_blocking=True``. Negative controls
prove the detector catches an injected read and a blocking upload.
"""

from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode, resolve_name

import moe_hal
from moe_hal.problem import Problem
from moe_hal.quant import quantize_fp8
from moe_hal_cuda import backend as cuda_backend
from moe_hal_cuda import configs, kernels, plugin

_READS = {"item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__", "__len__"}
_VALUE_SHAPED = {
    "nonzero",
    "nonzero_static",
    "argwhere",
    "masked_select",
    "unique",
    "unique_consecutive",
    "bincount",
    "histc",
    "where",
}


class HostSyncError(AssertionError):
    pass


class NoHostSync(TorchFunctionMode):
    """Raise :class:`HostSyncError` on an operation that syncs the host with the device."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = (resolve_name(func) or getattr(func, "__name__", "")).rsplit(".", 1)[-1]
        on_device = any(isinstance(x, torch.Tensor) and x.device.type != "cpu" for x in _flat(args, kwargs))
        if on_device and name in _READS:
            raise HostSyncError(f"{resolve_name(func)} reads a device tensor on the host")
        if on_device and name in _VALUE_SHAPED and not (name == "where" and len(args) + len(kwargs) > 1):
            raise HostSyncError(f"{resolve_name(func)} has a value-dependent shape (a device sync)")
        repeats = kwargs.get("repeats", args[1] if len(args) > 1 else None)
        if (
            on_device
            and name == "repeat_interleave"
            and isinstance(repeats, torch.Tensor)
            and "output_size" not in kwargs
        ):
            raise HostSyncError("repeat_interleave with tensor repeats and no output_size syncs")
        result = func(*args, **kwargs)
        if name in ("to", "copy_", "cuda") and not kwargs.get("non_blocking") and _crosses(args, result):
            raise HostSyncError(f"{resolve_name(func)} copies between devices without non_blocking=True")
        return result


def _flat(args, kwargs):
    for x in (*args, *kwargs.values()):
        if isinstance(x, (list, tuple)):
            yield from x
        else:
            yield x


def _crosses(args, result) -> bool:
    """True when a ``to``/``copy_`` moved data between the host and the device."""
    devices = {x.device.type for x in _flat(args, {}) if isinstance(x, torch.Tensor)}
    if isinstance(result, torch.Tensor):
        devices.add(result.device.type)
    return len(devices) > 1


class _Stub:
    def __init__(self, sink):
        self.sink = sink

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.sink.append(grid)


@pytest.fixture
def stubbed(monkeypatch):
    """Kernels replaced by a recorder; the backend as the real (non-interpreted) launch path runs it."""
    sink: list = []
    for name in ("contiguous_kernel", "masked_kernel", "k_grouped_kernel"):
        monkeypatch.setattr(kernels, name, _Stub(sink))
    return sink


def _backend(arch):
    spec = dict(zip(("sm90", "sm100"), plugin.specs()))[arch]
    cls = cuda_backend.CudaSM90Backend if arch == "sm90" else cuda_backend.CudaSM100Backend
    return cls(spec)


def _on_device(x):
    if isinstance(x, moe_hal.QuantizedTensor):
        return moe_hal.QuantizedTensor(x.data.to("meta"), x.scale.to("meta"), x.block, x.scale_format)
    return x.to("meta")


def _operand(gen, *shape, block, quantized, ue8m0):
    x = torch.randn(*shape, generator=gen)
    return quantize_fp8(x, block, ue8m0=ue8m0) if quantized else x.to(torch.bfloat16)


def _on_the_device(p: Problem, layout=None) -> Problem:
    """``p`` with its operands (and ``layout``, if given) on the meta device. ``Problem.build``
    refuses meta tensors (they cannot be multiplied), so the validated CPU problem is rebuilt
    field by field: the backend then sees what a GPU call would show it."""
    return Problem(
        p.op,
        _on_device(p.a),
        _on_device(p.b),
        layout or p.layout,
        p.c,
        p.out_dtype,
        torch.device("meta"),
        p.num_groups,
        p.m,
        p.n,
        p.k,
        p.b_major,
    )


def _fresh_call(be, op, gen, step, quantized, weight):
    """A call with a routing never seen before (like every MoE step); ``weight`` is the layer's
    weight, the same every step (prepared once, as a model's weights are)."""
    counts = torch.randint(0, 40, (8,), generator=gen).tolist()
    counts[step % 8] += step + 1
    kw = dict(quantized=quantized, ue8m0=be.ARCH == "sm100")
    if op == "contiguous":
        lay = moe_hal.ContiguousLayout.from_counts(counts, alignment=32)
        return Problem.build(_operand(gen, lay.num_rows, 256, block=(1, 128), **kw), weight, lay)
    if op == "k_grouped":
        lay = moe_hal.KGroupedLayout.from_counts(counts)
        return Problem.build(
            _operand(gen, lay.num_rows, 32, block=(128, 1), **kw),
            _operand(gen, lay.num_rows, 64, block=(128, 1), **kw),
            lay,
            out_dtype=torch.float32,
        )
    masked_m = torch.tensor(counts, dtype=torch.int32)
    lay = moe_hal.MaskedLayout(masked_m, max(counts), check=False)
    p = Problem.build(_operand(gen, 8, max(counts), 256, block=(1, 128), **kw), weight, lay)
    return p, moe_hal.MaskedLayout(masked_m.to("meta"), max(counts), check=False)


def _device_call(be, op, gen, step, quantized, weight):
    call = _fresh_call(be, op, gen, step, quantized, weight)
    return _on_the_device(*call) if isinstance(call, tuple) else _on_the_device(call)


CASES = [
    ("sm90", "contiguous", False),
    ("sm90", "contiguous", True),
    ("sm90", "masked", False),
    ("sm90", "masked", True),
    ("sm90", "k_grouped", False),
    ("sm100", "contiguous", True),
    ("sm100", "masked", True),
    ("sm100", "k_grouped", True),
]


@pytest.mark.parametrize("arch,op,quantized", CASES)
def test_fresh_layout_launch_path_makes_no_host_sync(stubbed, monkeypatch, arch, op, quantized):
    monkeypatch.delenv("MOE_HAL_CUDA_INTERPRET")  # the native path: plan with the advisor, no interpreter
    be = _backend(arch)
    gen = torch.Generator().manual_seed(7)
    weight = _operand(gen, 8, 64, 256, block=(128, 128), quantized=quantized, ue8m0=arch == "sm100")
    be.run(_device_call(be, op, gen, 0, quantized, weight), None)  # weights prepared once, as in a model
    for step in range(1, 5):
        p = _device_call(be, op, gen, step, quantized, weight)
        out = p.new_out()
        with NoHostSync():
            be.run(p, out)
    assert len(stubbed) == 5


def test_detector_catches_a_host_read(stubbed, monkeypatch):
    """Negative control: a value read injected into the launch path is caught."""
    monkeypatch.delenv("MOE_HAL_CUDA_INTERPRET")
    be = _backend("sm90")
    gen = torch.Generator().manual_seed(1)
    weight = _operand(gen, 8, 64, 256, block=None, quantized=False, ue8m0=False)
    p = _device_call(be, "contiguous", gen, 0, False, weight)
    be.plan(p)
    real = moe_hal.ContiguousLayout.psum_on

    def reading(layout, device):
        t = real(layout, device)
        int(t[0])  # what the old host-built schedule amounted to
        return t

    monkeypatch.setattr(moe_hal.ContiguousLayout, "psum_on", reading)
    with pytest.raises(HostSyncError), NoHostSync():
        be.run(p, p.new_out())


def test_detector_catches_a_blocking_upload():
    with pytest.raises(HostSyncError, match="non_blocking"), NoHostSync():
        torch.zeros(3).to("meta")
    with NoHostSync():
        torch.zeros(3).to("meta", non_blocking=True)
        torch.zeros(3).tolist()  # host tensors stay readable


def test_plan_is_shared_by_a_histogram_bucket(monkeypatch):
    """The advisor runs once per coarse histogram bucket, not once per routing."""
    monkeypatch.delenv("MOE_HAL_CUDA_INTERPRET")
    be = _backend("sm90")
    calls = []
    real = be._choose_tile
    monkeypatch.setattr(be, "_choose_tile", lambda p: calls.append(p) or real(p))
    a, b = torch.zeros(512, 64, dtype=torch.bfloat16), torch.zeros(4, 32, 64, dtype=torch.bfloat16)
    for counts in ([100, 90, 80, 70], [99, 91, 81, 69], [120, 60, 80, 70]):
        lay = moe_hal.ContiguousLayout.from_counts(counts, alignment=32, num_rows=512)
        be.plan(Problem.build(a, b, lay))
    assert len(calls) == 1
    skewed = moe_hal.ContiguousLayout.from_counts([500, 0, 0, 0], alignment=32, num_rows=512)
    be.plan(Problem.build(a, b, skewed))
    assert len(calls) == 2
    assert configs.candidates("sm90", "bf16", "contiguous")


def test_histogram_bucket_reads_no_group_counts():
    """The bucket of a fresh layout costs O(1): it reads the layout's row totals, never its G
    group counts (the plan lookup must not scale with the number of experts)."""

    class Totals:  # a layout that has only the totals: any read of the counts fails
        num_rows, num_valid_rows, num_groups = 4096, 3000, 4

    # 1024 rows per group -> 11 bits; 3000 rows in groups -> 12 bits; 3000 / 4096 -> 5 eighths
    assert cuda_backend.histogram_bucket(Totals()) == (11, 12, 5)
