"""Validation of a grouped-GEMM call into a :class:`Problem`, the value backends receive.

Every check here runs before anything is written, so a caller's ``out`` is untouched when one
fails. Values are never inspected: NaN and Inf are computed through, not rejected.
"""

from __future__ import annotations

import torch

from . import dtypes
from .errors import AliasError, ArgumentError, DeviceError, DTypeError, LayoutError, ShapeError
from .layouts import ContiguousLayout, KGroupedLayout, MaskedLayout
from .quant import QuantizedTensor, to_tensor_origin

Operand = torch.Tensor | QuantizedTensor
_NAMES = dtypes.NAMES
_FLOAT_DTYPES = frozenset(dtypes.DTYPES[n] for n in dtypes.FLOAT_INPUTS)


class Problem:
    """A validated grouped-GEMM call.

    ``op``: ``"contiguous"``, ``"masked"`` or ``"k_grouped"``. Dimensions (``m``, ``n``, ``k``):
    contiguous ``a[m, k]``, ``b[G, n, k]``, ``out[m, n]``; masked ``a[G, m, k]``, ``out[G, m, n]``
    (``m`` = max_m); K-grouped ``a[k, m]``, ``b[k, n]``, ``out[G, m, n]`` (``k`` = tokens T).
    ``in_dtype``/``out_dtype_name`` are canonical names (:mod:`moe_hal.dtypes`); ``scale_format``
    and ``scale_blocks`` are set for fp8 operands. ``b_major`` is ``"k"`` when ``b[G, N, K]`` has
    K contiguous, ``"n"`` for a transposed view of ``[G, K, N]``, ``"strided"`` otherwise, and
    ``None`` for K-grouped calls. ``signature`` is the hashable key selections are cached under.
    ``device_type`` is ``device.type``, kept as a plain string for backends' per-call checks.
    """

    __slots__ = (
        "op",
        "a",
        "b",
        "layout",
        "c",
        "out_dtype",
        "device",
        "device_type",
        "num_groups",
        "m",
        "n",
        "k",
        "in_dtype",
        "out_dtype_name",
        "quantized",
        "scale_format",
        "scale_blocks",
        "b_major",
        "signature",
    )

    def __init__(self, op, a, b, layout, c, out_dtype, device, num_groups, m, n, k, b_major):
        # Runs on every call: plain stores, each value computed once (host time is a target).
        self.op = op
        self.a = a
        self.b = b
        self.layout = layout
        self.c = c
        self.out_dtype = out_dtype
        self.device = device
        self.device_type = device.type
        self.num_groups = num_groups
        self.m = m
        self.n = n
        self.k = k
        self.in_dtype = in_dtype = _NAMES[a.dtype]
        self.out_dtype_name = out_name = _NAMES[out_dtype]
        self.quantized = quantized = type(a) is QuantizedTensor or isinstance(a, QuantizedTensor)
        if quantized:
            self.scale_format = scale_format = _combined_scale_format(a, b)
            self.scale_blocks = scale_blocks = (a.block, b.block)
        else:
            self.scale_format = scale_format = self.scale_blocks = scale_blocks = None
        self.b_major = b_major
        self.signature = (
            op,
            in_dtype,
            out_name,
            scale_format,
            scale_blocks,
            num_groups,
            n,
            k,
            getattr(layout, "alignment", None),
            b_major,
            device,
            c is not None,
        )

    def out_shape(self) -> tuple[int, ...]:
        if self.op == "contiguous":
            return (self.m, self.n)
        return (self.num_groups, self.m, self.n)

    def new_out(self) -> torch.Tensor:
        """A fresh output tensor for this call: zeros for masked calls (rows past ``masked_m``
        are never written, so they read as zeros), uninitialised otherwise."""
        if self.op == "masked":
            return torch.zeros(self.out_shape(), dtype=self.out_dtype, device=self.device)
        return torch.empty(self.out_shape(), dtype=self.out_dtype, device=self.device)

    @property
    def is_empty(self) -> bool:
        """True when there is nothing to multiply: M, N, K (T) or G is 0."""
        return not (self.m and self.n and self.k and self.num_groups)

    def masked_rows(self) -> torch.Tensor:
        """bool ``[G, max_m, 1]`` on the device: True on the rows ``r < masked_m[g]`` that a masked
        call may write (no host sync)."""
        rows = torch.arange(self.m, device=self.device)
        return (rows[None, :] < self.layout.masked_m[:, None])[..., None]

    def empty_product(self, out: torch.Tensor | None = None) -> torch.Tensor:
        """The result of a call with nothing to multiply (see :attr:`is_empty`), written into ``out``
        when given: zeros, on the writable rows only for masked calls, or ``c`` for K-grouped ones."""
        out = self.new_out() if out is None else out
        if self.op == "masked":
            if out.numel():
                out.masked_fill_(self.masked_rows(), 0)
        elif self.op == "k_grouped" and self.c is not None:
            if out is not self.c:
                out.copy_(self.c)
        else:
            out.zero_()
        return out

    def summary(self) -> str:
        """One line describing the call, e.g. for ``explain()``."""
        dt = self.in_dtype
        if self.quantized:
            dt += f" (scales {self.scale_format}, blocks a{self.scale_blocks[0]} b{self.scale_blocks[1]})"
        k_name = "T" if self.op == "k_grouped" else "K"
        text = (
            f"{self.op} {dt} -> {self.out_dtype_name}, G={self.num_groups}, M={self.m}, N={self.n}, {k_name}={self.k}"
        )
        if self.op == "contiguous":
            text += f", alignment={self.layout.alignment}, b {self.b_major}-major"
        elif self.op == "masked":
            text += f", max_m={self.layout.max_m}, b {self.b_major}-major"
        else:
            text += f", alignment={self.layout.alignment}" + (", with c" if self.c is not None else "")
        return text

    def __repr__(self) -> str:
        return f"Problem({self.summary()}, device={self.device})"

    # ------------------------------------------------------------------------------------------
    @classmethod
    def build(
        cls,
        a: Operand,
        b: Operand,
        layout,
        *,
        c: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
        out_dtype: torch.dtype | None = None,
    ) -> "Problem":
        """Validate a call and return its :class:`Problem`; raises a :mod:`moe_hal.errors`
        ``ArgumentError`` subclass naming the argument on any inconsistency."""
        a_q, b_q = isinstance(a, QuantizedTensor), isinstance(b, QuantizedTensor)
        if not (a_q or isinstance(a, torch.Tensor)):
            _check_operand(a, "a")
        if not (b_q or isinstance(b, torch.Tensor)):
            _check_operand(b, "b")
        if a_q != b_q:
            raise DTypeError(
                "b",
                "a QuantizedTensor like a" if a_q else "a plain tensor like a",
                "a QuantizedTensor" if b_q else f"a {b.dtype} tensor",
            )
        if not a_q:
            if a.dtype not in _FLOAT_DTYPES:
                raise DTypeError("a", "torch.float32, torch.bfloat16, torch.float16 or a QuantizedTensor", a.dtype)
            if b.dtype != a.dtype:
                raise DTypeError("b", f"{a.dtype} (the dtype of a)", b.dtype)
        device = a.device
        if device.type == "meta":
            raise DeviceError(
                "a",
                "a tensor with data (meta tensors cannot be multiplied; trace with fake tensors instead)",
                "a tensor on the meta device",
            )
        if b.device != device:
            raise DeviceError("b", f"device {device} (that of a)", b.device)

        if a_q:
            a, b = _row_block_origin(a, "a", layout), _row_block_origin(b, "b", layout)
        if type(layout) is ContiguousLayout or isinstance(layout, ContiguousLayout):
            problem = cls._contiguous(a, b, layout, c, out_dtype, device)
        elif isinstance(layout, MaskedLayout):
            problem = cls._masked(a, b, layout, c, out_dtype, device)
        elif isinstance(layout, KGroupedLayout):
            problem = cls._k_grouped(a, b, layout, c, out_dtype, device, out)
        else:
            raise LayoutError("layout", "a ContiguousLayout, MaskedLayout or KGroupedLayout", type(layout).__name__)
        if out is not None:
            _check_out(out, problem)
        return problem

    @classmethod
    def _contiguous(cls, a, b, layout, c, out_dtype, device):
        if c is not None:
            no_c(c, "contiguous")
        a_shape, b_shape = a.shape, b.shape
        if len(a_shape) != 2:
            _rank(a, 2, "a", "[num_rows, K]")
        if len(b_shape) != 3:
            _rank(b, 3, "b", "[G, N, K]")
        m, k = a_shape
        g, n, kb = b_shape
        if m != layout.num_rows:
            raise ShapeError(
                "a.shape[0]",
                f"{layout.num_rows} rows (layout.num_rows)",
                m,
                "the layout's aligned group counts must cover exactly the rows of a",
            )
        if g != layout.num_groups:
            raise ShapeError("b.shape[0]", f"{layout.num_groups} groups (layout.num_groups)", g)
        if kb != k:
            raise ShapeError("b.shape[2]", f"K = {k} (a.shape[1])", kb)
        out_dtype = _out_dtype(a, out_dtype, None)
        return cls("contiguous", a, b, layout, None, out_dtype, device, g, m, n, k, _b_major(b, n, kb))

    @classmethod
    def _masked(cls, a, b, layout, c, out_dtype, device):
        no_c(c, "masked")
        _rank(a, 3, "a", "[G, max_m, K]")
        _rank(b, 3, "b", "[G, N, K]")
        g, max_m, k = a.shape
        gb, n, kb = b.shape
        if g != layout.num_groups:
            raise ShapeError("a.shape[0]", f"{layout.num_groups} groups (masked_m.numel())", g)
        if max_m != layout.max_m:
            raise ShapeError("a.shape[1]", f"max_m = {layout.max_m} (layout.max_m)", max_m)
        if gb != g:
            raise ShapeError("b.shape[0]", f"{g} groups (a.shape[0])", gb)
        if kb != k:
            raise ShapeError("b.shape[2]", f"K = {k} (a.shape[2])", kb)
        if layout.masked_m.device != device:
            raise DeviceError("layout.masked_m", f"device {device} (that of a)", layout.masked_m.device)
        out_dtype = _out_dtype(a, out_dtype, None)
        return cls("masked", a, b, layout, None, out_dtype, device, g, max_m, n, k, _b_major(b, n, kb))

    @classmethod
    def _k_grouped(cls, a, b, layout, c, out_dtype, device, out):
        _rank(a, 2, "a", "[T, M]")
        _rank(b, 2, "b", "[T, N]")
        t, m = a.shape
        tb, n = b.shape
        if t != layout.num_rows:
            raise ShapeError(
                "a.shape[0]",
                f"{layout.num_rows} tokens (layout.num_rows)",
                t,
                "the layout's aligned group counts must cover exactly the tokens of a",
            )
        if tb != t:
            raise ShapeError("b.shape[0]", f"{t} tokens (a.shape[0])", tb)
        g = layout.num_groups
        if c is not None:
            if not isinstance(c, torch.Tensor):
                raise ArgumentError("c", "None or a tensor [G, M, N]", type(c).__name__)
            if tuple(c.shape) != (g, m, n):
                raise ShapeError("c", f"shape {(g, m, n)}", tuple(c.shape))
            if c.device != device:
                raise DeviceError("c", f"device {device} (that of a)", c.device)
            if out_dtype is not None and c.dtype != out_dtype:
                raise DTypeError("c", f"{out_dtype} (out_dtype)", c.dtype)
            if out is not None and out_dtype is None and c.dtype != out.dtype:
                raise DTypeError("c", f"{out.dtype} (the dtype of out)", c.dtype)
        return cls("k_grouped", a, b, layout, c, _out_dtype(a, out_dtype, c), device, g, m, n, t, None)


