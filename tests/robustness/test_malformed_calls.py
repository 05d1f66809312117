"""The malformed-call table: every careless or hostile call raises a typed error naming the argument,
and a sentinel-filled ``out`` is bit-identical afterwards.

Each case is ``(id, build, error type, argument)``: ``build(v)`` receives a fresh set of valid
operands ``v`` (see :class:`Valid`) and returns a zero-argument call that must fail. ``argument`` is
the name the error must carry (``err.argument`` for argument errors) and its message must contain.
"""

from __future__ import annotations

import pytest
import torch

import moe_hal
from moe_hal import errors
from moe_hal.layouts import ContiguousLayout, KGroupedLayout, MaskedLayout
from moe_hal.quant import QuantizedTensor, quantize_fp8

SENTINEL = -12345.0
G, K, N, M_TOKENS = 3, 32, 16, 8


class Valid:
    """A valid call of each operation (fp32), plus a fresh sentinel-filled ``out`` for each. The
    operands are built once and shared (refused calls never write them); the outs are copies."""

    _shared: "Valid | None" = None

    def __new__(cls):
        if cls._shared is None:
            cls._shared = super().__new__(cls)
            cls._shared._build()
        v = super().__new__(cls)
        v.__dict__.update(cls._shared.__dict__)
        for name in ("out", "out3", "outk", "outq"):
            setattr(v, name, getattr(cls._shared, name).clone())
        return v

    def _build(self, dtype: torch.dtype = torch.float32):
        gen = torch.Generator().manual_seed(7)
        self.dtype = dtype
        self.lay = ContiguousLayout.from_counts([2, 0, 5], alignment=4)
        self.a = torch.randn(self.lay.num_rows, K, generator=gen).to(dtype)
        self.b = torch.randn(G, N, K, generator=gen).to(dtype)
        self.out = torch.full((self.lay.num_rows, N), SENTINEL, dtype=dtype)
        self.mlay = MaskedLayout(torch.tensor([1, 0, 3], dtype=torch.int32), 4)
        self.a3 = torch.randn(G, 4, K, generator=gen).to(dtype)
        self.out3 = torch.full((G, 4, N), SENTINEL, dtype=dtype)
        self.klay = KGroupedLayout.from_counts([3, 0, 5])
        self.x = torch.randn(M_TOKENS, 6, generator=gen).to(dtype)
        self.dy = torch.randn(M_TOKENS, N, generator=gen).to(dtype)
        self.c = torch.randn(G, 6, N, generator=gen).to(dtype)
        self.outk = torch.full((G, 6, N), SENTINEL, dtype=dtype)
        self.qa = quantize_fp8(torch.randn(self.lay.num_rows, 128, generator=gen), block=(1, 128))
        self.qb = quantize_fp8(torch.randn(G, N, 128, generator=gen), block=(128, 128))
        self.outq = torch.full((self.lay.num_rows, N), SENTINEL, dtype=torch.bfloat16)

    def outs(self) -> list[torch.Tensor]:
        return [self.out, self.out3, self.outk, self.outq]


gg = moe_hal.grouped_gemm


def _op(**operands: str):
    """A case builder for one operation: ``build(v, **overrides)`` returns the call with ``v``'s
    operands named by ``operands`` (argument -> attribute of :class:`Valid`), ``overrides`` replacing
    or adding arguments."""

    def build(v: Valid, **kw):
        args = {name: getattr(v, attr) for name, attr in operands.items()} | kw
        a, b, layout = args.pop("a"), args.pop("b"), args.pop("layout")
        return lambda: gg(a, b, layout, **args)

    return build


contiguous = _op(a="a", b="b", layout="lay", out="out")
masked = _op(a="a3", b="b", layout="mlay", out="out3")
k_grouped = _op(a="x", b="dy", layout="klay", out="outk")
fp8 = _op(a="qa", b="qb", layout="lay", out="outq")


def meta(t: torch.Tensor) -> torch.Tensor:
    return torch.empty(t.shape, dtype=t.dtype, device="meta")


E = errors
NOT_TENSORS = [
    ("list", lambda t: t.tolist()),
    ("numpy", lambda t: t.numpy()),
    ("none", lambda t: None),
    ("int", lambda t: 3),
    ("str", lambda t: "a"),
]
# float64 operands are valid: the reference backend takes them (float64 gradient checks).
BAD_DTYPES = [torch.int32, torch.int64, torch.bool, torch.complex64, torch.uint8]

CASES: list[tuple] = []


