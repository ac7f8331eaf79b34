"""Coalescer: requests for the same key, made within a short window, go to the broker as one.

RocketMQ's batch ack works this way: acks for one (group, topic) that arrive close together
cross the network as one request and are answered per entry. Here the first item of a key
opens a batch; whatever else arrives for that key during the window joins it; the batch is then
submitted once and each caller gets back the slice of the results that matches its items.

Nothing is dropped on the way: a caller whose batch fails gets the failure. A refusal of a
batch holding several callers' items (one bad request would fail the others) is retried per
caller, so each gets its own answer; a transport failure (broker down, link lost) or the broker
refusing the proxy (cluster token) is reported to every caller as it is, because repeating it
per caller would only repeat the failure. So is an answer with the wrong number of results: the
batch may have been applied, and repeating it would store a send twice.

Time comes from the injected ``sleep``, so tests drive the window without the wall clock.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import anyio
from popmq.broker.contract.errors import BrokerAuthError, BrokerUnavailableError, Code, RefusedError

from popmq.errors import TransportError

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)
I = TypeVar("I")  # noqa: E741 - an item of a batch
R = TypeVar("R")


def is_transport_failure(error: BaseException) -> bool:
    """The broker did not answer (down, link lost, deadline): not the request's fault."""
    return isinstance(error, TransportError)


@dataclass(slots=True)
class _Caller(Generic[R]):
    start: int
    end: int
    future: asyncio.Future[list[R]]


@dataclass(slots=True)
class _Batch(Generic[I, R]):
    items: list[I] = field(default_factory=list)
    callers: list[_Caller[R]] = field(default_factory=list)
    # The first caller's context: the batch is sent in it, so a trace follows the request
    # (a batch is one request, parented to the first caller's span).
    context: contextvars.Context | None = None


class Coalescer(Generic[K, I, R]):
    """Batches ``submit(key, items)`` calls per key within ``window_s``.

    ``run()`` does the flushing; its owner runs it in a task group for as long as callers may
    call ``submit``. At most ``max_items`` items go in one batch (a full batch closes and the
    next item opens another, flushed at the same window's end).
    """

    def __init__(
        self,
        submit: Callable[[K, list[I]], Awaitable[list[R]]],
        *,
        window_s: float,
        max_items: int,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._submit = submit
        self._window_s = window_s
        self._max_items = max(1, max_items)
        self._sleep = sleep
        self._open: dict[K, _Batch[I, R]] = {}
        self._closed: list[tuple[K, _Batch[I, R]]] = []
        self._ready = asyncio.Event()
        self.batches = 0  # batches submitted (metrics, tests)
        self.items = 0  # items submitted in them

    async def submit(self, key: K, items: list[I]) -> list[R]:
        """Queue items for key; return their results once their batch was answered."""
        if not items:
            return []
        batch = self._open.get(key)
        if batch is None or (len(batch.items) + len(items) > self._max_items and batch.items):
            if batch is not None:
                self._closed.append((key, batch))
            batch = self._open[key] = _Batch(context=contextvars.copy_context())
        future: asyncio.Future[list[R]] = asyncio.get_running_loop().create_future()
        start = len(batch.items)
        batch.items.extend(items)
        batch.callers.append(_Caller(start, len(batch.items), future))
        self._ready.set()
        # A caller that gives up does not take its items back: they are on their way, as a
        # unary request would be. Its own future only stops being awaited.
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            future.cancel()  # nobody reads its answer now (no "exception never retrieved")
            raise

    async def run(self) -> None:
        """Flush every window's batches until cancelled (batches in flight are awaited)."""
        try:
            async with anyio.create_task_group() as flushes:
                while True:
                    await self._ready.wait()
                    await self._sleep(self._window_s)  # the window: let more items join
                    self._ready.clear()
                    due = self._closed + list(self._open.items())
                    self._closed, self._open = [], {}
                    for key, batch in due:
                        # Each flush runs in its first caller's context (trace span and all).
                        context = batch.context or contextvars.copy_context()
                        context.run(flushes.start_soon, self._flush, key, batch)
        finally:  # closing: whoever still waits is told, never left hanging
            stopped = BrokerUnavailableError("(coalescer)", "the link is closing")
            for _, batch in self._closed + list(self._open.items()):
                _fail(batch.callers, stopped)
            self._closed, self._open = [], {}

    async def _flush(self, key: K, batch: _Batch[I, R]) -> None:
        self.batches += 1
        self.items += len(batch.items)
        try:
            results = await self._submit(key, batch.items)
        except asyncio.CancelledError:
            _fail(batch.callers, BrokerUnavailableError("(coalescer)", "the link is closing"))
            raise
        except (TransportError, BrokerAuthError) as error:
            # No answer, or the broker refuses this proxy itself: every caller is told, nobody
            # retried (per caller it would only repeat the failure, once per caller).
            _fail(batch.callers, error)
            return
        except RefusedError as error:
            if len(batch.callers) > 1:
                await self._one_by_one(key, batch)
            else:
                _fail(batch.callers, error)
            return
        except Exception as error:
            log.exception("batch for %s failed", key)
            _fail(batch.callers, error)
            return
        if len(results) != len(batch.items):
            # A broker fault, not a refusal: the batch may have been applied, so it is not
            # repeated per caller (that would send a send's messages twice).
            log.error("broker answered %d results to %d items for %s",
                      len(results), len(batch.items), key)  # fmt: skip
            _fail(batch.callers, RefusedError(
                Code.INTERNAL_ERROR,
                f"the broker answered {len(results)} results to {len(batch.items)} items",
            ))  # fmt: skip
            return
        for caller in batch.callers:
            if not caller.future.done():
                caller.future.set_result(results[caller.start : caller.end])

    async def _one_by_one(self, key: K, batch: _Batch[I, R]) -> None:
        """A refused batch: each caller's items again on their own, for its own answer, all
        at once (one after another, the last caller waited for every other's round trip)."""
        async with anyio.create_task_group() as retries:
            for caller in batch.callers:
                retries.start_soon(self._alone, key, batch.items[caller.start : caller.end], caller)

    async def _alone(self, key: K, items: list[I], caller: _Caller[R]) -> None:
        try:
            result = await self._submit(key, items)
        except Exception as error:
            _fail([caller], error)
        else:
            if not caller.future.done():
                caller.future.set_result(result)


def _fail(callers: list[_Caller[R]], error: BaseException) -> None:
    for caller in callers:
        if not caller.future.done():
            caller.future.set_exception(error)
