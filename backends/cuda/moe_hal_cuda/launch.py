"""Host side of the kernels: grids, device-side layout tensors, strides, and the launches.

Each function takes plain tensors (the fp8 *data* of quantized operands), optional
:class:`~moe_hal_cuda.scales.Physical` scales, an output tensor and an explicit
:class:`~moe_hal_cuda.configs.KernelConfig`; the backend picks the config, benchmarks may pass any.

**No host synchronisation.** Nothing here reads a device value on the host: grids come from host
sizes (row count, group count, ``max_m``, N) and the kernels find their tiles from device tensors
(:mod:`moe_hal_cuda.kernels`). The only device data a call may need uploaded are a layout's group
ends (and, for K-grouped calls, starts), which the layout uploads once per device without making
the host wait (``psum_on`` / ``bounds_on``, :func:`moe_hal.layouts.upload`); a copy cannot be
recorded into a CUDA graph, so a contiguous or K-grouped call captured in a graph needs one call
with its layout before capture (the graph then replays that routing). Every small tensor a kernel indexes without a stride argument (``masked_m``, the
layout tensors) is made contiguous first; everything else has its strides passed.
"""

from __future__ import annotations

import functools

import torch

from moe_hal.plugin_api import IdentityTable

from . import kernels  # first: it sets TRITON_INTERPRET before triton is imported
from .configs import KernelConfig
from .scales import SCALES_NONE, Physical

#: Programs per SM of the persistent masked kernel.
PROGRAMS_PER_SM = 2
#: Programs of the persistent masked kernel when it is interpreted (no SMs to fill).
INTERPRETED_PROGRAMS = 3


@functools.lru_cache(maxsize=None)
def resident_programs(device: torch.device) -> int:
    """Programs of the persistent masked kernel on ``device``: ``PROGRAMS_PER_SM`` per SM (a
    host-side property, no sync), :data:`INTERPRETED_PROGRAMS` off the GPU."""
    if device.type != "cuda" or kernels.INTERPRET:
        return INTERPRETED_PROGRAMS
    return PROGRAMS_PER_SM * torch.cuda.get_device_properties(device).multi_processor_count


