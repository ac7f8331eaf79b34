"""A memory budget for the bytes of requests and answers in flight.

Sends, and the messages a receive is writing out, draw their size from one budget per
process; what would take it past its limit waits briefly for room, then is refused with
TOO_MANY_REQUESTS (RocketMQ's flow-control answer; clients back off and retry), so a crowd of
large requests is turned away instead of OOM-killing the process.

Limits of the idea: grpc has already received (and decoded) a request when its handler asks
the budget, so what the budget saves is every later copy (conversion, the broker link, the
store) and the time the request would be held; see docs/operations.md, sizing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio

from popmq.errors import Code, RefusedError

# How long a request may wait for room before it is refused.
WAIT_S = 0.2


class MemoryBudget:
    """At most ``limit`` bytes held at once; one request larger than the limit is let in only
    when nothing else is held (it must be able to pass alone, or it could never pass)."""

    def __init__(self, limit: int, what: str, on_refusal: Callable[[], None] | None = None) -> None:
        self.limit = limit
        self.held = 0
        self._what = what
        self._on_refusal = on_refusal
        self._released: anyio.Event | None = None  # set (and replaced) at each release

    def _fits(self, size: int) -> bool:
        return self.held == 0 or self.held + size <= self.limit

    async def acquire(self, size: int) -> None:
        """Take ``size`` bytes; RefusedError(TOO_MANY_REQUESTS) if no room came within WAIT_S."""
        if not self._fits(size):
            with anyio.move_on_after(WAIT_S):
                while not self._fits(size):
                    if self._released is None:
                        self._released = anyio.Event()
                    await self._released.wait()
            if not self._fits(size):
                if self._on_refusal is not None:
                    self._on_refusal()
                raise RefusedError(
                    Code.TOO_MANY_REQUESTS,
                    f"{self._what} is at its memory budget ({self.held} of {self.limit} bytes "
                    f"in flight; this needs {size}); retry shortly",
                )
        self.held += size

    def release(self, size: int) -> None:
        self.held -= size
        if self._released is not None:
            self._released.set()
            self._released = None

    @asynccontextmanager
    async def hold(self, size: int) -> AsyncIterator[None]:
        """acquire(size) for the block."""
        await self.acquire(size)
        try:
            yield
        finally:
            self.release(size)
