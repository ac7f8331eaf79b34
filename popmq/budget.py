"""A memory budget for the bytes of requests and answers in flight.

Sends, and the messages a receive is writing out, draw their size from one budget per
process; what would take it past its limit waits briefly for room, then is refused with
TOO_MANY_REQUESTS (RocketMQ's flow-control answer; clients back off and retry), so a crowd of
large requests is turned away instead of OOM-killing the process.

Limits of the idea: grpc has already received (and decoded) a request when its handler asks
the budget, so what the budget saves is every later copy (conversion, the broker link, the
store) and the time the request would be held; see docs/operations.md, sizing. When a budget
drains after large requests, the freed memory is handed back to the system (popmq.allocator).
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType

import anyio

from popmq.allocator import Trimmer
from popmq.errors import Code, RefusedError

# How long a request may wait for room before it is refused: RocketMQ's broker waits 200 ms
# in its send queue (waitTimeMillsInSendQueue) before answering SYSTEM_BUSY.
WAIT_MS = 200


class MemoryBudget:
    """At most ``limit`` bytes held at once; one request larger than the limit is let in only
    when nothing else is held (it must be able to pass alone, or it could never pass)."""

    def __init__(
        self,
        limit: int,
        what: str,
        on_refusal: Callable[[], None] | None = None,
        wait_ms: int = WAIT_MS,
        trimmer: Trimmer | None = None,
    ) -> None:
        self.limit = limit
        self.held = 0
        self._what = what
        self._on_refusal = on_refusal
        self._wait_s = wait_ms / 1000
        self._trimmer = trimmer if trimmer is not None else Trimmer()
        self._released: anyio.Event | None = None  # set (and replaced) at each release

    def _fits(self, size: int) -> bool:
        return self.held == 0 or self.held + size <= self.limit

    async def _wait_until(self, fits: Callable[[], bool], size: int) -> None:
        """Wait up to wait_ms for ``fits()``; RefusedError(TOO_MANY_REQUESTS) if it never did."""
        if fits():
            return
        with anyio.move_on_after(self._wait_s):
            while not fits():
                if self._released is None:
                    self._released = anyio.Event()
                await self._released.wait()
        if not fits():
            if self._on_refusal is not None:
                self._on_refusal()
            raise RefusedError(
                Code.TOO_MANY_REQUESTS,
                f"{self._what} is at its memory budget ({self.held} of {self.limit} bytes "
                f"in flight; this needs {size}); retry shortly",
            )

    async def acquire(self, size: int) -> None:
        """Take ``size`` bytes; RefusedError(TOO_MANY_REQUESTS) if no room came within wait_ms."""
        await self._wait_until(lambda: self._fits(size), size)
        self.held += size

    async def room(self) -> None:
        """Wait (up to wait_ms, else TOO_MANY_REQUESTS) until the budget is not full: for work
        whose size is known only once done, e.g. a pop, which then ``take``s what it got."""
        await self._wait_until(lambda: self.held < self.limit, 1)

    def take(self, size: int) -> None:
        """Take ``size`` bytes without waiting (after ``room()``: it may pass the limit by one
        answer, as one request larger than the limit passes alone)."""
        self.held += size

    def release(self, size: int) -> None:
        self.held -= size
        self._trimmer.released(size, self.held == 0)
        if self._released is not None:
            self._released.set()
            self._released = None

    def hold(self, size: int) -> Hold:
        """acquire(size) for the block (``async with``)."""
        return Hold(self, size)


class Hold:
    """``MemoryBudget.hold``: a plain class, not a generator context manager (whose making,
    entering and leaving took 3.8 us of every SendMessage; this takes 1.9); when the size
    fits, nothing is awaited and no closure is made."""

    __slots__ = ("_budget", "_size")

    def __init__(self, budget: MemoryBudget, size: int) -> None:
        self._budget = budget
        self._size = size

    async def __aenter__(self) -> None:
        budget, size = self._budget, self._size
        if budget._fits(size):  # acquire() without its closure and wait
            budget.held += size
        else:
            await budget.acquire(size)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._budget.release(self._size)
