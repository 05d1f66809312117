"""What a backend declares and implements.

A plugin registers :class:`BackendSpec` objects (cheap, declarative, no heavy imports). When a
call is considered, the host imports ``spec.impl`` (``"package.module:Class"``) and instantiates
the :class:`Backend` subclass it names with the spec. Selection asks the backend, in this order:
:meth:`Backend.is_available`, :meth:`Backend.check_device`, the declared :class:`Signature`
matrix, :meth:`Backend.unsupported`; every answer is a list of structured :class:`Reason`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .dtypes import CANONICAL as CANONICAL_DTYPES
from .dtypes import SCALE_FORMATS
from .errors import ArgumentError

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from .problem import Problem
    from .quant import QuantizedTensor

#: Major version of the backend API this core implements; a spec's ``api_version`` must share it.
API_VERSION = "1.0"
TIERS = ("optimized", "fallback", "reference")
OPS = ("contiguous", "masked", "k_grouped")
#: Memory orders of ``b[G, N, K]`` a signature may accept (see :attr:`Signature.b_majors`).
B_MAJORS = ("k", "n", "strided")
_IMPL = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")
_API_VERSION = re.compile(r"[0-9]+(\.[0-9]+)*")


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_collection(x: Any) -> bool:
    return isinstance(x, (tuple, list, set, frozenset))


@dataclass(frozen=True)
class Reason:
    """Why a backend cannot run a call. ``code`` is a stable slug that tests and reports match on;
    ``message`` is for humans; ``expected``/``actual`` carry the allowed and the given values."""

    code: str
    message: str
    expected: Any = None
    actual: Any = None

    def __str__(self) -> str:
        text = f"[{self.code}] {self.message}"
        if self.expected is not None or self.actual is not None:
            text += f" (expected {_fmt(self.expected)}, got {_fmt(self.actual)})"
        return text

    def as_dict(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "message": self.message,
            "expected": _jsonable(self.expected),
            "actual": _jsonable(self.actual),
        }


def _fmt(v: Any) -> str:
    if isinstance(v, (set, frozenset)):
        return "{" + ", ".join(sorted(map(str, v))) + "}"
    return str(v)


def _jsonable(v: Any) -> Any:
    if isinstance(v, (set, frozenset, tuple, list)):
        return sorted(map(str, v)) if isinstance(v, (set, frozenset)) else [_jsonable(x) for x in v]
    if v is None or isinstance(v, (int, float, str, bool)):
        return v
    return str(v)


@dataclass(frozen=True)
class Signature:
    """One family of calls a backend supports. A call matches when every field admits it.

    ``ops``: subset of ``{"contiguous", "masked", "k_grouped"}``.
    ``dtypes``: operand dtype names (``fp32``, ``bf16``, ``fp16``, ``fp8_e4m3``); both operands
    share it. ``out_dtypes``: output dtype names. ``scale_formats``: for fp8, the accepted API
    scale formats (``fp32``, ``ue8m0``). ``scale_blocks``: for fp8, accepted ``(a_block, b_block)``
    pairs (empty: any). ``k_multiple``/``n_multiple``: K and N must be multiples of these. ``max_groups``:
    largest G, or None. ``b_majors``: accepted memory orders of ``b[G, N, K]`` (``"k"``: K
    contiguous, the nn.Linear layout; ``"n"``: a transposed view of ``[G, K, N]``; ``"strided"``:
    neither). Every field is checked when the signature is built (:class:`ArgumentError`).
    ``alignment_power_of_two``: the kernels need a contiguous / K-grouped layout's alignment to be
    a power of two (layouts accept any positive int; such a backend refuses the others with a reason).
    """

    ops: frozenset[str]
    dtypes: frozenset[str]
    out_dtypes: frozenset[str]
    scale_formats: frozenset[str] = frozenset()
    scale_blocks: frozenset[tuple[tuple[int, int], tuple[int, int]]] = frozenset()
    k_multiple: int = 1
    n_multiple: int = 1
    max_groups: int | None = None
    b_majors: frozenset[str] = frozenset({"k", "n"})
    alignment_power_of_two: bool = False

    def __post_init__(self) -> None:
        for name in ("ops", "dtypes", "out_dtypes", "scale_formats", "b_majors"):
            value = getattr(self, name)
            if isinstance(value, str) or not _is_collection(value) or not all(isinstance(v, str) for v in value):
                raise ArgumentError(f"Signature.{name}", "a set of strings", repr(value))
            object.__setattr__(self, name, frozenset(value))
        if isinstance(self.scale_blocks, str) or not _is_collection(self.scale_blocks):
            raise ArgumentError(
                "Signature.scale_blocks", "a set of ((rows, cols), (rows, cols)) pairs", repr(self.scale_blocks)
            )
        object.__setattr__(self, "scale_blocks", frozenset(self.scale_blocks))
        unknown = self.ops - set(OPS)
        if unknown:
            raise ArgumentError("Signature.ops", f"a subset of {OPS}", sorted(unknown))
        for name in ("dtypes", "out_dtypes"):
            unknown = getattr(self, name) - set(CANONICAL_DTYPES)
            if unknown:  # e.g. "fp8" or "bfloat16": the signature would silently never match
                raise ArgumentError(
                    f"Signature.{name}", f"canonical dtype names, a subset of {list(CANONICAL_DTYPES)}", sorted(unknown)
                )
        unknown = self.scale_formats - set(SCALE_FORMATS)
        if unknown:
            raise ArgumentError("Signature.scale_formats", f"a subset of {list(SCALE_FORMATS)}", sorted(unknown))
        unknown = self.b_majors - set(B_MAJORS)
        if unknown:
            raise ArgumentError("Signature.b_majors", f"a subset of {B_MAJORS}", sorted(unknown))
        for name in ("k_multiple", "n_multiple"):
            if not _is_int(getattr(self, name)) or getattr(self, name) < 1:
                raise ArgumentError(f"Signature.{name}", "a positive int", repr(getattr(self, name)))
        if self.max_groups is not None and (not _is_int(self.max_groups) or self.max_groups < 0):
            raise ArgumentError("Signature.max_groups", "None or a non-negative int", repr(self.max_groups))
        if not isinstance(self.alignment_power_of_two, bool):
            raise ArgumentError("Signature.alignment_power_of_two", "a bool", repr(self.alignment_power_of_two))

    def mismatches(self, problem: "Problem") -> list[Reason]:
        """Every field of this signature that does not admit ``problem``."""
        out: list[Reason] = []
        if problem.op not in self.ops:
            out.append(Reason("op_unsupported", f"operation {problem.op!r} is not supported", self.ops, problem.op))
        if problem.in_dtype not in self.dtypes:
            out.append(Reason("dtype_unsupported", "operand dtype is not supported", self.dtypes, problem.in_dtype))
        if problem.out_dtype_name not in self.out_dtypes:
            out.append(
                Reason(
                    "out_dtype_unsupported", "output dtype is not supported", self.out_dtypes, problem.out_dtype_name
                )
            )
        if problem.scale_format is not None:
            if problem.scale_format not in self.scale_formats:
                out.append(
                    Reason(
                        "scale_format_unsupported",
                        "fp8 scale format is not supported",
                        self.scale_formats or {"(none)"},
                        problem.scale_format,
                    )
                )
            if self.scale_blocks and problem.scale_blocks not in self.scale_blocks:
                out.append(
                    Reason(
                        "scale_block_unsupported",
                        "fp8 scale blocks (a, b) are not supported",
                        self.scale_blocks or {"(none)"},
                        problem.scale_blocks,
                    )
                )
        if problem.k % self.k_multiple:
            out.append(
                Reason(
                    "shape_constraint",
                    f"K must be a multiple of {self.k_multiple}",
                    f"K % {self.k_multiple} == 0",
                    problem.k,
                )
            )
        if problem.n % self.n_multiple:
            out.append(
                Reason(
                    "shape_constraint",
                    f"N must be a multiple of {self.n_multiple}",
                    f"N % {self.n_multiple} == 0",
                    problem.n,
                )
            )
        if self.max_groups is not None and problem.num_groups > self.max_groups:
            out.append(
                Reason(
                    "shape_constraint",
                    f"at most {self.max_groups} groups",
                    f"G <= {self.max_groups}",
                    problem.num_groups,
                )
            )
        alignment = getattr(problem.layout, "alignment", None)
        if self.alignment_power_of_two and alignment is not None and alignment & (alignment - 1):
            out.append(
                Reason(
                    "alignment_unsupported",
                    "the layout's alignment must be a power of two",
                    "a power of two",
                    alignment,
                )
            )
        if problem.b_major is not None and problem.b_major not in self.b_majors:
            out.append(
                Reason("layout_unsupported", "memory order of b is not supported", self.b_majors, problem.b_major)
            )
        return out


@dataclass(frozen=True)
class PerfModel:
    """What a backend's kernels do that the performance model (:mod:`moe_hal.perf`) must know to
    predict them. Declared once in :attr:`BackendSpec.perf_model`; read by ``moe-hal bench --model``
    and by backends that rank tiles with :func:`moe_hal.perf.advise_problem` (so the prediction
    and the launch use the same facts).

    ``tiles``: ``(BM, BN)`` tiles the backend may launch (None: :data:`moe_hal.perf.DEFAULT_TILES`).
    ``streams_all_experts``: the kernel reads the weights of empty experts too.
    ``reads_padding_rows``: the kernel loads the alignment padding rows of A.
    ``masked_computes_max_m``: a masked call multiplies all ``max_m`` rows of every group.
    ``impl``: the kernel implementation name whose achieved efficiency the model applies
    (``achieved.<impl>`` in the hardware DB; None: the best known for the device).
    """

    tiles: tuple[tuple[int, int], ...] | None = None
    streams_all_experts: bool = False
    reads_padding_rows: bool = False
    masked_computes_max_m: bool = False
    impl: str | None = None

    def __post_init__(self) -> None:
        if self.tiles is not None:
            tiles = tuple(tuple(t) for t in self.tiles)
            for t in tiles:
                if len(t) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in t):
                    raise ArgumentError("PerfModel.tiles", "(block_m, block_n) pairs of positive ints", repr(t))
            object.__setattr__(self, "tiles", tiles)
        for name in ("streams_all_experts", "reads_padding_rows", "masked_computes_max_m"):
            if not isinstance(getattr(self, name), bool):
                raise ArgumentError(f"PerfModel.{name}", "a bool", repr(getattr(self, name)))
        if self.impl is not None and not (isinstance(self.impl, str) and self.impl):
            raise ArgumentError("PerfModel.impl", "None or a kernel implementation name", repr(self.impl))

    def estimate_options(self) -> dict[str, Any]:
        """The keyword arguments of :func:`moe_hal.perf.estimate` / ``advise`` these facts set."""
        return {
            "streams_all_experts": self.streams_all_experts,
            "reads_padding_rows": self.reads_padding_rows,
            "impl": self.impl,
        }


@dataclass(frozen=True)
class GraphCapture:
    """How a backend's calls of one layout behave under device-graph capture (CUDA graphs, or the
    device's equivalent), declared per operation in :attr:`BackendSpec.graph_capturable`.

    ``capturable``: a call can be captured and replayed (no host sync, no host-side work the
    replay would skip). ``replay_reads_layout``: a replay reads the layout's device tensors again,
    so new routing values written into them take effect (masked calls' ``masked_m``); False when
    the routing is fixed at capture and a replay repeats it. ``note``: the conditions, in words.
    """

    capturable: bool
    replay_reads_layout: bool = False
    note: str = ""

    def __post_init__(self) -> None:
        for name in ("capturable", "replay_reads_layout"):
            if not isinstance(getattr(self, name), bool):
                raise ArgumentError(f"GraphCapture.{name}", "a bool", repr(getattr(self, name)))
        if not isinstance(self.note, str):
            raise ArgumentError("GraphCapture.note", "a string", repr(self.note))
        if self.replay_reads_layout and not self.capturable:
            raise ArgumentError("GraphCapture.replay_reads_layout", "False when capturable is False", "True")

    def describe(self) -> str:
        """One phrase for ``explain()`` and reports."""
        if not self.capturable:
            text = "not capturable"
        elif self.replay_reads_layout:
            text = "capturable; a replay reads the layout's current device values"
        else:
            text = "capturable; a replay repeats the captured routing"
        return f"{text} ({self.note})" if self.note else text


_NOT_DECLARED = GraphCapture(False, note="not declared by the backend")


@dataclass(frozen=True)
class BackendSpec:
    """Declaration of one backend; cheap to build, imports nothing heavy.

    ``device_types``: torch device types it runs on natively (``("cuda",)``; ``("*",)`` means
    any device, as for the reference backend). ``requires``: hardware-DB feature flags the device must have.
    ``priority``: larger wins among eligible backends. ``impl``: ``"module:Class"``, imported
    only when the backend is considered. ``perf_model``: what the performance model must know
    about the kernels (:class:`PerfModel`). ``extra``: free-form data of the plugin's own, never
    read by the core. ``plugin``/``distribution``/``version`` are stamped by the host when the spec
    is registered.
    """

    name: str
    vendor: str
    device_types: tuple[str, ...]
    tier: str
    priority: int
    impl: str
    signatures: tuple[Signature, ...]
    requires: frozenset[str] = frozenset()
    api_version: str = API_VERSION
    deterministic: bool = False
    graph_capturable: bool | Mapping[str, GraphCapture] = False
    description: str = ""
    plugin: str = ""
    distribution: str = ""
    version: str = ""
    perf_model: PerfModel = PerfModel()
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        """Check every field's type and value, so a careless declaration fails where it is made
        (inside the plugin's hook, which the host isolates) instead of in every later call."""

        def bad(name: str, expected: str) -> ArgumentError:
            return ArgumentError(f"BackendSpec.{name}", expected, repr(getattr(self, name)))

        if (
            not isinstance(self.name, str)
            or not self.name.replace("_", "").isalnum()
            or not self.name.isascii()
            or self.name != self.name.lower()
        ):
            raise bad("name", "a lower-case identifier")
        if not isinstance(self.vendor, str):
            raise bad("vendor", "a string")
        for name in ("device_types", "requires"):
            value = getattr(self, name)
            if isinstance(value, str) or not _is_collection(value) or not all(isinstance(v, str) and v for v in value):
                raise bad(name, "a collection of non-empty strings")
        if not self.device_types:
            raise bad("device_types", "at least one torch device type (or '*')")
        if not isinstance(self.perf_model, PerfModel):
            raise bad("perf_model", "a moe_hal.backend.PerfModel")
        object.__setattr__(self, "requires", frozenset(self.requires))
        object.__setattr__(self, "device_types", tuple(self.device_types))
        if not isinstance(self.tier, str) or self.tier not in TIERS:
            raise bad("tier", f"one of {TIERS}")
        if not _is_int(self.priority):
            raise bad("priority", "an int (larger wins)")
        if not isinstance(self.impl, str) or not _IMPL.fullmatch(self.impl):
            raise bad("impl", "'package.module:Class'")
        if (
            isinstance(self.signatures, Signature)
            or not _is_collection(self.signatures)
            or not all(isinstance(s, Signature) for s in self.signatures)
        ):
            raise bad("signatures", "a sequence of moe_hal.Signature")
        object.__setattr__(self, "signatures", tuple(self.signatures))
        if not isinstance(self.api_version, str) or not _API_VERSION.fullmatch(self.api_version):
            raise bad("api_version", f"a version string 'MAJOR.MINOR' such as {API_VERSION!r}")
        if not isinstance(self.deterministic, bool):
            raise bad("deterministic", "a bool")
        object.__setattr__(self, "graph_capturable", self._graph_capture_per_op(bad))
        for name in ("description", "plugin", "distribution", "version"):
            if not isinstance(getattr(self, name), str):
                raise bad(name, "a string")
        if not isinstance(self.extra, dict):
            raise bad("extra", "a dict")

    def _graph_capture_per_op(self, bad) -> tuple[tuple[str, GraphCapture], ...]:
        """``graph_capturable`` as ``((op, GraphCapture), ...)`` sorted by op (hashable, like the
        spec). A bool declares every operation alike (the form of API 1.x specs)."""
        value = self.graph_capturable
        if isinstance(value, bool):
            return tuple((op, GraphCapture(value, note="declared for every layout alike")) for op in sorted(OPS))
        if isinstance(value, tuple) and all(isinstance(v, tuple) and len(v) == 2 for v in value):
            value = dict(value)  # already normalised (dataclasses.replace passes it back in)
        if not isinstance(value, Mapping) or not all(
            op in OPS and isinstance(v, GraphCapture) for op, v in value.items()
        ):
            raise bad("graph_capturable", f"a bool or a mapping from operations {OPS} to moe_hal.GraphCapture")
        return tuple(sorted(value.items()))

    def graph_capture(self, op: str) -> GraphCapture:
        """What this backend declares about graph capture of ``op`` calls (not capturable when it
        declares nothing for ``op``)."""
        return dict(self.graph_capturable).get(op, _NOT_DECLARED)

    def graph_capture_report(self) -> dict[str, str]:
        """``{op: phrase}`` for every operation, for JSON reports (``moe-hal info``, conformance)."""
        return {op: self.graph_capture(op).describe() for op in OPS}

    def signature_reasons(self, problem: "Problem") -> list[Reason]:
        """Reasons from the closest signature (empty when one admits the call)."""
        best: list[Reason] | None = None
        for sig in self.signatures:
            reasons = sig.mismatches(problem)
            if not reasons:
                return []
            if best is None or len(reasons) < len(best):
                best = reasons
        return best if best is not None else [Reason("no_signature", "the backend declares no signatures")]


@dataclass(frozen=True)
class DeviceInfo:
    """A torch device as the hardware DB sees it. ``hw_id`` is None for an unrecognised device;
    ``seen`` says what was observed (name, capability, SoC) so errors can name it."""

    type: str
    index: int | None
    hw_id: str | None
    features: frozenset[str]
    seen: str

    @property
    def label(self) -> str:
        dev = self.type if self.index is None else f"{self.type}:{self.index}"
        return f"{dev} ({self.hw_id or 'unrecognised: ' + self.seen})"


class Backend:
    """Runtime side of a backend. Subclasses override what they need; every check returns a list
    of :class:`Reason` (empty = fine) and must catch its own exceptions and report them."""

    #: Execution modes reported by :meth:`execution_mode`.
    NATIVE, INTERPRETED, EMULATED = "native", "interpreted", "emulated"

    def __init__(self, spec: BackendSpec):
        self.spec = spec

    @property
    def name(self) -> str:
        return self.spec.name

    def is_available(self) -> list[Reason]:
        """Whether the backend's software stack can run at all (libraries, driver)."""
        return []

    def check_device(self, device: DeviceInfo) -> list[Reason]:
        """Whether the backend can run on ``device``: its type and the hardware-DB features."""
        reasons = []
        if "*" in self.spec.device_types:
            return reasons
        if device.type not in self.spec.device_types:
            reasons.append(
                Reason(
                    "device_type_unsupported", "device type is not supported", set(self.spec.device_types), device.type
                )
            )
        missing = self.spec.requires - device.features
        if missing and device.type in self.spec.device_types:
            if device.hw_id is None:
                reasons.append(
                    Reason(
                        "device_unrecognised",
                        "the hardware DB does not know this device, so its features are unknown",
                        set(self.spec.requires),
                        device.seen,
                    )
                )
            else:
                reasons.append(
                    Reason(
                        "hw_feature_missing",
                        f"{device.hw_id} lacks required features",
                        set(self.spec.requires),
                        set(device.features & self.spec.requires),
                    )
                )
        return reasons

    def auto_select_reason(self, device: DeviceInfo) -> Reason | None:
        """A reason to skip this backend unless the user names it (e.g. an interpreter mode)."""
        return None

    def execution_mode(self, device: DeviceInfo) -> str:
        """``native``, ``interpreted`` (Triton interpreter) or ``emulated`` (CPU emulator)."""
        return self.NATIVE

    def unsupported(self, problem: "Problem") -> list[Reason]:
        """Checks the declared signatures cannot express. Must depend only on the problem's
        signature fields (op, dtypes, G, N, K, alignment, b order, device), because selections
        are cached per signature."""
        return []

    def describe_path(self, problem: "Problem") -> str:
        """One line saying which kernel/path this call takes (shown by ``explain()``)."""
        return ""

    def physical_scales(self, q: "QuantizedTensor", role: str) -> "torch.Tensor":
        """The fp8 scales of ``q`` in the memory form this backend's kernels read, for callers that
        transform weight scales once ahead of time (as DeepGEMM's callers do). Optional: a backend
        with fp8 signatures implements it when its kernels read a form other than the API's.

        ``q``: a :class:`~moe_hal.quant.QuantizedTensor` with UE8M0 (power-of-two) scales;
        ``role``: ``"a"`` (activations, 1x128 blocks, scales ``[M, ceil(K/128)]``) or ``"b"``
        (weights, 128x128 blocks). Returns a tensor on ``q``'s device whose dtype names the form
        (e.g. float32 TMA-aligned, int32 with four UE8M0 exponents packed per element, int16 with
        two). The conformance suite checks it against golden tensors, and reports the case not
        applicable for a backend that leaves it unimplemented (:meth:`has_physical_scales`).
        """
        raise NotImplementedError(f"backend {self.name!r} does not transform scales (physical_scales)")

    def has_physical_scales(self) -> bool:
        """Whether this backend implements :meth:`physical_scales`."""
        return type(self).physical_scales is not Backend.physical_scales

    def run(self, problem: "Problem", out: "torch.Tensor | None") -> "torch.Tensor":
        """Compute ``problem``. Write into ``out`` when given (and return it); otherwise allocate.

        The problem is already validated. Contracts (``docs/design.md``): contiguous writes every
        row of the output and zeroes rows of no group; masked never writes rows ``>= masked_m[g]``;
        K-grouped adds ``problem.c``.
        """
        raise NotImplementedError(f"backend {self.name!r} does not implement run()")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"
