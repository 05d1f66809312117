"""The checks a case can list, as small functions returning a :class:`CheckOutcome`.

Values go through :mod:`moe_hal.conformance.tolerances`; everything else is exact: output shape,
dtype and strides; bytes of layout, scale-format and index outputs; rows a backend must leave
untouched (pre-filled with the suite's sentinel) or write as zeros; bitwise-identical repeated
runs for backends that declare themselves deterministic; inputs left unmodified.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class CheckOutcome:
    """``status``: ``pass``, ``fail`` or ``not_checked`` (with the reason in ``message``)."""

    name: str
    status: str
    message: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    run: str = ""

    @property
    def failed(self) -> bool:
        return self.status == "fail"

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "status": self.status}
        if self.run:
            out["run"] = self.run
        if self.message:
            out["message"] = self.message
        if self.metrics:
            out["metrics"] = self.metrics
        return out


def passed(name: str, run: str = "", metrics: dict[str, Any] | None = None) -> CheckOutcome:
    return CheckOutcome(name, "pass", run=run, metrics=metrics or {})


def failed(name: str, message: str, run: str = "", metrics: dict[str, Any] | None = None) -> CheckOutcome:
    return CheckOutcome(name, "fail", message, metrics or {}, run)


def not_checked(name: str, why: str, run: str = "") -> CheckOutcome:
    return CheckOutcome(name, "not_checked", why, run=run)


def raw_bytes(t: torch.Tensor) -> torch.Tensor:
    """The elements of ``t`` as uint8, row-major (its logical contents, whatever the strides)."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def fingerprint(t: torch.Tensor) -> str:
    """sha256 of the logical bytes of ``t`` (moved to the CPU)."""
    return hashlib.sha256(raw_bytes(t.cpu()).numpy().tobytes()).hexdigest()


# -- output form --------------------------------------------------------------------------------------


def shape(out: Any, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, run: str) -> CheckOutcome:
    """An allocated output has the contract's shape, dtype and device and is row-major contiguous."""
    if not isinstance(out, torch.Tensor):
        return failed("shape", f"the backend returned {type(out).__name__}, not a tensor", run)
    problems = []
    if tuple(out.shape) != tuple(shape):
        problems.append(f"shape {tuple(out.shape)} != {tuple(shape)}")
    if out.dtype != dtype:
        problems.append(f"dtype {out.dtype} != {dtype}")
    if out.device != device:
        problems.append(f"device {out.device} != {device}")
    if not out.is_contiguous():
        problems.append(f"strides {tuple(out.stride())} are not row-major contiguous")
    return failed("shape", "; ".join(problems), run) if problems else passed("shape", run)


def returns_out(result: Any, out: torch.Tensor, run: str) -> CheckOutcome:
    """When ``out`` is given, the call returns that very tensor."""
    if isinstance(result, torch.Tensor) and result.data_ptr() == out.data_ptr() and result.shape == out.shape:
        return passed("shape", run)
    return failed("shape", "the call was given out= but returned a different tensor", run)


# -- rows the contracts constrain -------------------------------------------------------------------------