def case(name, build, error, argument):
    CASES.append(pytest.param(build, error, argument, id=name))


# -- contiguous: operands -------------------------------------------------------------------------------
for op_name, op, a_key in (("contiguous", contiguous, "a"), ("masked", masked, "a3"), ("k_grouped", k_grouped, "x")):
    b_key = "dy" if op_name == "k_grouped" else "b"
    for label, bad in NOT_TENSORS:
        case(
            f"{op_name}-a-{label}",
            lambda v, op=op, bad=bad, a_key=a_key: op(v, a=bad(getattr(v, a_key))),
            E.ArgumentError,
            "a",
        )
        case(
            f"{op_name}-b-{label}",
            lambda v, op=op, bad=bad, b_key=b_key: op(v, b=bad(getattr(v, b_key))),
            E.ArgumentError,
            "b",
        )
    for dt in BAD_DTYPES:
        case(
            f"{op_name}-a-{dt}",
            lambda v, op=op, dt=dt, a_key=a_key, b_key=b_key: op(
                v, a=getattr(v, a_key).to(dt), b=getattr(v, b_key).to(dt)
            ),
            E.DTypeError,
            "a",
        )
    case(f"{op_name}-b-other-dtype", lambda v, op=op, b_key=b_key: op(v, b=getattr(v, b_key).half()), E.DTypeError, "b")
    case(
        f"{op_name}-a-fp8-plain",
        lambda v, op=op, a_key=a_key, b_key=b_key: op(
            v, a=getattr(v, a_key).to(torch.float8_e4m3fn), b=getattr(v, b_key).to(torch.float8_e4m3fn)
        ),
        E.DTypeError,
        "a",
    )
    case(
        f"{op_name}-a-meta",
        lambda v, op=op, a_key=a_key, b_key=b_key: op(
            v, a=meta(getattr(v, a_key)), b=meta(getattr(v, b_key)), out=None
        ),
        E.DeviceError,
        "a",
    )
    case(f"{op_name}-b-meta", lambda v, op=op, b_key=b_key: op(v, b=meta(getattr(v, b_key))), E.DeviceError, "b")
    case(
        f"{op_name}-a-quantized-b-plain",
        lambda v, op=op, a_key=a_key: op(v, a=quantize_fp8(getattr(v, a_key).float().contiguous(), block=(1, 128))),
        E.DTypeError,
        "b",
    )
    case(f"{op_name}-a-plain-b-quantized", lambda v, op=op: op(v, b=v.qb), E.DTypeError, "b")
    for label, layout in (("none", None), ("dict", {}), ("list", [1, 2]), ("str", "contiguous")):
        case(f"{op_name}-layout-{label}", lambda v, op=op, layout=layout: op(v, layout=layout), E.LayoutError, "layout")
    for label, bad_out in (
        ("shape", lambda o: o[:1]),
        ("dtype", lambda o: o.double()),
        ("not-tensor", lambda o: o.tolist()),
        ("meta", meta),
        (
            "column-major",
            lambda o: o.transpose(-1, -2).contiguous().transpose(-1, -2) if o.shape[-1] > 1 else o[..., :0],
        ),
        ("overlapping", lambda o: o[..., :1].expand(o.shape)),
    ):
        out_key = {"contiguous": "out", "masked": "out3", "k_grouped": "outk"}[op_name]
        case(
            f"{op_name}-out-{label}",
            lambda v, op=op, bad_out=bad_out, out_key=out_key: op(v, out=bad_out(getattr(v, out_key))),
            E.ArgumentError,
            "out",
        )
    for label, out_dtype in (
        ("fp16", torch.float16),
        ("int32", torch.int32),
        ("str", "bf16"),
        ("float64", torch.float64),
    ):
        case(
            f"{op_name}-out_dtype-{label}",
            lambda v, op=op, out_dtype=out_dtype: op(v, out_dtype=out_dtype, out=None),
            E.DTypeError,
            "out_dtype",
        )
    case(f"{op_name}-backend-int", lambda v, op=op: op(v, backend=123), E.ArgumentError, "backend")
    case(
        f"{op_name}-backend-duplicates", lambda v, op=op: op(v, backend=["torch", "torch"]), E.ArgumentError, "backend"
    )

