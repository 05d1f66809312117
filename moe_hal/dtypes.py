"""Canonical dtype names used in backend support matrices, reports and the CLI.

Names are short strings so that backend declarations need not import torch.
"""

from __future__ import annotations

import torch

FP64, FP32, BF16, FP16, FP8_E4M3 = "fp64", "fp32", "bf16", "fp16", "fp8_e4m3"

#: torch dtype -> canonical name, for every dtype an operand or output may have.
NAMES: dict[torch.dtype, str] = {
    torch.float64: FP64,
    torch.float32: FP32,
    torch.bfloat16: BF16,
    torch.float16: FP16,
    torch.float8_e4m3fn: FP8_E4M3,
}
#: canonical name -> torch dtype.
DTYPES: dict[str, torch.dtype] = {v: k for k, v in NAMES.items()}

#: Dtypes an unquantized operand may have (fp64 is taken by the reference backend only: float64
#: gradient checks of the autograd formulas run through it).
FLOAT_INPUTS = frozenset({FP64, FP32, BF16, FP16})
#: Largest finite value of float8 e4m3fn.
FP8_E4M3_MAX = 448.0


def name_of(dtype: torch.dtype) -> str:
    """Canonical name of ``dtype``; the torch repr for dtypes moe_hal does not use."""
    return NAMES.get(dtype, str(dtype).removeprefix("torch."))


def parse(name: str) -> torch.dtype:
    """torch dtype for a canonical name, also accepting torch spellings (``bfloat16``, ``float32``)."""
    key = name.strip().lower()
    aliases = {"float64": FP64, "double": FP64, "float32": FP32, "float": FP32, "bfloat16": BF16, "float16": FP16, "half": FP16,
               "fp8": FP8_E4M3, "float8_e4m3fn": FP8_E4M3, "e4m3": FP8_E4M3}
    key = aliases.get(key, key)
    if key not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; expected one of {sorted(DTYPES)}")
    return DTYPES[key]