_INT_OF_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _as_int(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(_INT_OF_WIDTH[t.element_size()])


def _signed(pattern: int, width: int) -> int:
    bits = 8 * width
    return pattern - (1 << bits) if pattern >= 1 << (bits - 1) else pattern


def fill_sentinel(out: torch.Tensor, pattern: int) -> torch.Tensor:
    """Fill ``out`` with the bit pattern ``pattern`` (one element's bits)."""
    out.view(_INT_OF_WIDTH[out.element_size()]).fill_(_signed(pattern, out.element_size()))
    return out


def _equals_sentinel(out: torch.Tensor, pattern: int) -> torch.Tensor:
    return _as_int(out) == _signed(pattern, out.element_size())


def _rows_message(mask: torch.Tensor, what: str) -> str:
    idx = torch.nonzero(mask)
    first = tuple(int(i) for i in idx[0])
    return f"{idx.shape[0]} element(s) {what}; first at {first}"


def all_written(out: torch.Tensor, pattern: int, run: str) -> CheckOutcome:
    """No element still holds the sentinel's bytes (contiguous and K-grouped outputs)."""
    same = _equals_sentinel(out, pattern)
    if bool(same.any()):
        return failed("sentinel", _rows_message(same, "still hold the sentinel (never written)"), run)
    return passed("sentinel", run)


def untouched(out: torch.Tensor, pattern: int, keep: torch.Tensor, run: str) -> CheckOutcome:
    """Every element of ``keep`` still holds the sentinel's exact bytes (masked rows past ``masked_m``)."""
    region = keep.expand(out.shape)
    changed = region & ~_equals_sentinel(out, pattern)
    if bool(changed.any()):
        return failed("sentinel", _rows_message(changed, "past masked_m were written (must stay untouched)"), run)
    return passed("sentinel", run, {"untouched_elements": int(region.sum())})


def zero_rows(
    out: torch.Tensor,
    rows: torch.Tensor,
    run: str,
    name: str = "padding_zero",
    what: str = "in rows of no group are not zero",
) -> CheckOutcome:
    """Every element of the boolean ``rows`` mask is exactly zero (either sign)."""
    region = rows.expand(out.shape)
    bad = region & ~(out == 0)
    if bool(bad.any()):
        idx = tuple(int(i) for i in torch.nonzero(bad)[0])
        return failed(name, _rows_message(bad, what) + f" (value {float(out[idx])!r})", run)
    return passed(name, run, {"checked_elements": int(region.sum())})


def bitwise_equal(
    x: torch.Tensor, y: torch.Tensor, region: torch.Tensor, name: str, what: str, run: str
) -> CheckOutcome:
    """``x`` and ``y`` have identical bytes on ``region``."""
    differ = region.expand(x.shape) & (_as_int(x) != _as_int(y))
    if bool(differ.any()):
        return failed(name, _rows_message(differ, what), run)
    return passed(name, run)


def inputs_unchanged(before: dict[str, str], after: dict[str, str], run: str) -> CheckOutcome:
    """The backend did not write into its inputs (``before``/``after``: name -> fingerprint)."""
    changed = sorted(n for n in before if before[n] != after.get(n))
    if changed:
        return failed("inputs_unchanged", f"the call modified its input(s) {', '.join(changed)}", run)
    return passed("inputs_unchanged", run)


# -- exact transforms ------------------------------------------------------------------------------------


def exact_bytes(name: str, actual: torch.Tensor, expected: torch.Tensor) -> str | None:
    """None when ``actual`` has ``expected``'s dtype, shape and bytes; else what differs."""
    if actual.dtype != expected.dtype:
        return f"{name}: dtype {actual.dtype} != {expected.dtype}"
    if tuple(actual.shape) != tuple(expected.shape):
        return f"{name}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    a, e = raw_bytes(actual), raw_bytes(expected)
    differ = a != e
    if bool(differ.any()):
        byte = int(torch.nonzero(differ)[0])
        element = byte // max(1, actual.element_size())
        index = (
            tuple(int(i) for i in torch.unravel_index(torch.tensor(element), tuple(actual.shape)))
            if actual.dim()
            else ()
        )
        flat_a, flat_e = actual.contiguous().reshape(-1), expected.contiguous().reshape(-1)
        return (
            f"{name}: {int(differ.sum())} byte(s) differ; first in element {index}: "
            f"got {_show(flat_a[element])}, expected {_show(flat_e[element])}"
        )
    return None


def _show(v: torch.Tensor) -> str:
    if v.dtype in (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8):
        width = 2 * v.element_size()
        return f"{int(v)} (0x{int(v) & ((1 << (8 * v.element_size())) - 1):0{width}x})"
    if v.dtype == torch.float8_e4m3fn:
        return f"{float(v.float())!r} (code 0x{int(v.view(torch.uint8)):02x})"
    return repr(float(v))


def storage_span(t: torch.Tensor) -> torch.Tensor:
    """The flat storage from ``t``'s first to its last element, padding included, on the CPU."""
    if t.numel() == 0:
        return t.new_empty((0,)).cpu()
    extent = sum((n - 1) * s for n, s in zip(t.shape, t.stride())) + 1
    return torch.as_strided(t, (extent,), (1,), t.storage_offset()).cpu()


def strided_layout(
    name: str, actual: torch.Tensor, golden: dict[str, torch.Tensor], prefix: str
) -> tuple[list[str], list[str]]:
    """``(layout problems, byte problems)`` of a strided result against
    ``golden[prefix + '.span'/'.shape'/'.strides']``: shape and strides exactly, then the bytes of
    the storage span (padding included; only compared when the layout matches)."""
    shape_ = tuple(int(v) for v in golden[prefix + ".shape"].tolist())
    strides = tuple(int(v) for v in golden[prefix + ".strides"].tolist())
    if tuple(actual.shape) != shape_:
        return [f"{name}: shape {tuple(actual.shape)} != {shape_}"], []
    if tuple(actual.stride()) != strides:
        return [f"{name}: strides {tuple(actual.stride())} != {strides}"], []
    problem = exact_bytes(name + " (storage span)", storage_span(actual), golden[prefix + ".span"])
    return [], [problem] if problem else []
