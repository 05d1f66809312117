"""What one hardware-database entry holds: quantities with units and sources, the figures the
library derives from them, and the result of recognising a device (:class:`Match`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

from ..errors import ArgumentError

#: Dtype names understood by :meth:`HardwareEntry.peak_flops`, in the order tables show them.
DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8", "fp4", "int8")

# Spellings accepted for those names (moe_hal.dtypes names and torch names among them).
_DTYPE_ALIASES = {
    "float32": "fp32",
    "float": "fp32",
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "fp8_e4m3": "fp8",
    "fp8_e5m2": "fp8",
    "float8_e4m3fn": "fp8",
    "float8_e5m2": "fp8",
    "e4m3": "fp8",
    "fp4_e2m1": "fp4",
    "float4_e2m1fn_x2": "fp4",
}

# Factor from each unit the schema allows to its SI base (FLOP/s, OP/s, B/s, B, Hz, W, count).
_UNIT_SCALE = {
    "count": 1.0,
    "GFLOPS": 1e9,
    "TFLOPS": 1e12,
    "PFLOPS": 1e15,
    "GOPS": 1e9,
    "TOPS": 1e12,
    "POPS": 1e15,
    "GB/s": 1e9,
    "TB/s": 1e12,
    "B": 1.0,
    "KB": 1e3,
    "MB": 1e6,
    "GB": 1e9,
    "TB": 1e12,
    "KiB": 2.0**10,
    "MiB": 2.0**20,
    "GiB": 2.0**30,
    "TiB": 2.0**40,
    "MHz": 1e6,
    "GHz": 1e9,
    "W": 1.0,
}

_QUANTITY_KEYS = frozenset({"value", "unit"})


@dataclass(frozen=True)
class Quantity:
    """One number of an entry, with its unit and where it comes from.

    ``basis`` is one of ``datasheet``, ``whitepaper``, ``secondary``, ``derived``, ``measured``;
    ``date``, ``method`` and ``tool`` are set for measured values.
    """

    value: float
    unit: str
    basis: str
    source: str
    note: str | None = None
    date: str | None = None
    method: str | None = None
    tool: str | None = None

    @property
    def si(self) -> float:
        """The value in SI base units: FLOP/s, OP/s, bytes/s, bytes, Hz, W or a plain count."""
        return self.value * _UNIT_SCALE[self.unit]

    @classmethod
    def from_mapping(cls, node: dict[str, Any]) -> Quantity:
        return cls(
            value=node["value"],
            unit=node["unit"],
            basis=node["basis"],
            source=node["source"],
            note=node.get("note"),
            date=node.get("date"),
            method=node.get("method"),
            tool=node.get("tool"),
        )


def _is_quantity(node: Any) -> bool:
    return isinstance(node, dict) and _QUANTITY_KEYS <= node.keys()


class HardwareEntry:
    """One validated accelerator entry, with the measured values of any overlays merged in.

    ``raw`` is the validated YAML mapping (``measured`` and ``achieved`` include overlay values);
    ``path`` is the file the entry came from and ``measured_paths`` the overlay files merged in.
    """

    def __init__(self, raw: dict[str, Any], path: str, measured_paths: tuple[str, ...] = ()):
        self.raw = raw
        self.path = path
        self.measured_paths = measured_paths
        self.id: str = raw["id"]
        self.vendor: str = raw["vendor"]
        self.name: str = raw["name"]
        self.architecture: str = raw["architecture"]
        self.aliases: tuple[str, ...] = tuple(raw.get("aliases", ()))
        self.features: frozenset[str] = frozenset(raw["features"])

    def __repr__(self) -> str:
        return f"HardwareEntry({self.id!r}, {self.path!r})"

    def quantity(self, path: str) -> Quantity | None:
        """The quantity at a dotted ``path`` such as ``"memory.bandwidth"`` or
        ``"measured.matmul.bf16"``; None when the entry does not give it or gives it as unknown
        (``value: null``). A path that leads to something other than a quantity is an error."""
        node: Any = self.raw
        for part in path.split("."):
            if not isinstance(node, dict) or _is_quantity(node):
                raise ArgumentError("path", "a dotted path to a quantity of the entry", path)
            node = node.get(part)
            if node is None:
                return None
        if not _is_quantity(node):
            raise ArgumentError(
                "path", "a dotted path to a quantity of the entry", path, f"{path!r} holds {type(node).__name__}"
            )
        return None if node["value"] is None else Quantity.from_mapping(node)

    def quantities(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """Every quantity mapping in the entry as ``(dotted path, mapping)``, unknown ones included."""

        def walk(node: Any, prefix: str) -> Iterator[tuple[str, dict[str, Any]]]:
            if _is_quantity(node):
                yield prefix, node
            elif isinstance(node, dict):
                for key, child in node.items():
                    yield from walk(child, f"{prefix}.{key}" if prefix else key)

        return walk(self.raw, "")

    def _first(self, *paths: str) -> Quantity | None:
        for path in paths:
            found = self.quantity(path)
            if found is not None:
                return found
        return None

    def peak_flops(self, dtype: str, *, measured: bool = True) -> float | None:
        """Dense peak rate in FLOP/s (OP/s for int8) for ``dtype`` (one of :data:`DTYPES`, or a
        moe_hal/torch dtype name such as ``"fp8_e4m3"`` or ``torch.bfloat16``). With ``measured``,
        a measured matmul rate is preferred over the spec figure. None when unknown."""
        name = _canonical_dtype(dtype)
        paths = ([f"measured.matmul.{name}"] if measured else []) + [f"peak_dense.{name}"]
        found = self._first(*paths)
        return None if found is None else found.si

    def mem_bandwidth(self, *, measured: bool = True) -> float | None:
        """Memory bandwidth in bytes/s: the measured read bandwidth first (with ``measured``),
        else the spec figure. None when unknown."""
        paths = (["measured.read_bandwidth"] if measured else []) + ["memory.bandwidth"]
        found = self._first(*paths)
        return None if found is None else found.si

    @property
    def num_cores(self) -> int | None:
        """SMs (NVIDIA), AI (cube) cores (Ascend) or CPU cores; a measured count first.
        None for ``cpu-generic``, whose core count depends on the machine."""
        found = self._first("measured.units", "compute.units")
        return None if found is None else int(found.value)

    @property
    def mma_min_m(self) -> int | None:
        """Smallest M one matrix instruction handles efficiently (Hopper wgmma 64, Ascend cube 16)."""
        found = self.quantity("compute.mma_min_m")
        return None if found is None else int(found.value)

    @property
    def fp4_mma_min_m(self) -> int | None:
        """Smallest M of the block-scaled fp4 MMA where it exceeds :attr:`mma_min_m` (SM100: 128
        rows per SM); None where fp4 takes the same floor as other dtypes."""
        found = self.quantity("compute.fp4_mma_min_m")
        return None if found is None else int(found.value)

    @property
    def fp8_promotion_k(self) -> int | None:
        """K elements per software promotion of fp8 partial sums (Hopper 128); None where the
        matrix unit accumulates in fp32 and applies block scales itself (Blackwell)."""
        found = self.quantity("compute.fp8_promotion_k")
        return None if found is None else int(found.value)

    @property
    def l2_bytes(self) -> int | None:
        """L2 cache size in bytes (a measured size first)."""
        found = self._first("measured.l2", "on_chip.l2")
        return None if found is None else int(found.si)

    @property
    def smem_per_core_bytes(self) -> int | None:
        """Shared memory per SM in bytes (None where the device has no such memory, e.g. Ascend,
        whose per-core buffers are ``on_chip.l1_per_unit``/``ub_per_unit``/...)."""
        found = self.quantity("on_chip.smem_per_unit")
        return None if found is None else int(found.si)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready view: the entry mapping plus where it came from and the figures the
        library derives from it."""
        return {
            "id": self.id,
            "path": self.path,
            "measured_paths": list(self.measured_paths),
            "derived": {
                "num_cores": self.num_cores,
                "mma_min_m": self.mma_min_m,
                "fp8_promotion_k": self.fp8_promotion_k,
                "fp4_mma_min_m": self.fp4_mma_min_m,
                "l2_bytes": self.l2_bytes,
                "smem_per_core_bytes": self.smem_per_core_bytes,
                "mem_bandwidth_bytes_per_s": self.mem_bandwidth(),
                "peak_flops": {d: self.peak_flops(d) for d in DTYPES},
            },
            "entry": self.raw,
        }


@dataclass(frozen=True)
class Match:
    """Result of recognising a device: the entry, or None with the reason nothing matched."""

    entry: HardwareEntry | None
    seen: str
    reason: str | None = None

    @property
    def id(self) -> str | None:
        return None if self.entry is None else self.entry.id

    @property
    def features(self) -> frozenset[str]:
        return frozenset() if self.entry is None else self.entry.features

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "seen": self.seen, "reason": self.reason}


def _canonical_dtype(dtype: Any) -> str:
    key = str(dtype).strip().lower().removeprefix("torch.")
    key = _DTYPE_ALIASES.get(key, key)
    if key not in DTYPES:
        raise ArgumentError("dtype", f"one of {list(DTYPES)} (or a torch/moe_hal spelling)", dtype)
    return key
