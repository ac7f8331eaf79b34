"""One loop timer for the deadlines of every held long poll, not a timer each.

10,000 idle long polls each held a ``loop.call_at`` timer for their deadline: a timer handle,
its libuv timer and a copy of the context, about 0.6 KiB a poll (tracemalloc, docs/
benchmarks.md "Idle proxy, wave 8"). Here a poll's deadline is a heap entry (a tuple, under
0.1 KiB) and one timer is armed for the earliest; when it fires, every poll whose deadline
has come is ended (``expire()``) and the timer is armed for the next one.

A poll that ends before its deadline (messages found, client gone) is not looked for in the
heap: its entry stays until its deadline passes, and ending an ended poll does nothing. So
that a busy proxy (many polls answered early) does not keep their entries for a whole poll
time, the heap is rebuilt without them once they outnumber the waiting polls (``done``).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from typing import Protocol

# Deadlines this close to the timer's firing are due now: the loop may run a timer a little
# before its time (uvloop counts in milliseconds), which would otherwise re-arm it for a
# deadline it is already at.
_SLACK_S = 0.001


# Rebuild the heap once it holds this many entries more than twice the waiting polls.
_COMPACT_SLACK = 1024


class Expiring(Protocol):
    @property
    def closed(self) -> bool:
        """It has ended (its entry can go)."""
        ...

    def expire(self) -> None:
        """Its deadline has come: end the wait (called once, or never if the loop closed)."""
        ...


class Deadlines:
    """The deadlines of one strategy's held polls, on one event loop."""

    __slots__ = ("_heap", "_live", "_loop", "_order", "_timer", "_timer_at")

    def __init__(self) -> None:
        # (deadline, order, poll): the order keeps ties first come, first ended, and polls
        # themselves are never compared.
        self._heap: list[tuple[float, int, Expiring]] = []
        self._order = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = float("inf")
        self._live = 0  # polls added and not yet done

    def __len__(self) -> int:
        """Entries still in the heap (ended polls' included until their deadline)."""
        return len(self._heap)

    def add(self, deadline: float, poll: Expiring) -> None:
        """End ``poll`` at ``deadline`` (the running loop's clock)."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # a new loop (tests run one per test): start afresh
            self._reset(loop)
        heapq.heappush(self._heap, (deadline, next(self._order), poll))
        self._live += 1
        if deadline < self._timer_at:
            self._arm(deadline)

    def done(self) -> None:
        """A poll added here has ended (``closed``), at its deadline or before it."""
        self._live = max(self._live - 1, 0)
        heap = self._heap
        if len(heap) > 2 * self._live + _COMPACT_SLACK:
            heap[:] = [entry for entry in heap if not entry[2].closed]
            heapq.heapify(heap)

    def _reset(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._heap.clear()
        self._live = 0
        self._loop = loop
        self._timer = None
        self._timer_at = float("inf")

    def _arm(self, at: float) -> None:
        assert self._loop is not None
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = at
        self._timer = self._loop.call_at(at, self._fire)

    def _fire(self) -> None:
        assert self._loop is not None
        self._timer = None
        self._timer_at = float("inf")
        heap = self._heap
        due = self._loop.time() + _SLACK_S
        while heap and heap[0][0] <= due:
            _, _, poll = heapq.heappop(heap)
            poll.expire()
        if heap:
            self._arm(heap[0][0])
