"""Achieved efficiency: the fraction of the datasheet peak and bandwidth real kernels reach.

A datasheet peak is what the silicon could do; published grouped-GEMM kernels reach 0.33-0.77 of
the fp8 peak on an H800 and stream at 0.4-0.9 of the listed bandwidth (``docs/perf-model.md``).
The model therefore predicts from *achieved* figures, kept per device, kernel implementation
(``impl``: a name such as the library the kernel comes from), dtype and kernel family:

* ``compute``: fraction of the dense datasheet peak of one dtype, per family
  (:data:`FAMILIES`);
* ``bandwidth``: fraction of the datasheet memory bandwidth a streaming kernel reaches;
* ``tile_overhead``: seconds a 128 x 128 output tile costs beyond its MMA time (pipeline fill and
  accumulator drain: what makes tiles with a short K loop less efficient than their MMA); a tile
  with a smaller accumulator pays the share its area is of that one's
  (:data:`OVERHEAD_TILE`);
* ``stage_latency``: seconds each K block of a tile costs beyond its MMA time, for dtypes whose
  kernels promote the partial sums once per K block (``Hardware.promotion_k``, from the hardware
  DB's ``compute.fp8_promotion_k``: block-scaled fp8 on SM90 waits for a block's MMAs to complete before scaling their partial sums
  on the CUDA cores). A tile's blocks run one after another, so this latency is paid once per
  block per tile and the memory streaming of other tiles cannot hide it: it dominates calls with
  few, narrow tiles and long K (decode-sized GEMMs) and is a small share of large tiles' MMA time;
* ``launch``: fixed seconds per call (launch and prologue). Fitted jointly for every kernel of an
  architecture (``impl`` ``*``) and, for a kernel whose own calls separate it from its rates, as
  that kernel's own, which answers for it alone, on every device of the architecture and on no
  other (an architecture that borrows a fixed time borrows the joint one): a kernel without one
  pays the joint time;
* ``bandwidth_per_unit``: bytes/s one SM or AI core streams, which caps the bandwidth of a call
  with fewer tiles than cores; ``l2_bandwidth``: bytes/s at which operands already in the L2
  stream into the cores (calls estimated with ``operands="l2"``: a benchmark that wrote its
  operands just before the timed call), per implementation; a kernel without its own takes the
  best known (:data:`BEST_UNLESS_OWN`);
* ``tile_load_rate``: bytes/s at which one SM or AI core loads a tile's operands into its
  on-chip memory. A tile's MMA cannot run faster than its operands arrive, so a tile whose
  operand bytes per K step, ``BM + BN`` elements, are large against its ``BM x BN`` MMA (little
  operand reuse: a 64 x 128 tile has half a 128 x 256 one's FLOP per byte) runs at most at
  ``tile_load_rate`` x its FLOP per byte, below the achieved compute rate of larger tiles.

Figures live in the hardware DB under ``achieved.<impl>`` (fitted from published measurements or
measured by calibration, ``hwdb/measured/``). :class:`EfficiencyTable` answers "which figure
applies to this call" with one fallback order, used both at prediction time and by the
leave-one-source-out validation, so the validation tests exactly what predictions do:

1. this implementation on the same device: the same dtype and family, then the same
   forward/backward class (contiguous and masked calls are forward kernels, K-grouped ones weight
   gradients); after the dtype, its twin of the same width where it has one (fp16 and bf16,
   :data:`SAME_MMA_RATE`). One library's forward kernels share code and tuning, so its own figure
   for another family says more of it than another library's for this one (a DeepGEMM version
   with a known multicast bug ran the README's masked H800 calls at 0.63-0.79 of the README's
   TFLOP/s: PR #193's base with the L2 flushed, README a6d97a1 with it warm);
2. the same levels, another implementation (see below which);
3. the same architecture instead of the same device (1, then 2). For a compute fraction and a
   fixed time per call this implementation's figure on the architecture comes before another
   implementation's on the device (:data:`OWN_ON_ARCHITECTURE_FIRST`): both are the kernel's code
   (its tiles and pipeline, its prologue), which runs alike on every device of one architecture.
   Held out, TileOPs PR #2148's cuBLAS calls on the H200 (the fold has no cuBLAS figure there)
   took the H200's typical bf16 forward figure (DeepGEMM, TileOPs, torch, Triton), 0.628 of the
   peak; cuBLAS's own on the H100 is 0.710, and with it those calls of 8 x 1024^3 went from +14.5%
   and +15.6% to +4.0% and +5.0% (``docs/perf-model-history.md``, "A thirteenth round").
   A streaming fraction is the device's memory system as much as the kernel's: after this
   implementation on the device come the others there, then the architecture's
   (:meth:`EfficiencyTable.bandwidth`). A compute fraction of another device of the architecture
   whose datasheet counts a higher MMA rate of the dtype per core and clock cycle (by
   :data:`CONVERSION_RATIO` or more) is converted to this device's datasheet at that ratio, capped
   at 1 (:meth:`EfficiencyTable._lent_at_this_rate`):
   the L40S and the RTX 4090 are one AD102 silicon, but the L40S's datasheet counts FP8 with FP32
   accumulation at twice the RTX 4090's rate per SM and cycle, and held out, the RTX 4090's Triton
   FP8 GEMM (SGLang PR #29638) took the L40S kernels' 0.399 of their peak as its own and was
   predicted 117.0% slow, where its calls fit 0.90 of its own peak (docs/perf-model-history.md,
   "Ada's tile load rate"). The other way round a share is
   lent as it is: a kernel held to a lower rate says nothing of how far it falls short of a
   higher one;
4. the architecture and dtype, kernels of the other class; then the dtype (or its twin), this
   class, on any architecture; then the architecture, any dtype, this class, then the other
   class. A figure of the other class is scaled by how much of the peak
   weight-gradient kernels reach relative to forward ones where one implementation was measured
   in both (:meth:`EfficiencyTable._class_ratio`; 1 where none was, and the answer says so):
   K-grouped kernels reduce each group's tokens into a tile of their own and read both operands
   along the token axis, and run at a lower share of the peak than the same library's forward
   kernels. A dtype's share of its peak carries across architectures better than across dtypes:
   the peak sets how fast operands and scales must arrive, and what does not scale with it
   (epilogue, scale loads, promotion) takes a larger share of a higher peak. cuBLAS bf16 reached
   0.68 of the B200's bf16 peak and 0.71 of the H100's, while Blackwell's FP4 kernels reached
   0.48-0.65 of theirs; DeepGEMM's bf16 kernels reach 0.69 of the H200's bf16 peak, its fp8 ones
   over 0.9 of the H800's fp8 peak. As on the device, this implementation's figure comes before
   another implementation's within the architecture's dtype levels (3 and the first of 4), within
   the dtype level, and within the architecture's any-dtype levels. The dtype level serves only
   an architecture with figures of its own;
5. an architecture with no figure of a kind (compute, streaming, launch, tile overhead, K-block
   latency) borrows that kind from the architectures its vendor has figures on: for compute the
   dtype (or its twin), this class, then the dtype's other class (scaled as in 4); for a dtype
   the vendor never measured, any dtype (this class, then the other). A share of the
   datasheet carries across architectures better than the datasheet itself predicts: on the 470
   published cases of c155159, fitted on Blackwell alone, the model predicted the Hopper cases at a
   median 37.0% (worst 94.9%) without this step and 11.4% (39.1%) with it; fitted on Hopper alone,
   the Blackwell cases at 57.3% (93.8%) and 17.4% (46.1%) (``moe-hal model validate --hold-out
   architecture``; ``docs/perf-model.md`` has the figures of the current set). The L2 rate of a warm call is borrowed as a multiple of the datasheet
   memory bandwidth (the best the vendor's architectures reach, as for a kernel without its own,
   :data:`BEST_UNLESS_OWN`): cuBLAS draws 1.19x the B200's listed bandwidth from its L2 and 1.25x
   the H100's; without it the held-out worst errors were 56.8% (Blackwell) and 73.5% (Hopper),
   warm calls predicted as if they streamed from memory. A share at the cap of 1 is lent to no
   other architecture, at this step or the dtype level of 4: it says the device outran its
   datasheet (two RTX 5090s run cuBLAS bf16 at up to 1.15 of the peak the hardware DB lists), not
   what share of a peak a kernel reaches; lent, it raised the held-out median of Hopper's timings
   from 16.5% to 24.6% ("A seventeenth round"). A per-core streaming cap and a tile load rate are the device's and the
   kernel's own and are never borrowed, nor is anything borrowed across vendors (an Ascend NPU's
   share of its peak is not an NVIDIA GPU's). The level says which architecture was never measured
   and where the figure came from.

A fitted level needs at least :data:`MIN_CASES` measured cases behind it (a measured figure
stands on its own), and so does each implementation a level answers for (one timing makes no
figure to go by). Without ``impl`` every level takes the best implementation known: what the
device can reach. With an ``impl`` a level has no figure of, the level answers for a *typical*
implementation: the case-weighted median over every implementation it knows — a kernel never
measured is assumed ordinary, not as good as the best one measured. A typical figure pools at
least :data:`MIN_TYPICAL_IMPLEMENTATIONS` implementations: a level that knows only one other
kernel is passed over for the next level that knows more, and its lone figure is the answer only
where no level of this architecture does (one kernel is not what kernels typically reach: vLLM
PR #20578's NVFP4 GEMM, read with tiles it does not launch, looked like a kernel at 0.07 of the
B200's FP4 peak and was the only FP4 dense kernel on that device once torchao's was held out); a
lone figure of this architecture still comes before the kernels of others
(:data:`OTHER_ARCHITECTURES`). This project's own
kernels (``typical: false``, measured by its own runs alone) answer only for themselves: one
young kernel says neither what kernels typically reach nor what the device can. Each answer
carries its basis and the level it came from.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NamedTuple

from ..errors import ArgumentError

if TYPE_CHECKING:
    from ..hwdb.entry import HardwareEntry

#: Kernel families an achieved compute fraction is kept for.
FAMILIES = ("dense", "grouped_contiguous", "grouped_masked", "k_grouped")

#: The family of each grouped operation.
FAMILY_OF_OP = {"contiguous": "grouped_contiguous", "masked": "grouped_masked", "k_grouped": "k_grouped"}

#: Forward kernels share code and tiling; weight-gradient (K-grouped) kernels are a different kernel.
CLASS_OF_FAMILY = {
    "dense": "forward",
    "grouped_contiguous": "forward",
    "grouped_masked": "forward",
    "k_grouped": "weight_gradient",
}

#: Kinds of achieved figure: fractions (compute, bandwidth), seconds (tile_overhead,
#: stage_latency, launch) and rates in bytes/s (bandwidth_per_unit, l2_bandwidth, tile_load_rate).
KINDS = (
    "compute",
    "bandwidth",
    "tile_overhead",
    "stage_latency",
    "launch",
    "bandwidth_per_unit",
    "l2_bandwidth",
    "tile_load_rate",
)
FRACTIONS = ("compute", "bandwidth")
SECONDS = ("tile_overhead", "stage_latency", "launch")
RATES = ("bandwidth_per_unit", "l2_bandwidth", "tile_load_rate")

#: Kinds that apply only to the implementation they were measured or fitted for (or to every
#: one, ``*``): a tile load rate depends on how a kernel loads its operands (TMA multicast across
#: a cluster halves one operand's loads), so one kernel's says nothing of another's.
OWN_IMPL_ONLY = ("tile_load_rate",)

#: Kinds where a kernel's own figure on another device of the architecture comes before other
#: kernels' (or the one every kernel pays) on this device: a fixed time per call is the kernel's
#: code (its prologue, the host work its call makes inside a CUDA graph), not the board's, and so is
#: its share of the MMA peak (its tiles and pipeline). ``torch._scaled_mm``'s rowwise-scaled FP8
#: GEMM pays 6 us per call on the B200 where the Blackwell joint time is 3 us, and held out, Helion
#: PR #3209's GB200 calls of it took the joint 3 us (docs/perf-model-history.md, "An eleventh round");
#: cuBLAS's calls on the H200 took other libraries' bf16 share there (module docstring, 3). Not a
#: streaming fraction, which is the device's memory system as much as the kernel's.
OWN_ON_ARCHITECTURE_FIRST = ("compute", "launch")

#: Kinds where a kernel without a figure of its own takes the best one known, not a typical one.
#: The L2 rate of a warm call is what the L2 delivers to a kernel that keeps enough loads in
#: flight; one that draws less is held back by something of its own (its tiles, its pipeline)
#: that says nothing of another kernel: on the B200, vLLM PR #20578's NVFP4 GEMM, read with tiles
#: it does not launch (one wave of 128 x 256 tiles is what holds it back), drew 1.7 TB/s where
#: vLLM's FP8 GEMM and cuBLAS drew 8.5 and 9.3, and pooled with one of them it set the rate every
#: other kernel was predicted with.
BEST_UNLESS_OWN = ("l2_bandwidth",)

#: A fallback level is used only with at least this many measured cases behind it.
MIN_CASES = 2

#: A typical figure (for an implementation a level has no figure of) pools at least this many
#: implementations; one other kernel's figure is a last resort within the architecture (module
#: docstring).
MIN_TYPICAL_IMPLEMENTATIONS = 2

#: Fallback levels whose figures come from architectures other than the call's. A lone figure of
#: one other kernel on the call's own device or architecture is taken before them: held out, the
#: RTX 5090's CuTe DSL NVFP4 GEMM (FlashInfer PR #3051) took the FP4 share of the B200's kernels,
#: 0.595 of the peak, and was predicted a median 35.8% slow, where its architecture's one other
#: FP4 kernel (PR #3026's CUTLASS GEMM) gives 11.0% (``docs/perf-model-history.md``, "A
#: seventeenth round"). SM120's warp-level MMA reaches a share of its own peak that SM100's
#: tensor-memory kernels do not tell.
OTHER_ARCHITECTURES = ("dtype", "vendor")

#: The output tile an achieved ``tile_overhead`` is stated for. A tile with a smaller
#: accumulator pays the share its area is of this one's; a larger one pays the whole
#: (:class:`moe_hal.perf.model.Call`).
OVERHEAD_TILE = (128, 128)

#: What a ``tile_overhead`` figure is stated for, in the words records and bases say it with.
PER_OVERHEAD_TILE = f"per {OVERHEAD_TILE[0]} x {OVERHEAD_TILE[1]} tile"

#: How a level says it lent a share converted between datasheets (EfficiencyTable._lent_at_this_rate).
CONVERTED = "shares of the architecture's devices with a higher datasheet MMA rate per core-cycle converted"

#: How many times another device's datasheet MMA rate per core and boost-clock cycle must be this
#: device's before a share it lends is converted. Parts built with a lower rate per cycle differ by
#: factors of 2 and more (the RTX 4090's FP32-accumulate rate is half the L40S's, the H20's a quarter
#: of the H100's); parts of one design differ by the clock their datasheet quotes the peak at, a few
#: percent (the H100 SXM's peak is at 1.83 of its 1.98 GHz, the PCIe board's at 1.62 of 1.755: 0.13%
#: apart per boost cycle; the GB200's 3.1% above the B200's), which says nothing of the clock either
#: sustains under load, so their shares are lent as they are.
CONVERSION_RATIO = 1.25

#: Dtypes a kernel runs on the same tensor-core instructions at the same share of each one's
#: datasheet peak: fp16 and bf16 (one MMA shape and issue rate per 16-bit float type on Hopper and
#: Blackwell). Where a level has a figure of only one of them, it answers for the other before a
#: dtype of another width is tried (an fp8 or fp4 rate says little of a 16-bit kernel).
SAME_MMA_RATE = {"fp16": "bf16", "bf16": "fp16"}


@dataclass(frozen=True)
class Achieved:
    """One achieved figure of one implementation on one device.

    ``value``: a fraction of the datasheet figure (``compute``, ``bandwidth``), seconds
    (``tile_overhead``, ``stage_latency``, ``launch``) or bytes/s (``bandwidth_per_unit``, ``l2_bandwidth``,
    ``tile_load_rate``).
    ``dtype``/``family`` only for ``compute``. ``cases``: how
    many measured cases it summarises. ``basis``: ``fitted`` or ``measured``; ``source``: where.
    ``typical``: False for an implementation that only this project's own runs measured (its
    own kernels): its figures answer for itself only, never for a typical implementation or as
    the best known one (one young kernel is no sample of what kernels reach on a device).
    """

    device: str
    architecture: str
    impl: str
    kind: str
    value: float
    cases: int
    basis: str
    source: str
    dtype: str | None = None
    family: str | None = None
    typical: bool = True

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ArgumentError("Achieved.kind", f"one of {KINDS}", self.kind)
        if self.kind == "compute" and (self.dtype is None or self.family not in FAMILIES):
            raise ArgumentError(
                "Achieved.family", f"a dtype and one of {FAMILIES} for kind 'compute'", (self.dtype, self.family)
            )
        if not (isinstance(self.value, (int, float)) and math.isfinite(self.value) and self.value >= 0):
            raise ArgumentError("Achieved.value", "a finite number >= 0", self.value)
        if self.kind in FRACTIONS and not 0 < self.value <= 1:
            raise ArgumentError("Achieved.value", "a fraction in (0, 1] of the datasheet figure", self.value)
        if not isinstance(self.typical, bool):
            raise ArgumentError("Achieved.typical", "a bool", repr(self.typical))


@dataclass(frozen=True)
class Resolved:
    """The figure that applies to a call: ``value``, its ``basis`` and ``source``, and ``level``
    in words (which device, implementation, dtype and family it was taken from)."""

    value: float
    basis: str
    source: str
    level: str


def _hwdb_entry(device: str):
    """The hardware-DB entry of ``device``; None for a device named only by a hand-built Hardware."""
    from .. import hwdb

    try:
        return hwdb.get(device)
    except ArgumentError:
        return None


def hwdb_vendor(device: str) -> str | None:
    """The vendor the hardware DB gives ``device`` (None for a device it does not know)."""
    entry = _hwdb_entry(device)
    return None if entry is None else entry.vendor


def hwdb_bandwidth(device: str) -> float | None:
    """The datasheet memory bandwidth (bytes/s) the hardware DB gives ``device`` (None when it
    does not know the device or its bandwidth)."""
    entry = _hwdb_entry(device)
    return None if entry is None else entry.mem_bandwidth(measured=False)


def hwdb_mma_rate(device: str, dtype: str) -> float | None:
    """The datasheet dense peak of ``dtype`` per SM (or AI core) and clock cycle, FLOP, that the
    hardware DB gives ``device``; None where it lacks the peak, the core count or the boost clock."""
    entry = _hwdb_entry(device)
    return None if entry is None else _mma_rate(entry, dtype)


# Kept per entry object, not per device id: a hardware DB reloaded (other overlays, another
# MOE_HAL_HWDB) has new entries, so a figure it changed is never answered from before.
@functools.lru_cache(maxsize=1024)
def _mma_rate(entry: HardwareEntry, dtype: str) -> float | None:
    peak = entry.peak_flops(dtype, measured=False)
    cores, clock = entry.quantity("compute.units"), entry.quantity("compute.boost_clock")
    if not (peak and cores and clock):
        return None
    return peak / (cores.value * clock.si)


class _Scope(NamedTuple):
    """Which of a place's records one level of a fallback order reads (None: any). A value, not a
    function, so that what a level finds is worked out once per table (:meth:`EfficiencyTable._at_level`)."""

    dtype: str | None = None
    family: str | None = None
    kernel_class: str | None = None
    impls: tuple[str | None, ...] | None = None

    def __call__(self, r: Achieved) -> bool:
        return (
            (self.dtype is None or r.dtype == self.dtype)
            and (self.family is None or r.family == self.family)
            and (self.kernel_class is None or CLASS_OF_FAMILY[str(r.family)] == self.kernel_class)
            and (self.impls is None or r.impl in self.impls)
        )


#: every record of a place
EVERY = _Scope()


class EfficiencyTable:
    """Achieved figures, answered through the fallback order of the module docstring.

    ``vendor_of``, ``bandwidth_of``: a device id's vendor and datasheet memory bandwidth, for the
    borrowing of step 5 (default: the hardware DB's; a device whose vendor is None borrows
    nothing, and one whose bandwidth is None no L2 rate). ``mma_rate_of``: a device's datasheet
    peak of a dtype per core and clock cycle, for a share lent by a device of the same
    architecture (:meth:`_lent_at_this_rate`; None: lent as it is)."""

    def __init__(
        self,
        records: Iterable[Achieved] = (),
        vendor_of: Callable[[str], str | None] = hwdb_vendor,
        bandwidth_of: Callable[[str], float | None] = hwdb_bandwidth,
        mma_rate_of: Callable[[str, str], float | None] = hwdb_mma_rate,
    ):
        self.records: tuple[Achieved, ...] = tuple(records)
        self.vendor_of = vendor_of
        self.bandwidth_of = bandwidth_of
        self.mma_rate_of = mma_rate_of
        # answers by question: the records never change, and backends ask once per grouped GEMM
        self._answers: dict[tuple, Resolved | None] = {}
        self._lent: dict[tuple[str, str | None], EfficiencyTable] = {}
        self._places: dict[tuple[str, str], dict[str, list[Achieved]]] = {}
        self._pools: dict[tuple, _Pool] = {}

    def __bool__(self) -> bool:
        return bool(self.records)

    def __iter__(self) -> Iterator[Achieved]:
        return iter(self.records)

    def compute(
        self, device: str, architecture: str | None, impl: str | None, dtype: str, family: str
    ) -> Resolved | None:
        """Achieved fraction of the dtype's datasheet peak for a call of ``family``."""
        key = ("compute", device, architecture, impl, dtype, family)
        if key not in self._answers:
            self._answers[key] = self._compute(device, architecture, impl, dtype, family)
        return self._answers[key]

    def _compute(
        self, device: str, architecture: str | None, impl: str | None, dtype: str, family: str
    ) -> Resolved | None:
        cls = CLASS_OF_FAMILY[family]
        places = [("device", device)] + ([("architecture", architecture)] if architecture else [])
        levels = []
        twins = [dtype] + ([SAME_MMA_RATE[dtype]] if dtype in SAME_MMA_RATE else [])
        for where, name in places:
            for scope, match in ((family, {"family": family}), (f"{cls} kernels", {"kernel_class": cls})):
                for dt in twins:
                    levels.append((where, name, f"{dt} {scope}", _Scope(dtype=dt, **match)))
        if architecture:
            other = "forward" if cls == "weight_gradient" else "weight_gradient"
            ratio = self._class_ratio()
            if ratio is None:
                factor = (1.0, "no implementation measured in both classes: ratio taken as 1")
            else:
                value = ratio[0] if cls == "weight_gradient" else 1 / ratio[0]
                factor = (value, f"the weight-gradient / forward ratio of {ratio[1]}")
            in_other = _Scope(kernel_class=other)
            levels.append(
                ("architecture", architecture, f"{dtype} {other} kernels", _Scope(dtype, kernel_class=other), factor)
            )
            # a dtype's share of its peak carries across architectures better than across dtypes
            # (module docstring, 4), so this dtype's kernels elsewhere come before other dtypes
            # here; an architecture never measured borrows from its vendor's instead (5)
            measured_here = self._measured("compute", architecture)
            for dt in twins if measured_here else ():
                levels.append(("dtype", dt, f"{cls} kernels of any architecture", _Scope(kernel_class=cls)))
            levels.append(("architecture", architecture, f"any dtype, {cls} kernels", _Scope(kernel_class=cls)))
            levels.append(("architecture", architecture, f"any dtype, {other} kernels", in_other, factor))
            if (vendor := self._borrows("compute", device, architecture)) is not None:
                why = f"{architecture} never measured"
                for dt in twins:
                    levels.append(("vendor", vendor, f"{dt} {cls} kernels ({why})", _Scope(dt, kernel_class=cls)))
                levels.append(
                    ("vendor", vendor, f"{dtype} {other} kernels ({why})", _Scope(dtype, kernel_class=other), factor)
                )
                # another dtype's share only for a dtype the vendor never measured: within one
                # place an implementation's own figure at any level comes first (_resolve), and
                # its share of another dtype's peak says less than other kernels' of this one
                if not any(
                    r.kind == "compute" and r.dtype in twins and self.vendor_of(r.device) == vendor
                    for r in self.records
                ):
                    levels.append(("vendor", vendor, f"any dtype, {cls} kernels ({why})", _Scope(kernel_class=cls)))
                    levels.append(("vendor", vendor, f"any dtype, {other} kernels ({why})", in_other, factor))
        found = self._resolve("compute", levels, impl, own_first=True)
        lent = self._lent_at_this_rate(device, architecture)
        if lent is not self and (converted := lent._resolve("compute", levels, impl, own_first=True)) != found:
            found = replace(converted, level=f"{converted.level}; {CONVERTED}")
        return found

    def _lent_at_this_rate(self, device: str, architecture: str | None) -> EfficiencyTable:
        """This table with the compute shares of the architecture's other devices whose datasheet
        MMA rate per core and clock cycle is :data:`CONVERSION_RATIO` times ``device``'s or more
        converted to ``device``'s datasheet (:data:`CONVERTED`); itself when none is."""
        key = (device, architecture)
        if key not in self._lent:
            self._lent[key] = self._convert_for(device, architecture)
        return self._lent[key]

    def _convert_for(self, device: str, architecture: str | None) -> EfficiencyTable:
        rates: dict[tuple[str, str], float | None] = {}

        def rate(of: str, dtype: str) -> float | None:
            if (of, dtype) not in rates:
                rates[(of, dtype)] = self.mma_rate_of(of, dtype)
            return rates[(of, dtype)]

        converted: dict[int, Achieved] = {}
        for r in self._placed("compute", "architecture").get(architecture, []) if architecture else ():
            if r.device != device:
                mine, there = rate(device, str(r.dtype)), rate(r.device, str(r.dtype))
                if there and mine and there >= mine * CONVERSION_RATIO:
                    converted[id(r)] = replace(r, value=min(1.0, r.value * there / mine))
        if not converted:
            return self
        records = [converted.get(id(r), r) for r in self.records]
        return EfficiencyTable(records, self.vendor_of, self.bandwidth_of, self.mma_rate_of)

    def _measured(self, kind: str, architecture: str) -> bool:
        return architecture in self._placed(kind, "architecture")

    def _borrows(self, kind: str, device: str, architecture: str | None) -> str | None:
        """The vendor whose measured architectures an ``architecture`` with no figure of ``kind``
        borrows from (module docstring, 5); None when it has figures of its own, or its vendor
        is not known."""
        if architecture is None or self._measured(kind, architecture):
            return None
        return self.vendor_of(device)

    def _class_ratio(self) -> tuple[float, str] | None:
        """How much of the peak weight-gradient (K-grouped) kernels reach relative to forward ones,
        where one implementation was measured in both classes on one device and dtype: the
        case-weighted median of those ratios, and the words naming them. None when none was."""
        if "class_ratio" not in self._answers:
            by_kernel: dict[tuple[str, str, str], dict[str, list[Achieved]]] = {}
            for r in self.records:
                if r.kind == "compute":
                    key = (r.device, r.impl, str(r.dtype))
                    by_kernel.setdefault(key, {}).setdefault(CLASS_OF_FAMILY[str(r.family)], []).append(r)
            ratios = []
            for (device, impl, dtype), by_class in sorted(by_kernel.items()):
                forward, gradient = by_class.get("forward", []), by_class.get("weight_gradient", [])
                if _enough(forward) and _enough(gradient):
                    value = _weighted_median(gradient) / _weighted_median(forward)
                    ratios.append((value, _cases(forward) + _cases(gradient), f"{impl} {dtype} on {device}"))
            answer = None
            if ratios:
                median = _median_by_weight([(v, n) for v, n, _ in ratios])
                answer = (median, ", ".join(f"{name} ({v:.2f})" for v, _, name in ratios))
            self._answers["class_ratio"] = answer
        return self._answers["class_ratio"]

    def bandwidth(self, device: str, architecture: str | None, impl: str | None) -> Resolved | None:
        """Achieved fraction of the datasheet memory bandwidth. Streaming is a property of the
        device more than of the kernel, so after this implementation on this device come the
        others on this device, then those on the architecture (module docstring: which of them)."""
        key = ("bandwidth", device, architecture, impl)
        if key not in self._answers:
            levels = [("device", device, "streaming", EVERY)]
            if architecture:
                levels.append(("architecture", architecture, "streaming", EVERY))
            if (vendor := self._borrows("bandwidth", device, architecture)) is not None:
                levels.append(("vendor", vendor, f"streaming ({architecture} never measured)", EVERY))
            self._answers[key] = self._resolve("bandwidth", levels, impl, impl_only_first=True)
        return self._answers[key]

    def figure(self, kind: str, device: str, architecture: str | None, impl: str | None) -> Resolved | None:
        """A time (``tile_overhead``, ``stage_latency``, ``launch``) or a rate (``bandwidth_per_unit``,
        ``l2_bandwidth``, ``tile_load_rate``): this implementation, then another (module docstring), on this device,
        then on the architecture (a fixed time per call: this implementation on the architecture
        before another on this device, :data:`OWN_ON_ARCHITECTURE_FIRST`); an architecture never
        measured borrows a time, and an L2 rate as a multiple of the datasheet bandwidth, from its
        vendor's (module docstring, 5)."""
        if kind not in SECONDS + RATES:
            raise ArgumentError("kind", f"one of {SECONDS + RATES}", kind)
        key = (kind, device, architecture, impl)
        if key not in self._answers:
            levels = [("device", device, kind, EVERY)]
            if architecture:
                levels.append(("architecture", architecture, kind, EVERY))
            # a time is borrowed as a share is (5); a rate in bytes/s only as below (_borrowed_rate)
            if kind in SECONDS and (vendor := self._borrows(kind, device, architecture)) is not None:
                levels.append(("vendor", vendor, f"{kind} ({architecture} never measured)", EVERY))
            own = [(*level[:3], _Scope(impls=(impl, "*"))) for level in levels]
            if kind in OWN_IMPL_ONLY:
                # how a kernel loads its tiles is its own trait: never another kernel's figure
                self._answers[key] = None if impl is None else self._resolve(kind, own, impl)
            elif kind in OWN_ON_ARCHITECTURE_FIRST:
                self._answers[key] = self._resolve(kind, levels, impl, own_first=True)
            elif kind in BEST_UNLESS_OWN:
                mine = None if impl is None else self._resolve(kind, own, impl)
                self._answers[key] = (
                    mine or self._resolve(kind, levels, None) or self._borrowed_rate(kind, device, architecture)
                )
            else:
                self._answers[key] = self._resolve(kind, levels, impl)
        return self._answers[key]

    def _borrowed_rate(self, kind: str, device: str, architecture: str | None) -> Resolved | None:
        """A rate of ``kind`` for an architecture with none of its own (module docstring, 5): the
        best multiple of its datasheet memory bandwidth the vendor's devices reach, times this
        device's; None when the architecture has its own, or the vendor or a bandwidth is unknown."""
        vendor = self._borrows(kind, device, architecture)
        here = self.bandwidth_of(device)
        if vendor is None or not here:
            return None
        shares = EfficiencyTable(
            [
                replace(r, value=r.value / there * here)
                for r in self.records
                if r.kind == kind and (there := self.bandwidth_of(r.device))
            ],
            self.vendor_of,
            self.bandwidth_of,
            self.mma_rate_of,
        )
        why = f"as a multiple of the datasheet bandwidth ({architecture} never measured)"
        return shares._resolve(kind, [("vendor", vendor, f"{kind} {why}", EVERY)], None)

    def _resolve(
        self, kind: str, levels, impl: str | None, impl_only_first: bool = False, own_first: bool = False
    ) -> Resolved | None:
        """The first answer of ``levels`` (place, name, scope, filter[, scale]). ``impl_only_first``:
        ``impl``'s own figure is looked for at the first level only. ``own_first``: within each place
        (consecutive levels of one device or architecture; for a kind of
        :data:`OWN_ON_ARCHITECTURE_FIRST`, a device and its architecture are one place) ``impl``'s
        figure at any level comes before another implementation's at the first."""
        if own_first and impl is not None:
            steps = []
            for _, place in itertools.groupby(levels, key=lambda level: _place(kind, level)):
                place = list(place)
                steps += [(level, True, False) for level in place] + [(level, False, True) for level in place]
        else:
            steps = [
                (level, impl is not None and not (impl_only_first and i > 0), True) for i, level in enumerate(levels)
            ]
        lone = None  # the first typical figure of a single other implementation
        for (where, name, scope, keep, *scaled), try_impl, others in steps:
            found, single = self._at_level(kind, where, name, scope, keep, impl, try_impl, others)
            if found is None:
                continue
            if lone is not None and where in OTHER_ARCHITECTURES:
                return lone
            found = _scaled(found, *scaled) if scaled else found
            if not single:
                return found
            lone = lone or found
        return lone

    def _placed(self, kind: str, where: str) -> dict[str, list[Achieved]]:
        """The records of ``kind`` by the name of their ``where`` (device, architecture, dtype or
        vendor), in record order."""
        if (kind, where) not in self._places:
            placed: dict[str, list[Achieved]] = {}
            for r in self.records:
                if r.kind == kind:
                    name = self.vendor_of(r.device) if where == "vendor" else getattr(r, where)
                    placed.setdefault(name, []).append(r)
            self._places[(kind, where)] = placed
        return self._places[(kind, where)]

    def _at_level(
        self,
        kind: str,
        where: str,
        name: str,
        scope: str,
        keep: _Scope,
        impl: str | None,
        try_impl: bool,
        others: bool = True,
    ) -> tuple[Resolved | None, bool]:
        """The answer of one level of a fallback order (module docstring), None when it has none;
        only ``impl``'s own figure unless ``others``; and whether it is a typical figure of fewer
        than :data:`MIN_TYPICAL_IMPLEMENTATIONS` implementations."""
        # the fit asks each table the same levels for many devices and kernels: a level's records
        # and answers are worked out once
        key = (kind, where, name, scope, keep)
        if key not in self._pools:
            # a share at the cap says the device outran its datasheet (the RTX 5090's cuBLAS bf16
            # at up to 1.15 of it), not what share of a peak kernels reach: it is not lent to others
            lent = where in OTHER_ARCHITECTURES and kind in FRACTIONS
            records = [r for r in self._placed(kind, where).get(name, ()) if not (lent and r.value >= 1.0) and keep(r)]
            self._pools[key] = _Pool(kind, f"on {where} {name}, {scope}", records)
        pool = self._pools[key]
        if kind == "launch" and where in OTHER_ARCHITECTURES:
            # a kernel's own fixed time is its prologue on its architecture: another architecture
            # borrows the joint time (cuBLAS's 10 us on the RTX 5090, from back-to-back calls,
            # put held-out B200 calls of 5 us at +147%)
            try_impl = False
        if try_impl and impl is not None and (own := pool.own(impl)) is not None:
            return own, False
        if not others:
            return None, False
        return pool.others(typical=impl is not None)


