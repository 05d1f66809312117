"""The performance model beside measured times, for ``moe-hal bench --model``.

:func:`hardware_here` gives the figures the model uses on a device: its hardware-DB entry
(measured values first, :meth:`moe_hal.perf.Hardware.from_entry`), with any peak or bandwidth the
entry lacks measured in process (:mod:`moe_hal.timing`). :func:`calibrate` fits a second set on
three calls of the backend outside the sweep. :func:`add_model` puts the model's prediction for
the backend's best tile (and the plain and padded rooflines) beside a measured row of
:func:`moe_hal.peers.time_case`, with the error of each; :func:`summarize` gives the median and
worst error over a report. Backends tell the model about their kernels through
``BackendSpec.perf_model`` (:func:`model_options`).

Measurements of the device keep the fastest repetition (what the device can do).
"""

from __future__ import annotations

import statistics
from typing import Any

from . import peers, timing
from .timing import Timer
from .workloads import Case


def hardware_here(device: Any, dtypes: set[str], timer: Timer) -> tuple[Any, dict[str, Any]]:
    """The hardware the model uses on ``device`` for cases in ``dtypes``: the DB entry (measured
    values first), with any peak or bandwidth the entry lacks measured here (copy bandwidth,
    dense ``torch.mm``; fp8 never). Returns ``(perf.Hardware, notes)``; ``notes["measured_here"]``
    lists what was measured."""
    import os

    from . import perf
    from .devices import match_device
    from .errors import ArgumentError
    from .perf.hardware import dtype_fields_of

    found = match_device(device)
    entry, seen = found.entry, found.seen
    notes: dict[str, Any] = {"db_entry": getattr(entry, "id", None), "device_seen": seen, "measured_here": {}}
    peaks: dict[str, float] = {}
    sources: dict[str, str] = {}
    bandwidth = cores = mma = None
    per_dtype: dict[str, dict[str, int]] = {}
    if entry is not None:
        cores, mma = entry.num_cores, entry.mma_min_m
        per_dtype = dtype_fields_of(entry)
        try:
            db_hw = perf.Hardware.from_entry(entry)
        except ArgumentError as exc:  # an entry without figures (cpu-generic): measured below
            notes["db_incomplete"] = str(exc)
        else:
            peaks, bandwidth, sources = dict(db_hw.peak_flops), db_hw.mem_bandwidth, dict(db_hw.sources)
    if not bandwidth:
        bandwidth = _copy_bandwidth(device, timer)
        notes["measured_here"]["bandwidth"] = bandwidth
        sources["bandwidth"] = "measured here (copy, read+write)"
    for d in sorted(dtypes):
        if d not in peaks and d != "fp8":
            peaks[d] = _mm_peak(device, d, timer)
            notes["measured_here"][f"peak.{d}"] = peaks[d]
            sources[f"peak.{d}"] = "measured here (dense torch.mm)"
    if not cores:
        cores = os.cpu_count() or 1
        sources["num_cores"] = "os.cpu_count()"
    name = getattr(entry, "id", None) or f"unrecognised {device.type}"
    hw = perf.Hardware(
        name,
        int(cores),
        peaks,
        float(bandwidth),
        mma_min_m=mma,
        sources=sources,
        **per_dtype,
    )
    return hw, notes


def _copy_bandwidth(device: Any, timer: Timer) -> float:
    """Copy bandwidth in bytes/s counting read + write (the basis of the H200 entry) over 1 GiB
    buffers on CUDA, 256 MiB elsewhere; the fastest repetition."""
    nbytes = (1 << 30) if device.type == "cuda" else (256 << 20)
    return timing.copy_bandwidth(nbytes, device, lambda fn: timer(fn)["min"])


def _mm_peak(device: Any, dtype: str, timer: Timer) -> float:
    """Dense FLOP/s of one square ``torch.matmul`` (8192 on CUDA, 1024 elsewhere); the fastest
    repetition."""
    n = 8192 if device.type == "cuda" else 1024
    return timing.matmul_rate(dtype, n, device, lambda fn: timer(fn)["min"])


