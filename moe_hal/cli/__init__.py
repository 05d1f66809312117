"""The ``moe-hal`` command line.

Each subcommand lives in its own module of this package and exposes ``register(subparsers)``,
which adds its parser and sets ``func(args) -> int``. Modules import torch and the rest of the
library inside ``func`` so that ``moe-hal --help`` stays fast.

Exit statuses (:data:`EXIT_STATUSES`, also shown by ``moe-hal --help``): an error is reported as
one line on stderr, never as a traceback (``moe-hal --traceback ...`` shows it).
"""

from __future__ import annotations

import argparse
import importlib
import sys

#: Subcommand modules, in the order ``--help`` lists them.
SUBCOMMANDS = ("info", "run", "hw", "model", "bench", "conformance")
#: What each exit status of ``moe-hal`` means.
EXIT_STATUSES = {
    0: "success",
    1: "the command ran and found a failure (a conformance or verification failure, a regression), "
    "or an unexpected internal error",
    2: "invalid use: a bad argument, environment variable, input file or hardware-DB file; or no "
    "backend can run the call",
    3: "moe-hal info printed everything but found problems (plugins failing under "
    "MOE_HAL_STRICT_PLUGINS, a malformed hardware-DB file, an environment variable it cannot parse)",
    130: "interrupted",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="moe-hal",
        description="One grouped-GEMM API for MoE layers across NVIDIA SM90/SM100, Ascend NPUs and the CPU.",
        epilog="exit status: " + "; ".join(f"{code} {meaning}" for code, meaning in EXIT_STATUSES.items()),
    )
    from .. import __version__

    parser.add_argument("--version", action="version", version=f"moe-hal {__version__}")
    parser.add_argument("--traceback", action="store_true", help="on an error, print the Python traceback too")
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
        if (
            action.help
            and action.help is not argparse.SUPPRESS
            and "default" not in action.help
            and action.default not in (None, False, argparse.SUPPRESS)
        ):
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

    from ..errors import BackendRunError, MoeHalError

    shown = warnings.showwarning
    warnings.showwarning = _show_warning
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # noqa: BLE001 - the command line reports errors, it does not crash
        if args.traceback:
            import traceback

            traceback.print_exc()
        print(_error_line(args.command, exc), file=sys.stderr)
        invalid_use = isinstance(exc, (MoeHalError, OSError)) and not isinstance(exc, BackendRunError)
        return 2 if invalid_use else 1
    finally:
        warnings.showwarning = shown


def _error_line(command: str, exc: Exception) -> str:
    """``moe-hal <command>: error: <first line>``: the first line of a library error already says
    what, expected and given; the lines after it (a selection's explanation) follow indented."""
    from ..errors import MoeHalError

    text = str(exc).strip() or type(exc).__name__
    if not isinstance(exc, MoeHalError):
        text = f"{type(exc).__name__}: {text}"
        if not isinstance(exc, OSError):
            text += " (an unexpected error: rerun with `moe-hal --traceback ...` and report it)"
    first, _, rest = text.partition("\n")
    line = f"moe-hal {command}: error: {first}"
    return line + ("\n" + "\n".join("    " + r for r in rest.splitlines()) if rest.strip() else "")


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings as one plain line on stderr, without the library's file and line (which mean
    nothing to a command-line user and break progress output)."""
    print(f"warning: {message}", file=sys.stderr if file is None else file)


if __name__ == "__main__":
    sys.exit(main())
