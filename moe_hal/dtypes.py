"""The one dtype vocabulary: canonical names used in backend support matrices, reports and the CLI.

Names are short strings so that backend declarations need not import torch: the names, their
accepted spellings and :func:`canonical` load without torch; the torch mappings (:data:`NAMES`,
:data:`DTYPES`) and :func:`parse` / :func:`name_of` import it on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import DTypeError

if TYPE_CHECKING:
    import torch

FP64, FP32, BF16, FP16, FP8_E4M3 = "fp64", "fp32", "bf16", "fp16", "fp8_e4m3"

#: Every dtype an operand or an output may have, by canonical name.
CANONICAL = (FP64, FP32, BF16, FP16, FP8_E4M3)
#: Other spellings accepted for them (torch's names among them), lower case.
ALIASES = {
    "float64": FP64,
    "double": FP64,
    "float32": FP32,
    "float": FP32,
    "bfloat16": BF16,
    "float16": FP16,
    "half": FP16,
    "fp8": FP8_E4M3,
    "float8_e4m3fn": FP8_E4M3,
    "e4m3": FP8_E4M3,
}

#: Forms of fp8 block scales: plain fp32, or powers of two (UE8M0 exponents).
SCALE_FORMATS = ("fp32", "ue8m0")

#: Dtypes an unquantized operand may have (fp64 is taken by the reference backend only: float64
#: gradient checks of the autograd formulas run through it).
FLOAT_INPUTS = frozenset({FP64, FP32, BF16, FP16})
#: Largest finite value of float8 e4m3fn.
FP8_E4M3_MAX = 448.0


def canonical(name: Any, argument: str = "dtype") -> str:
    """The canonical name for ``name`` (a canonical name, an alias such as ``bfloat16``, or a
    torch dtype); raises :class:`~moe_hal.errors.DTypeError` naming ``argument`` otherwise."""
    key = str(name).strip().lower().removeprefix("torch.") if isinstance(name, str) or _is_torch_dtype(name) else None
    key = ALIASES.get(key, key)
    if key not in CANONICAL:
        raise DTypeError(argument, f"one of {list(CANONICAL)} (or a spelling such as bfloat16)", repr(name))
    return key


def _is_torch_dtype(value: Any) -> bool:
    return type(value).__module__ == "torch" and type(value).__name__ == "dtype"


def _torch_maps() -> tuple[dict, dict]:
    import torch

    names = {
        torch.float64: FP64,
        torch.float32: FP32,
        torch.bfloat16: BF16,
        torch.float16: FP16,
        torch.float8_e4m3fn: FP8_E4M3,
    }
    return names, {v: k for k, v in names.items()}


def __getattr__(attribute: str) -> Any:
    # NAMES: torch dtype -> canonical name; DTYPES: canonical name -> torch dtype (torch loads here).
    if attribute in ("NAMES", "DTYPES"):
        names, dtypes = _torch_maps()
        globals().update(NAMES=names, DTYPES=dtypes)
        return globals()[attribute]
    raise AttributeError(f"module {__name__!r} has no attribute {attribute!r}")


def name_of(dtype: "torch.dtype") -> str:
    """Canonical name of ``dtype``; the torch repr for dtypes moe_hal does not use."""
    names = globals().get("NAMES") or __getattr__("NAMES")
    return names.get(dtype, str(dtype).removeprefix("torch."))


def accumulation_dtype(dtype: "torch.dtype") -> "torch.dtype":
    """The dtype sums and weighted sums of ``dtype`` values run in: fp32, or fp64 for float64 —
    fp32 would cost a float64 caller (``torch.autograd.gradcheck``, a float64 reference) half its
    digits."""
    import torch

    return torch.promote_types(dtype, torch.float32)


def parse(name: str) -> "torch.dtype":
    """torch dtype for a canonical name or an accepted spelling (``bfloat16``, ``float32``);
    :class:`~moe_hal.errors.DTypeError` otherwise."""
    dtypes = globals().get("DTYPES") or __getattr__("DTYPES")
    return dtypes[canonical(name)]
