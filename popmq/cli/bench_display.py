"""What `popmq bench` shows on stderr while a benchmark runs.

On a terminal: a rich progress bar for the current phase (n/total messages, msg/s, elapsed,
time left), with each finished phase kept above it and log lines printed above the bar, never
through it. Piped: one line per finished phase.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any

from rich.console import Console, RenderableType
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Column
from rich.text import Text

from popmq.bench import progress as bench_progress


class _Rate(ProgressColumn):
    def __init__(self) -> None:
        super().__init__(table_column=Column(no_wrap=True, min_width=14, justify="right"))

    def render(self, task: Task) -> Text:
        rate = task.fields.get("rate", 0.0)
        return Text(f"{rate:,.0f} msg/s" if rate else "", style="green")


class _TimeLeft(ProgressColumn):
    """At the shown rate (rich's own estimate averages another window)."""

    def render(self, task: Task) -> Text:
        eta = task.fields.get("eta")
        if task.finished or eta is None:
            return Text("")
        return Text(f"{int(eta) // 60}:{int(eta) % 60:02d} left", style="cyan")


class _PhaseBars(Progress):
    """One task per phase; counts are read from the benchmark's BenchProgress at each refresh
    (the benchmark only bumps integers)."""

    def __init__(self, bench: bench_progress.BenchProgress, console: Console) -> None:
        self._bench = bench  # before super(): its Live renders once while being built
        self._shown_index = 0
        self._task: TaskID | None = None
        super().__init__(
            TextColumn("[bold]{task.description}"), BarColumn(bar_width=20), MofNCompleteColumn(),
            _Rate(), TimeElapsedColumn(), _TimeLeft(),
            console=console, refresh_per_second=4, transient=False,
        )  # fmt: skip

    def get_renderables(self) -> Iterable[RenderableType]:
        self.sync()
        yield from super().get_renderables()

    def sync(self) -> None:
        b = self._bench
        if b.phase_index != self._shown_index:
            self._task = None  # add_task refreshes, which calls here again: touch no old bar
            self._shown_index = b.phase_index
            self._task = self.add_task(f"{b.name} {b.phase}", total=b.total)
        if self._task is not None:
            self.update(self._task, completed=b.phase_messages, rate=b.rate(), eta=b.eta_s())

    def close_phase(self, bench: bench_progress.BenchProgress) -> None:
        """A phase ended: its bar keeps its final figures (made now if no refresh saw it)."""
        self.sync()
        if self._task is not None and bench.phase_index == self._shown_index:
            done = bench.phase_messages
            self.update(self._task, completed=done, total=bench.total or done,
                        rate=bench.rate(), eta=None)  # fmt: skip
            self.stop_task(self._task)


@contextlib.contextmanager
def _logs_above(console: Console) -> Iterator[None]:
    """Log handlers writing to the real stderr write through the live display instead (rich
    then prints each record above the bar); restored afterwards."""
    swapped: list[tuple[logging.StreamHandler[Any], Any]] = []
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler) and handler.stream in (
            sys.__stderr__, console.file,
        ):  # fmt: skip
            swapped.append((handler, handler.setStream(sys.stderr)))
    try:
        yield
    finally:
        for handler, stream in swapped:
            handler.setStream(stream)


@contextlib.contextmanager
def live_progress(
    name: str, console: Console | None = None
) -> Iterator[bench_progress.BenchProgress]:
    console = console or Console(file=sys.stderr)
    bench = bench_progress.BenchProgress(name=name)
    if console.is_terminal:
        bars = _PhaseBars(bench, console)
        bench.on_phase = bars.close_phase
        with bars, _logs_above(console):  # Live redirects sys.stderr while it runs
            bench_progress.attach(bench)
            try:
                yield bench
            finally:
                bench_progress.attach(None)
                if bench.phase_index:
                    bars.close_phase(bench)
        return

    def log_phase(p: bench_progress.BenchProgress) -> None:
        of = f"/{p.total:,}" if p.total else ""
        print(f"[{name}] {time.monotonic() - p.started:7.1f} s  {p.phase}: "
              f"{p.phase_messages:,}{of} messages, {p.rate():,.0f} msg/s",
              file=console.file, flush=True)  # fmt: skip

    bench.on_phase = log_phase
    bench_progress.attach(bench)
    try:
        yield bench
    finally:
        bench_progress.attach(None)
        if bench.phase_index:
            log_phase(bench)
