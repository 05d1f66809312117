"""Segment layouts carried by a device tensor alone, for compiled graphs and device-side routing.

:class:`~moe_hal.ContiguousLayout` and :class:`~moe_hal.KGroupedLayout` hold their group bounds
on the host, which is what kernels need to pick tiles, but which a traced graph cannot produce
without a host sync, and which ``torch.compile`` would bake into the graph as constants (one graph
per routing histogram). :class:`PsumLayout` holds only the int32 psum tensor ``[G]`` on the
device plus the alignment; the number of rows comes from the operand. Inside
``moe_hal.grouped_gemm`` it becomes the custom op's layout arguments unchanged; the op's eager
kernel reads the psum values on the host (one sync) to rebuild the host layout the backends take.

``PsumLayout(psum, op, alignment)`` means exactly ``ContiguousLayout.from_psum(psum, alignment,
num_rows=a.shape[0])`` (``op="contiguous"``) or the ``KGroupedLayout`` equivalent.
"""

from __future__ import annotations

import torch

from .errors import LayoutError
from .layouts import ContiguousLayout, KGroupedLayout, _check_alignment, _check_int32_vector

#: The host layout each ``op`` stands for.
HOST_LAYOUTS = {cls.op: cls for cls in (ContiguousLayout, KGroupedLayout)}


class PsumLayout:
    """A contiguous or K-grouped layout given by its device psum tensor (no host values).

    ``psum``: int32 ``[G]`` on the operands' device, ``psum[g]`` = exclusive end row of group
    ``g``; group ``g`` starts at ``align(psum[g-1], alignment)``. ``op``: ``"contiguous"``
    (``a[num_rows, K]`` M-grouped) or ``"k_grouped"`` (``a[T, M]``, ``b[T, N]``). Rows past the
    aligned end of the last group belong to no group. Values are not read here (that would be a
    host sync); the kernel that rebuilds the host layout validates them.
    """

    __slots__ = ("__weakref__", "alignment", "op", "psum")

    def __init__(self, psum: torch.Tensor, op: str = "contiguous", alignment: int = 1):
        self.psum = _check_int32_vector(psum, "psum", "[G]")
        if op not in HOST_LAYOUTS:
            raise LayoutError("op", f"one of {tuple(HOST_LAYOUTS)}", op)
        self.op = op
        self.alignment = _check_alignment(alignment)

    @property
    def num_groups(self) -> int:
        return self.psum.shape[0]

    def to_host(self, num_rows: int):
        """The equivalent :class:`~moe_hal.ContiguousLayout` / :class:`~moe_hal.KGroupedLayout` for
        an operand of ``num_rows`` rows (reads ``psum`` on the host: one sync)."""
        return HOST_LAYOUTS[self.op].from_psum(self.psum, alignment=self.alignment, num_rows=num_rows)

    def __repr__(self) -> str:
        return (
            f"PsumLayout(op={self.op!r}, num_groups={self.num_groups}, alignment={self.alignment}, "
            f"device={self.psum.device})"
        )