def calibrate(
    base: Any, device: Any, dtypes: set[str], backend: str | None, timer: Timer, model_opts: dict[str, Any], seed: int
) -> tuple[Any, dict[str, Any]]:
    """A calibrated copy of ``base``, fitted on calls that are not part of the sweep:

    1. ``t_fixed``: a one-row call of the backend, minus the model's time for it;
    2. bandwidth: scaled so the model's memory time of one memory-bound call of the backend
       (16 experts x 8 rows, N = K = 4096 on a GPU) equals its measured time; the device copy
       bandwidth is the starting point, and what is kept when that call is not memory-bound;
    3. per dtype, the peak scaled so the model's compute time of one large single-group call
       (M 8192, N = K 4096 on a GPU) equals its measured time.
    Each fit keeps the fastest repetition and subtracts ``t_fixed``.
    """
    gpu = device.type == "cuda"
    first = sorted(dtypes)[0]
    info: dict[str, Any] = {"copy_bandwidth": _copy_bandwidth(device, timer)}
    hw = base.replace(mem_bandwidth=info["copy_bandwidth"], name=base.name + "+calibrated")

    def measure(case: Case) -> float:
        return timer(peers.prepare(case, device, backend, False, seed).calls[peers.MOE_HAL])["min"]

    tiny = Case("calibration-tiny", "calibration", "contiguous", first, 128, 128, [1])
    t_tiny = measure(tiny)
    info["t_fixed"] = max(0.0, t_tiny - predict(tiny, hw, model_opts).t_predicted)
    hw = hw.replace(t_fixed=info["t_fixed"])

    groups, rows, nk = (16, 8, 4096) if gpu else (8, 4, 512)
    stream = Case("calibration-stream", "calibration", "contiguous", first, nk, nk, [rows] * groups)
    t = measure(stream)
    est = predict(stream, hw, model_opts)
    body = t - info["t_fixed"]
    fitted = est.bound == "memory" and body > 0
    if fitted:
        hw = hw.replace(mem_bandwidth=hw.mem_bandwidth * est.t_memory / body)
    info["bandwidth"] = {
        "value": hw.mem_bandwidth,
        "shape": {"groups": groups, "rows": rows, "n": nk, "k": nk},
        "dtype": first,
        "measured_s": t,
        "fitted": fitted,
    }

    peaks = dict(hw.peak_flops)
    big_m, big_nk = (8192, 4096) if gpu else (1024, 512)
    for d in sorted(dtypes):
        if d not in peaks:
            info[f"peak.{d}"] = "not calibrated: no base peak for this dtype"
            continue
        case = Case(f"calibration-{d}", "calibration", "contiguous", d, big_nk, big_nk, [big_m])
        t = measure(case)
        est = predict(case, hw.replace(peak_flops=peaks), model_opts)
        body = t - info["t_fixed"]
        fitted = est.bound == "compute" and body > 0
        if fitted:
            peaks[d] = peaks[d] * est.t_compute / body
        info[f"peak.{d}"] = {"value": peaks[d], "shape": [big_m, big_nk, big_nk], "measured_s": t, "fitted": fitted}
    sources = dict(
        hw.sources,
        **{f"peak.{d}": "fitted on one large call of the backend" for d in dtypes if d in peaks},
        bandwidth="fitted on one memory-bound call of the backend"
        if info["bandwidth"]["fitted"]
        else "measured here (copy, read+write)",
        t_fixed="one-row call of the backend",
    )
    return hw.replace(peak_flops=peaks, sources=sources), info


def model_options(spec: Any) -> dict[str, Any]:
    """What a backend declares about its kernels for the model (``spec.perf_model``)."""
    from . import perf

    declared = spec.perf_model
    return {
        "tiles": list(declared.tiles or perf.DEFAULT_TILES),
        **declared.estimate_options(),
        "masked_computes_max_m": declared.masked_computes_max_m,
    }