# -- contiguous: shapes and aliasing -------------------------------------------------------------------------
case("contiguous-a-1d", lambda v: contiguous(v, a=v.a[:, 0]), E.ShapeError, "a")
case("contiguous-a-3d", lambda v: contiguous(v, a=v.a[None]), E.ShapeError, "a")
case("contiguous-b-2d", lambda v: contiguous(v, b=v.b[0]), E.ShapeError, "b")
case("contiguous-b-4d", lambda v: contiguous(v, b=v.b[None]), E.ShapeError, "b")
case("contiguous-a-too-few-rows", lambda v: contiguous(v, a=v.a[:-1]), E.ShapeError, "a.shape[0]")
case("contiguous-a-too-many-rows", lambda v: contiguous(v, a=torch.cat([v.a, v.a])), E.ShapeError, "a.shape[0]")
case("contiguous-b-groups", lambda v: contiguous(v, b=v.b[:2]), E.ShapeError, "b.shape[0]")
case("contiguous-k-mismatch", lambda v: contiguous(v, b=v.b[:, :, :-1]), E.ShapeError, "b.shape[2]")
case("contiguous-c-given", lambda v: contiguous(v, c=v.out.clone()), E.ArgumentError, "c")
case("contiguous-layout-masked", lambda v: contiguous(v, layout=v.mlay), E.ShapeError, "a")
case("contiguous-layout-kgrouped", lambda v: contiguous(v, layout=v.klay), E.ShapeError, "b")
case("contiguous-out-aliases-a", lambda v: _alias_a(v), E.AliasError, "out")
case("contiguous-out-aliases-b", lambda v: _alias_b(v), E.AliasError, "out")


def _alias_a(v: Valid):
    # a and out share memory: a is a view of out's storage.
    store = torch.full((v.lay.num_rows, K), SENTINEL, dtype=v.dtype)
    v.out = store[:, :N]
    return lambda: gg(store, v.b, v.lay, out=v.out)


def _alias_b(v: Valid):
    store = torch.full((G * N * K,), SENTINEL, dtype=v.dtype)
    v.out = store[: v.lay.num_rows * N].view(v.lay.num_rows, N)
    return lambda: gg(v.a, store.view(G, N, K), v.lay, out=v.out)


# -- masked ---------------------------------------------------------------------------------------------------
case("masked-a-2d", lambda v: masked(v, a=v.a3[0]), E.ShapeError, "a")
case("masked-b-2d", lambda v: masked(v, b=v.b[0]), E.ShapeError, "b")
case("masked-a-groups", lambda v: masked(v, a=v.a3[:2]), E.ShapeError, "a.shape[0]")
case("masked-a-max_m", lambda v: masked(v, a=v.a3[:, :3]), E.ShapeError, "a.shape[1]")
case("masked-b-groups", lambda v: masked(v, b=v.b[:2]), E.ShapeError, "b.shape[0]")
case("masked-k-mismatch", lambda v: masked(v, b=v.b[:, :, :-1]), E.ShapeError, "b.shape[2]")
case("masked-c-given", lambda v: masked(v, c=v.out3.clone()), E.ArgumentError, "c")
case(
    "masked-masked_m-meta",
    lambda v: masked(v, layout=MaskedLayout(torch.zeros(G, dtype=torch.int32, device="meta"), 4)),
    E.DeviceError,
    "layout.masked_m",
)
case("masked-out-aliases-masked_m", lambda v: _alias_masked_m(v), E.AliasError, "out")


def _alias_masked_m(v: Valid):
    v.out3 = torch.full((G, 4, N), SENTINEL, dtype=torch.float32)
    m = v.out3.view(torch.int32).view(-1)[:G]
    return lambda: gg(v.a3, v.b, MaskedLayout(m, 4, check=False), out=v.out3)


# -- K-grouped -------------------------------------------------------------------------------------------------
case("k_grouped-a-3d", lambda v: k_grouped(v, a=v.x[None]), E.ShapeError, "a")
case("k_grouped-b-3d", lambda v: k_grouped(v, b=v.dy[None]), E.ShapeError, "b")
case("k_grouped-a-tokens", lambda v: k_grouped(v, a=v.x[:-1]), E.ShapeError, "a.shape[0]")
case("k_grouped-b-tokens", lambda v: k_grouped(v, b=v.dy[:-1]), E.ShapeError, "b.shape[0]")
case("k_grouped-c-shape", lambda v: k_grouped(v, c=v.c[:2]), E.ShapeError, "c")
case("k_grouped-c-list", lambda v: k_grouped(v, c=v.c.tolist()), E.ArgumentError, "c")
case("k_grouped-c-meta", lambda v: k_grouped(v, c=meta(v.c)), E.DeviceError, "c")
case(
    "k_grouped-c-dtype-vs-out_dtype",
    lambda v: k_grouped(v, c=v.c.half(), out_dtype=torch.float32, out=None),
    E.DTypeError,
    "c",
)
case("k_grouped-c-dtype-vs-out", lambda v: k_grouped(v, c=v.c.double()), E.DTypeError, "c")
case("k_grouped-out-overlaps-c", lambda v: _overlap_c(v), E.AliasError, "out")


