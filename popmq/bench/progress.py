"""Live progress of a running benchmark: its phase, the messages through it (of how many, when
known) and the running msg/s.

Benchmarks call ``phase("proxy: send", total=5000)`` when they enter a phase, ``count(n)`` as
messages get through, and ``measure()`` / ``measured()`` around the interval their final table
times, so the live rate is the same quotient as the table's. These cost a few attribute writes
and do nothing more unless a display listens (``popmq bench`` shows one on stderr, so stdout
keeps only the final table).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class BenchProgress:
    name: str = ""
    phase: str = "starting"
    phase_index: int = 0  # 1 for the first phase; a display notices a new phase by it
    total: int | None = None  # messages the phase will move, when known
    started: float = field(default_factory=time.monotonic)
    phase_started: float = field(default_factory=time.monotonic)
    phase_ended: float | None = None  # the measured interval's end, once known
    phase_messages: int = 0
    messages: int = 0  # over every phase
    on_phase: Callable[[BenchProgress], None] | None = None

    def rate(self) -> float:
        """msg/s of the current phase so far (of its measured interval, once it ended)."""
        end = self.phase_ended if self.phase_ended is not None else time.monotonic()
        elapsed = end - self.phase_started
        return self.phase_messages / elapsed if elapsed > 0 else 0.0

    def eta_s(self) -> float | None:
        """Seconds left at the current rate (None: no total, or no rate yet)."""
        rate = self.rate()
        if self.total is None or rate <= 0:
            return None
        return max(self.total - self.phase_messages, 0) / rate


_current: BenchProgress | None = None


def attach(progress: BenchProgress | None) -> None:
    """Make `progress` receive the reports (None: nobody listens)."""
    global _current
    _current = progress


def phase(name: str, total: int | None = None) -> None:
    progress = _current
    if progress is None:
        return
    if progress.on_phase is not None and progress.phase_index:
        progress.on_phase(progress)  # the phase that ends, with its final figures
    progress.phase = name
    progress.phase_index += 1
    progress.total = total
    progress.phase_started = time.monotonic()
    progress.phase_ended = None
    progress.phase_messages = 0


def measure() -> None:
    """The phase's timed interval starts now (after its setup: servers, topics)."""
    progress = _current
    if progress is not None:
        progress.phase_started = time.monotonic()
        progress.phase_ended = None
        progress.phase_messages = 0


def measured() -> None:
    """The phase's timed interval ended: its rate stops moving."""
    progress = _current
    if progress is not None:
        progress.phase_ended = time.monotonic()


def count(messages: int) -> None:
    progress = _current
    if progress is not None:
        progress.phase_messages += messages
        progress.messages += messages
