"""Every exception and warning moe_hal raises.

All errors derive from :class:`MoeHalError`. Validation errors (:class:`ArgumentError` and its
subclasses) name the argument, what was expected and what was given, and are raised before any
output is written, so a caller's ``out`` tensor is untouched when one is raised. They also derive
from the matching builtin (``ValueError``/``TypeError``) so generic handlers keep working.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class MoeHalError(Exception):
    """Base class of every error the library raises."""


class _Expectation:
    """Mixed into errors that name ``argument``, what was ``expected`` and what was given
    (``actual``), with an optional ``detail``: one message format for all of them."""

    def __init__(self, argument: str, expected: Any, actual: Any, detail: str | None = None):
        self.argument = argument
        self.expected = expected
        self.actual = actual
        self.detail = detail
        text = f"{argument}: expected {expected}, got {actual}"
        if detail:
            text += f" ({detail})"
        super().__init__(text)


def _listing(header: str, items: Sequence[Any]) -> str:
    """``header`` followed by one indented ``- item`` line per item."""
    return "\n".join([header, *(f"  - {item}" for item in items)])


class ArgumentError(_Expectation, MoeHalError, ValueError):
    """An argument is invalid. ``argument``, ``expected`` and ``actual`` say which and why."""


class LayoutError(ArgumentError):
    """A grouping layout (counts, offsets, m_indices, masked_m, alignment) is inconsistent."""


class ShapeError(ArgumentError):
    """A tensor has the wrong number of dimensions or sizes that do not agree."""


class DTypeError(ArgumentError, TypeError):
    """A tensor has a dtype the operation or the backend does not accept."""


class DeviceError(ArgumentError):
    """Tensors live on different devices, or on a device the call cannot use."""


class AliasError(ArgumentError):
    """``out`` overlaps an input tensor in memory."""


class ScaleFormatError(ArgumentError):
    """Quantization scales cannot be represented in the requested physical format."""


class CapacityError(ArgumentError):
    """More tokens were routed to an expert than its capacity allows (masked dispatch)."""


class EnvironmentVariableError(ArgumentError):
    """A ``MOE_HAL_*`` environment variable holds a value moe_hal cannot parse; ``argument`` is
    the variable's name."""


class EPCapacityError(CapacityError):
    """Expert-parallel capacity dispatch: one source rank routed more slots to one expert than the
    per-(source rank, expert) ``capacity``. ``expert`` (global id), ``rank`` (the source rank),
    ``owner`` (the rank holding the expert), ``count`` and ``capacity`` say which and by how much."""

    def __init__(self, expert: int, rank: int, owner: int, count: int, capacity: int, detail: str | None = None):
        self.expert, self.rank, self.owner, self.count, self.capacity = expert, rank, owner, count, capacity
        super().__init__(
            f"expert {expert} (held by rank {owner}) from rank {rank}",
            f"at most capacity = {capacity} routed slots per (source rank, expert)",
            count,
            detail,
        )


class PeerRankError(MoeHalError, RuntimeError):
    """An expert-parallel collective was abandoned because another rank failed in it; ``ranks``
    lists the failing ranks and ``operation`` names the call (the failing rank raises its own error)."""

    def __init__(self, operation: str, ranks: Sequence[int], what: str):
        self.operation = operation
        self.ranks = list(ranks)
        super().__init__(
            f"{operation}: rank(s) {self.ranks} failed ({what}); this rank stopped with them "
            "instead of waiting in the collective"
        )


class SpawnError(MoeHalError, RuntimeError):
    """A local multi-process run (``moe_hal.ep.spawn_local``) failed; ``failures`` maps each failing
    rank to what happened to it (its error and traceback, its exit code, or the timeout)."""

    def __init__(self, failures: dict[int, str]):
        self.failures = dict(sorted(failures.items()))
        lines = [f"{len(self.failures)} rank(s) failed:"]
        lines += [f"--- rank {r}: {text}" for r, text in self.failures.items()]
        super().__init__("\n".join(lines))


class GradientError(_Expectation, MoeHalError, RuntimeError):
    """A gradient was requested through an operation that has none (fp8 operands are forward only);
    ``argument``, ``expected`` and ``actual`` say which operand and why."""


class BackendError(MoeHalError, RuntimeError):
    """Base of backend errors (selection, and a backend failing while it runs a call)."""


class BackendRunError(BackendError):
    """The selected backend ``backend`` raised while running a call (the original exception is
    chained as ``__cause__``) or returned a result that breaks the output contract (not ``out``
    when ``out`` was given; wrong type, shape, dtype or device). When it raised, a caller's ``out``
    may be partially written."""

    def __init__(self, backend: str, message: str):
        self.backend = backend
        super().__init__(f"backend {backend!r} {message}")


class BackendUnavailableError(BackendError):
    """A backend the caller named explicitly cannot run this call; ``reasons`` says why."""

    def __init__(self, backend: str, reasons: Sequence[Any], explanation: str = ""):
        self.backend = backend
        self.reasons = list(reasons)
        self.explanation = explanation
        text = _listing(f"backend {backend!r} cannot run this call:", self.reasons)
        super().__init__(f"{text}\n\n{explanation}" if explanation else text)


class NoBackendError(BackendError):
    """No known backend can run this call; ``explanation`` lists every backend and its reasons."""

    def __init__(self, explanation: str):
        self.explanation = explanation
        super().__init__("no backend can run this call\n" + explanation)


class TransportUnavailableError(BackendError):
    """No expert-parallel transport can serve the call (or the one named cannot); ``explanation``
    lists every transport and why it is not eligible."""

    def __init__(self, explanation: str):
        self.explanation = explanation
        super().__init__("no expert-parallel transport can serve this call\n" + explanation)


class PluginError(MoeHalError, RuntimeError):
    """A plugin failed to load while ``MOE_HAL_STRICT_PLUGINS=1`` asked for failures to raise."""

    def __init__(self, failures: Sequence[Any]):
        self.failures = list(failures)
        super().__init__(_listing("moe_hal plugin loading failed (MOE_HAL_STRICT_PLUGINS is set):", self.failures))


class HardwareDBError(MoeHalError, ValueError):
    """A hardware-database file is malformed; ``file`` and ``path`` locate the problem."""

    def __init__(self, file: str, path: str, message: str):
        self.file = file
        self.path = path
        self.message = message
        super().__init__(f"{file}: {path or '<root>'}: {message}")


class ConformanceError(MoeHalError, RuntimeError):
    """The conformance suite itself is misconfigured (bad manifest, hash mismatch, bad waiver)."""


class MoeHalWarning(UserWarning):
    """Base of the warnings moe_hal emits."""


class PathWarning(MoeHalWarning):
    """The library took a different path than the fastest one (fallback backend, upcast,
    dequantization, extra copy). Emitted once per distinct path per process."""


class PluginWarning(MoeHalWarning):
    """A plugin failed to load and was skipped (set ``MOE_HAL_STRICT_PLUGINS=1`` to raise)."""
