"""Pop with notify: the client's long poll decoupled from the brokers' long polls.

Article 001's algorithm, per client long poll:

1. A first pop (no hold) on one broker: a backlog is served at once.
2. If it is empty and time remains, the long poll waits for notifications from every broker
   ("does this group have a visible message?").
3. A broker's positive notification puts it into the long poll's result queue and starts a
   consume task.
4. A consume task takes one result and pops that broker; a lock lets only one consume task
   of a long poll pop at a time, so one client poll never takes more than one batch.
5. An empty pop means another client or proxy got the message first: that broker's
   notification is re-armed and the long poll goes on.
6. The long poll ends when messages are found or at the deadline; every task it started is
   cancelled then (they all live in one TaskGroup owned by the call).

The notifications of step 2 are shared by every long poll of this proxy through the
``NotificationHub`` (``proxy.longpoll.hub``): one notification is held per broker and group,
not one per long poll, and a "has message" goes to ONE waiting long poll (the oldest), which
passes it on when its pop leaves more behind, finds nothing, or is not needed.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import anyio
from anyio.abc import TaskGroup
from popmq.broker.contract.port import ConsumePort
from popmq.broker.contract.types import PopRequest
from popmq.proxy.longpoll.base import (
    LongPollRequest,
    StrategyBase,
    is_broker_down,
    is_refused_request,
)
from popmq.proxy.longpoll.calls import BrokerCalls, remaining_ms
from popmq.proxy.longpoll.custody import Custody
from popmq.proxy.longpoll.hub import NotificationHub, Subscription
from popmq.proxy.metrics import ProxyMetrics

from popmq.tracing import tracer


@dataclass(eq=False)
class _LongPoll:
    """The state of one client long poll in its notify phase."""

    request: LongPollRequest
    deadline: float
    custody: Custody
    group: TaskGroup  # the long poll's own: its consume tasks end with it
    consume: Callable[[_LongPoll], Coroutine[Any, Any, None]]  # the consume step
    # 3. The result queue: subscriptions whose broker reported a message to this long poll.
    # A plain deque (only put/get without waiting), made on the first signal: most idle
    # long polls never get one, and 10,000 of them should not carry 10,000 asyncio.Queues.
    results: deque[Subscription] | None = None
    consume_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    found: asyncio.Event = field(default_factory=asyncio.Event)
    closed: bool = False
    refused: Exception | None = None  # a consume pop refused the request itself: ends the poll

    def on_signal(self, sub: Subscription) -> bool:
        """The hub hands this long poll a broker's "has message"; False declines it."""
        if self.closed or self.found.is_set():
            return False
        try:
            self.group.start_soon(self.consume, self, name=f"consume:{sub.port.name}")
        except RuntimeError:  # the task group is shutting down: this long poll is ending
            return False
        if self.results is None:
            self.results = deque()
        self.results.append(sub)
        return True


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
        self.hub = NotificationHub(calls)

    async def _poll(
        self,
        brokers: Sequence[ConsumePort],
        request: LongPollRequest,
        deadline: float,
        custody: Custody,
    ) -> None:
        # 1. The first pop, without holding -- only on a broker whose watch does not promise
        # an event (armed and silent means empty): an idle group costs the brokers nothing.
        watches = self.hub.watches
        candidates = watches.candidates(brokers, request.pop)
        if candidates:
            first = self.picker.pick(candidates, request.preferred_broker)
            with tracer().start_as_current_span("popmq.long_poll.first_pop"):
                try:
                    result = await self.calls.pop(
                        first, replace(request.pop, poll_time_ms=0), custody
                    )
                except Exception as exc:
                    # Guarded like the consume pops: a broker that is down (often one whose link
                    # was just lost) or leaderless must not fail the receive while others are
                    # up; its watch reports when it is back. If it is the only one, the base
                    # waits for its group's next leader (_poll_through_outages).
                    if not is_broker_down(exc):
                        raise
                    self.calls.note_error("pop", exc, first)
                    if len(brokers) == 1:
                        raise
                else:
                    if result.rest_num == 0:
                        watches.popped_empty(first, request.pop)  # re-arm: the broker tells us
                    if custody.count:
                        self.metrics.first_pop_hits.labels(self.label).inc()
                        return
        if remaining_ms(deadline) == 0:
            return
        # 2. Notifications from every broker (shared through the hub); consume tasks as
        # they report.
        self.metrics.pop_with_notify.inc()
        with tracer().start_as_current_span("popmq.long_poll.notify_wait"):
            await self._notify_wait(brokers, request, deadline, custody)

    async def _notify_wait(
        self,
        brokers: Sequence[ConsumePort],
        request: LongPollRequest,
        deadline: float,
        custody: Custody,
    ) -> None:
        async with anyio.create_task_group() as group:
            poll = _LongPoll(request, deadline, custody, group, self._consume_task)
            subs = [self.hub.subscribe(port, request.pop, deadline, poll.on_signal)
                    for port in brokers]  # fmt: skip
            try:
                await poll.found.wait()
            finally:
                # At once, whatever ended the long poll: signals this long poll holds go on
                # to other subscribers, and notifications nobody else needs are cancelled.
                poll.closed = True
                with anyio.CancelScope(shield=True):  # runs to its end even when cancelled
                    await self.hub.leave(subs)
            group.cancel_scope.cancel()  # consume tasks still running: this poll has its batch
        if poll.refused is not None and not custody.count:
            raise poll.refused

    def _probe_targets(self, brokers: Sequence[ConsumePort], pop: PopRequest) -> list[ConsumePort]:
        # A broker whose watch is armed on a live link has promised an event for anything
        # visible: asking it again would cost the idle group one RPC per probe. The probe
        # still asks every broker that may have messages (an unanswered event, a lost link).
        return self.hub.watches.candidates(brokers, pop)

    async def _consume_task(self, poll: _LongPoll) -> None:
        # 4. One consume task at a time per long poll.
        async with poll.consume_lock:
            if not poll.results:
                return
            sub = poll.results.popleft()
            if poll.found.is_set():
                sub.pass_on()  # this long poll has its batch: the next subscriber pops
                return
            port = sub.port
            try:
                with tracer().start_as_current_span(
                    "popmq.long_poll.consume", attributes={"popmq.broker": port.name}
                ):
                    result = await self.calls.pop(
                        port, replace(poll.request.pop, poll_time_ms=0), poll.custody
                    )
            except Exception as exc:  # a failing broker must not end the others' watch
                if is_refused_request(exc):
                    # ... but a refused request would be refused again at every signal: the
                    # receive ends with the refusal (a retry loop logged a line per attempt).
                    poll.refused = exc
                    poll.found.set()
                    sub.pass_on()
                    return
                self.calls.note_error("pop", exc, port)
                sub.missed()
                return
            if poll.custody.count:
                poll.found.set()  # 6. found: the caller cancels everything else
                sub.used(result.rest_num)  # more left: the hub signals further subscribers
                return
        # 5. Empty: someone else got there first. The hub re-arms this broker's notification
        # (this long poll stays subscribed to it).
        sub.missed()

    async def aclose(self) -> None:
        await self.hub.aclose()
        await super().aclose()
