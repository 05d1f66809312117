"""Errors of the DeepGEMM shim: each is a :class:`~moe_hal.errors.MoeHalError` *and* the exception
type DeepGEMM raises for the same condition, so ``except RuntimeError`` written for DeepGEMM and
``except MoeHalError`` written for moe_hal both catch it.

DeepGEMM's host checks (``DG_HOST_ASSERT``) surface in Python as ``RuntimeError``; pybind11's
argument conversion failures as ``TypeError``; a missing attribute as ``AttributeError``.
"""

from __future__ import annotations

from ...errors import ArgumentError, MoeHalError


class DeepGEMMError(MoeHalError, RuntimeError):
    """A call DeepGEMM would refuse with a host assertion (its ``RuntimeError``)."""


class NotProvidedError(MoeHalError, AttributeError):
    """A DeepGEMM entry point the shim does not provide (attention, einsum, mega-MoE, ...).

    An ``AttributeError``, so ``hasattr(deep_gemm, name)`` and ``getattr(deep_gemm, name, None)``
    probing keeps working. ``name`` is the entry point; ``provided`` lists what the shim offers.
    """

    def __init__(self, name: str, provided: list[str]):
        self.name = name
        self.provided = list(provided)
        super().__init__(
            f"moe_hal.compat.deep_gemm does not provide {name!r} (only grouped/dense GEMMs, "
            f"scale-layout helpers and settings); provided: {', '.join(self.provided)}"
        )


_ARGUMENT_ERRORS: dict[type, type] = {}


def as_deepgemm_error(exc: ArgumentError) -> ArgumentError:
    """The same error re-typed as a subclass of both its moe_hal class and ``RuntimeError``
    (DeepGEMM's type for the host check it replaces); argument/expected/actual are kept."""
    cls = type(exc)
    twin = _ARGUMENT_ERRORS.get(cls)
    if twin is None:
        twin = type(
            f"DeepGEMM{cls.__name__}",
            (cls, RuntimeError),
            {
                "__doc__": f"{cls.__name__} raised through the DeepGEMM shim (also a RuntimeError).",
                "__module__": __name__,
            },
        )
        _ARGUMENT_ERRORS[cls] = twin
    new = twin.__new__(twin)
    new.__dict__.update(exc.__dict__)
    new.args = exc.args
    return new


__all__ = ["DeepGEMMError", "NotProvidedError", "as_deepgemm_error"]
