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


@contextlib.contextmanager
def writes_within(
    context: grpc.aio.ServicerContext, timeout_s: float
) -> Iterator[Callable[[Any], Awaitable[None]]]:
    """A writer for a whole stream where each write gets timeout_s.

    One cancel scope for the stream, its deadline moved before each write: a scope entered
    and left per frame was ~4% of a proxy's CPU under ``bench e2e`` (one per message).
    WriterStalled leaves the block once a write waited timeout_s for the client.
    """
    # grpc.aio runs on asyncio only, and anyio's asyncio deadlines are on the loop's clock:
    # read it directly (anyio.current_time() looks its backend up on every call).
    now = asyncio.get_running_loop().time
    try:
        with anyio.fail_after(timeout_s) as scope:

            async def write(frame: Any) -> None:
                scope.deadline = now() + timeout_s
                await context.write(frame)

            yield write
    except TimeoutError:
        raise WriterStalled(f"the client read nothing for {timeout_s:g} s") from None