class _Pool:
    """The records one level of a fallback order reads (:meth:`EfficiencyTable._at_level`), by
    implementation, and its answers; ``here`` says where the level is, for the answers' words."""

    def __init__(self, kind: str, here: str, records: list[Achieved]):
        self.kind, self.here = kind, here
        self.by_impl: dict[str, list[Achieved]] = {}
        for r in records:
            self.by_impl.setdefault(r.impl, []).append(r)
        self._own: dict[str, Resolved | None] = {}
        self._others: dict[bool, tuple[Resolved | None, bool]] = {}

    def own(self, impl: str) -> Resolved | None:
        """``impl``'s own figure here, None when it has too few cases behind it."""
        if impl not in self._own:
            mine = self.by_impl.get(impl, [])
            self._own[impl] = _summary(mine, f"{impl} {self.here}") if _enough(mine) else None
        return self._own[impl]

    def others(self, typical: bool) -> tuple[Resolved | None, bool]:
        """The figure for a kernel with none of its own here: the typical implementation's (for a
        named kernel), else the best known; and whether it rests on a single implementation."""
        if typical not in self._others:
            self._others[typical] = self._for_others(typical)
        return self._others[typical]

    def _for_others(self, typical: bool) -> tuple[Resolved | None, bool]:
        by_impl = self.by_impl
        # implementations with enough cases of their own (one timing makes no figure to go by);
        # this project's own kernels answer only for themselves (own)
        backed = sorted(i for i, records in by_impl.items() if _enough(records) and all(r.typical for r in records))
        if not backed:
            return None, False
        if "*" in backed:
            # a time fitted jointly answers for every kernel without one of its own
            return _summary(by_impl["*"], f"every implementation (fitted jointly) {self.here}"), False
        if typical:
            # A kernel never measured here is taken to be a typical one, not the best known:
            # the median over the cases of every implementation measured here.
            pooled = [r for i in backed for r in by_impl[i]]
            single = len(backed) < MIN_TYPICAL_IMPLEMENTATIONS
            found = _summary(pooled, f"typical implementation ({', '.join(backed)}) {self.here}")
            if single:
                found = replace(found, level=f"{found.level}; no level pools two implementations")
            return found, single
        # without an implementation, the best: the highest fraction or rate, the shortest time
        sign = -1 if self.kind in SECONDS else 1
        best_impl = max(backed, key=lambda i: sign * _weighted_median(by_impl[i]))
        return _summary(by_impl[best_impl], f"best known implementation ({best_impl}) {self.here}"), False


