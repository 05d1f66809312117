"""DeepGEMM's grouped (and dense) GEMM functions, run through :func:`moe_hal.grouped_gemm`.

Every function has DeepGEMM v2.6's name, positional order and defaults, writes into the caller's
``d`` and returns None. The grouping argument is turned into a moe_hal layout:

* ``m_indices`` (int32 ``[M]``): the canonical form (one aligned run per group, ascending) maps to
  a :class:`~moe_hal.ContiguousLayout` directly; any other valid form (groups out of order, split
  runs, -1 blocks anywhere) through a row permutation (:meth:`ContiguousLayout.from_m_indices_permuted`).
* psum (``use_psum_layout=True``, int32 ``[G]`` exclusive ends): :meth:`ContiguousLayout.from_psum`.
* masked: :class:`~moe_hal.MaskedLayout` (``expected_m`` kept as its hint).
* K-grouped: ``ks_cpu`` / psum -> :class:`~moe_hal.KGroupedLayout`, scales per group
  (:attr:`QuantizedTensor.row_groups`).

The alignment is this thread's ``get_mk_alignment_for_contiguous_layout()``. Output rows: moe_hal
writes exactly the rows of each group and zeros on rows of no group (DeepGEMM writes whole
blocks); masked rows past ``masked_m`` are never written, as in DeepGEMM.
"""

from __future__ import annotations

import functools

import torch

from ... import api
from ...errors import ArgumentError, DTypeError, LayoutError, ShapeError
from ...layouts import ContiguousLayout, KGroupedLayout, MaskedLayout, take_rows
from ...quant import QuantizedTensor, unpack_ue8m0
from . import passthrough, settings
from .errors import DeepGEMMError, as_deepgemm_error
from .scales import fp32_scales_for_arch, resolve_recipes, to_quantized


def deepgemm_api(fn):
    """Wrap a shim function: real DeepGEMM first when the passthrough setting allows it, and
    moe_hal argument errors re-typed as DeepGEMM's RuntimeError too."""
    name = fn.__name__

    @functools.wraps(fn)
    def call(*args, **kwargs):
        mode = settings.current()["passthrough"]
        if mode != "never":
            real = passthrough.real_module()
            target = getattr(real, name, None) if real is not None else None
            on_device = passthrough.device_arch_major(passthrough.first_tensor(args, kwargs)) is not None
            if target is not None and (on_device or mode == "always"):
                return target(*args, **kwargs)
            if mode == "always":
                raise DeepGEMMError(
                    f"passthrough='always': real DeepGEMM cannot run {name} here "
                    f"({'not importable' if real is None else 'no such function'})"
                )
        try:
            return fn(*args, **kwargs)
        except ArgumentError as exc:
            if isinstance(exc, RuntimeError):
                raise
            raise as_deepgemm_error(exc) from exc

    return call


# -- helpers -----------------------------------------------------------------------------------
def _arch(tensor: torch.Tensor | None) -> int | None:
    chosen = settings.current()["arch_major"]
    return chosen if chosen is not None else passthrough.device_arch_major(tensor)


def _backend():
    return settings.current()["backend"]


def _data(x) -> torch.Tensor | None:
    if isinstance(x, (tuple, list)) and x:
        x = x[0]
    return x if isinstance(x, torch.Tensor) else None


def _check_d(d: object, dtypes: tuple[torch.dtype, ...], rank: int) -> torch.Tensor:
    if not isinstance(d, torch.Tensor):
        raise DTypeError("d", "a torch.Tensor", type(d).__name__)
    if d.dtype not in dtypes:
        raise DTypeError("d", " or ".join(map(str, dtypes)), d.dtype)
    if d.dim() != rank:
        raise ShapeError("d", f"a {rank}-D tensor", tuple(d.shape))
    if d.numel() and d.stride(-1) != 1:
        raise ShapeError("d", "an N-major (row-major) tensor", tuple(d.stride()))
    return d


