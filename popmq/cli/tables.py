"""Human output of every command: rich tables on stdout (plain text when piped)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

# rich is imported when a table is printed, not with the CLI: a serving process (`popmq
# proxy`, `popmq broker`) prints none, and rich's modules cost it about 1.3 MiB of RSS
# (docs/benchmarks.md, "Idle proxy, wave 9").

# Piped output is read by grep and friends: never wrap or cut it at 80 columns.
_PIPE_WIDTH = 400


def console() -> Console:
    """A console on the current stdout (looked up per call: tests swap sys.stdout)."""
    from rich.console import Console

    tty = sys.stdout.isatty()
    return Console(file=sys.stdout, width=None if tty else _PIPE_WIDTH, soft_wrap=not tty)


def print_table(
    headers: Sequence[str],
    rows: Sequence[Sequence[Any]],
    *,
    title: str | None = None,
    numeric: bool = True,
) -> None:
    """One table; columns whose cells are all numbers are right-aligned."""
    from rich import box
    from rich.table import Table

    table = Table(
        box=box.SIMPLE_HEAD, title=title, title_justify="left", pad_edge=False, show_edge=False
    )
    for index, header in enumerate(headers):
        column = [row[index] for row in rows]
        is_number = (
            numeric
            and bool(column)
            and all(isinstance(c, int | float) and not isinstance(c, bool) for c in column)
        )
        table.add_column(str(header), justify="right" if is_number else "left")
    for row in rows:
        table.add_row(*(str(cell) for cell in row))
    console().print(table)