def _row_block_origin(q: QuantizedTensor, name: str, layout) -> QuantizedTensor:
    """``q`` with row blocks counted from row 0 (what backends read), after checking that its block
    origin agrees with a K-grouped ``layout``: per-group blocks must name exactly the layout's
    groups, and scales that would also fit per-group blocks with a different meaning must say
    which origin they use (LayoutError: the silent misreading of DeepGEMM's K-grouped scales)."""
    if isinstance(layout, KGroupedLayout) and q.data.dim() == 2:
        rows = q.data.shape[0]
        segments = tuple((s, e) for _, s, e in layout.segments())
        if q.row_groups is None and q.block[0] > 1 and rows == layout.num_rows:
            per_group = QuantizedTensor.scale_shape(tuple(q.data.shape), q.block, segments)
            if per_group == tuple(q.scale.shape):
                in_groups = layout.valid_rows_on("cpu")
                tensor_rows = in_groups // q.block[0]
                group_rows = torch.repeat_interleave(
                    torch.cumsum(
                        torch.tensor([0] + [-(-(e - s) // q.block[0]) for s, e in segments[:-1]], dtype=torch.int64), 0
                    ),
                    torch.tensor([e - s for s, e in segments], dtype=torch.int64),
                )
                group_rows = (
                    group_rows
                    + (
                        in_groups
                        - torch.repeat_interleave(
                            torch.tensor([s for s, _ in segments], dtype=torch.int64),
                            torch.tensor([e - s for s, e in segments], dtype=torch.int64),
                        )
                    )
                    // q.block[0]
                )
                if not torch.equal(tensor_rows, group_rows):
                    raise LayoutError(
                        f"{name}.row_groups",
                        "the block origin stated: the scale shape fits both "
                        f"blocks of {q.block[0]} rows from row 0 and blocks restarting at each group "
                        "(DeepGEMM's K-grouped scales), which mean different things here",
                        None,
                        f"pass row_groups={segments[:3]}{'...' if len(segments) > 3 else ''} "
                        f"(layout groups) or (({0}, {rows}),) (row 0), or use quantize_fp8",
                    )
        elif q.row_groups is not None and q.row_groups != ((0, rows),) and q.row_groups != segments:
            raise LayoutError(
                f"{name}.row_groups",
                f"the layout's groups {segments[:4]}{'...' if len(segments) > 4 else ''} or ((0, {rows}),)",
                q.row_groups,
            )
    return to_tensor_origin(q) if q.row_groups is not None else q


def _check_operand(x, name: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise ArgumentError(name, "a torch.Tensor or a moe_hal.QuantizedTensor", type(x).__name__)


def _rank(x, rank: int, name: str, shape: str) -> None:
    if x.dim() != rank:
        raise ShapeError(name, f"a {rank}-D tensor {shape}", f"shape {tuple(x.shape)}")


def no_c(c, op: str) -> None:
    """Refuse ``c`` for a layout ``op`` other than K-grouped (the custom ops' path checks it too,
    before choosing an op)."""
    if c is not None:
        raise ArgumentError("c", f"None (c is only used by K-grouped calls, not {op})", type(c).__name__)


def _b_major(b, n: int, k: int) -> str:
    """How ``b[G, N, K]`` (``n``, ``k`` its sizes) is laid out: see :attr:`Problem.b_major`."""
    _, s_n, s_k = (b.data if isinstance(b, QuantizedTensor) else b).stride()
    if s_k == 1 or k == 1:
        return "k"
    if s_n == 1 or n == 1:
        return "n"
    return "strided"


def _combined_scale_format(a: QuantizedTensor, b: QuantizedTensor) -> str:
    # ue8m0 only when both operands' scales are powers of two; fp32 covers ue8m0 scales too.
    return "ue8m0" if a.scale_format == b.scale_format == "ue8m0" else "fp32"


def _out_dtype(a, out_dtype: torch.dtype | None, c: torch.Tensor | None) -> torch.dtype:
    if out_dtype is None and c is None and type(a) is torch.Tensor:
        return a.dtype  # the common call, answered first
    quantized = isinstance(a, QuantizedTensor)
    natural = torch.bfloat16 if quantized else a.dtype
    if out_dtype is None:
        out_dtype = natural if c is None else c.dtype
    if out_dtype is not natural and out_dtype is not torch.float32:
        names = sorted({str(natural), str(torch.float32)})
        raise DTypeError("out_dtype", f"one of {names} for {'fp8' if quantized else a.dtype} operands", out_dtype)
    return out_dtype


def _check_out(out, problem: Problem) -> None:
    if not isinstance(out, torch.Tensor):
        raise ArgumentError("out", "None or a torch.Tensor", type(out).__name__)
    shape = problem.out_shape()
    if tuple(out.shape) != shape:
        raise ShapeError("out", f"shape {shape}", tuple(out.shape))
    if out.dtype != problem.out_dtype:
        raise DTypeError("out", f"{problem.out_dtype} (out_dtype)", out.dtype)
    if out.device != problem.device:
        raise DeviceError("out", f"device {problem.device} (that of a)", out.device)
    if out.numel() and out.stride(-1) != 1:
        raise ShapeError("out", "a row-major tensor (stride(-1) == 1)", f"strides {tuple(out.stride())}")
    if not _non_overlapping(out):
        raise AliasError(
            "out",
            "a tensor whose elements do not overlap each other",
            f"strides {tuple(out.stride())} for shape {tuple(out.shape)}",
        )
    inputs = [("a", problem.a), ("b", problem.b)]
    if problem.op == "masked":
        inputs.append(("layout.masked_m", problem.layout.masked_m))
    for name, x in inputs:
        parts = (
            [(name + ".data", x.data), (name + ".scale", x.scale)] if isinstance(x, QuantizedTensor) else [(name, x)]
        )
        for part_name, t in parts:
            if _overlaps(out, t):
                raise AliasError("out", f"memory disjoint from {part_name}", f"a tensor overlapping {part_name}")
    if problem.c is not None and problem.c is not out and _overlaps(out, problem.c):
        raise AliasError(
            "out",
            "either c itself (in-place accumulation) or memory disjoint from c",
            "a tensor partially overlapping c",
        )


def _non_overlapping(t: torch.Tensor) -> bool:
    dims = sorted((s, n) for s, n in zip(t.stride(), t.shape) if n > 1)
    span = 1
    for stride, size in dims:
        if stride < span:
            return False
        span = stride * size
    return True


def _byte_range(t: torch.Tensor) -> tuple[int, int]:
    if t.numel() == 0:
        return (0, 0)
    start = t.data_ptr()
    extent = sum((n - 1) * s for n, s in zip(t.shape, t.stride())) + 1
    return start, start + extent * t.element_size()


def _overlaps(x: torch.Tensor, y: torch.Tensor) -> bool:
    if x.device != y.device or x.numel() == 0 or y.numel() == 0:
        return False
    # Eager functionalization (torch.func.functionalize) hands over wrappers whose data_ptr() is 0:
    # the tensors they wrap hold the memory to compare.
    if torch._is_functional_tensor(x):
        x = torch._from_functional_tensor(x)
    if torch._is_functional_tensor(y):
        y = torch._from_functional_tensor(y)
    (x0, x1), (y0, y1) = _byte_range(x), _byte_range(y)
    return x0 < y1 and y0 < x1