def _overlap_c(v: Valid):
    store = torch.full((2 * G * 6 * N,), SENTINEL)
    c = store[: G * 6 * N].view(G, 6, N)
    v.outk = store[N : N + G * 6 * N].view(G, 6, N)
    return lambda: gg(v.x, v.dy, v.klay, c=c, out=v.outk)


# -- fp8 operands ------------------------------------------------------------------------------------------------
case("fp8-out_dtype-fp16", lambda v: fp8(v, out_dtype=torch.float16, out=None), E.DTypeError, "out_dtype")
case("fp8-out-fp16", lambda v: fp8(v, out=v.outq.half()), E.DTypeError, "out")
case("fp8-b-plain", lambda v: fp8(v, b=v.qb.dequantize()), E.DTypeError, "b")
case(
    "fp8-b-k-mismatch",
    lambda v: fp8(v, b=quantize_fp8(torch.randn(G, N, 256), block=(128, 128))),
    E.ShapeError,
    "b.shape[2]",
)
case("fp8-a-rows", lambda v: fp8(v, a=quantize_fp8(torch.randn(v.lay.num_rows + 1, 128))), E.ShapeError, "a.shape[0]")

# -- layout constructors ------------------------------------------------------------------------------------------
for cls in (ContiguousLayout, KGroupedLayout):
    n = cls.__name__
    for label, counts, arg in (
        ("str", "123", "counts"),
        ("bytes", b"12", "counts"),
        ("bools", [True, False], "counts"),
        ("floats", [1.5, 2.0], "counts"),
        ("integral-floats", [1.0, 2.0], "counts"),
        ("none", None, "counts"),
        ("int", 5, "counts"),
        ("nested", [[1, 2]], "counts"),
        ("negative", [3, -1], "counts[1]"),
        ("int32-overflow", [2**31], "counts[0]"),
        ("huge", [10**400], "counts[0]"),
        ("sum-overflow", [2**30, 2**30, 2**30], "counts"),
        ("float-tensor", torch.tensor([1.0]), "counts"),
        ("bool-tensor", torch.tensor([True]), "counts"),
        ("2d-tensor", torch.tensor([[1]]), "counts"),
        ("int64-tensor-overflow", torch.tensor([2**40]), "counts[0]"),
        ("dict", {1: 2}, "counts"),
    ):
        case(
            f"{n}.from_counts-{label}",
            lambda v, cls=cls, counts=counts: lambda: cls.from_counts(counts),
            E.LayoutError
            if arg != "counts" or label not in ("float-tensor", "bool-tensor", "2d-tensor")
            else E.ArgumentError,
            arg,
        )
    for label, alignment in (
        ("zero", 0),
        ("negative", -4),
        ("float", 2.0),
        ("bool", True),
        ("str", "128"),
        ("none-like", [128]),
    ):
        case(
            f"{n}.from_counts-alignment-{label}",
            lambda v, cls=cls, alignment=alignment: lambda: cls.from_counts([1, 2], alignment=alignment),
            E.LayoutError,
            "alignment",
        )
    for label, num_rows in (("too-small", 1), ("float", 8.0), ("bool", True), ("over-int32", 2**31)):
        case(
            f"{n}.from_counts-num_rows-{label}",
            lambda v, cls=cls, num_rows=num_rows: lambda: cls.from_counts([1, 2], alignment=1, num_rows=num_rows),
            E.LayoutError,
            "num_rows",
        )
