"""Declarations of expert-parallel transports: :class:`TransportSpec` and the built-in one.

Kept apart from :mod:`.transport` (registry, selection, runtime) so that the plugin host can
register the built-in transport (``moe_hal.builtin``) without importing the module that queries
the host — and so that a plugin declaring a transport imports nothing heavy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MODES = ("exact", "capacity")


@dataclass(frozen=True)
class TransportSpec:
    """Declaration of an expert-parallel transport.

    ``name``: unique name (``transport=`` on :func:`moe_hal.ep.dispatch` forces it).
    ``impl``: ``"package.module:Class"`` of the :class:`~moe_hal.ep.Transport` subclass, imported
    on first use. ``modes``: the dispatch modes it serves (``"exact"``, ``"capacity"``).
    ``process_group_backends``: ``torch.distributed`` backends it runs on (``"gloo"``, ``"nccl"``,
    ``"hccl"``, ...); ``("*",)`` for any backend that implements the two collectives.
    ``needs_host_sync`` / ``graph_safe``: see :mod:`moe_hal.ep.transport`. ``priority``: higher wins.
    """

    name: str
    impl: str
    modes: frozenset[str] = frozenset(MODES)
    process_group_backends: tuple[str, ...] = ("*",)
    needs_host_sync: bool = False
    graph_safe: bool = False
    priority: int = 0
    description: str = ""
    plugin: str = field(default="", compare=False)


BUILTIN = TransportSpec(
    name="all_to_all_single",
    impl="moe_hal.ep.transport:AllToAllSingle",
    needs_host_sync=False,
    # NCCL can capture all_to_all_single, but moe_hal has not verified capture on multi-GPU
    # hardware; a transport that has (symmetric memory, DeepEP low latency) declares it.
    graph_safe=False,
    priority=0,
    description="torch.distributed.all_to_all_single on the process group (gloo, NCCL, HCCL)",
)

__all__ = ["BUILTIN", "MODES", "TransportSpec"]
