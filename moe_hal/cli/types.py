"""Argument types shared by the subcommands: each refuses a bad value while the command line is
parsed, so the user gets argparse's one-line usage error (exit status 2) instead of a traceback
from deep inside the command."""

from __future__ import annotations

import argparse
import os


def positive_int(text: str) -> int:
    """An int >= 1."""
    return _int(text, 1)


def non_negative_int(text: str) -> int:
    """An int >= 0."""
    return _int(text, 0)


def _int(text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {value}")
    return value


def device(text: str) -> str:
    """A torch device string (``cpu``, ``cuda:1``, ``npu``): checked by torch, which knows the
    device types of this build (plugins such as torch_npu add theirs when loaded)."""
    import torch

    try:
        torch.device(text)
    except (RuntimeError, ValueError) as exc:
        raise argparse.ArgumentTypeError(f"not a torch device: {text!r} ({str(exc).splitlines()[0]})") from None
    return text


def output_file(text: str) -> str:
    """A file the command will write: its directory must exist (checked before any work is done)."""
    folder = os.path.dirname(os.path.abspath(text))
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"cannot write {text!r}: the directory {folder!r} does not exist")
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"cannot write {text!r}: it is a directory")
    return text