def _place(kind: str, level: tuple) -> tuple:
    """Which place a fallback ``level`` of ``kind`` belongs to, for ``EfficiencyTable._resolve``'s
    ``own_first``."""
    if kind in OWN_ON_ARCHITECTURE_FIRST and level[0] in ("device", "architecture"):
        return ("device or architecture",)
    return level[:2]


def _cases(records: list[Achieved]) -> int:
    return sum(r.cases for r in records)


def _enough(records: list[Achieved]) -> bool:
    """A measured figure stands on its own; fitted ones need :data:`MIN_CASES` cases behind them."""
    return bool(records) and (_cases(records) >= MIN_CASES or any(r.basis == "measured" for r in records))


def _weighted_median(records: list[Achieved]) -> float:
    """Median of the record values, each counted ``cases`` times (the median of the cases when
    every record is one case)."""
    return _median_by_weight([(r.value, r.cases) for r in records])


def _median_by_weight(weighted: list[tuple[float, float]]) -> float:
    """The lower median of ``(value, weight)`` pairs, each value counted ``weight`` times."""
    ordered = sorted(weighted)
    half = sum(w for _, w in ordered) / 2
    seen = 0
    for value, weight in ordered:
        seen += weight
        if seen >= half:
            return value
    return ordered[-1][0]


