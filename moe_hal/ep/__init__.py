"""Expert parallelism over ``torch.distributed``: experts sharded across ranks, tokens moved by a
pluggable transport (built in: ``all_to_all_single`` on gloo, NCCL or HCCL).

>>> g = moe_hal.ep.EPGroup(process_group=None, num_experts=E, placement=None)     # doctest: +SKIP
>>> d = moe_hal.ep.dispatch(x, topk_ids, topk_weights, g, mode="exact")            # doctest: +SKIP
>>> y = moe_hal.ep.combine(moe_hal.grouped_gemm(d.a, w_local, d.layout), d)        # doctest: +SKIP

* :class:`EPGroup` — which rank holds which expert (:mod:`.group`).
* :func:`dispatch` / :func:`combine` / :class:`EPDispatch` — the two modes, ordering, autograd and
  the failure protocol (:mod:`.exchange`; not named ``dispatch`` so that importing it never
  shadows the function).
* :func:`select` / :class:`Transport` — transports, selection and their promises
  (:mod:`.transport`); :class:`TransportSpec` declares one (:mod:`.spec`); plugins add transports
  through the ``moe_hal_ep_transports`` hook.
* :func:`spawn_local` — run a function on W local processes over gloo (:mod:`.launch`).

Names load on first access, so ``import moe_hal.ep.spec`` from a plugin stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "EPGroup": "group",
    "EPDispatch": "exchange",
    "dispatch": "exchange",
    "combine": "exchange",
    "OVERFLOW_POLICIES": "exchange",
    "select": "transport",
    "TransportSpec": "spec",
    "Transport": "transport",
    "TransportSelection": "transport",
    "transport_specs": "transport",
    "spawn_local": "launch",
}

__all__ = [
    "OVERFLOW_POLICIES",
    "EPDispatch",
    "EPGroup",
    "Transport",
    "TransportSelection",
    "TransportSpec",
    "combine",
    "dispatch",
    "select",
    "spawn_local",
    "transport_specs",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


if TYPE_CHECKING:
    from .exchange import OVERFLOW_POLICIES, EPDispatch, combine, dispatch
    from .group import EPGroup
    from .launch import spawn_local
    from .spec import TransportSpec
    from .transport import Transport, TransportSelection, select, transport_specs
