"""Live progress of a running benchmark: its phase, the elapsed time and the running msg/s.

Benchmarks call ``phase("proxy: send")`` when they enter a phase and ``count(n)`` as messages
get through; both cost a few attribute writes and do nothing more unless a display listens
(``popmq bench`` shows one on stderr, so stdout keeps only the final table).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class BenchProgress:
    name: str = ""
    phase: str = "starting"
    started: float = field(default_factory=time.monotonic)
    phase_started: float = field(default_factory=time.monotonic)
    phase_messages: int = 0
    messages: int = 0
    on_phase: Callable[[BenchProgress], None] | None = None

    def rate(self) -> float:
        """msg/s of the current phase so far."""
        elapsed = time.monotonic() - self.phase_started
        return self.phase_messages / elapsed if elapsed > 0 else 0.0


_current: BenchProgress | None = None


def attach(progress: BenchProgress | None) -> None:
    """Make `progress` receive the reports (None: nobody listens)."""
    global _current
    _current = progress


def phase(name: str) -> None:
    progress = _current
    if progress is None:
        return
    progress.phase = name
    progress.phase_started = time.monotonic()
    progress.phase_messages = 0
    if progress.on_phase is not None:
        progress.on_phase(progress)


def count(messages: int) -> None:
    progress = _current
    if progress is not None:
        progress.phase_messages += messages
        progress.messages += messages
