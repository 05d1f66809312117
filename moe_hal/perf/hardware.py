"""The device the performance model runs on: :class:`Hardware` (the few numbers it needs) and
its construction from a hardware-DB entry or id."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Mapping

from ..checks import is_number, is_positive_number
from ..errors import ArgumentError, DTypeError
from .efficiency import EfficiencyTable, Rates, table_from_entries
from .operands import BYTES_PER_ELEMENT, dtype_name, operand_bytes


@dataclass(frozen=True)
class Hardware:
    """The few numbers the model needs from a device.

    ``num_cores``: SMs (NVIDIA) or AI cores (Ascend): tiles that run at once. ``peak_flops``:
    dense FLOP/s per model dtype. ``mem_bandwidth``: bytes/s. ``mma_min_m``: smallest M an MMA
    instruction computes (a tile with BM below it costs ``mma_min_m`` rows; None = no floor).
    ``bw_per_core``: bytes/s one core can stream (caps bandwidth when fewer tiles than cores
    run; None = no cap). ``t_fixed``: seconds of launch + prologue added to every prediction.
    ``l2_bandwidth``: bytes/s at which operands already in the L2 stream into the cores; used
    for calls estimated with ``operands="l2"`` (None = not known: such calls are predicted cold).
    ``l2_bytes``: the L2 size. ``tile_load_rate``: bytes/s one core loads a tile's operands at,
    which caps the MMA rate of tiles with little operand reuse (None: the table's, else no cap).
    ``sources``: where each number came from (free text per key, for reports).

    Achieved efficiency (:mod:`moe_hal.perf.efficiency`): ``efficiency`` is the table of achieved
    figures, ``architecture`` the device family its fallback may use, ``impl`` the kernel
    implementation whose figures apply (None: the best known), ``datasheet_peak_flops`` /
    ``datasheet_bandwidth`` the figures achieved fractions are fractions of (default:
    ``peak_flops`` / ``mem_bandwidth``). ``tile_overhead``: seconds a 128 x 128 tile costs beyond its
    MMA time, a smaller tile its accumulator's share (``moe_hal.perf.efficiency.OVERHEAD_TILE``; None:
    the table's, else 0). ``stage_latency``: seconds each K block of a tile costs
    beyond its MMA time in kernels that promote partial sums per K block (None: the table's, else
    0). ``promotion_k``: K elements per such block, per dtype (``{"fp8": 128}`` on Hopper, whose
    fp8 kernels promote in software; empty where the MMA accumulates in fp32 and applies block
    scales itself, as on Blackwell; the hardware DB's ``compute.fp8_promotion_k``). ``mma_min_n``:
    smallest token count per MMA when tokens sit on the MMA's N side (swap-AB kernels; None = no
    floor). ``mma_min_m_of``: per dtype, a floor that replaces ``mma_min_m`` for it (``{"fp4": 128}``
    on datacenter Blackwell, whose block-scaled MMA takes 128 rows per SM where a dense one takes
    64; the hardware DB's ``compute.fp4_mma_min_m``); :meth:`min_m` answers per dtype.
    """

    name: str
    num_cores: int
    peak_flops: Mapping[str, float]
    mem_bandwidth: float
    mma_min_m: int | None = None
    l2_bytes: int | None = None
    bw_per_core: float | None = None
    l2_bandwidth: float | None = None
    tile_load_rate: float | None = None
    t_fixed: float = 0.0
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)
    architecture: str | None = None
    impl: str | None = None
    efficiency: EfficiencyTable = field(default_factory=EfficiencyTable, compare=False, repr=False)
    datasheet_peak_flops: Mapping[str, float] | None = None
    datasheet_bandwidth: float | None = None
    tile_overhead: float | None = None
    mma_min_n: int | None = None
    stage_latency: float | None = None
    promotion_k: Mapping[str, int] = field(default_factory=dict)
    mma_min_m_of: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.num_cores, bool) or not isinstance(self.num_cores, int) or self.num_cores < 1:
            raise ArgumentError("Hardware.num_cores", "a positive int", self.num_cores)
        peaks: dict[str, float] = {}
        if not isinstance(self.peak_flops, Mapping):
            raise ArgumentError("Hardware.peak_flops", "a mapping of dtype to FLOP/s", self.peak_flops)
        for key, value in dict(self.peak_flops).items():
            if not is_positive_number(value):
                raise ArgumentError(f"Hardware.peak_flops[{key!r}]", "a positive FLOP/s value", value)
            peaks[dtype_name(key)] = float(value)
        if not peaks:
            raise ArgumentError("Hardware.peak_flops", "at least one dtype with a peak", self.peak_flops)
        object.__setattr__(self, "peak_flops", MappingProxyType(peaks))
        object.__setattr__(self, "sources", MappingProxyType(dict(self.sources)))
        if not is_positive_number(self.mem_bandwidth):
            raise ArgumentError("Hardware.mem_bandwidth", "a positive bytes/s value", self.mem_bandwidth)
        if self.mma_min_m is not None and (
            isinstance(self.mma_min_m, bool) or not isinstance(self.mma_min_m, int) or self.mma_min_m < 1
        ):
            raise ArgumentError("Hardware.mma_min_m", "None or a positive int", self.mma_min_m)
        if self.bw_per_core is not None and not is_positive_number(self.bw_per_core):
            raise ArgumentError("Hardware.bw_per_core", "None or a positive bytes/s value", self.bw_per_core)
        if self.l2_bandwidth is not None and not is_positive_number(self.l2_bandwidth):
            raise ArgumentError("Hardware.l2_bandwidth", "None or a positive bytes/s value", self.l2_bandwidth)
        if self.tile_load_rate is not None and not is_positive_number(self.tile_load_rate):
            raise ArgumentError("Hardware.tile_load_rate", "None or a positive bytes/s value", self.tile_load_rate)
        if not is_number(self.t_fixed) or self.t_fixed < 0:
            raise ArgumentError("Hardware.t_fixed", "a non-negative number of seconds", self.t_fixed)
        if self.tile_overhead is not None and (not is_number(self.tile_overhead) or self.tile_overhead < 0):
            raise ArgumentError(
                "Hardware.tile_overhead", "None or a non-negative number of seconds", self.tile_overhead
            )
        if self.stage_latency is not None and (not is_number(self.stage_latency) or self.stage_latency < 0):
            raise ArgumentError(
                "Hardware.stage_latency", "None or a non-negative number of seconds", self.stage_latency
            )
        object.__setattr__(self, "promotion_k", _counts_by_dtype("promotion_k", self.promotion_k, "K elements"))
        object.__setattr__(self, "mma_min_m_of", _counts_by_dtype("mma_min_m_of", self.mma_min_m_of, "rows"))
        if self.mma_min_n is not None and (
            isinstance(self.mma_min_n, bool) or not isinstance(self.mma_min_n, int) or self.mma_min_n < 1
        ):
            raise ArgumentError("Hardware.mma_min_n", "None or a positive int", self.mma_min_n)
        if self.datasheet_peak_flops is not None:
            object.__setattr__(
                self,
                "datasheet_peak_flops",
                MappingProxyType({dtype_name(k): float(v) for k, v in dict(self.datasheet_peak_flops).items()}),
            )
        if self.datasheet_bandwidth is not None and not is_positive_number(self.datasheet_bandwidth):
            raise ArgumentError(
                "Hardware.datasheet_bandwidth", "None or a positive bytes/s value", self.datasheet_bandwidth
            )
        if not isinstance(self.efficiency, EfficiencyTable):
            raise ArgumentError(
                "Hardware.efficiency", "a perf.efficiency.EfficiencyTable", type(self.efficiency).__name__
            )

    def peak(self, dtype: str) -> float:
        """Dense FLOP/s for ``dtype``; :class:`~moe_hal.errors.DTypeError` when the device has none."""
        name = dtype_name(dtype)
        if name not in self.peak_flops:
            raise DTypeError("dtype", f"a dtype with a known peak on {self.name}: {sorted(self.peak_flops)}", dtype)
        return self.peak_flops[name]

    def min_m(self, dtype: str) -> int | None:
        """Smallest M one MMA instruction computes for ``dtype`` (None = no floor)."""
        return self.mma_min_m_of.get(dtype_name(dtype), self.mma_min_m)

    def replace(self, **changes: Any) -> "Hardware":
        """A copy with some fields changed (e.g. calibrated ``peak_flops`` or ``t_fixed``)."""
        return replace(self, **changes)

    @classmethod
    def from_entry(
        cls, entry: Any, measured: bool = True, achieved: bool = True, impl: str | None = None
    ) -> "Hardware":
        """Adapter from a :mod:`moe_hal.hwdb` entry.

        The roofline figures (``peak_flops``, ``mem_bandwidth``): with ``measured`` (default) the
        entry's measured matmul rates and read bandwidth are used where present, spec figures
        otherwise. Without a measured read bandwidth, a measured copy bandwidth
        (``measured.copy_bandwidth``, read + write bytes counted) is preferred over the
        datasheet. ``sources`` records which figure each number came from, so a roofline that
        mixes a measured and a datasheet figure says so. With ``achieved`` (default), the achieved
        figures of the whole hardware DB are attached (``efficiency``) as fractions of this
        entry's datasheet figures, for the implementation ``impl`` (None: the best known).
        An entry without a core count (``cpu-generic``) gets this machine's ``os.cpu_count()``.
        """
        sources: dict[str, str] = {}
        peaks: dict[str, float] = {}
        for name in BYTES_PER_ELEMENT:
            value = entry.peak_flops(name, measured=measured)
            if value:
                peaks[name] = float(value)
                spec = entry.peak_flops(name, measured=False)
                sources[f"peak.{name}"] = "spec" if value == spec else "measured"
        if not peaks:
            raise ArgumentError(
                "hw",
                "a hardware-DB entry with a dense peak for some dtype",
                entry.id,
                "the entry gives none; measure them (bench/calibrate.py) or pass a perf.Hardware",
            )
        bandwidth = entry.mem_bandwidth(measured=measured)
        spec_bw = entry.mem_bandwidth(measured=False)
        sources["bandwidth"] = "spec" if bandwidth == spec_bw else "measured read"
        if measured and bandwidth == spec_bw:
            copy = entry.quantity("measured.copy_bandwidth")
            if copy is not None:
                bandwidth, sources["bandwidth"] = copy.si, "measured copy (read+write)"
        if not bandwidth:
            raise ArgumentError(
                "hw",
                "a hardware-DB entry with a memory bandwidth",
                entry.id,
                "the entry gives none; measure it (bench/calibrate.py) or pass a perf.Hardware",
            )
        cores = entry.num_cores
        if not cores:
            cores = os.cpu_count() or 1
            sources["num_cores"] = "os.cpu_count() (the entry gives none)"
        mma_min_m = entry.mma_min_m
        l2 = entry.l2_bytes
        datasheet = {name: float(v) for name in BYTES_PER_ELEMENT if (v := entry.peak_flops(name, measured=False))}
        table = EfficiencyTable()
        if achieved and hasattr(entry, "raw"):
            from .. import hwdb

            table = table_from_entries(hwdb.all())
        return cls(
            name=str(entry.id),
            num_cores=int(cores),
            peak_flops=peaks,
            mem_bandwidth=float(bandwidth),
            mma_min_m=int(mma_min_m) if mma_min_m else None,
            **dtype_fields_of(entry),
            l2_bytes=int(l2) if l2 else None,
            sources=sources,
            architecture=getattr(entry, "architecture", None),
            impl=impl,
            efficiency=table,
            datasheet_peak_flops=datasheet or None,
            datasheet_bandwidth=entry.mem_bandwidth(measured=False) or None,
        )


def resolve_hardware(hw: Any, measured: bool = True, achieved: bool = True) -> Hardware:
    """A :class:`Hardware` from an id or alias of the hardware DB, a hardware-DB entry, or a
    :class:`Hardware` (returned as is). ``achieved=False`` leaves out the achieved efficiency
    (predictions then use the peak and bandwidth themselves: the ideal, not the expected time)."""
    if isinstance(hw, Hardware):
        return hw
    if isinstance(hw, str):
        # the DB loader reads YAML; only needed when a name is given
        from .. import hwdb

        return Hardware.from_entry(hwdb.get(hw), measured=measured, achieved=achieved)
    if all(hasattr(hw, a) for a in ("peak_flops", "mem_bandwidth", "num_cores", "quantity", "id")):
        return Hardware.from_entry(hw, measured=measured, achieved=achieved)
    raise ArgumentError("hw", "a hardware-DB id or alias, a hwdb entry or a perf.Hardware", type(hw).__name__)


def ridge_m(hw: Any, dtype: str, *, impl: str | None = None, op: str = "contiguous") -> float:
    """Ridge height ``M* = rate * e_b / (2 * BW)`` in rows: a group whose padded height stays at
    or below it is bound by streaming its weights, so its tile padding costs no time. Rate and
    bandwidth are the pair predictions use (achieved figures of ``impl`` where known), so both
    have one basis."""
    h = resolve_hardware(hw)
    if impl is not None:
        h = h.replace(impl=impl)
    name = dtype_name(dtype)
    rates = Rates.of(h, name, op)
    return rates.flops * operand_bytes(name)[1] / (2 * rates.bandwidth)


def dtype_fields_of(entry: Any) -> dict[str, dict[str, int]]:
    """The :class:`Hardware` fields a hardware-DB entry gives per dtype: ``promotion_k`` (its
    ``compute.fp8_promotion_k``) and ``mma_min_m_of`` (its ``compute.fp4_mma_min_m``), empty where
    the entry has none."""
    promotion = getattr(entry, "fp8_promotion_k", None)
    fp4_floor = getattr(entry, "fp4_mma_min_m", None)
    return {
        "promotion_k": {"fp8": promotion} if promotion else {},
        "mma_min_m_of": {"fp4": fp4_floor} if fp4_floor else {},
    }


def _counts_by_dtype(field_name: str, given: Any, unit: str) -> Mapping[str, int]:
    """``given`` (a mapping of dtype to a positive int count of ``unit``) with canonical dtype
    names, read-only; :class:`ArgumentError` naming ``Hardware.<field_name>`` otherwise."""
    if not isinstance(given, Mapping):
        raise ArgumentError(f"Hardware.{field_name}", f"a mapping of dtype to {unit}", given)
    counts: dict[str, int] = {}
    for key, value in dict(given).items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ArgumentError(f"Hardware.{field_name}[{key!r}]", f"a positive int ({unit})", value)
        counts[dtype_name(key)] = value
    return MappingProxyType(counts)
