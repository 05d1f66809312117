"""Grouping layouts for the three grouped-GEMM operations.

* :class:`ContiguousLayout` — M-grouped, contiguous: the rows of expert ``g`` form one segment of
  ``a[M, K]``; each segment starts at a multiple of ``alignment``.
* :class:`MaskedLayout` — M-grouped, masked: ``a[G, max_m, K]`` with ``masked_m[g]`` valid rows,
  read on the device (no host sync in the kernels).
* :class:`KGroupedLayout` — K-grouped: token groups along the reduction axis of ``a[T, M]`` and
  ``b[T, N]`` (expert weight gradients).

Segment arithmetic follows DeepGEMM's psum layout: ``psum[g]`` is the exclusive end row of group
``g``; group ``g`` starts at ``align(psum[g-1], alignment)`` (0 for ``g = 0``); rows between a
group's end and the next start, and rows past ``align(psum[-1], alignment)``, belong to no group.
"""

from __future__ import annotations

import functools
import math
import operator
import struct
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from typing import Iterable, Sequence

import torch

from .errors import CapacityError, DeviceError, DTypeError, LayoutError, ShapeError
from .quant import QuantizedTensor

IntsLike = Sequence[int] | torch.Tensor


def align(x: int, alignment: int) -> int:
    """Smallest multiple of ``alignment`` that is >= ``x``."""
    return -(-x // alignment) * alignment


def _check_alignment(alignment: object, argument: str = "alignment") -> int:
    """Any positive int (DeepGEMM's SM100 tests use 224, 160, 96); a backend that needs a power of
    two declares it (``Signature.alignment_power_of_two``) and refuses the call with a reason."""
    if isinstance(alignment, bool) or not isinstance(alignment, int) or alignment < 1:
        raise LayoutError(argument, "a positive int", alignment)
    return alignment


def _check_int32_vector(value: object, argument: str, shape: str, where: str = "") -> torch.Tensor:
    """``value`` itself when it is a 1-D int32 tensor (``shape`` names its size, e.g. ``"[G]"``;
    ``where`` says where it must live); else the typed error naming ``argument``. The values are
    not read (that would be a host sync)."""
    if not isinstance(value, torch.Tensor):
        raise LayoutError(argument, f"an int32 tensor {shape}{where}", type(value).__name__)
    if value.dtype != torch.int32:
        raise DTypeError(argument, "torch.int32", value.dtype)
    if value.dim() != 1:
        raise ShapeError(argument, f"a 1-D tensor {shape}", tuple(value.shape))
    return value


#: Largest row index or offset the int32 psum / m_indices forms can hold.
INT32_MAX = 2**31 - 1


def _check_count(value: object, argument: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise LayoutError(argument, "a non-negative int", value)
    return value


def _host_ints(values: IntsLike | Iterable[int], argument: str) -> list[int]:
    """Host list of ints from a sequence of ints or an integer tensor (a device tensor is copied:
    one sync). Strings, bools and floats are refused, not coerced; values must fit int32."""
    if isinstance(values, torch.Tensor):
        if values.dtype.is_floating_point or values.dtype.is_complex or values.dtype == torch.bool:
            raise DTypeError(argument, "an integer tensor", values.dtype)
        if values.dim() != 1:
            raise ShapeError(argument, "a 1-D tensor", tuple(values.shape))
        out = [int(v) for v in values.tolist()]
    else:
        if isinstance(values, (str, bytes, Mapping, AbstractSet)) or not isinstance(values, Iterable):
            raise LayoutError(argument, "a sequence of ints or a 1-D integer tensor", type(values).__name__)
        out = []
        for i, v in enumerate(values):
            if isinstance(v, bool) or not hasattr(v, "__index__"):
                raise LayoutError(
                    argument, "a sequence of ints or a 1-D integer tensor", f"{type(v).__name__} {v!r} at index {i}"
                )
            out.append(operator.index(v))
    for i, v in enumerate(out):
        if abs(v) > INT32_MAX:
            raise LayoutError(f"{argument}[{i}]", f"a value that fits int32 (|v| <= {INT32_MAX})", v)
    return out


def _int32_tensor(values: tuple[int, ...]) -> torch.Tensor:
    """Host int32 tensor of ``values``, packed by one ``struct`` call (a C loop; ``torch.tensor``
    on a tuple of ints costs about three times as much, on every new layout of a launch)."""
    if not values or torch.compiler.is_compiling():  # dynamo traces torch.tensor, not bytearray
        return torch.tensor(values, dtype=torch.int32)
    buffer = bytearray(4 * len(values))
    _packer(len(values)).pack_into(buffer, 0, *values)
    return torch.frombuffer(buffer, dtype=torch.int32)


@functools.lru_cache(maxsize=64)
def _packer(count: int) -> struct.Struct:
    """The compiled ``struct`` format of ``count`` native int32 (one per group count seen)."""
    return struct.Struct(f"={count}i")


def _segment_rows(starts: Sequence[int], lengths: Sequence[int], device: torch.device) -> torch.Tensor:
    """int64 ``[sum(lengths)]``: ``starts[b], starts[b] + 1, ..`` (``lengths[b]`` values) for each
    segment ``b`` in order — built with a fixed number of device ops (no host sync: the total is
    known)."""
    total = sum(lengths)
    start, length = torch.tensor([list(starts), list(lengths)], dtype=torch.int64, device=device)  # one copy
    shift = start - (torch.cumsum(length, 0) - length)  # start minus the segment's first output index
    return torch.repeat_interleave(shift, length, output_size=total) + torch.arange(total, device=device)


def upload(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The host tensor ``host`` on ``device``, copied without making the host wait for the device.

    On CUDA the bytes go through pinned memory: from pageable memory ``cudaMemcpyAsync`` "may
    synchronize with the stream" to stage them (CUDA runtime API, "API synchronization
    behavior"), while from pinned memory the copy is asynchronous, and torch's caching host
    allocator keeps the pinned block until the copy has run. The copy is queued on the current
    stream: like any tensor made on one stream, a use on another needs ordering after it. A copy
    cannot be recorded into a CUDA graph: inside capture this raises (make one call with the
    layout before capturing).
    """
    if device.type == "cpu":
        return host
    if torch.compiler.is_compiling():  # traced into a graph: the copy is the graph's, as before
        return host.to(device)
    if device.type == "cuda":
        if torch.cuda.is_current_stream_capturing():
            raise LayoutError(
                "layout",
                "a layout used once before CUDA-graph capture (its group bounds cannot be uploaded inside it)",
                "a layout whose group bounds are first needed inside capture",
            )
        host = host.pin_memory()
    return host.to(device, non_blocking=True)


class SegmentLayout:
    """Groups as ordered row segments of one axis; the shared base of the contiguous and
    K-grouped layouts. Holds host-side segment bounds and caches device tensors per device."""

    __slots__ = (
        "_counts",
        "_starts",
        "_ends",
        "alignment",
        "num_rows",
        "num_valid_rows",
        "_device_cache",
        "__weakref__",
    )

    #: Operation name used in problem signatures and backend support matrices.
    op: str = ""

    def __init__(self, counts: Sequence[int], starts: Sequence[int], alignment: int, num_rows: int):
        """Checked raw constructor: ``starts[g]`` must be ``align(starts[g-1] + counts[g-1],
        alignment)`` (0 for ``g = 0``) and ``num_rows`` at least the aligned end of the last group,
        so that segments never overlap and never pass ``num_rows``. Prefer :meth:`from_counts`,
        :meth:`from_psum` or ``from_m_indices``, which compute ``starts`` for you."""
        alignment = _check_alignment(alignment)
        counts = [_check_count(c, f"counts[{g}]") for g, c in enumerate(counts)]
        starts = list(starts)
        if len(starts) != len(counts):
            raise LayoutError("starts", f"{len(counts)} group starts (one per count)", len(starts))
        end = 0
        for g, (start, count) in enumerate(zip(starts, counts)):
            expected = align(end, alignment)
            if isinstance(start, bool) or not isinstance(start, int) or start != expected:
                raise LayoutError(
                    f"starts[{g}]",
                    f"{expected} (align(end of group {g - 1}, {alignment}))" if g else "0",
                    start,
                    "segments follow each other at the alignment",
                )
            end = start + count
        _check_count(num_rows, "num_rows")
        if num_rows < align(end, alignment):
            raise LayoutError(
                "num_rows", f"an int >= {align(end, alignment)} (the aligned end of the last group)", num_rows
            )
        self._counts = tuple(counts)
        self._starts = tuple(starts)
        self._ends = tuple(s + c for s, c in zip(self._starts, self._counts))
        self.alignment = alignment
        self.num_rows = num_rows
        #: Rows that belong to some group.
        self.num_valid_rows = sum(self._counts)
        self._device_cache: dict[tuple[str, torch.device], torch.Tensor] = {}

    # -- constructors -----------------------------------------------------------------------
    @classmethod
    def from_counts(cls, counts: IntsLike, alignment: int = 1, num_rows: int | None = None):
        """Layout from per-group row counts (``G`` non-negative ints, list or integer tensor).

        ``num_rows`` defaults to ``align(sum of aligned segments, alignment)``; a larger value
        over-allocates tail rows that belong to no group.
        """
        alignment = _check_alignment(alignment)
        values = _host_ints(counts, "counts")
        starts: list[int] = []
        end = 0
        for g, c in enumerate(values):
            if c < 0:
                raise LayoutError(f"counts[{g}]", "a non-negative row count", c)
            start = align(end, alignment)
            starts.append(start)
            end = start + c
        return cls(values, starts, alignment, cls._check_num_rows(end, alignment, num_rows, "counts"))

    @classmethod
    def from_psum(cls, psum: IntsLike, alignment: int = 1, num_rows: int | None = None):
        """Layout from DeepGEMM-style psum offsets: ``psum[g]`` is the exclusive end of group ``g``,
        which starts at ``align(psum[g-1], alignment)``."""
        alignment = _check_alignment(alignment)
        ends = _host_ints(psum, "psum")
        counts, starts = [], []
        prev_end = 0
        for g, e in enumerate(ends):
            start = align(prev_end, alignment)
            if e < start:
                raise LayoutError(
                    f"psum[{g}]",
                    f"a non-decreasing offset >= {start} (align(psum[{g - 1}], {alignment}))"
                    if g
                    else "a non-negative offset",
                    e,
                )
            starts.append(start)
            counts.append(e - start)
            prev_end = e
        return cls(counts, starts, alignment, cls._check_num_rows(prev_end, alignment, num_rows, "psum"))

    @staticmethod
    def _check_num_rows(end: int, alignment: int, num_rows: int | None, argument: str) -> int:
        needed = align(end, alignment)
        if needed > INT32_MAX:
            raise LayoutError(argument, f"groups whose aligned rows fit int32 (<= {INT32_MAX} in all)", needed)
        if num_rows is None:
            return needed
        if isinstance(num_rows, bool) or not isinstance(num_rows, int) or not needed <= num_rows <= INT32_MAX:
            raise LayoutError(
                "num_rows",
                f"an int in [{needed}, {INT32_MAX}] (from the aligned end of the last group to the int32 limit)",
                num_rows,
            )
        return num_rows

    # -- views ------------------------------------------------------------------------------
    @property
    def num_groups(self) -> int:
        return len(self._counts)

    @property
    def counts(self) -> torch.Tensor:
        """int32 ``[G]`` rows per group (host tensor)."""
        return _int32_tensor(self._counts)

    @property
    def psum(self) -> torch.Tensor:
        """int32 ``[G]`` exclusive end row of each group (DeepGEMM psum; host tensor)."""
        return _int32_tensor(self._ends)

    @property
    def counts_list(self) -> tuple[int, ...]:
        return self._counts

    @property
    def starts(self) -> tuple[int, ...]:
        """First row of each group."""
        return self._starts

    @property
    def ends(self) -> tuple[int, ...]:
        """Exclusive end row of each group (the psum values)."""
        return self._ends

    def segments(self) -> Iterable[tuple[int, int, int]]:
        """``(group, start, end)`` for every group, empty ones included, in order."""
        return zip(range(len(self._counts)), self._starts, self._ends)

    def has_gaps(self) -> bool:
        """True when some row belongs to no group (alignment padding or tail rows)."""
        return self.num_valid_rows != self.num_rows

    def m_indices(self, device: torch.device | str | None = None) -> torch.Tensor:
        """int32 ``[num_rows]``: the group of each row, -1 for rows that belong to no group."""
        return self._cached("m_indices", device, self._build_m_indices)

    def psum_on(self, device: torch.device | str | None) -> torch.Tensor:
        """The int32 psum tensor ``[G]`` on ``device`` (cached per device; uploaded without
        making the host wait, see :func:`upload`)."""
        hit = self._device_cache.get(("psum", device))  # the hot path of a launch: one look-up
        return hit if hit is not None else self._cached("psum", device, lambda: self.psum)

    def bounds_on(self, device: torch.device | str | None) -> torch.Tensor:
        """int32 ``[2, G]`` on ``device``: each group's first row (row 0) and exclusive end row
        (row 1), for kernels that read both (cached per device, uploaded like :meth:`psum_on`)."""
        hit = self._device_cache.get(("bounds", device))
        if hit is not None:
            return hit
        return self._cached("bounds", device, lambda: _int32_tensor(self._starts + self._ends).reshape(2, -1))

    def aligned_ends_on(self, device: torch.device | str | None) -> torch.Tensor:
        """int32 ``[G]`` of ``align(psum[g], alignment)``: segment ends padding included (cached)."""
        return self._cached(
            "aligned_ends",
            device,
            lambda: torch.tensor([align(e, self.alignment) for e in self._ends], dtype=torch.int32),
        )

    def gap_rows_on(self, device: torch.device | str | None) -> torch.Tensor:
        """int64 indices of the rows that belong to no group (cached per device)."""
        return self._cached("gap_rows", device, lambda: torch.nonzero(self._build_m_indices() < 0).flatten())

    def valid_rows_on(self, device: torch.device | str | None) -> torch.Tensor:
        """int64 indices of the rows that belong to some group, in order (cached per device)."""
        return self._cached("valid_rows", device, lambda: torch.nonzero(self._build_m_indices() >= 0).flatten())

    def packed_ends_on(self, device: torch.device | str | None) -> torch.Tensor:
        """int32 ``[G]`` cumulative counts: group ends once the rows of no group are removed."""
        return self._cached(
            "packed_ends",
            device,
            lambda: torch.cumsum(torch.tensor(self._counts, dtype=torch.int64), 0).to(torch.int32),
        )

    def _build_m_indices(self) -> torch.Tensor:
        ids = torch.full((self.num_rows,), -1, dtype=torch.int32)
        counts = torch.tensor(self._counts, dtype=torch.int64)
        if counts.numel() and int(counts.sum()):
            groups = torch.repeat_interleave(torch.arange(len(self._counts), dtype=torch.int32), counts)
            ids[_segment_rows(self._starts, self._counts, torch.device("cpu"))] = groups
        return ids

    def _cached(self, kind: str, device, build) -> torch.Tensor:
        hit = self._device_cache.get((kind, device))
        if hit is not None:
            return hit
        dev = device if isinstance(device, torch.device) else torch.device(device or "cpu")
        key = (kind, dev)
        hit = self._device_cache.get(key) if dev is not device else None
        if hit is None:
            hit = upload(build(), dev)
            self._device_cache[key] = hit
        return hit

    # -- equality / repr ------------------------------------------------------------------------
    def _key(self) -> tuple:
        return (type(self), self._counts, self._starts, self.alignment, self.num_rows)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SegmentLayout) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        counts = list(self._counts)
        shown = counts if len(counts) <= 16 else counts[:16] + ["..."]
        return (
            f"{type(self).__name__}(num_groups={self.num_groups}, counts={shown}, "
            f"alignment={self.alignment}, num_rows={self.num_rows})"
        )


class ContiguousLayout(SegmentLayout):
    """M-grouped contiguous layout of ``a[num_rows, K]`` (DeepGEMM's contiguous / psum layout).

    Build it with :meth:`from_counts` (``alignment`` defaults to 128, DeepGEMM's value),
    :meth:`from_psum` or :meth:`from_m_indices`. Empty groups are legal. The output contract:
    every row of ``out`` is written, and rows that belong to no group are zeros.
    """

    __slots__ = ()
    op = "contiguous"

    @classmethod
    def from_counts(cls, counts: IntsLike, alignment: int = 128, num_rows: int | None = None):
        return super().from_counts(counts, alignment, num_rows)

    @classmethod
    def from_psum(cls, psum: IntsLike, alignment: int = 128, num_rows: int | None = None):
        return super().from_psum(psum, alignment, num_rows)

    @classmethod
    def from_m_indices(cls, m_indices: torch.Tensor, num_groups: int, alignment: int | None = None):
        """Layout from an int32 ``[M]`` tensor of group ids per row, -1 on rows of no group, in the
        canonical form: each group's rows form one run, groups in ascending order, group ``g``
        starting at ``align(end of g-1, alignment)``.

        With ``alignment=None`` the smallest alignment that fits is inferred (1 when there is no
        padding). A device tensor is copied to the host. Other valid DeepGEMM forms (unsorted
        groups, a group split into several runs, -1 blocks between groups) are refused here:
        :meth:`from_m_indices_permuted` converts those, returning the row permutation.
        """
        ids = cls._host_m_indices(m_indices, num_groups)
        num_rows = ids.numel()
        rows = torch.nonzero(ids >= 0).flatten()
        vals = ids[rows]
        hint = "; ContiguousLayout.from_m_indices_permuted accepts any order and returns the row permutation"
        descending = torch.nonzero(vals[1:] < vals[:-1]).flatten()
        if descending.numel():
            row = int(rows[descending[0] + 1])
            raise LayoutError(
                f"m_indices[{row}]",
                "group ids in ascending order (one run per group)",
                int(ids[row]),
                hint.lstrip("; "),
            )
        counts = torch.bincount(vals, minlength=num_groups).tolist()
        first = [-1] * num_groups
        if vals.numel():
            change = torch.ones_like(vals, dtype=torch.bool)
            change[1:] = vals[1:] != vals[:-1]
            for r, g in zip(rows[change].tolist(), vals[change].tolist()):
                first[g] = r
        for g, (start, count) in enumerate(zip(first, counts)):
            if count and int(ids[start + count - 1]) != g:
                row = start + int(torch.nonzero(ids[start : start + count] != g)[0])
                raise LayoutError(
                    f"m_indices[{row}]",
                    f"{g} (the rows of group {g} must be contiguous)",
                    int(ids[row]),
                    hint.lstrip("; "),
                )
        if alignment is None:
            # Every non-first start is a multiple of the alignment: try the divisors of their gcd.
            starts = [f for f in first if f > 0]
            common = math.gcd(*starts) if starts else 1
            fitting = [d for d in range(1, common + 1) if common % d == 0 and cls._fits(counts, first, d, num_rows)]
            if not fitting:
                raise LayoutError(
                    "m_indices",
                    "groups placed at align(previous end, A) for some alignment A",
                    "an irregular placement",
                    hint.lstrip("; "),
                )
            alignment = fitting[0]
        elif not cls._fits(counts, first, _check_alignment(alignment), num_rows):
            raise LayoutError(
                "m_indices",
                f"each group to start at align(previous end, {alignment})",
                "a different placement",
                hint.lstrip("; "),
            )
        return cls(counts, cls._place(counts, alignment), alignment, num_rows)

    @classmethod
    def from_m_indices_permuted(
        cls, m_indices: torch.Tensor, num_groups: int, alignment: int = 1
    ) -> tuple["ContiguousLayout", torch.Tensor]:
        """Any per-row ``m_indices`` (int32 ``[M]``, group id of each row, -1 on rows of no group;
        groups in any order, split into any number of runs, -1 blocks anywhere) -> the canonical
        layout plus the row permutation that realises it.

        Returns ``(layout, source_rows)``: ``layout = from_counts(counts, alignment)`` with
        ``counts[g]`` the number of rows whose id is ``g``; ``source_rows`` is an int64 host tensor
        ``[layout.num_rows]`` giving, for each row of the canonical layout, the row of the original
        tensor it takes (rows of one group keep their original order), and -1 on rows of no group.
        So ``a_canonical[r] = a[source_rows[r]]`` and the result rows scatter back with
        ``d[source_rows[r]] = out[r]``; rows with ``m_indices == -1`` belong to no group.
        """
        ids = cls._host_m_indices(m_indices, num_groups)
        valid = torch.nonzero(ids >= 0).flatten()
        groups, order = torch.sort(ids[valid], stable=True)
        counts = torch.bincount(groups, minlength=num_groups).tolist()
        layout = cls.from_counts(counts, alignment)
        source_rows = torch.full((layout.num_rows,), -1, dtype=torch.int64)
        source_rows[layout.valid_rows_on("cpu")] = valid[order]
        return layout, source_rows

    @staticmethod
    def _host_m_indices(m_indices: object, num_groups: object) -> torch.Tensor:
        """Checked int64 host copy of ``m_indices`` (ids in ``[-1, num_groups)``)."""
        if not isinstance(m_indices, torch.Tensor):
            raise LayoutError("m_indices", "an int32 tensor", type(m_indices).__name__)
        if m_indices.dtype not in (torch.int32, torch.int64):
            raise DTypeError("m_indices", "torch.int32", m_indices.dtype)
        if m_indices.dim() != 1:
            raise ShapeError("m_indices", "a 1-D tensor [M]", tuple(m_indices.shape))
        _check_count(num_groups, "num_groups")
        ids = m_indices.to("cpu", torch.int64)
        bad = (ids < -1) | (ids >= num_groups)
        if bool(bad.any()):
            row = int(torch.nonzero(bad)[0])
            raise LayoutError(f"m_indices[{row}]", f"a group id in [0, {num_groups}) or -1", int(ids[row]))
        return ids

    @staticmethod
    def _place(counts: list[int], alignment: int) -> list[int]:
        out, end = [], 0
        for c in counts:
            start = align(end, alignment)
            out.append(start)
            end = start + c
        return out

    @classmethod
    def _fits(cls, counts: list[int], first: list[int], alignment: int, num_rows: int) -> bool:
        placed = cls._place(counts, alignment)
        if any(f >= 0 and f != p for f, p in zip(first, placed)):
            return False
        end = placed[-1] + counts[-1] if placed else 0
        return align(end, alignment) <= num_rows


class KGroupedLayout(SegmentLayout):
    """K-grouped layout: token groups along the reduction axis ``T`` of ``a[T, M]`` and ``b[T, N]``.

    ``out[g] = (c[g] if c is given else 0) + a[rows_g].T @ b[rows_g]``; an empty group gives
    ``c[g]`` or zeros. Rows outside every group do not contribute. ``alignment`` defaults to 1.
    """

    __slots__ = ()
    op = "k_grouped"


class MaskedLayout:
    """M-grouped masked layout of ``a[G, max_m, K]`` (CUDA-graph decode).

    ``masked_m``: int32 ``[G]`` on the device of ``a``: valid rows of each group, read by kernels
    on the device. ``max_m``: the row capacity per group. ``expected_m``: optional tokens-per-group
    hint for tile selection; correctness never depends on it.

    ``check`` (default True) verifies ``0 <= masked_m[g] <= max_m`` here, which reads ``masked_m``
    on the host (one device sync). It is skipped while a CUDA graph is being captured; pass
    ``check=False`` to skip it in eager decode loops (kernels then clamp to ``max_m``).
    Output contract: rows ``r >= masked_m[g]`` of ``out[g]`` are never written.
    """

    __slots__ = ("masked_m", "max_m", "expected_m", "__weakref__")
    op = "masked"

    def __init__(self, masked_m: torch.Tensor, max_m: int, expected_m: int | None = None, check: bool = True):
        _check_int32_vector(masked_m, "masked_m", "[G]", " on the device of a")
        if isinstance(max_m, bool) or not isinstance(max_m, int) or max_m < 0:
            raise LayoutError("max_m", "a non-negative int", max_m)
        if expected_m is not None and (
            isinstance(expected_m, bool) or not isinstance(expected_m, int) or expected_m < 1
        ):
            raise LayoutError("expected_m", "None or a positive int", expected_m)
        if check and masked_m.numel() and not _values_unreadable(masked_m.device):
            lo, hi = (int(v) for v in torch.aminmax(masked_m))
            if lo < 0:
                g = int(torch.nonzero(masked_m < 0)[0])
                raise LayoutError(f"masked_m[{g}]", "a non-negative row count", int(masked_m[g]))
            if hi > max_m:
                g = int(torch.nonzero(masked_m > max_m)[0])
                raise LayoutError(f"masked_m[{g}]", f"<= max_m ({max_m})", int(masked_m[g]))
        self.masked_m = masked_m
        self.max_m = max_m
        self.expected_m = expected_m

    @property
    def num_groups(self) -> int:
        return self.masked_m.numel()

    @property
    def device(self) -> torch.device:
        return self.masked_m.device

    def __repr__(self) -> str:
        return (
            f"MaskedLayout(num_groups={self.num_groups}, max_m={self.max_m}, "
            f"expected_m={self.expected_m}, device={self.masked_m.device})"
        )


def _values_unreadable(device: torch.device) -> bool:
    """True where reading ``masked_m`` on the host is impossible (meta tensors) or illegal
    (a CUDA graph is being captured)."""
    if device.type == "meta":
        return True
    return device.type == "cuda" and bool(torch.cuda.is_current_stream_capturing())


Layout = ContiguousLayout | MaskedLayout | KGroupedLayout

__all__ = [
    "ContiguousLayout",
    "KGroupedLayout",
    "Layout",
    "MaskedLayout",
    "SegmentLayout",
    "align",
    "contiguous_to_masked",
    "masked_to_contiguous",
    "take_rows",
]


# -- data conversions between the contiguous and masked layouts -------------------------------------
#
# Both directions move whole rows, so they serve activations (``a``) and GEMM outputs alike, and a
# QuantizedTensor with per-row scales (``block = (1, c)``) moves its scale rows with its data rows.
# The counts <-> psum <-> m_indices conversions are the ContiguousLayout constructors and views
# (``from_counts``/``from_psum``/``from_m_indices`` and ``counts``/``psum``/``m_indices()``).

RowOperand = torch.Tensor | QuantizedTensor


def take_rows(
    x: RowOperand, source_rows: torch.Tensor, empty_rows: torch.Tensor, filled_rows: torch.Tensor | None = None
) -> RowOperand:
    """``x[source_rows]`` along dim 0 (a tensor, or a QuantizedTensor with per-row scales) with the
    rows listed in ``empty_rows`` (int64, same device) set to zero — their scale to 1.0, a power of
    two, so UE8M0 packing stays exact.

    ``filled_rows`` (optional, the complement of ``empty_rows``) lets the mostly-empty case (decode
    batches padded to a large alignment or capacity) start from a zero buffer and write only the
    filled rows, instead of gathering every row and clearing the empty ones."""
    if filled_rows is not None and empty_rows.numel() > filled_rows.numel():
        return _fill_rows(x, source_rows.index_select(0, filled_rows), filled_rows, source_rows.shape[0])
    if isinstance(x, QuantizedTensor):
        raw = x.data.view(torch.uint8)  # fp8 lacks fill kernels; zero bits == 0.0
        data = take_rows(raw, source_rows, empty_rows).view(torch.float8_e4m3fn)
        if x.scale.shape[0] == 0:
            scale = x.scale.new_ones(source_rows.shape[0], *x.scale.shape[1:])
        else:
            scale = x.scale.index_select(0, source_rows).index_fill_(0, empty_rows, 1.0)
        return QuantizedTensor(data, scale, x.block, x.scale_format)
    if x.shape[0] == 0:  # nothing to read: every row is empty
        return x.new_zeros(source_rows.shape[0], *x.shape[1:])
    return x.index_select(0, source_rows).index_fill_(0, empty_rows, 0)


def _fill_rows(x: RowOperand, sources: torch.Tensor, rows: torch.Tensor, num_rows: int) -> RowOperand:
    """A ``num_rows`` buffer of empty rows (zeros; scale 1.0) with ``out[rows] = x[sources]``."""
    if isinstance(x, QuantizedTensor):
        data = _fill_rows(x.data.view(torch.uint8), sources, rows, num_rows).view(torch.float8_e4m3fn)
        scale = x.scale.new_ones(num_rows, *x.scale.shape[1:])
        scale.index_put_((rows,), x.scale.index_select(0, sources))
        return QuantizedTensor(data, scale, x.block, x.scale_format)
    out = x.new_zeros(num_rows, *x.shape[1:])
    return out.index_put_((rows,), x.index_select(0, sources))  # unique rows: deterministic


def _check_rows_operand(x: object, argument: str, rank: int) -> torch.Tensor:
    """The row tensor of ``x`` (a tensor, or the data of a QuantizedTensor with per-row scales)."""
    data = x.data if isinstance(x, QuantizedTensor) else x
    if not isinstance(data, torch.Tensor):
        raise DTypeError(argument, "a torch.Tensor or moe_hal.QuantizedTensor", type(x).__name__)
    if data.dim() != rank:
        raise ShapeError(argument, f"a {rank}-D tensor", tuple(data.shape))
    if isinstance(x, QuantizedTensor) and x.block[0] != 1:
        raise ShapeError(f"{argument}.block", "(1, cols): per-row scales, so rows can move with their scales", x.block)
    return data


def _reshape_rows(x: RowOperand, lead: tuple[int, ...]) -> RowOperand:
    if isinstance(x, QuantizedTensor):
        return QuantizedTensor(
            x.data.reshape(*lead, x.data.shape[-1]), x.scale.reshape(*lead, x.scale.shape[-1]), x.block, x.scale_format
        )
    return x.reshape(*lead, x.shape[-1])


def contiguous_to_masked(
    a: RowOperand, layout: ContiguousLayout, max_m: int | None = None
) -> tuple[RowOperand, MaskedLayout]:
    """Rows of a contiguous M-grouped tensor -> the masked layout.

    ``a``: ``[num_rows, K]`` tensor (activations or GEMM output) or a QuantizedTensor with
    ``block = (1, c)``, laid out by ``layout``. ``max_m``: the row capacity per group; default
    ``max(counts)`` (0 without groups). Returns ``(a3, masked_layout)``: ``a3[g, m] = a[starts[g] + m]``
    for ``m < counts[g]``, zero rows after (scale 1.0 when quantized); ``masked_layout.masked_m``
    is ``counts`` as int32 on ``a``'s device. A group with more than ``max_m`` rows raises
    :class:`~moe_hal.errors.CapacityError`. Rows of ``a`` that belong to no group are not read.
    """
    data = _check_rows_operand(a, "a", 2)
    if not isinstance(layout, ContiguousLayout):
        raise LayoutError("layout", "a ContiguousLayout", type(layout).__name__)
    if data.shape[0] != layout.num_rows:
        raise ShapeError("a", f"{layout.num_rows} rows (layout.num_rows)", tuple(data.shape))
    counts = list(layout.counts_list)
    if max_m is None:
        max_m = max(counts, default=0)
    if isinstance(max_m, bool) or not isinstance(max_m, int) or max_m < 0:
        raise LayoutError("max_m", "None or a non-negative int", max_m)
    over = [g for g, c in enumerate(counts) if c > max_m]
    if over:
        raise CapacityError(
            f"layout.counts[{over[0]}]",
            f"<= max_m = {max_m}",
            counts[over[0]],
            f"{len(over)} group(s) exceed the capacity",
        )
    num_groups = layout.num_groups
    m = torch.arange(max_m, dtype=torch.int64)
    filled = m < torch.tensor(counts, dtype=torch.int64).reshape(num_groups, 1)  # [G, max_m]
    starts = torch.tensor(layout.starts, dtype=torch.int64).reshape(num_groups, 1)
    source = torch.where(filled, starts + m, 0).reshape(-1)
    empty = torch.nonzero(~filled.reshape(-1)).flatten()
    rows = take_rows(a, source.to(data.device), empty.to(data.device))
    masked_m = torch.tensor(counts, dtype=torch.int32, device=data.device)
    return _reshape_rows(rows, (num_groups, max_m)), MaskedLayout(masked_m, max_m, check=False)


def masked_to_contiguous(
    a3: RowOperand, layout: MaskedLayout, alignment: int = 128
) -> tuple[RowOperand, ContiguousLayout]:
    """Rows of a masked M-grouped tensor -> the contiguous layout (DeepGEMM's masked-to-psum).

    ``a3``: ``[G, max_m, K]`` tensor (activations or GEMM output) or a QuantizedTensor with
    ``block = (1, c)``. Returns ``(a, contiguous_layout)``: ``contiguous_layout =
    ContiguousLayout.from_counts(masked_m, alignment)`` and ``a[starts[g] + m] = a3[g, m]`` for
    ``m < masked_m[g]``; padding rows are zero. Rows past ``masked_m`` are never read (a masked GEMM
    leaves them unwritten). Reads ``masked_m`` on the host (one device sync) and re-checks
    ``0 <= masked_m[g] <= max_m`` (LayoutError), since a MaskedLayout may skip that check.
    """
    data = _check_rows_operand(a3, "a3", 3)
    if not isinstance(layout, MaskedLayout):
        raise LayoutError("layout", "a MaskedLayout", type(layout).__name__)
    expected = (layout.num_groups, layout.max_m)
    if tuple(data.shape[:2]) != expected:
        raise ShapeError("a3", f"[G, max_m, K] with (G, max_m) = {expected} (from the layout)", tuple(data.shape))
    if layout.masked_m.device != data.device:
        raise DeviceError("layout.masked_m", f"device {data.device} (that of a3)", layout.masked_m.device)
    counts = layout.masked_m.tolist()
    for g, c in enumerate(counts):
        if not 0 <= c <= layout.max_m:
            raise LayoutError(f"masked_m[{g}]", f"a row count in [0, {layout.max_m}] (max_m)", c)
    contiguous = ContiguousLayout.from_counts(counts, alignment=alignment)
    group = contiguous.m_indices().to(torch.int64)
    g = group.clamp(min=0)
    row = torch.arange(contiguous.num_rows, dtype=torch.int64)
    shift = torch.tensor(contiguous.starts, dtype=torch.int64) - torch.arange(len(counts)) * layout.max_m
    source = torch.where(group >= 0, row - shift[g], 0) if counts else row
    flat = _reshape_rows(a3, (layout.num_groups * layout.max_m,))
    rows = take_rows(flat, source.to(data.device), contiguous.gap_rows_on(data.device))
    return rows, contiguous