def _check_int32(t: object, argument: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise DTypeError(argument, "an int32 tensor", type(t).__name__)
    if t.dtype != torch.int32:
        raise DTypeError(argument, "torch.int32", t.dtype)
    if not t.is_contiguous():
        raise ShapeError(argument, "a contiguous tensor", tuple(t.stride()))
    return t


def _check_bf16(x: object, argument: str, rank: int) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or x.dtype != torch.bfloat16:
        got = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
        raise DTypeError(argument, "a torch.bfloat16 tensor", got)
    if x.dim() != rank:
        raise ShapeError(argument, f"a {rank}-D tensor", tuple(x.shape))
    return x


def _fp8_pair(a, b, recipe, recipe_a, recipe_b, disable_ue8m0_cast, rank_b, transpose_b=False):
    """Both fp8 operands of an M-grouped / dense call as QuantizedTensors."""
    if transpose_b and isinstance(b, (tuple, list)) and len(b) == 2 and all(isinstance(t, torch.Tensor) for t in b):
        b = (b[0].transpose(-2, -1), b[1].transpose(-2, -1))
    for name, x in (("a", a), ("b", b)):
        if not (isinstance(x, (tuple, list)) and len(x) == 2 and all(isinstance(t, torch.Tensor) for t in x)):
            raise DTypeError(name, "a (tensor, scale factors) pair", type(x).__name__)
    arch = _arch(a[0])
    gran_a, gran_b = resolve_recipes(a[1], b[1], recipe, recipe_a, recipe_b, arch)
    qa = to_quantized(a, "a", gran_a, arch, disable_ue8m0_cast, a[0].dim())
    qb = to_quantized(b, "b", gran_b, arch, disable_ue8m0_cast, rank_b)
    return qa, qb


def _num_groups(b) -> int:
    data = b.data if isinstance(b, QuantizedTensor) else b
    return data.shape[0]


def _run_contiguous(a, b, d: torch.Tensor, grouped_layout, use_psum_layout: bool, expected_m_for_psum_layout) -> None:
    """M-grouped contiguous (m_indices or psum) into ``d``."""
    grouped_layout = _check_int32(grouped_layout, "grouped_layout")
    alignment = settings.current()["mk_alignment"]
    num_groups = _num_groups(b)
    rows = (a.data if isinstance(a, QuantizedTensor) else a).shape[0]
    if tuple(d.shape[:1]) != (rows,):
        raise ShapeError("d", f"[M, N] with M = {rows} (a.shape[0])", tuple(d.shape))
    if use_psum_layout:
        if grouped_layout.numel() != num_groups:
            raise ShapeError(
                "grouped_layout", f"{num_groups} psum offsets (one per group of b)", tuple(grouped_layout.shape)
            )
        layout = ContiguousLayout.from_psum(grouped_layout, alignment=alignment, num_rows=rows)
        api.grouped_gemm(a, b, layout, out=d, backend=_backend())
        return
    if expected_m_for_psum_layout is not None:
        raise DeepGEMMError("expected_m_for_psum_layout is only valid with use_psum_layout=True")
    if grouped_layout.numel() != rows:
        raise ShapeError("grouped_layout", f"{rows} m_indices (one per row of a)", tuple(grouped_layout.shape))
    if rows == 0:
        return
    try:
        layout = ContiguousLayout.from_m_indices(grouped_layout, num_groups, alignment=alignment)
    except LayoutError:
        layout = None
    if layout is not None:
        api.grouped_gemm(a, b, layout, out=d, backend=_backend())
        return
    layout, source = ContiguousLayout.from_m_indices_permuted(grouped_layout, num_groups, alignment=alignment)
    source = source.to(d.device)
    filled = torch.nonzero(source >= 0).flatten()
    gathered = take_rows(a, source.clamp(min=0), torch.nonzero(source < 0).flatten(), filled)
    out = api.grouped_gemm(gathered, b, layout, out_dtype=d.dtype, backend=_backend())
    d.masked_fill_((grouped_layout < 0).to(d.device)[:, None], 0)
    d.index_copy_(0, source.index_select(0, filled), out.index_select(0, filled))


def _run_masked(a, b, d: torch.Tensor, masked_m, expected_m) -> None:
    masked_m = _check_int32(masked_m, "masked_m")
    if isinstance(expected_m, bool) or not isinstance(expected_m, int) or expected_m <= 0:
        raise LayoutError("expected_m", "a positive int (DeepGEMM: expected_m > 0)", expected_m)
    data = a.data if isinstance(a, QuantizedTensor) else a
    if data.dim() != 3:
        raise ShapeError("a", "a 3-D tensor [G, max_m, K]", tuple(data.shape))
    layout = MaskedLayout(masked_m, data.shape[1], expected_m=expected_m)
    api.grouped_gemm(a, b, layout, out=d, backend=_backend())


def _k_grouped_layout(
    ks_cpu, grouped_layout, num_groups: int, use_psum_layout: bool, rows: int, fp8: bool
) -> KGroupedLayout:
    """DeepGEMM's K-grouped arguments -> the layout of the ``rows`` tokens (its checks included)."""
    grouped_layout = _check_int32(grouped_layout, "grouped_layout")
    alignment = settings.current()["mk_alignment"]
    if fp8 and alignment % 32:
        raise DeepGEMMError(
            f"K-grouped fp8 GEMMs need get_mk_alignment_for_contiguous_layout() % 32 == 0, got {alignment}"
        )
    if grouped_layout.numel() != num_groups:
        raise ShapeError("grouped_layout", f"{num_groups} entries (d.shape[0])", tuple(grouped_layout.shape))
    if ks_cpu is not None and not isinstance(ks_cpu, (list, tuple)):
        raise DTypeError("ks_cpu", "None or a list of ints", type(ks_cpu).__name__)
    if ks_cpu:
        if len(ks_cpu) != num_groups:
            raise ShapeError("ks_cpu", f"{num_groups} group sizes", len(ks_cpu))
        for g, k in enumerate(ks_cpu):
            if isinstance(k, bool) or not isinstance(k, int) or k < 0 or k % alignment:
                raise LayoutError(f"ks_cpu[{g}]", f"a non-negative multiple of the alignment {alignment}", k)
        if sum(ks_cpu) != rows:
            raise ShapeError("a", f"sum(ks_cpu) = {sum(ks_cpu)} rows", rows)
    elif not use_psum_layout:
        raise DeepGEMMError("ks_cpu may be None or empty only with use_psum_layout=True")
    if use_psum_layout:
        return KGroupedLayout.from_psum(grouped_layout, alignment=alignment, num_rows=rows)
    return KGroupedLayout.from_counts(list(ks_cpu), alignment=alignment, num_rows=rows)


def _k_grouped_fp8(x, argument: str, layout: KGroupedLayout, gran_k: int, arch: int | None) -> QuantizedTensor:
    """A K-grouped fp8 operand ``(data [sum K, MN], sf [sum ceil(K_g / gran_k), MN])``: scale rows
    restart at each group's start (:attr:`QuantizedTensor.row_groups`)."""
    if not (isinstance(x, (tuple, list)) and len(x) == 2):
        raise DTypeError(argument, "a (tensor, scale factors) pair", type(x).__name__)
    data, sf = x
    if not isinstance(data, torch.Tensor) or data.dtype != torch.float8_e4m3fn:
        got = data.dtype if isinstance(data, torch.Tensor) else type(data).__name__
        raise DTypeError(f"{argument}[0]", "a torch.float8_e4m3fn tensor", got)
    if not isinstance(sf, torch.Tensor) or sf.dtype not in (torch.float32, torch.int32) or sf.dim() != 2:
        got = (sf.dtype, tuple(sf.shape)) if isinstance(sf, torch.Tensor) else type(sf).__name__
        raise DTypeError(f"{argument}[1]", "2-D torch.float32 or packed torch.int32 scale factors", got)
    groups = tuple((s, e) for _, s, e in layout.segments())
    if sf.dtype == torch.int32:
        if arch == 9:
            raise DeepGEMMError(f"{argument}: packed UE8M0 scale factors need SM100 (arch_major=10)")
        sks = [-(-(e - s) // gran_k) for s, e in groups]
        words = [-(-sk // 4) for sk in sks]
        if tuple(sf.shape) != (sum(words), data.shape[1]):
            raise ShapeError(
                f"{argument}[1]",
                f"packed shape {(sum(words), data.shape[1])} (ceil(K_g / {4 * gran_k}) rows per group)",
                tuple(sf.shape),
            )
        blocks = torch.split(sf, words)
        scale = (
            torch.cat([unpack_ue8m0(block.T, sk).T for block, sk in zip(blocks, sks)])
            if sks
            else sf.new_empty(0, data.shape[1], dtype=torch.float32)
        )
        return QuantizedTensor(data, scale, (gran_k, 1), "ue8m0", groups)
    expected = QuantizedTensor.scale_shape(tuple(data.shape), (gran_k, 1), groups)
    if tuple(sf.shape) != expected:
        raise ShapeError(f"{argument}[1]", f"shape {expected} (ceil(K_g / {gran_k}) rows per group)", tuple(sf.shape))
    scale, scale_format = fp32_scales_for_arch(sf, argument, arch, False)
    return QuantizedTensor(data, scale, (gran_k, 1), scale_format, groups)


def _run_k_grouped(qa, qb, d, c, layout) -> None:
    if c is None:
        raise DeepGEMMError("K-grouped GEMMs need c (DeepGEMM: c.has_value()); pass c=d to accumulate in place")
    api.grouped_gemm(qa, qb, layout, c=c, out=d, backend=_backend())


# == M-grouped fp8 ================================================================================
@deepgemm_api
def m_grouped_fp8_fp4_gemm_nt_contiguous(
    a,
    b,
    d,
    grouped_layout,
    recipe=None,
    recipe_a=None,
    recipe_b=None,
    compiled_dims="nk",
    disable_ue8m0_cast=False,
    use_psum_layout=False,
    ensure_zero_padding=True,
    expected_m_for_psum_layout=None,
) -> None:
    """``d[M, N] = a @ b[g].T`` per row group. ``a = (fp8 [M, K], sf)``, ``b = (fp8 [G, N, K], sf)``,
    ``d`` bf16 ``[M, N]``; ``grouped_layout``: int32 ``m_indices [M]``, or psum ``[G]`` with
    ``use_psum_layout``. ``ensure_zero_padding`` is always honoured (rows of no group are zeros);
    ``compiled_dims`` and ``expected_m_for_psum_layout`` are hints."""
    qa, qb = _fp8_pair(a, b, recipe, recipe_a, recipe_b, disable_ue8m0_cast, 3)
    _run_contiguous(
        qa, qb, _check_d(d, (torch.bfloat16,), 2), grouped_layout, use_psum_layout, expected_m_for_psum_layout
    )


@deepgemm_api
def m_grouped_fp8_fp4_gemm_nn_contiguous(
    a,
    b,
    d,
    grouped_layout,
    recipe=None,
    recipe_a=None,
    recipe_b=None,
    compiled_dims="nk",
    disable_ue8m0_cast=False,
    use_psum_layout=False,
    ensure_zero_padding=True,
) -> None:
    """As the nt form with ``b = (fp8 [G, K, N], sf [G, ceil(K/gk), ceil(N/gn)])`` (both transposed views)."""
    qa, qb = _fp8_pair(a, b, recipe, recipe_a, recipe_b, disable_ue8m0_cast, 3, transpose_b=True)
    _run_contiguous(qa, qb, _check_d(d, (torch.bfloat16,), 2), grouped_layout, use_psum_layout, None)


@deepgemm_api
def m_grouped_fp8_fp4_gemm_nt_masked(
    a,
    b,
    d,
    masked_m,
    expected_m,
    recipe=None,
    recipe_a=None,
    recipe_b=None,
    compiled_dims="nk",
    disable_ue8m0_cast=False,
) -> None:
    """``d[g, :masked_m[g]] = a[g, :masked_m[g]] @ b[g].T``; ``a = (fp8 [G, max_m, K], sf)``, ``d`` bf16
    ``[G, max_m, N]``; rows past ``masked_m[g]`` are never written. ``expected_m`` is a hint (> 0)."""
    qa, qb = _fp8_pair(a, b, recipe, recipe_a, recipe_b, disable_ue8m0_cast, 3)
    _run_masked(qa, qb, _check_d(d, (torch.bfloat16,), 3), masked_m, expected_m)


# == K-grouped fp8 ================================================================================
def _k_grouped_fp8_call(a, b, d, ks_cpu, grouped_layout, c, recipe, use_psum_layout, k_major_flat: bool) -> None:
    d = _check_d(d, (torch.float32,), 3)
    g, m, n = d.shape
    recipe = tuple(recipe) if isinstance(recipe, (tuple, list)) else recipe
    if not (isinstance(recipe, tuple) and len(recipe) == 3 and recipe[:2] == (1, 1) and recipe[2] in (32, 128)):
        raise DeepGEMMError(f"K-grouped fp8 recipes are (1, 1, 32) or (1, 1, 128), got {recipe}")
    if k_major_flat:
        if recipe != (1, 1, 128):
            raise DeepGEMMError(f"k_grouped_fp8_gemm_nt_contiguous takes recipe (1, 1, 128) only, got {recipe}")
        if use_psum_layout:
            raise DeepGEMMError("k_grouped_fp8_gemm_nt_contiguous has no psum layout")
        a, b = _unflatten_k_major(a, "a", ks_cpu, m), _unflatten_k_major(b, "b", ks_cpu, n)
    rows = _data(a).shape[0] if _data(a) is not None else 0
    layout = _k_grouped_layout(ks_cpu, grouped_layout, g, use_psum_layout, rows, fp8=True)
    arch = _arch(d)
    qa = _k_grouped_fp8(a, "a", layout, recipe[2], arch)
    qb = _k_grouped_fp8(b, "b", layout, recipe[2], arch)
    _run_k_grouped(qa, qb, d, c, layout)


def _unflatten_k_major(x, argument: str, ks_cpu, mn: int):
    """SM90's K-major K-grouped operand (1-D fp8, group ``g`` stored as its ``[MN, K_g]`` block
    flattened; ``sf [MN, sum ceil(K_g/128)]``) -> the MN-major ``([sum K, MN], [sum .., MN])`` form."""
    if not (isinstance(x, (tuple, list)) and len(x) == 2 and all(isinstance(t, torch.Tensor) for t in x)):
        raise DTypeError(argument, "a (tensor, scale factors) pair", type(x).__name__)
    flat, sf = x
    if not ks_cpu:
        raise DeepGEMMError("k_grouped_fp8_gemm_nt_contiguous needs ks_cpu")
    if flat.numel() != sum(ks_cpu) * mn:
        raise ShapeError(f"{argument}[0]", f"sum(ks_cpu) * {mn} = {sum(ks_cpu) * mn} elements", flat.numel())
    flat = flat.reshape(-1)
    parts, offset = [], 0
    for k in ks_cpu:
        parts.append(flat[offset * mn : (offset + k) * mn].view(mn, k).T)
        offset += k
    data = torch.cat(parts) if parts else flat.new_empty(0, mn)
    return data, sf.T


@deepgemm_api
def k_grouped_fp8_gemm_tn_contiguous(
    a, b, d, ks_cpu, grouped_layout, c=None, recipe=(1, 1, 128), compiled_dims="mn", use_psum_layout=False
) -> None:
    """``d[g] = c[g] + a_g.T @ b_g`` (SM100 form): ``a = (fp8 [sum K, M], sf fp32 [sum ceil(K_g/gk), M])``,
    ``b`` likewise with N; ``d``/``c`` fp32 ``[G, M, N]`` (``c`` required; ``c is d`` accumulates).
    ``ks_cpu``: per-group K (multiples of the alignment), or None/[] with ``use_psum_layout``."""
    _k_grouped_fp8_call(a, b, d, ks_cpu, grouped_layout, c, recipe, use_psum_layout, k_major_flat=False)


@deepgemm_api
def k_grouped_fp8_gemm_nt_contiguous(
    a, b, d, ks_cpu, grouped_layout, c=None, recipe=(1, 1, 128), compiled_dims="mn", use_psum_layout=False
) -> None:
    """The SM90 form of :func:`k_grouped_fp8_gemm_tn_contiguous`: each group's ``[MN, K_g]`` block is
    stored K-major and flattened, scale factors ``[MN, sum ceil(K_g/128)]``; recipe ``(1, 1, 128)``."""
    _k_grouped_fp8_call(a, b, d, ks_cpu, grouped_layout, c, recipe, use_psum_layout, k_major_flat=True)


# == bf16 =========================================================================================
@deepgemm_api
def m_grouped_bf16_gemm_nt_contiguous(
    a,
    b,
    d,
    grouped_layout,
    compiled_dims="nk",
    use_psum_layout=False,
    ensure_zero_padding=True,
    expected_m_for_psum_layout=None,
) -> None:
    """bf16 ``a [M, K]``, ``b [G, N, K]``, ``d`` bf16 ``[M, N]``; layouts as the fp8 form."""
    _run_contiguous(
        _check_bf16(a, "a", 2),
        _check_bf16(b, "b", 3),
        _check_d(d, (torch.bfloat16,), 2),
        grouped_layout,
        use_psum_layout,
        expected_m_for_psum_layout,
    )


@deepgemm_api
def m_grouped_bf16_gemm_nn_contiguous(
    a, b, d, grouped_layout, compiled_dims="nk", use_psum_layout=False, ensure_zero_padding=True
) -> None:
    """As the nt form with ``b`` bf16 ``[G, K, N]``."""
    b = _check_bf16(b, "b", 3).transpose(1, 2)
    _run_contiguous(_check_bf16(a, "a", 2), b, _check_d(d, (torch.bfloat16,), 2), grouped_layout, use_psum_layout, None)


@deepgemm_api
def m_grouped_bf16_gemm_nt_masked(a, b, d, masked_m, expected_m, compiled_dims="nk") -> None:
    """bf16 masked: ``a [G, max_m, K]``, ``b [G, N, K]``, ``d`` bf16 ``[G, max_m, N]``."""
    _run_masked(_check_bf16(a, "a", 3), _check_bf16(b, "b", 3), _check_d(d, (torch.bfloat16,), 3), masked_m, expected_m)


@deepgemm_api
def k_grouped_bf16_gemm_tn_contiguous(
    a, b, d, ks_cpu, grouped_layout, c=None, compiled_dims="mn", use_psum_layout=False
) -> None:
    """bf16 ``a [sum K, M]``, ``b [sum K, N]``; ``d``/``c`` fp32 ``[G, M, N]``, ``d[g] = c[g] + a_g.T @ b_g``."""
    d = _check_d(d, (torch.float32,), 3)
    a, b = _check_bf16(a, "a", 2), _check_bf16(b, "b", 2)
    layout = _k_grouped_layout(ks_cpu, grouped_layout, d.shape[0], use_psum_layout, a.shape[0], fp8=False)
    _run_k_grouped(a, b, d, c, layout)


# == dense (one group) ============================================================================
def _dense(
    a,
    b,
    d,
    c,
    transpose_a: bool,
    transpose_b: bool,
    fp8: bool,
    recipe=None,
    recipe_a=None,
    recipe_b=None,
    disable_ue8m0_cast=False,
) -> None:
    d = _check_d(d, (torch.bfloat16, torch.float32), 2)
    if fp8:
        if transpose_a and isinstance(a, (tuple, list)) and len(a) == 2:
            a = (a[0].T, a[1].T)
        if transpose_b and isinstance(b, (tuple, list)) and len(b) == 2:
            b = (b[0].T, b[1].T)
        qa, qb = _fp8_pair(a, b, recipe, recipe_a, recipe_b, disable_ue8m0_cast, 2)
        qb = QuantizedTensor(qb.data[None], qb.scale[None], qb.block, qb.scale_format)
        a_op, b_op, rows = qa, qb, qa.data.shape[0]
    else:
        a = _check_bf16(a, "a", 2)
        b = _check_bf16(b, "b", 2)
        a_op, b_op = (a.T if transpose_a else a), (b.T if transpose_b else b)[None]
        rows = a_op.shape[0]
    if c is not None and (not isinstance(c, torch.Tensor) or tuple(c.shape) != tuple(d.shape)):
        raise ShapeError(
            "c",
            f"None or a tensor of shape {tuple(d.shape)}",
            tuple(c.shape) if isinstance(c, torch.Tensor) else type(c).__name__,
        )
    layout = ContiguousLayout.from_counts([rows], alignment=1)
    if c is None:
        api.grouped_gemm(a_op, b_op, layout, out=d, backend=_backend())
        return
    out = api.grouped_gemm(a_op, b_op, layout, out_dtype=torch.float32, backend=_backend())
    d.copy_(out.add_(c.float()))


def _dense_api(form: str, fp8: bool):
    """DeepGEMM's dense entry point ``fp8_fp4_gemm_<form>`` / ``bf16_gemm_<form>``. ``form`` is two
    letters, one per operand as DeepGEMM names them: ``a`` is ``[M, K]`` for ``n`` and ``[K, M]`` for
    ``t``; ``b`` is ``[N, K]`` for ``t`` and ``[K, N]`` for ``n`` (transposed views)."""
    transpose_a, transpose_b = form[0] == "t", form[1] == "n"
    dims = "nk" if form[0] == "n" else "mn"  # DeepGEMM's default compiled_dims per form
    a_shape = "[K, M]" if transpose_a else "[M, K]"
    b_shape = "[K, N]" if transpose_b else "[N, K]"
    if fp8:

        def gemm(
            a, b, d, c=None, recipe=None, recipe_a=None, recipe_b=None, compiled_dims=dims, disable_ue8m0_cast=False
        ) -> None:
            _dense(a, b, d, c, transpose_a, transpose_b, True, recipe, recipe_a, recipe_b, disable_ue8m0_cast)

        name, operands = f"fp8_fp4_gemm_{form}", f"``a = (fp8 {a_shape}, sf)``, ``b = (fp8 {b_shape}, sf)``"
    else:

        def gemm(a, b, d, c=None, compiled_dims=dims) -> None:
            _dense(a, b, d, c, transpose_a, transpose_b, False)

        name, operands = f"bf16_gemm_{form}", f"bf16 ``a {a_shape}``, ``b {b_shape}``"
    gemm.__name__ = gemm.__qualname__ = name
    gemm.__doc__ = (
        f"Dense ``d = (c or 0) + a @ b.T`` in DeepGEMM's {form} form: {operands}; ``d`` bf16 or fp32 "
        "``[M, N]`` (one group through moe_hal)."
    )
    return deepgemm_api(gemm)


fp8_fp4_gemm_nt = _dense_api("nt", fp8=True)
fp8_fp4_gemm_nn = _dense_api("nn", fp8=True)
fp8_fp4_gemm_tn = _dense_api("tn", fp8=True)
fp8_fp4_gemm_tt = _dense_api("tt", fp8=True)
bf16_gemm_nt = _dense_api("nt", fp8=False)
bf16_gemm_nn = _dense_api("nn", fp8=False)
bf16_gemm_tn = _dense_api("tn", fp8=False)
bf16_gemm_tt = _dense_api("tt", fp8=False)