def _scaled(found: Resolved, factor: tuple[float, str]) -> Resolved:
    """``found`` (a compute fraction of the other kernel class) times ``factor`` = (ratio, the
    words saying where the ratio comes from), capped at 1 (no kernel beats the datasheet)."""
    ratio, why = factor
    return Resolved(min(1.0, found.value * ratio), found.basis, found.source, f"{found.level} x {ratio:.3f}: {why}")


def _summary(records: list[Achieved], level: str) -> Resolved:
    value = _weighted_median(records)
    bases = sorted({r.basis for r in records})
    sources = sorted({r.source for r in records})
    return Resolved(value, "+".join(bases), "; ".join(sources), f"{level} ({_cases(records)} cases)")


# ---------------------------------------------------------------------------------------------
# From the hardware DB
# ---------------------------------------------------------------------------------------------
_SI = {"us": 1e-6, "ns": 1e-9, "GB/s": 1e9, "TB/s": 1e12}


def records_of(entry_id: str, architecture: str, achieved: dict) -> list[Achieved]:
    """The :class:`Achieved` figures of one hardware-DB entry's ``achieved`` mapping (fractions
    and seconds; the rates (:data:`RATES`) the model reads directly)."""
    out = []
    for impl, figures in achieved.items():
        typical = bool(figures.get("typical", True))
        for dtype, families in figures.get("compute", {}).items():
            for family, q in families.items():
                out.append(
                    Achieved(
                        entry_id,
                        architecture,
                        impl,
                        "compute",
                        float(q["value"]),
                        int(q.get("cases", 1)),
                        q["basis"],
                        q["source"],
                        dtype=dtype,
                        family=family,
                        typical=typical,
                    )
                )
        if "bandwidth" in figures:
            q = figures["bandwidth"]
            out.append(
                Achieved(
                    entry_id,
                    architecture,
                    impl,
                    "bandwidth",
                    float(q["value"]),
                    int(q.get("cases", 1)),
                    q["basis"],
                    q["source"],
                    typical=typical,
                )
            )
        for kind in SECONDS + RATES:
            if kind in figures:
                q = figures[kind]
                out.append(
                    Achieved(
                        entry_id,
                        architecture,
                        impl,
                        kind,
                        float(q["value"]) * _SI[q["unit"]],
                        int(q.get("cases", 1)),
                        q["basis"],
                        q["source"],
                        typical=typical,
                    )
                )
    return out


