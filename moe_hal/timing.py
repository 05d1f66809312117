"""Timing device work: the one measurement module of ``moe-hal bench``, the ``bench/`` scripts and
the plugins' scripts.

Device-neutral: an accelerator is synchronised through ``torch.<device type>.synchronize`` and
timed with that module's ``Event`` (CUDA events, NPU events) where it has one; the CPU with
``time.perf_counter``. Every function reports seconds; callers round and convert. Nothing here
asserts a speed: benchmarks report, tests never time.

The device's own figures (dense matmul rate, read and copy bandwidth) are measured here too, for
``bench/calibrate.py`` and for ``moe-hal bench`` on a device whose hardware-DB entry lacks them;
each takes ``seconds``, the caller's way of timing one call (median wall time, fastest event
time, ...).
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from .errors import ArgumentError

#: Bytes the default L2 flush writes before each timed call (more than any current L2).
FLUSH_BYTES = 512 << 20

#: How :func:`time_calls` evicts the L2 before a timed call. ``write`` zeroes a buffer, as
#: ``triton.testing.do_bench`` and DeepGEMM's ``bench_kineto`` do: the L2 is then full of dirty
#: lines, which the GPU's write-back L2 writes to memory while the timed call's operands arrive, so
#: the call may pay for them. ``read`` sums the buffer and leaves clean lines, which cost nothing to
#: evict. Published cold timings mostly come from the first; which one a model should be fitted to
#: is an open question (``docs/perf-model.md``).
FLUSHES = ("write", "read")

#: The clocks a host-overhead benchmark offers (``--clock``): ``thread``, this thread's CPU time
#: (steadier on a shared, oversubscribed host), or ``wall``, elapsed time.
CLOCKS: dict[str, Callable[[], float]] = {"thread": time.thread_time, "wall": time.perf_counter}


def _device_module(device: Any) -> Any:
    """``torch.cuda``, ``torch.npu``, ... for an accelerator; None for the CPU or an unknown type."""
    import torch

    kind = torch.device(device).type
    return None if kind == "cpu" else getattr(torch, kind, None)


def synchronize(device: Any) -> None:
    """Wait until the work queued on ``device`` is done (nothing to wait for on the CPU)."""
    import torch

    sync = getattr(_device_module(device), "synchronize", None)
    if sync is not None:
        sync(torch.device(device))


def has_events(device: Any) -> bool:
    """Whether ``device`` has timing events (``torch.<type>.Event``); the CPU has none."""
    return getattr(_device_module(device), "Event", None) is not None


@dataclass(frozen=True)
class Timing:
    """Seconds per call over ``reps`` timed calls: ``median`` and ``min`` of the device time,
    ``host`` the median time the host spent issuing one call (a call is host-bound when it nears
    ``median``); ``copies`` the input sets the calls rotated over."""

    median: float
    min: float
    host: float
    reps: int
    copies: int = 1


def time_calls(
    calls: Callable[[], Any] | Sequence[Callable[[], Any]],
    device: Any,
    *,
    warmup: int,
    reps: int,
    flush_bytes: int = 0,
    flush: str = "write",
    budget_s: float | None = None,
    events: bool = True,
) -> Timing:
    """Time a call: ``calls`` is one callable, or several run round-robin (one per rotating input
    set, so no set is still in cache when it comes back).

    ``warmup`` untimed calls first (at least one: the first call may compile kernels). With
    ``budget_s``, one more call is timed alone and ``reps`` is cut (to no fewer than 3) so the
    timed calls fit the budget. With ``events`` and a device that has them, each call is timed by
    device events, after writing (``flush="write"``) or reading (``"read"``: :data:`FLUSHES`)
    ``flush_bytes`` bytes to evict the L2 (0: no flush; the flush also lets the host queue the call
    before the device reaches it); otherwise by ``time.perf_counter`` around call + synchronize.
    """
    import torch

    if flush not in FLUSHES:
        raise ArgumentError("flush", f"one of {FLUSHES}", flush)

    fns = [calls] if callable(calls) else list(calls)
    n = len(fns)
    for i in range(max(1, warmup)):
        fns[i % n]()
    synchronize(device)
    reps = max(1, reps)
    if budget_s is not None:
        t0 = time.perf_counter()
        fns[0]()
        synchronize(device)
        one = time.perf_counter() - t0
        if one * reps > budget_s:
            reps = min(reps, max(3, int(budget_s / max(one, 1e-9))))
    times: list[float] = []
    host: list[float] = []
    if events and has_events(device):
        module = _device_module(device)
        evict = None
        if flush_bytes:
            buffer = torch.empty(flush_bytes // 4, dtype=torch.int32, device=device)
            evict = buffer.zero_ if flush == "write" else buffer.sum
        marks = [(module.Event(enable_timing=True), module.Event(enable_timing=True)) for _ in range(reps)]
        for i, (start, end) in enumerate(marks):
            if evict is not None:
                evict()
            start.record()
            h0 = time.perf_counter()
            fns[i % n]()
            host.append(time.perf_counter() - h0)
            end.record()
        synchronize(device)
        times = [start.elapsed_time(end) / 1e3 for start, end in marks]
    else:
        for i in range(reps):
            h0 = time.perf_counter()
            fns[i % n]()
            host.append(time.perf_counter() - h0)
            synchronize(device)
            times.append(time.perf_counter() - h0)
    return Timing(statistics.median(times), min(times), statistics.median(host), reps, n)


def describe(
    device: Any, *, warmup: int, reps: int, flush_bytes: int = 0, flush: str = "write", events: bool = True
) -> str:
    """One sentence saying how :func:`time_calls` times on ``device`` with these settings."""
    if events and has_events(device):
        how = "written" if flush == "write" else "read"
        evicted = f" after a {flush_bytes >> 20} MiB L2 flush ({how})" if flush_bytes else ""
        return f"device events around each call{evicted}; median of {reps} after {warmup} warm-up calls"
    return f"time.perf_counter around call + synchronize; median of up to {reps} after {warmup} warm-up calls"


def wall_seconds(fn: Callable[[], Any], device: Any, *, warmup: int, repeat: int) -> list[float]:
    """Wall time of each of ``repeat`` calls of ``fn``, each timed alone (call + synchronize)
    after ``warmup`` untimed calls."""
    return interleaved_wall_seconds({"fn": fn}, device, warmup=warmup, repeat=repeat)["fn"]


def interleaved_wall_seconds(
    fns: Mapping[str, Callable[[], Any]], device: Any, *, warmup: int, repeat: int
) -> dict[str, list[float]]:
    """Wall time of each call of each function: ``repeat`` rounds that run every function once in
    turn, so that all of them see the same machine load (a shared host drifts between rounds)."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    synchronize(device)
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            synchronize(device)
            times[name].append(time.perf_counter() - start)
    return times