case(
    "from_psum-decreasing", lambda v: lambda: ContiguousLayout.from_psum([4, 3], alignment=1), E.LayoutError, "psum[1]"
)
case("from_psum-str", lambda v: lambda: ContiguousLayout.from_psum("43", alignment=1), E.LayoutError, "psum")
case("from_psum-overflow", lambda v: lambda: ContiguousLayout.from_psum([2**31], alignment=1), E.LayoutError, "psum[0]")
case("from_m_indices-list", lambda v: lambda: ContiguousLayout.from_m_indices([0, 1], 2), E.LayoutError, "m_indices")
case(
    "from_m_indices-float",
    lambda v: lambda: ContiguousLayout.from_m_indices(torch.tensor([0.0]), 1),
    E.DTypeError,
    "m_indices",
)
case(
    "from_m_indices-out-of-range",
    lambda v: lambda: ContiguousLayout.from_m_indices(torch.tensor([0, 7], dtype=torch.int32), 2),
    E.LayoutError,
    "m_indices[1]",
)
case(
    "from_m_indices-num_groups-str",
    lambda v: lambda: ContiguousLayout.from_m_indices(torch.tensor([0], dtype=torch.int32), "1"),
    E.LayoutError,
    "num_groups",
)
for label, masked_m, max_m, arg in (
    ("list", [1, 2], 4, "masked_m"),
    ("int64", torch.tensor([1], dtype=torch.int64), 4, "masked_m"),
    ("2d", torch.tensor([[1]], dtype=torch.int32), 4, "masked_m"),
    ("over-max_m", torch.tensor([5], dtype=torch.int32), 4, "masked_m[0]"),
    ("negative", torch.tensor([-1], dtype=torch.int32), 4, "masked_m[0]"),
    ("max_m-float", torch.tensor([1], dtype=torch.int32), 4.0, "max_m"),
    ("max_m-negative", torch.tensor([1], dtype=torch.int32), -1, "max_m"),
    ("max_m-bool", torch.tensor([1], dtype=torch.int32), True, "max_m"),
):
    case(f"MaskedLayout-{label}", lambda v, m=masked_m, mm=max_m: lambda: MaskedLayout(m, mm), E.ArgumentError, arg)
case(
    "MaskedLayout-expected_m-zero",
    lambda v: lambda: MaskedLayout(torch.tensor([1], dtype=torch.int32), 4, expected_m=0),
    E.LayoutError,
    "expected_m",
)

# -- quantization ------------------------------------------------------------------------------------------------
for label, block in (
    ("float", (1.5, 128)),
    ("str", "11"),
    ("none", None),
    ("three", (1, 2, 3)),
    ("zero", (0, 128)),
    ("negative", (1, -128)),
    ("bool", (True, 128)),
    ("int", 128),
    ("floats-integral", (1.0, 128.0)),
):
    case(
        f"quantize_fp8-block-{label}",
        lambda v, block=block: lambda: quantize_fp8(torch.randn(4, 128), block=block),
        E.ShapeError,
        "block",
    )
    case(
        f"QuantizedTensor-block-{label}",
        lambda v, block=block: lambda: QuantizedTensor(v.qa.data, v.qa.scale, block),
        E.ShapeError,
        "QuantizedTensor.block",
    )
case(
    "QuantizedTensor-data-fp32",
    lambda v: lambda: QuantizedTensor(v.qa.data.float(), v.qa.scale, (1, 128)),
    E.DTypeError,
    "QuantizedTensor.data",
)
case(
    "QuantizedTensor-scale-bf16",
    lambda v: lambda: QuantizedTensor(v.qa.data, v.qa.scale.bfloat16(), (1, 128)),
    E.DTypeError,
    "QuantizedTensor.scale",
)
case(
    "QuantizedTensor-scale-shape",
    lambda v: lambda: QuantizedTensor(v.qa.data, v.qa.scale[:1], (1, 128)),
    E.ShapeError,
    "QuantizedTensor.scale",
)
case(
    "QuantizedTensor-scale_format",
    lambda v: lambda: QuantizedTensor(v.qa.data, v.qa.scale, (1, 128), "e8m0"),
    E.ShapeError,
    "QuantizedTensor.scale_format",
)
case(
    "QuantizedTensor-data-1d",
    lambda v: lambda: QuantizedTensor(v.qa.data[0], v.qa.scale[0], (1, 128)),
    E.ShapeError,
    "QuantizedTensor.data",
)


@pytest.mark.parametrize("build,error,argument", CASES)
def test_malformed_call_raises_typed_error_and_leaves_out_untouched(build, error, argument):
    v = Valid()
    call = build(v)
    before = [o.clone() for o in v.outs()]
    with pytest.raises(error) as info:
        call()
    err = info.value
    assert isinstance(err, errors.MoeHalError), type(err)
    if isinstance(err, errors.ArgumentError):
        assert err.argument == argument, str(err)
    assert argument in str(err), str(err)
    for o, b in zip(v.outs(), before):  # bytes, so NaN or -0.0 written over the sentinel is caught too
        assert torch.equal(o.view(torch.uint8), b.view(torch.uint8)), "out was written although the call was refused"


def test_the_table_is_large_enough():
    assert len(CASES) >= 150, len(CASES)
