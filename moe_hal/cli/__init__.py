"""The ``moe-hal`` command line.

Each subcommand lives in its own module of this package and exposes ``register(subparsers)``,
which adds its parser and sets ``func(args) -> int``. Modules import torch and the rest of the
library inside ``func`` so that ``moe-hal --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

#: Subcommand modules, in the order ``--help`` lists them.
SUBCOMMANDS = ("info", "run", "hw", "model", "bench", "conformance")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="moe-hal",
        description="One grouped-GEMM API for MoE layers across NVIDIA SM90/SM100, Ascend NPUs and the CPU.",
    )
    from .. import __version__

    parser.add_argument("--version", action="version", version=f"moe-hal {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        try:
            importlib.import_module(f"{__name__}.{name}").register(sub)
        except Exception as exc:  # noqa: BLE001 - one broken subcommand must not take `info` down
            _register_broken(sub, name, exc)
    _finish_help(parser)
    return parser


def _plain(text: str) -> str:
    """Docstring text without reStructuredText markup (``x``, :mod:`x`), for help screens."""
    import re

    return re.sub(r"(?::[a-z]+:)?`+([^`]+)`+", r"\1", text)


def _finish_help(parser: argparse.ArgumentParser) -> None:
    """Help screens say what they mean: descriptions without docstring markup, and every option
    help that does not state its default already gets ``(default: X)``."""
    if parser.description:
        parser.description = _plain(parser.description)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _finish_help(sub)
            continue
        if (action.help and action.help is not argparse.SUPPRESS and "default" not in action.help
                and action.default not in (None, False, argparse.SUPPRESS)):
            action.help += " (default: %(default)s)"


def _register_broken(sub, name: str, exc: Exception) -> None:
    message = f"the `{name}` subcommand failed to load: {type(exc).__name__}: {exc}"
    parser = sub.add_parser(name, help=f"(unavailable: {type(exc).__name__})", description=message)

    def report(args) -> int:
        print(f"moe-hal: {message}", file=sys.stderr)
        return 1

    parser.set_defaults(func=report)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``moe-hal`` console script; returns the process exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    import warnings

    from ..errors import MoeHalError

    shown = warnings.showwarning
    warnings.showwarning = _show_warning
    try:
        return int(args.func(args) or 0)
    except MoeHalError as exc:
        print(f"moe-hal {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    finally:
        warnings.showwarning = shown


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings as one plain line on stderr, without the library's file and line (which mean
    nothing to a command-line user and break progress output)."""
    print(f"warning: {message}", file=sys.stderr if file is None else file)


if __name__ == "__main__":
    sys.exit(main())
