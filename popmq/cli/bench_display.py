"""The live line `popmq bench` shows on stderr while a benchmark runs."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator

from rich.console import Console
from rich.live import Live
from rich.text import Text

from popmq.bench import progress as bench_progress


class _Line:
    def __init__(self, progress: bench_progress.BenchProgress) -> None:
        self._progress = progress

    def __rich__(self) -> Text:
        p = self._progress
        now = time.monotonic()
        text = Text()
        text.append(f"{p.name} ", style="bold")
        text.append(f"{p.phase}", style="cyan")
        text.append(f"  elapsed {now - p.started:6.1f} s  phase {now - p.phase_started:5.1f} s")
        if p.messages:
            text.append(f"  {p.rate():,.0f} msg/s", style="green")
            text.append(f"  ({p.messages:,} messages)")
        return text


@contextlib.contextmanager
def live_progress(name: str) -> Iterator[bench_progress.BenchProgress]:
    """On a terminal: one line redrawn 4 times a second. Piped: one stderr line per phase."""
    console = Console(file=sys.stderr)
    progress = bench_progress.BenchProgress(name=name)
    if console.is_terminal:
        with Live(_Line(progress), console=console, refresh_per_second=4, transient=True):
            bench_progress.attach(progress)
            try:
                yield progress
            finally:
                bench_progress.attach(None)
        return

    def log_phase(p: bench_progress.BenchProgress) -> None:
        print(f"[{name}] {time.monotonic() - p.started:7.1f} s  {p.phase}", file=sys.stderr)

    progress.on_phase = log_phase
    bench_progress.attach(progress)
    try:
        yield progress
    finally:
        bench_progress.attach(None)
