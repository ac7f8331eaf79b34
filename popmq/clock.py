"""Clock: the one way popmq code reads time and sleeps, so tests can run on virtual time.

``SYSTEM`` reads the wall clock. ``LoopClock`` derives both readings from the event loop's
time, so a test under a virtual loop clock (the ``looptime`` pytest plugin) moves wall time,
monotonic time and sleeps together, without waiting for real.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int:
        """Wall-clock time in epoch milliseconds (store timestamps, invisible times)."""
        ...

    def monotonic(self) -> float:
        """Seconds for deadlines and intervals."""
        ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def now_ms(self) -> int:
        return int(time.time() * 1000)

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class LoopClock:
    """Time of the running event loop, anchored to the wall clock when first read."""

    def __init__(self, start_ms: int | None = None) -> None:
        self._start_ms = int(time.time() * 1000) if start_ms is None else start_ms
        self._anchor: float | None = None

    def monotonic(self) -> float:
        return asyncio.get_running_loop().time()

    def now_ms(self) -> int:
        now = self.monotonic()
        if self._anchor is None:
            self._anchor = now
        return self._start_ms + int((now - self._anchor) * 1000)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class ManualClock:
    """Time moved by hand (tests, simulations): set or add to ``now_s``; a sleep moves it."""

    def __init__(self, now_s: float = 0.0) -> None:
        self.now_s = now_s

    def monotonic(self) -> float:
        return self.now_s

    def now_ms(self) -> int:
        return int(self.now_s * 1000)

    async def sleep(self, seconds: float) -> None:
        self.now_s += seconds
        await asyncio.sleep(0)


SYSTEM: Clock = SystemClock()
