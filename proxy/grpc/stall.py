"""Stalled readers: a ReceiveMessage or PullMessage stream whose client stops reading.

A write waits on HTTP/2 flow control until the client reads, so a client that never reads
would keep its popped messages, its long-poll slot and the frames in memory for as long as
its connection lives. Each write gets ``proxy.write_stall_timeout_ms``; past it the stream is
given up: the servicer releases what was not written (visible again at once), frees the slot
and ends the call.

grpc.aio has no server-side cancel, and the stalled write stays queued in grpc-core (a status
cannot overtake it), so the call is ended the one quiet way it offers: the handler ends as
cancelled. The HTTP/2 stream then lingers in the transport, holding that one frame, until
the client's deadline or its connection ends.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import anyio
import grpc


class WriterStalled(Exception):
    """The client did not take a frame within the stall timeout."""


class _StallWatch:
    """One timer for a whole stream, moved only when it fires: it cancels the stream's scope
    once the write in flight (if any) has waited ``timeout_s``. Moving a deadline before each
    write cost a timer handle and a heap push per message (about 2% of a proxy's CPU under
    ``bench e2e``, one write per message); a write now costs two attribute stores."""

    __slots__ = ("_handle", "_loop", "_scope", "_timeout_s", "fired", "started")

    def __init__(
        self, loop: asyncio.AbstractEventLoop, timeout_s: float, scope: anyio.CancelScope
    ) -> None:
        self._loop = loop
        self._timeout_s = timeout_s
        self._scope = scope
        self.started: float | None = None  # when the write in flight began
        self.fired = False
        self._handle = loop.call_at(loop.time() + timeout_s, self._check)

    def _check(self) -> None:
        now = self._loop.time()
        started = self.started
        if started is not None and now - started >= self._timeout_s:
            self.fired = True
            self._scope.cancel()
            return
        # No write waited that long (yet): look again when the one in flight would stall.
        self._handle = self._loop.call_at(
            (now if started is None else started) + self._timeout_s, self._check
        )

    def stop(self) -> None:
        self._handle.cancel()


@contextlib.contextmanager
def writes_within(
    context: grpc.aio.ServicerContext, timeout_s: float
) -> Iterator[Callable[[Any], Awaitable[None]]]:
    """A writer for a whole stream where each write gets timeout_s.

    One cancel scope for the stream and one timer (_StallWatch); the time between writes
    does not count. WriterStalled leaves the block once a write waited timeout_s for the
    client.
    """
    # grpc.aio runs on asyncio only: the loop's clock is the one its timers use.
    loop = asyncio.get_running_loop()
    now = loop.time
    with anyio.CancelScope() as scope:
        watch = _StallWatch(loop, timeout_s, scope)

        async def write(frame: Any) -> None:
            watch.started = now()
            await context.write(frame)
            watch.started = None

        try:
            yield write
        finally:
            watch.stop()
    if watch.fired and scope.cancelled_caught:
        raise WriterStalled(f"the client read nothing for {timeout_s:g} s")
