"""Benchmark tables as text (rich), the same in a terminal, a log file and a report."""

from __future__ import annotations

import io

from rich import box
from rich.console import Console
from rich.table import Table


def grid(rows: list[list[str]]) -> list[str]:
    """Lines of a table whose first row is the header; the first column is left-aligned
    (names), the others right-aligned (figures)."""
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for index, header in enumerate(rows[0]):
        table.add_column(header, justify="left" if index == 0 else "right")
    for row in rows[1:]:
        table.add_row(*row)
    out = io.StringIO()
    Console(file=out, width=400, color_system=None).print(table)
    return [line.rstrip() for line in out.getvalue().splitlines()]
