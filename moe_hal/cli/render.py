"""How the command line prints tables and lines: data is never read as markup, key columns are
never cut, and piped output is not squeezed into 80 columns.

Every cell and every piece of data goes through :class:`rich.text.Text`, so text in square brackets
(reason codes such as ``[hw_feature_missing]``, ``pip install moe-hal-ascend[npu]``,
``[direct]``) prints as written. Key columns (ids, names a user types back, numbers) get a minimum
width of their longest cell and never wrap; the other columns fold. Output that is not a terminal
gets an unlimited width, so a table keeps its natural width in logs and pipes.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from rich.progress import Progress

#: Width of a console whose output is not a terminal: wide enough that no table is ever squeezed.
PIPE_WIDTH = 100_000


def console(stderr: bool = False) -> Console:
    """A console on stdout (or stderr): the terminal's width, or unlimited when piped."""
    stream = sys.stderr if stderr else sys.stdout
    interactive = hasattr(stream, "isatty") and stream.isatty()
    return Console(stderr=stderr, width=None if interactive else PIPE_WIDTH, highlight=False)


def progress_bar(on: Console) -> Progress:
    """A bar of counted steps on ``on`` that clears when it stops: the description (literal text,
    never markup, so ``[direct]`` prints as written), the bar, steps done / total, time elapsed."""
    # imported here: only the commands that run long steps draw one
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    return Progress(*columns, console=on, transient=True)


def text(value: Any, style: str | None = None) -> Text:
    """``value`` as literal text (never parsed as markup), optionally styled."""
    if isinstance(value, Text):
        return value
    return Text("" if value is None else str(value), style=style or "")


def join(*parts: Any) -> Text:
    """Literal pieces (or ``(text, style)`` pairs) joined into one line."""
    out = Text()
    for part in parts:
        out.append_text(text(*part) if isinstance(part, tuple) else text(part))
    return out


def table(
    title: str | None,
    columns: Sequence[str],
    rows: Iterable[Sequence[Any]],
    *,
    key: Iterable[str] = (),
    right: Iterable[str] = (),
    row_styles: Sequence[str | None] | None = None,
) -> Table:
    """A table whose cells are literal text. ``key``: columns that are never wrapped or cut (the
    longest cell sets their minimum width); the others fold when the console is narrow. ``right``:
    columns aligned right (numbers). ``row_styles``: one style (or None) per row."""
    key, right = set(key), set(right)
    cells = [[text(v) for v in row] for row in rows]
    t = Table(title=text(title) if title else None, title_justify="left")
    for i, name in enumerate(columns):
        justify = "right" if name in right else "left"
        if name in key:
            width = max([len(name), *(c[i].cell_len for c in cells)])
            t.add_column(text(name), justify=justify, no_wrap=True, min_width=width)
        else:
            t.add_column(text(name), justify=justify, overflow="fold")
    for n, row in enumerate(cells):
        t.add_row(*row, style=row_styles[n] if row_styles else None)
    return t
