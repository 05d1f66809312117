"""EPGroup: which rank holds which expert, over one ``torch.distributed`` process group."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch
import torch.distributed as dist

from ..errors import ArgumentError, LayoutError


class EPGroup:
    """An expert-parallel group: ``num_experts`` experts sharded over the ranks of ``process_group``.

    ``process_group``: a ``torch.distributed`` process group (None: the default group, which must be
    initialized). ``placement``: int ``[E]`` (sequence or tensor), ``placement[e]`` = rank holding
    expert ``e``; uneven placements and ranks holding no expert are allowed. Default: contiguous
    blocks, rank ``r`` holds experts ``[r * E // W, (r + 1) * E // W)`` (``E / W`` each when W
    divides E).

    Rank ``r``'s **local experts** are the experts it holds in increasing global id; local index
    ``l`` is the position in that list, and ``w_local[l]`` is the weight of ``local_experts[l]``.
    Everything here is host-side metadata; building an EPGroup communicates nothing (every rank
    must build it alike: dispatch checks :attr:`placement_digest` across the ranks). The group also
    keeps the reusable buffers for rows in flight (:meth:`scratch`).
    """

    def __init__(
        self,
        process_group: dist.ProcessGroup | None = None,
        num_experts: int = 0,
        placement: Sequence[int] | torch.Tensor | None = None,
    ):
        if not dist.is_available() or not dist.is_initialized():
            raise ArgumentError(
                "process_group",
                "an initialized torch.distributed process group (call torch.distributed.init_process_group first)",
                "not initialized",
            )
        if isinstance(num_experts, bool) or not isinstance(num_experts, int) or num_experts < 1:
            raise ArgumentError("num_experts", "a positive int", num_experts)
        self.process_group = process_group if process_group is not None else dist.group.WORLD
        self.rank: int = dist.get_rank(self.process_group)
        self.world_size: int = dist.get_world_size(self.process_group)
        if self.rank < 0:
            raise ArgumentError("process_group", "a group this process belongs to", "a group without this rank")
        #: the backend as torch reports it: one name (``"gloo"``), or a device map such as
        #: ``"cpu:gloo,cuda:nccl"`` (:meth:`backend_for` reads it)
        self.backend: str = str(dist.get_backend(self.process_group))
        self.num_experts = num_experts
        self.placement: tuple[int, ...] = self._check_placement(placement)
        #: a 56-bit digest of the placement, the same in every process: dispatch's count exchange
        #: states it, since ranks whose groups disagree would read each other's counts wrongly
        self.placement_digest: int = int.from_bytes(
            hashlib.blake2b(repr(self.placement).encode(), digest_size=7).digest(), "big"
        )
        #: global expert ids held by each rank, increasing
        self.experts_of_rank: tuple[tuple[int, ...], ...] = tuple(
            tuple(e for e, r in enumerate(self.placement) if r == rank) for rank in range(self.world_size)
        )
        #: position of each expert in (holding rank, local index) order: the order rows are sent in
        order = [e for rank_experts in self.experts_of_rank for e in rank_experts]
        self.expert_position: tuple[int, ...] = tuple(order.index(e) for e in range(num_experts))
        #: first position of each rank's experts in that order (length world_size + 1)
        self.position_start: tuple[int, ...] = tuple(
            sum(len(x) for x in self.experts_of_rank[:r]) for r in range(self.world_size + 1)
        )
        #: the order of the send rows in both modes: each expert's *block* is its position, with this
        #: rank's own experts moved last — the rows for other ranks are then contiguous and in rank
        #: order (one all-to-all moves them), and the rows for its own experts, which never enter the
        #: all-to-all, are the tail.
        own = range(self.position_start[self.rank], self.position_start[self.rank + 1])
        block_position = [p for p in range(num_experts) if p not in own] + list(own)
        self.block_position: tuple[int, ...] = tuple(block_position)  # position of each block
        position_block = {p: b for b, p in enumerate(block_position)}
        self.send_block: tuple[int, ...] = tuple(position_block[p] for p in self.expert_position)
        #: rank holding each send block's expert, and ``world_size`` for block ``E`` (slots not sent)
        self.block_rank: tuple[int, ...] = tuple(
            next(d for d in range(self.world_size) if p < self.position_start[d + 1]) for p in block_position
        ) + (self.world_size,)
        #: received rows in capacity mode: one fixed chunk per source rank, this rank's own last
        self.rank_chunk: tuple[int, ...] = tuple(
            self.world_size - 1 if s == self.rank else s - (s > self.rank) for s in range(self.world_size)
        )
        self.chunk_rank: tuple[int, ...] = tuple(sorted(range(self.world_size), key=self.rank_chunk.__getitem__))
        self._tensors: dict[tuple, torch.Tensor] = {}  # on_device and constant, by name or values
        self._scratch: dict[tuple[str, torch.device], torch.Tensor] = {}

    def _check_placement(self, placement) -> tuple[int, ...]:
        E, W = self.num_experts, self.world_size
        if placement is None:
            return tuple(next(r for r in range(W) if e < (r + 1) * E // W) for e in range(E))
        if isinstance(placement, torch.Tensor):
            if placement.dtype.is_floating_point or placement.dtype == torch.bool or placement.dim() != 1:
                raise LayoutError(
                    "placement", f"a 1-D integer tensor [{E}]", f"{placement.dtype} {tuple(placement.shape)}"
                )
            placement = placement.tolist()
        try:
            values = tuple(int(p) for p in placement)
        except (TypeError, ValueError):
            raise LayoutError("placement", f"{E} ints (expert -> rank)", type(placement).__name__) from None
        if len(values) != E:
            raise LayoutError("placement", f"{E} entries (one rank per expert)", len(values))
        bad = next((e for e, r in enumerate(values) if not 0 <= r < W), None)
        if bad is not None:
            raise LayoutError(f"placement[{bad}]", f"a rank in [0, {W})", values[bad])
        return values

    @property
    def local_experts(self) -> tuple[int, ...]:
        """Global ids of the experts this rank holds, increasing."""
        return self.experts_of_rank[self.rank]

    @property
    def num_local_experts(self) -> int:
        return len(self.local_experts)

    def on_device(self, name: str, device: torch.device) -> torch.Tensor:
        """The int tuple attribute ``name`` (:attr:`expert_position`, :attr:`position_start`,
        :attr:`send_block`, :attr:`block_position`, :attr:`block_rank`, :attr:`rank_chunk`,
        :attr:`chunk_rank`) as int64 on ``device`` (cached)."""
        return self._cached((name, device), getattr(self, name), device)

    def constant(self, values: tuple[int, ...], device: torch.device) -> torch.Tensor:
        """``values`` as int64 on ``device`` (cached): what a call states about itself is the same
        from step to step, so after the first call it costs no host-to-device copy (which CUDA-graph
        capture, after warm-up calls, would refuse)."""
        return self._cached(("constant", values, device), values, device)

    def _cached(self, key: tuple, values: tuple[int, ...], device: torch.device) -> torch.Tensor:
        t = self._tensors.get(key)
        if t is None:
            t = self._tensors[key] = torch.tensor(values, dtype=torch.int64, device=device)
        return t

    def scratch(self, role: str, nbytes: int, device: torch.device) -> torch.Tensor:
        """A reused uint8 buffer of at least ``nbytes`` for ``role`` on ``device``: rows in flight
        between two collectives, which a fresh allocation would page in on every call (on the CPU
        that costs about as much as copying them). Calls on one group never overlap — their
        collectives must run in the same order on every rank — so one buffer per role suffices;
        whatever is returned to the caller never lives in one. Each role keeps the largest size asked
        for until :meth:`free_scratch`."""
        buf = self._scratch.get((role, device))
        if buf is None or buf.numel() < nbytes:
            buf = torch.empty(nbytes, dtype=torch.uint8, device=device)
            self._scratch[(role, device)] = buf
        return buf[:nbytes]

    def backend_for(self, device: torch.device | str) -> str:
        """The ``torch.distributed`` backend that runs this group's collectives on tensors of
        ``device``: :attr:`backend` when it is one name, else the entry of its device map for the
        device's type (``"nccl"`` for CUDA tensors of a ``"cpu:gloo,cuda:nccl"`` group, what
        ``init_process_group()`` without a backend makes on a CUDA machine). Raises
        :class:`~moe_hal.errors.ArgumentError` (``device``) when the map has no entry for it."""
        try:
            device_type = torch.device(device).type
        except (RuntimeError, TypeError):
            raise ArgumentError("device", "a torch.device or a device string", device) from None
        if ":" not in self.backend:
            return self.backend
        served = dict(entry.strip().split(":", 1) for entry in self.backend.split(","))
        if device_type not in served:
            raise ArgumentError("device", f"a device type the process group serves ({self.backend})", device_type)
        return served[device_type]

    def free_scratch(self) -> None:
        """Drop the scratch buffers (the next call allocates them again)."""
        self._scratch.clear()

    def __repr__(self) -> str:
        return (
            f"EPGroup(rank={self.rank}, world_size={self.world_size}, backend={self.backend!r}, "
            f"num_experts={self.num_experts}, local_experts={list(self.local_experts)})"
        )


__all__ = ["EPGroup"]