def warmup_calls(iters: int) -> int:
    """Untimed calls :func:`host_seconds_per_call` makes of each function before its rounds of
    ``iters`` calls."""
    return max(3, iters // 10)


def host_seconds_per_call(
    fns: Mapping[str, Callable[[], Any]],
    *,
    iters: int,
    repeats: int,
    clock: Callable[[], float] = time.perf_counter,
    statistic: Callable[[list[float]], float] = statistics.median,
) -> dict[str, float]:
    """Median host seconds per call of each function, without synchronising: every round times
    ``iters`` back-to-back calls of each function in turn (what a launch-overhead benchmark
    measures). :func:`warmup_calls` warm-up calls each first. ``clock``: wall time by default;
    ``time.thread_time`` counts only this thread's CPU time (steadier on an oversubscribed host).
    ``statistic`` reduces the rounds (``min``: the least disturbed round, for differences of a few
    microseconds on a loaded host)."""
    for fn in fns.values():
        for _ in range(warmup_calls(iters)):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = clock()
            for _ in range(iters):
                fn()
            samples[name].append((clock() - t0) / iters)
    return {name: statistic(v) for name, v in samples.items()}


def machine_record() -> dict[str, Any]:
    """Where a measurement ran, for a benchmark's JSON: the torch and moe_hal versions, torch's
    thread count, the platform and processor, the date, and the 1-minute load average (figures
    on a shared host move with it; None where the OS has none)."""
    import torch

    from . import __version__

    return {
        "torch": torch.__version__,
        "moe_hal": __version__,
        "threads": torch.get_num_threads(),
        "machine": platform.platform(),
        "processor": platform.processor(),
        "date": time.strftime("%Y-%m-%d"),
        "load_avg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }


class Timer:
    """:func:`time_calls` with fixed settings for one device, as ``moe-hal bench`` times every
    call: device events after an L2 flush of :data:`FLUSH_BYTES` where the device has events,
    else wall time; the median over ``reps`` after ``warmup`` calls."""

    def __init__(self, device: Any, warmup: int, reps: int, flush_bytes: int = FLUSH_BYTES):
        self.device = device
        self.warmup = max(0, warmup)
        self.reps = max(1, reps)
        self.flush_bytes = flush_bytes

    @property
    def method(self) -> str:
        """How calls are timed, in words (for reports)."""
        return describe(self.device, warmup=self.warmup, reps=self.reps, flush_bytes=self.flush_bytes)

    def __call__(self, fn: Callable[[], Any], budget_s: float = 2.0) -> dict[str, float]:
        """``{"median": s, "min": s, "host": s, "reps": n}`` of ``fn`` (see :class:`Timing`)."""
        t = time_calls(
            fn, self.device, warmup=self.warmup, reps=self.reps, flush_bytes=self.flush_bytes, budget_s=budget_s
        )
        return {"median": t.median, "min": t.min, "host": t.host, "reps": t.reps}


#: Dtypes :func:`matmul_call` knows: ``tf32`` is fp32 with TF32 tensor cores on (CUDA); fp8 (e4m3,
#: ``torch._scaled_mm``) and int8 (``torch._int_mm``) are CUDA only.
MATMUL_DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8", "int8")


def matmul_call(dtype: str, n: int, device: Any) -> Callable[[], Any]:
    """A zero-argument callable doing one ``n x n x n`` product in ``dtype`` (one of
    :data:`MATMUL_DTYPES`) on ``device``; raises ``RuntimeError`` where the device lacks it and
    :class:`~moe_hal.errors.ArgumentError` for another dtype."""
    import torch

    from .errors import ArgumentError

    if dtype not in MATMUL_DTYPES:
        raise ArgumentError("dtype", f"one of {MATMUL_DTYPES}", dtype)
    device = torch.device(device)
    gen = torch.Generator(device="cpu").manual_seed(0)
    if dtype == "tf32" and device.type != "cuda":
        raise RuntimeError("tf32 is a CUDA tensor-core mode; fp32 covers this device")
    floats = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    if dtype in floats:
        a = torch.randn(n, n, generator=gen).to(device=device, dtype=floats[dtype])
        b = torch.randn(n, n, generator=gen).to(device=device, dtype=floats[dtype])
        return lambda: torch.matmul(a, b)
    if device.type != "cuda":
        raise RuntimeError(f"{dtype} matmul is only measured on CUDA devices")
    if dtype == "fp8":
        a = torch.randn(n, n, generator=gen).to(device).to(torch.float8_e4m3fn)
        b = torch.randn(n, n, generator=gen).to(device).to(torch.float8_e4m3fn)
        one = torch.tensor(1.0, device=device)
        # _scaled_mm wants the second operand column-major: b.t() of a row-major tensor is. Fast
        # accumulation: the tensor cores' fp8 rate, which a ceiling is about; without it cuBLAS
        # adds its own promotion and ran at 1295 TFLOP/s on an H200 (bench/results/gpu_check_h200.log),
        # below what block-scaled kernels published on the same compute reach (bench/published).
        return lambda: torch._scaled_mm(
            a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16, use_fast_accum=True
        )
    # int8, the one dtype left
    a = torch.randint(-8, 8, (n, n), generator=gen, dtype=torch.int8).to(device)
    b = torch.randint(-8, 8, (n, n), generator=gen, dtype=torch.int8).to(device)
    return lambda: torch._int_mm(a, b)


def matmul_rate(dtype: str, n: int, device: Any, seconds: Callable[[Callable[[], Any]], float]) -> float:
    """FLOP/s (OP/s for int8) of one square ``n``-sized product in ``dtype`` (:func:`matmul_call`),
    counting ``2 n^3``; TF32 is on for ``tf32`` only, and restored after."""
    import torch

    previous_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
    try:
        return 2.0 * n**3 / seconds(matmul_call(dtype, n, device))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous_tf32


def read_bandwidth(nbytes: int, device: Any, seconds: Callable[[Callable[[], Any]], float]) -> float:
    """Bytes/s of ``torch.sum`` over an fp32 buffer of ``nbytes`` (bytes read)."""
    import torch

    src = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=device)
    return src.numel() * 4 / seconds(lambda: src.sum())


def copy_bandwidth(nbytes: int, device: Any, seconds: Callable[[Callable[[], Any]], float]) -> float:
    """Bytes/s of ``Tensor.copy_`` between two fp32 buffers of ``nbytes``, counting read + write."""
    import torch

    src = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    return 2 * src.numel() * 4 / seconds(lambda: dst.copy_(src))
