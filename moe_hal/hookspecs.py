"""The plugin hooks a moe_hal backend distribution may implement — the whole plugin API.

A plugin is a module named by an entry point in the group ``moe_hal.backends``; it implements
some of these hooks with the :data:`hookimpl` marker (``from moe_hal.plugin_api import hookimpl``,
where every other name a plugin needs lives too). Each hook's docstring says when the host calls
it. The discovery hooks (backends, hardware DB, environment) are registration callbacks: the host
passes ``register``-style callables and the plugin calls them as often as it likes. Hooks must be
cheap: no device initialisation, no import of vendor stacks (torch_npu, triton, cuda-python) —
those belong in the backend class named by ``BackendSpec.impl``, imported only when the backend is
considered — except :func:`moe_hal_probe_device`, which runs only when a device is asked about.

The host calls each plugin's implementation separately, so one failing plugin cannot hide the
others; a failure is recorded with its traceback and shown by ``moe-hal info``. The order in which
plugins are called never decides anything: selection ranks backends by preference, priority,
tier and name.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Callable

import pluggy

from .backend import BackendSpec

if TYPE_CHECKING:
    from .hwdb import Match

PROJECT = "moe_hal"
#: Entry-point group under which backend distributions register their plugin module.
ENTRY_POINT_GROUP = "moe_hal.backends"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def moe_hal_register_backends(register: Callable[[BackendSpec], None]) -> None:
    """Declare backends: call ``register(spec)`` once per :class:`~moe_hal.backend.BackendSpec`.

    Called once per plugin when plugins are discovered (the first call, ``select`` or ``moe-hal
    info`` of the process; again after :func:`moe_hal.plugins.reload`). Names ``reference`` and
    ``torch`` are reserved for the built-in backends; raising fails this plugin only (phase
    ``register_backends``) and none of its backends is kept.
    """


@hookspec
def moe_hal_hardware_db(register: Callable[[str | os.PathLike], None]) -> None:
    """Contribute hardware-database entries: call ``register(path)`` with a YAML file or a
    directory of YAML files.

    Called once per plugin at discovery, after every plugin's backends are registered. The files
    are validated like the built-in entries at once; a malformed file or a duplicate id (naming
    both files) fails this plugin only (phase ``hardware_db``) and its files are not kept.
    """


@hookspec
def moe_hal_environment(
    env_var: Callable[[str, str], None], package: Callable[[str], None], fact: Callable[[str, Callable[[], str]], None]
) -> None:
    """Declare what of the environment this plugin depends on, for ``moe-hal info`` and the
    reports (the core lists no vendor variable or package itself).

    ``env_var(name, meaning)`` once per environment variable the plugin reads (its own
    ``MOE_HAL_<PLUGIN>_*`` ones and others such as ``TRITON_INTERPRET``); ``package(distribution)``
    per library whose version decides results (``triton``, ``torch_npu``); ``fact(name, read)`` per
    fact of the machine worth a bug report (driver or CANN version), ``read`` being a zero-argument
    callable returning one line of text. Called once per plugin at discovery; ``read`` is called
    only by ``moe-hal info`` and the reports, one at a time, and a ``read`` that raises shows its
    error instead of a value.
    """


@hookspec
def moe_hal_conformance_manifest(backend_name: str) -> str | os.PathLike | None:
    """Return the path of this plugin's expected-failure manifest for ``backend_name`` (a YAML
    file whose every entry has a reason), or None when the plugin has none for that backend.

    Called by the conformance runner once per plugin for each backend it tests; the manifests of
    every plugin that returns one apply. Raising fails this plugin only (phase
    ``conformance_manifest``).
    """


@hookspec
def moe_hal_probe_device(device_type: str, index: int | None) -> Match | None:
    """Recognise the device ``device_type:index`` (``index`` None: the current device) and return
    a :class:`moe_hal.hwdb.Match`, or None when this plugin does not handle ``device_type``.

    Called by :func:`moe_hal.match_device` (selection, ``moe-hal hw match``, ``moe-hal info``) for
    every device type but ``cpu``, one plugin at a time until one answers; unlike the other hooks
    it may import the vendor stack (torch.cuda, torch_npu), since it runs only when such a device
    is asked about. It must not raise for a device it cannot read: return a ``Match`` with
    ``entry=None`` whose ``reason`` says why (a probe that raises fails this plugin only, phase
    ``probe_device``, and the next plugin is asked). Recognition rules live in the hardware DB:
    the built-in ``cuda`` and ``npu`` rules are applied by :func:`moe_hal.hwdb.match_cuda` /
    :func:`~moe_hal.hwdb.match_npu`; a plugin adding a device type reads its own
    ``recognition.<device_type>`` block from :func:`moe_hal.hwdb.all` and reports through
    :func:`moe_hal.hwdb.decide`.
    """


@hookspec
def moe_hal_ep_transports(register: Callable[[object], None]) -> None:
    """Declare expert-parallel transports: call ``register(spec)`` once per
    :class:`moe_hal.ep.TransportSpec`. Called once per process, on the first expert-parallel
    selection; every implementation is called (none stops the others), and a duplicate name makes
    both ineligible. The spec names its implementation lazily (``"package.module:Class"``)."""