def table_from_entries(entries: Iterable) -> EfficiencyTable:
    """Every achieved figure of the hardware DB (all devices: the architecture-level fallback
    needs the other devices of the same architecture)."""
    records: list[Achieved] = []
    for entry in entries:
        raw = getattr(entry, "raw", {})
        if raw.get("achieved"):
            records.extend(records_of(entry.id, str(raw.get("architecture", "")), raw["achieved"]))
    return EfficiencyTable(records)


# ---------------------------------------------------------------------------------------------
# The figures one call is predicted with
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Rates:
    """What one call of ``dtype`` and ``op`` on a :class:`~moe_hal.perf.Hardware` is predicted
    with: FLOP/s and bytes/s a kernel achieves, seconds per tile, per K block of a tile and per
    call, the per-core streaming cap, the L2 bandwidth and the per-core tile load rate (None: not
    modelled), and in ``basis`` where each came from (``roofline``, ``compute``, ``bandwidth``,
    ``tile_overhead``, ``stage_latency``, ``launch``, ``bw_per_core``, ``l2_bandwidth``,
    ``tile_load_rate``)."""

    flops: float
    bandwidth: float
    tile_overhead: float
    stage_latency: float
    launch: float
    bw_per_core: float | None
    l2_bandwidth: float | None
    tile_load_rate: float | None
    basis: Mapping[str, str]

    @classmethod
    def of(cls, hw: Any, dtype: str, op: str, t_fixed: float | None = None, family: str | None = None) -> Rates:
        """The rates of ``hw`` (a :class:`~moe_hal.perf.Hardware`): its implementation's achieved
        fractions of the datasheet figures where its table knows them, otherwise its peak and
        bandwidth as given (and the basis says the prediction is then optimistic). ``t_fixed``
        given overrides the launch time. ``family``: the kernel family whose compute fraction
        applies (default: the grouped family of ``op``; ``dense`` for a plain GEMM)."""
        table, device, arch, impl = hw.efficiency, hw.name, hw.architecture, hw.impl
        who = impl or "any implementation"
        datasheet_peak = (hw.datasheet_peak_flops or {}).get(dtype, hw.peak(dtype))
        datasheet_bw = hw.datasheet_bandwidth or hw.mem_bandwidth
        peak_word = _source_word(hw.sources.get(f"peak.{dtype}"))
        bw_word = _source_word(hw.sources.get("bandwidth"))
        basis = {"roofline": f"{dtype} peak: {peak_word}; bandwidth: {bw_word}"}
        compute = table.compute(device, arch, impl, dtype, family or FAMILY_OF_OP[op])
        if compute is not None:
            flops = compute.value * datasheet_peak
            basis["compute"] = (
                f"achieved {compute.value:.3f} x datasheet {dtype} peak ({compute.basis}; {compute.level})"
            )
        else:
            flops = hw.peak(dtype)
            basis["compute"] = (
                f"{dtype} peak as given ({peak_word}); no achieved efficiency known for {who} on {device}: optimistic"
            )
        band = table.bandwidth(device, arch, impl)
        if band is not None:
            bandwidth = band.value * datasheet_bw
            basis["bandwidth"] = f"achieved {band.value:.3f} x datasheet bandwidth ({band.basis}; {band.level})"
        else:
            bandwidth = hw.mem_bandwidth
            basis["bandwidth"] = (
                f"bandwidth as given ({bw_word}); no achieved streaming bandwidth known for {who} on {device}"
            )
        if hw.tile_overhead is not None:
            overhead, basis["tile_overhead"] = hw.tile_overhead, "given (Hardware.tile_overhead)"
        elif (found := table.figure("tile_overhead", device, arch, impl)) is not None:
            overhead = found.value
            basis["tile_overhead"] = f"{found.value * 1e6:.2f} us {PER_OVERHEAD_TILE} ({found.basis}; {found.level})"
        else:
            overhead, basis["tile_overhead"] = 0.0, "not known: 0"
        if hw.stage_latency is not None:
            stage, basis["stage_latency"] = hw.stage_latency, "given (Hardware.stage_latency)"
        elif (found := table.figure("stage_latency", device, arch, impl)) is not None:
            stage = found.value
            basis["stage_latency"] = f"{found.value * 1e9:.0f} ns per K block of a tile ({found.basis}; {found.level})"
        else:
            stage, basis["stage_latency"] = 0.0, "not known: 0"
        if t_fixed is not None:
            launch, basis["launch"] = float(t_fixed), "given (t_fixed)"
        elif hw.t_fixed:
            launch, basis["launch"] = hw.t_fixed, "given (Hardware.t_fixed)"
        elif (found := table.figure("launch", device, arch, impl)) is not None:
            launch, basis["launch"] = found.value, f"{found.value * 1e6:.2f} us ({found.basis}; {found.level})"
        else:
            launch, basis["launch"] = 0.0, "not known: 0"
        caps: dict[str, float | None] = {}
        for kind, given in (
            ("bandwidth_per_unit", hw.bw_per_core),
            ("l2_bandwidth", hw.l2_bandwidth),
            ("tile_load_rate", hw.tile_load_rate),
        ):
            name = "bw_per_core" if kind == "bandwidth_per_unit" else kind
            if given is not None:
                caps[name], basis[name] = given, "given (Hardware)"
            elif (found := table.figure(kind, device, arch, impl)) is not None:
                caps[name], basis[name] = found.value, f"{found.value / 1e9:.1f} GB/s ({found.basis}; {found.level})"
            else:
                caps[name], basis[name] = None, "not modelled"
        return cls(
            flops,
            bandwidth,
            overhead,
            stage,
            launch,
            caps["bw_per_core"],
            caps["l2_bandwidth"],
            caps["tile_load_rate"],
            MappingProxyType(basis),
        )


def _source_word(source: str | None) -> str:
    """A ``Hardware.sources`` value in report words (``spec`` is the datasheet)."""
    if source is None:
        return "as given"
    return "datasheet" if source == "spec" else source