def _cdiv(x: int, y: int) -> int:
    """Ceiling division of host ints (``triton.cdiv`` is a jit function: slower on the host)."""
    return -(-x // y)


def _scale_args(s: Physical | None, dims: int, dummy: torch.Tensor):
    """(tensor, strides padded to ``dims``, kind, rows per scale) for a kernel launch."""
    if s is None:
        return dummy, (0,) * dims, SCALES_NONE, 1
    strides = tuple(s.tensor.stride())
    return s.tensor, (0,) * (dims - len(strides)) + strides, s.kind, s.rows_per_scale


def _check_config(config: KernelConfig, scaled: bool) -> None:
    if scaled and 128 % config.block_k:
        raise ValueError(f"BLOCK_K={config.block_k} must divide 128 (the scale block along K) for fp8")


#: Operand sources of the contiguous and masked kernels (the ``B_TMA`` constexpr).
B_POINTER, B_TMA_K_MAJOR, B_TMA_N_MAJOR = 0, 1, 2


@functools.lru_cache(maxsize=None)
def _checked_block(*block: int) -> list[int]:
    """``block`` as a list, after Triton's own check of a descriptor box (powers of two, at most
    the largest tile): it depends on the config only, so it runs once per box shape."""
    from triton._utils import validate_block_shape  # here: triton is imported after kernels' set-up

    validate_block_shape(list(block))
    return list(block)


def _make_descriptor(t: torch.Tensor, shape: list, strides: list, block: list) -> kernels.TensorDescriptor:
    """A zero-padded, non-TF32 TMA descriptor built without ``TensorDescriptor.__post_init__``:
    the caller has made every check it makes (:func:`_tma_readable`, :func:`_checked_block`);
    re-running them costs ~5 us per descriptor on the host, on every launch."""
    desc = object.__new__(kernels.TensorDescriptor)
    desc.__dict__.update(
        base=t, shape=shape, strides=strides, block_shape=block, padding="zero", round_f32_to_tf32=False
    )
    return desc


def _tma_readable(t: torch.Tensor, shape, strides) -> bool:
    """Whether TMA can read ``t`` seen as ``shape``/``strides``: not when the base or an outer
    stride is not a multiple of 16 bytes, the inner stride is not 1, a dimension is empty or the
    rank is not 1-5 (the hardware's rules for ``cuTensorMapEncodeTiled``; the checks of
    ``TensorDescriptor.__post_init__``). Plain loops: this runs on every launch."""
    if t.data_ptr() % 16 or strides[-1] != 1 or 0 in shape or not 0 < len(shape) <= 5:
        return False
    size = t.element_size()
    for stride in strides[:-1]:
        if stride <= 0 or stride * size % 16:
            return False
    return True


def _descriptor(t: torch.Tensor, shape: list, strides: list, block: list) -> kernels.TensorDescriptor | None:
    """A TMA descriptor of ``t`` seen as ``shape``/``strides``, or None when TMA cannot read it."""
    if not _tma_readable(t, shape, strides):
        return None
    return _make_descriptor(t, shape, strides, _checked_block(*block))


#: Launch entries of weight operands (``b`` of the contiguous and masked kernels, the same tensor
#: call after call), per tensor object: what a launch with that weight and a config can reuse.
#: The table never holds the tensor (an entry holds no tensor; a call builds ``b``'s descriptor
#: from the entry's checked geometry) and drops the entry when the tensor dies. Within it,
#: entries are keyed by everything the TMA checks read (address, dtype, shape, strides) and the
#: config object, so a tensor changed in place (``set_``, ``resize_``) is checked again.
_weight_geometry = IdentityTable()


class _WeightEntry:
    """What the launches of one weight state with one config share: ``kind`` (``B_TMA``),
    ``descriptor`` (the fields of ``b``'s TMA descriptor but its base; None for pointer loads),
    ``strides`` (of ``b``), ``boxes`` (the checked TMA box of ``a``, by its rank) and ``kwargs``
    (the launch keywords, per kernel, scale kind and A_TMA; callers unpack them, never change
    them). It holds ``config``, so the config's ``id`` in its key cannot pass to another object."""

    __slots__ = ("config", "kind", "descriptor", "strides", "boxes", "kwargs")

    def __init__(self, b: torch.Tensor, shape, strides, config: KernelConfig):
        g, n, k = shape
        sg, sn, sk = strides
        bn, bk = config.block_n, config.block_k
        if sk == 1:
            geometry = ([g, n, k], [sg, sn, 1], (1, bn, bk), B_TMA_K_MAJOR)
        else:
            geometry = ([g, k, n], [sg, sk, sn], (1, bk, bn), B_TMA_N_MAJOR)
        self.config, self.strides, self.kwargs = config, strides, {}
        if _tma_readable(b, geometry[0], geometry[1]):
            self.kind = geometry[3]
            self.descriptor = dict(
                shape=geometry[0],
                strides=geometry[1],
                block_shape=_checked_block(*geometry[2]),
                padding="zero",
                round_f32_to_tf32=False,
            )
        else:
            self.kind, self.descriptor = B_POINTER, None
        bm = config.block_m
        self.boxes = {2: _checked_block(bm, bk), 3: _checked_block(1, bm, bk)}

    def launch_kwargs(self, kernel: str, scales: int, a_tma: bool) -> dict:
        """The keywords of a ``kernel`` launch (``contiguous`` or ``masked``), built once."""
        key = (kernel, scales, a_tma)
        hit = self.kwargs.get(key)
        if hit is None:
            hit = self.kwargs[key] = dict(
                _launch_kwargs(self.config),
                SCALES=scales,
                GROUP_CHUNK=kernels.GROUP_CHUNK,
                A_TMA=a_tma,
                B_TMA=self.kind,
                **({"GROUP_M": self.config.group_m} if kernel == "contiguous" else {}),
            )
        return hit


def _weight_entry(b: torch.Tensor, config: KernelConfig) -> _WeightEntry:
    """The launch entry of ``b[G, N, K]`` with ``config`` (cached per tensor, see above)."""
    shape, strides = b.shape, b.stride()
    ident = (b.data_ptr(), b.dtype, shape, strides, id(config))
    known = _weight_geometry.slot(b)
    entry = known.get(ident)
    if entry is None:
        entry = known[ident] = _WeightEntry(b, shape, strides, config)
    return entry


def _sources(a: torch.Tensor, a_strides: tuple, b: torch.Tensor, entry: _WeightEntry) -> tuple:
    """``(a source, A_TMA, b source)``: TMA descriptors where the operand allows, else the tensors."""
    shape = a.shape
    a_src, a_tma = a, False
    if _tma_readable(a, shape, a_strides):
        a_src, a_tma = _make_descriptor(a, list(shape), list(a_strides), entry.boxes[len(shape)]), True
    if entry.descriptor is None:
        return a_src, a_tma, b
    b_src = object.__new__(kernels.TensorDescriptor)
    b_src.__dict__.update(entry.descriptor, base=b)
    return a_src, a_tma, b_src


def operand_sources(a: torch.Tensor, b: torch.Tensor, config: KernelConfig):
    """``(a source, A_TMA, b source, B_TMA)`` for the contiguous (``a[rows, K]``) and masked
    (``a[G, max_m, K]``) kernels: TMA descriptors where the operand's alignment allows, else the
    tensors themselves (pointer loads with masks, pipelined by cp.async). ``b[G, N, K]`` is
    described K-major (stride 1 along K) or, for a 16-bit N-major weight, as ``[G, K, N]``."""
    entry = _weight_entry(b, config)
    a_src, a_tma, b_src = _sources(a, a.stride(), b, entry)
    return a_src, a_tma, b_src, entry.kind


def tma_note(op: str, a: torch.Tensor, b: torch.Tensor, config: KernelConfig, k_major: bool = False) -> str:
    """How the kernel of ``op`` loads the operands ``a`` and ``b`` it is given (for ``explain()``;
    ``k_major`` as for :func:`k_grouped`: its token-major copies are aligned by construction)."""
    fallback = "cp.async (base or stride not 16-byte aligned, so no TMA)"
    if op == "k_grouped":
        a_tma = (k_major and a.numel() > 0) or _descriptor(
            a, list(a.shape), list(a.stride()), [config.block_k, config.block_m]
        ) is not None
        b_tma = (k_major and b.numel() > 0) or _descriptor(
            b, list(b.shape), list(b.stride()), [config.block_k, config.block_n]
        ) is not None
        copies = "token-major copies of " if k_major else ""
        return (
            f"operands: whole steps of {copies}a by {'TMA' if a_tma else fallback}, of {copies}b by "
            f"{'TMA' if b_tma else fallback}{' (K-major for the fp8 MMA)' if k_major else ''}; "
            "a group's partial first and last step by masked loads"
        )
    _, a_tma, _, b_tma = operand_sources(a, b, config)
    return f"operands: a by {'TMA' if a_tma else fallback}, b by {'TMA' if b_tma else fallback}"


#: Token stride of a token-major copy: a multiple of 16 elements, so every row of the copy
#: starts 16-byte aligned (vectorised async copies for fp8).
TOKEN_STRIDE_MULTIPLE = 16


def token_major(x: torch.Tensor) -> torch.Tensor:
    """``x[T, MN]`` with the same values, contiguous along T: a view of ``[MN, align(T, 16)]``
    with strides ``(1, align(T, 16))``. The copy is a device operation queued on the current
    stream (no host sync); its memory comes from torch's caching allocator, which keeps it
    until the kernel that reads it is done."""
    t, mn = x.shape
    width = _cdiv(max(t, 1), TOKEN_STRIDE_MULTIPLE) * TOKEN_STRIDE_MULTIPLE
    buf = torch.empty(mn, width, dtype=x.dtype, device=x.device)
    buf[:, :t].copy_(x.t())
    return buf[:, :t].t()


def _k_grouped_source(x: torch.Tensor, k_major: bool, block_mn: int, block_k: int):
    """``(source, TMA?, (token stride, MN stride))`` of the K-grouped kernel's whole steps for
    the operand ``x[T, MN]``: with ``k_major`` a :func:`token_major` copy, seen ``[MN, T]``, else
    ``x`` seen ``[T, MN]``; a TMA descriptor with a box of one step where the alignment allows,
    else the tensor (pointer loads; the strides are for those)."""
    src = token_major(x) if k_major else x
    t, mn = src.shape
    st, smn = src.stride()
    if k_major:
        desc = _descriptor(src, [mn, t], [smn, st], [block_mn, block_k])
    else:
        desc = _descriptor(src, [t, mn], [st, smn], [block_k, block_mn])
    return (src, False, (st, smn)) if desc is None else (desc, True, (0, 0))


@functools.lru_cache(maxsize=256)
def _launch_kwargs(config: KernelConfig) -> dict:
    """The config's launch keywords, built once per config (callers unpack it, never change it)."""
    return dict(
        BLOCK_M=config.block_m,
        BLOCK_N=config.block_n,
        BLOCK_K=config.block_k,
        INTERPRET=kernels.INTERPRET,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )


@functools.lru_cache(maxsize=1024)
def _k_grouped_kwargs(config: KernelConfig, scales: int, k_major: bool, a_tma: bool, b_tma: bool) -> dict:
    """The K-grouped kernel's launch keywords, built once per combination (callers unpack it)."""
    return dict(
        _launch_kwargs(config), SCALES=scales, GROUP_M=config.group_m, TOKEN_MAJOR=k_major, A_TMA=a_tma, B_TMA=b_tma
    )


def contiguous(
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor,
    layout,
    config: KernelConfig,
    *,
    sa: Physical | None = None,
    sb: Physical | None = None,
) -> torch.Tensor:
    """``out[r] = a[r] @ b[group(r)].T`` for ``a[num_rows, K]``, ``b[G, N, K]``, ``out[num_rows, N]``;
    rows of no group are written as zeros."""
    _check_config(config, sa is not None)
    num_rows, k = a.shape
    groups, n, _ = b.shape
    if out.numel() == 0:
        return out
    if groups == 0:
        return out.zero_()
    sa_t, sa_strides, kind, _ = _scale_args(sa, 2, a)
    sb_t, sb_strides, _, sb_rows = _scale_args(sb, 3, a)
    row_tiles = -(-num_rows // config.block_m) + groups  # upper bound; the kernel finds the real ones
    grid = (row_tiles * -(-n // config.block_n),)
    entry = _weight_entry(b, config)
    a_strides = a.stride()
    a_src, a_tma, b_src = _sources(a, a_strides, b, entry)
    kernels.contiguous_kernel[grid](
        a_src,
        b_src,
        out,
        sa_t,
        sb_t,
        layout.psum_on(a.device),
        groups,
        layout.alignment,
        num_rows,
        n,
        k,
        *a_strides,
        *entry.strides,
        *out.stride(),
        *sa_strides,
        *sb_strides,
        sb_rows,
        **entry.launch_kwargs("contiguous", kind, a_tma),
    )
    return out


def masked(
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor,
    masked_m: torch.Tensor,
    config: KernelConfig,
    *,
    sa: Physical | None = None,
    sb: Physical | None = None,
    programs: int | None = None,
) -> torch.Tensor:
    """``out[g, r] = a[g, r] @ b[g].T`` for ``r < masked_m[g]`` (read on the device); other rows of
    ``out`` are never written. ``a[G, max_m, K]``, ``b[G, N, K]``, ``out[G, max_m, N]``.
    ``programs``: size of the persistent grid (default :func:`resident_programs`)."""
    _check_config(config, sa is not None)
    g, max_m, k = a.shape
    n = b.shape[1]
    if out.numel() == 0:
        return out
    masked_m = masked_m.contiguous()  # the kernel indexes it as a dense [G] array
    sa_t, sa_strides, kind, _ = _scale_args(sa, 3, a)
    sb_t, sb_strides, _, sb_rows = _scale_args(sb, 3, a)
    most = g * _cdiv(max_m, config.block_m) * _cdiv(n, config.block_n)
    grid = (min(most, programs or resident_programs(a.device)),)
    entry = _weight_entry(b, config)
    a_strides = a.stride()
    a_src, a_tma, b_src = _sources(a, a_strides, b, entry)
    kernels.masked_kernel[grid](
        a_src,
        b_src,
        out,
        sa_t,
        sb_t,
        masked_m,
        g,
        max_m,
        n,
        k,
        *a_strides,
        *entry.strides,
        *out.stride(),
        *sa_strides,
        *sb_strides,
        sb_rows,
        **entry.launch_kwargs("masked", kind, a_tma),
    )
    return out


def k_grouped(
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor,
    layout,
    config: KernelConfig,
    *,
    c: torch.Tensor | None = None,
    sa: Physical | None = None,
    sb: Physical | None = None,
    k_major: bool = False,
) -> torch.Tensor:
    """``out[g] = (c[g] or 0) + a[rows_g].T @ b[rows_g]`` for ``a[T, M]``, ``b[T, N]``, ``out[G, M, N]``;
    ``out`` may be ``c`` itself. ``k_major``: feed the MMA K-major operands (SM90 fp8) — whole
    steps read :func:`token_major` copies of ``a`` and ``b``, made here. Whole steps read
    through TMA where the (copied) operand's alignment allows (:func:`_k_grouped_source`)."""
    _check_config(config, sa is not None)
    m, n = a.shape[1], b.shape[1]
    groups = out.shape[0]
    if out.numel() == 0:
        return out
    bounds = layout.bounds_on(a.device)
    sa_t, sa_strides, kind, _ = _scale_args(sa, 2, a)
    sb_t, sb_strides, _, _ = _scale_args(sb, 2, a)
    c_t = c if c is not None else out
    a_src, a_tma, a_strides = _k_grouped_source(a, k_major, config.block_m, config.block_k)
    b_src, b_tma, b_strides = _k_grouped_source(b, k_major, config.block_n, config.block_k)
    grid = (groups * _cdiv(m, config.block_m) * _cdiv(n, config.block_n),)
    kernels.k_grouped_kernel[grid](
        a,
        b,
        a_src,
        b_src,
        c_t,
        out,
        sa_t,
        sb_t,
        bounds,
        m,
        n,
        *a.stride(),
        *b.stride(),
        *a_strides,
        *b_strides,
        *c_t.stride(),
        *out.stride(),
        *sa_strides,
        *sb_strides,
        bounds.stride(0),
        int(c is not None),
        **_k_grouped_kwargs(config, kind, k_major, a_tma, b_tma),
    )
    return out
