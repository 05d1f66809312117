"""Run a function on ``W`` local processes joined in a gloo process group (tests, the CLI, the bench).

The parent owns the rendezvous store, bound to a free port chosen by the OS (port 0), so parallel
runs never collide. Each rank reports its result or its error through a queue; the parent enforces
a hard deadline and terminates every process still running when a rank fails or time is up, so a
broken rank can never leave the caller waiting.
"""

from __future__ import annotations

import datetime
import queue as queue_module
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ..errors import ArgumentError, SpawnError

#: After the first failure, how long the other ranks get to fail on their own (they should, through
#: dispatch's failure protocol or a closed connection) before they are terminated.
FAILURE_GRACE_S = 10.0


def _worker(
    fn: Callable[..., Any],
    rank: int,
    world_size: int,
    port: int,
    args: tuple,
    results,
    collective_timeout_s: float,
    threads: int,
) -> None:
    torch.set_num_threads(threads)
    timeout = datetime.timedelta(seconds=collective_timeout_s)
    try:
        store = dist.TCPStore("127.0.0.1", port, world_size, is_master=False, timeout=timeout)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=timeout)
        try:
            value = fn(rank, world_size, *args)
        finally:
            dist.destroy_process_group()
        results.put((rank, True, value))
    except BaseException as exc:  # noqa: BLE001 - report everything, the parent decides
        results.put((rank, False, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


def spawn_local(
    fn: Callable[..., Any],
    world_size: int,
    args: tuple = (),
    *,
    timeout_s: float = 120.0,
    collective_timeout_s: float = 30.0,
    threads: int = 1,
) -> list[Any]:
    """Call ``fn(rank, world_size, *args)`` on ``world_size`` spawned processes in one gloo group on
    127.0.0.1 and return their results in rank order (each must be picklable; ``fn`` must be a
    module-level function). ``timeout_s`` bounds the whole run; ``collective_timeout_s`` is the
    process group's timeout; ``threads``: torch threads per rank.

    Raises :class:`~moe_hal.errors.SpawnError` naming every failing rank (its error and traceback,
    its exit code, or "no result within ..."), after terminating the processes still running.
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ArgumentError("world_size", "a positive int", world_size)
    ctx = mp.get_context("spawn")
    store = dist.TCPStore(
        "127.0.0.1",
        0,
        world_size,
        is_master=True,
        wait_for_workers=False,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    results = ctx.Queue()
    procs = [
        ctx.Process(
            target=_worker,
            daemon=True,
            name=f"moe_hal-ep-rank{rank}",
            args=(fn, rank, world_size, store.port, args, results, collective_timeout_s, threads),
        )
        for rank in range(world_size)
    ]
    for p in procs:
        p.start()
    values: dict[int, Any] = {}
    failures: dict[int, str] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(values) + len(failures) < world_size:
            now = time.monotonic()
            if now >= deadline:
                break
            try:
                rank, ok, value = results.get(timeout=min(0.2, deadline - now))
            except queue_module.Empty:
                _note_silent_exits(procs, values, failures)
                continue
            (values if ok else failures)[rank] = value
            if failures:
                deadline = min(deadline, time.monotonic() + FAILURE_GRACE_S)
    finally:
        others_failed = bool(failures)
        for rank, p in enumerate(procs):
            if rank not in values and rank not in failures:
                failures[rank] = (
                    "still running after another rank failed; terminated"
                    if others_failed
                    else f"no result within {timeout_s:g} s; terminated"
                )
            _stop(p)
        results.close()
        del store
    if failures:
        raise SpawnError(failures)
    return [values[r] for r in range(world_size)]


def _note_silent_exits(procs, values: dict, failures: dict) -> None:
    """A process that exited without reporting (killed, os._exit) fails its rank — after a moment,
    since its last message may still be in flight."""
    for rank, p in enumerate(procs):
        if rank in values or rank in failures or p.exitcode is None:
            continue
        p.join(0)
        since = getattr(p, "_moe_hal_exit_seen", None)
        if since is None:
            p._moe_hal_exit_seen = time.monotonic()
        elif time.monotonic() - since > 1.0:
            failures[rank] = f"process exited with code {p.exitcode} without reporting a result"


def _stop(p) -> None:
    p.join(timeout=2.0)
    if p.is_alive():
        p.terminate()
        p.join(timeout=5.0)
    if p.is_alive():
        p.kill()
        p.join()
    p.close()


__all__ = ["FAILURE_GRACE_S", "spawn_local"]