def predict(case: Case, hw: Any, opts: dict[str, Any]) -> Any:
    """The best :class:`moe_hal.perf.Estimate` over the backend's tiles for ``case``."""
    from . import perf

    counts = case.counts
    extra: dict[str, Any] = {"op": case.op}
    if case.op == "masked":
        extra["max_m"] = case.max_m
        if opts["masked_computes_max_m"]:
            counts = [case.max_m] * len(case.counts)
    if case.op == "k_grouped":
        extra["m"] = case.m
    else:
        extra["streams_all_experts"] = opts["streams_all_experts"]
        extra["reads_padding_rows"] = opts["reads_padding_rows"]
    return perf.advise(counts, case.n, case.k, hw, case.dtype, opts["tiles"], **extra).best


def error_summary(errors: list[float]) -> dict[str, Any]:
    """Median and worst absolute relative error, mean signed error, count."""
    if not errors:
        return {"n": 0}
    absolute = [abs(e) for e in errors]
    return {
        "n": len(errors),
        "median_abs_error": statistics.median(absolute),
        "worst_abs_error": max(absolute),
        "mean_error": statistics.fmean(errors),
    }


def add_model(row: dict[str, Any], case: Case, hw: Any, hw_cal: Any, opts: dict[str, Any]) -> None:
    """``row["model"]``: the model's best tile for ``case`` on ``hw`` (and on ``hw_cal`` when not
    None), its rooflines and prediction in seconds, and ``error_*`` = predicted / measured - 1
    against the row's moe_hal median."""
    measured = row["times"].get(peers.MOE_HAL, {}).get("median")
    est = predict(case, hw, opts)
    model: dict[str, Any] = {
        "tile": list(est.tile),
        "bound": est.bound,
        "occupancy_m": est.occupancy_m,
        "tiles": est.tiles,
        "waves": est.waves,
        "wave_efficiency": est.wave_efficiency,
        "t_roofline": est.t_roofline,
        "t_padded": est.t_padded,
        "t_predicted": est.t_predicted,
    }
    if hw_cal is not None:
        cal = predict(case, hw_cal, opts)
        model.update(t_predicted_calibrated=cal.t_predicted, tile_calibrated=list(cal.tile), bound_calibrated=cal.bound)
    if measured:
        for key in ("t_roofline", "t_padded", "t_predicted", "t_predicted_calibrated"):
            if key in model:
                model["error_" + key.removeprefix("t_")] = model[key] / measured - 1
    row["model"] = model


def summarize(rows: list[dict[str, Any]], calibrated: bool) -> dict[str, Any]:
    """:func:`error_summary` of the roofline, the padded roofline, the model and (``calibrated``)
    the calibrated model over the rows that have them."""
    variants = {"roofline": "error_roofline", "padded_roofline": "error_padded", "model": "error_predicted"}
    if calibrated:
        variants["model_calibrated"] = "error_predicted_calibrated"
    out = {}
    for name, key in variants.items():
        errors = [r["model"][key] for r in rows if key in r.get("model", {})]
        out[name] = error_summary(errors)
    out["definition"] = "error = predicted / measured - 1 per case; median and worst of |error|"
    return out


def hw_dict(hw: Any) -> dict[str, Any]:
    """``hw`` (:class:`moe_hal.perf.Hardware`) as JSON-ready data."""
    return {
        "name": hw.name,
        "num_cores": hw.num_cores,
        "peak_flops": dict(hw.peak_flops),
        "mem_bandwidth": hw.mem_bandwidth,
        "mma_min_m": hw.mma_min_m,
        "mma_min_m_of": dict(hw.mma_min_m_of),
        "t_fixed": hw.t_fixed,
        "sources": dict(hw.sources),
    }
