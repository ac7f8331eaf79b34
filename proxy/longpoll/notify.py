"""Pop with notify: the client's long poll decoupled from the brokers' long polls.

Article 001's algorithm:

1. A first pop (no hold) on one broker: a backlog is served at once.
2. If it is empty and time remains, a notification task per broker long-polls "does this group
   have a visible message?".
3. A positive notification puts its broker into the long poll's result queue and starts a
   consume task.
4. A consume task takes one result and pops that broker; a lock lets only one consume task
   of a long poll pop at a time, so one client poll never takes more than one batch.
5. An empty pop means another client or proxy got the message first: that broker's
   notification is re-armed and the long poll goes on.
6. The long poll ends when messages are found or at the deadline; every task it started is
   cancelled then (they all live in one TaskGroup owned by the call).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from broker.api.port import BrokerPort
from proxy.longpoll.base import LongPollRequest, StrategyBase, remaining_ms
from proxy.longpoll.calls import BACKOFF_MAX_S, BrokerCalls
from proxy.longpoll.custody import Custody
from proxy.metrics import ProxyMetrics

# A broker that says "message" while its pops keep coming back empty (its queues are locked
# by other pullers, say) is re-armed after a growing pause instead of in a tight loop.
_MISS_PAUSE_START_S = 0.002


@dataclass(eq=False)
class _LongPoll:
    """The state of one client long poll in its notify phase."""

    brokers: Sequence[BrokerPort]
    request: LongPollRequest
    deadline: float
    custody: Custody
    group: asyncio.TaskGroup
    results: asyncio.Queue[BrokerPort] = field(default_factory=asyncio.Queue)
    consume_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    found: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    misses: dict[str, int] = field(default_factory=dict)

    def start(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = self.group.create_task(coro, name=name)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)


class NotifyStrategy(StrategyBase):
    name = "notify"

    def __init__(
        self,
        calls: BrokerCalls,
        metrics: ProxyMetrics,
        *,
        label: str | None = None,
        probe_false_empty: bool = True,
    ) -> None:
        super().__init__(calls, metrics, label=label, probe_false_empty=probe_false_empty)

    async def _poll(
        self,
        brokers: Sequence[BrokerPort],
        request: LongPollRequest,
        deadline: float,
        custody: Custody,
    ) -> None:
        # 1. The first pop, without holding.
        first = self.picker.pick(brokers, request.preferred_broker)
        await self.calls.pop(first, replace(request.pop, poll_time_ms=0), custody)
        if custody.count:
            self.metrics.first_pop_hits.labels(self.label).inc()
            return
        if remaining_ms(deadline) == 0:
            return
        # 2. Notification tasks to every broker; consume tasks as they report.
        self.metrics.pop_with_notify.inc()
        async with asyncio.TaskGroup() as group:
            poll = _LongPoll(brokers, request, deadline, custody, group)
            for port in brokers:
                poll.start(self._notification_task(poll, port), f"notify:{port.name}")
            await poll.found.wait()
            for task in list(poll.tasks):
                task.cancel()

    async def _notification_task(self, poll: _LongPoll, port: BrokerPort) -> None:
        if await self.calls.watch(port, poll.request.pop, poll.deadline):
            # 3. A positive result is cached in the result queue; a consume task follows.
            poll.results.put_nowait(port)
            poll.start(self._consume_task(poll), f"consume:{port.name}")
        # A negative result means the deadline came: this broker is done.

    async def _consume_task(self, poll: _LongPoll) -> None:
        # 4. One consume task at a time per long poll.
        async with poll.consume_lock:
            if poll.found.is_set():
                return
            try:
                port = poll.results.get_nowait()
            except asyncio.QueueEmpty:
                return  # another consume task already used this result
            try:
                await self.calls.pop(port, replace(poll.request.pop, poll_time_ms=0), poll.custody)
            except Exception as exc:  # a failing broker must not end the others' watch
                self.calls.note_error("pop", exc, port)
            if poll.custody.count:
                poll.found.set()  # 6. found: the caller cancels everything else
                return
        # 5. Empty: someone else got there first. Re-arm this broker's notification.
        misses = poll.misses.get(port.name, 0) + 1
        poll.misses[port.name] = misses
        poll.start(self._rearm(poll, port, misses), f"notify:{port.name}")

    async def _rearm(self, poll: _LongPoll, port: BrokerPort, misses: int) -> None:
        if misses > 2:
            await asyncio.sleep(min(_MISS_PAUSE_START_S * 2 ** (misses - 3), BACKOFF_MAX_S / 5))
        await self._notification_task(poll, port)
