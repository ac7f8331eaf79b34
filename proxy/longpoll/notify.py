"""Pop with notify: the client's long poll decoupled from the brokers' long polls.

Article 001's algorithm, per client long poll:

1. A first pop (no hold) on one broker: a backlog is served at once.
2. If it is empty and time remains, the long poll waits for notifications from every broker
   ("does this group have a visible message?").
3. A broker's positive notification puts it into the long poll's result queue and starts a
   consume task.
4. The long poll's own coroutine takes the results one at a time and pops that broker, so
   one client poll never takes more than one batch. (It once started a consume task per
   result in a task group of its own, serialised by a lock: the same order, but a task
   group, a lock and an event for each of 10,000 idle long polls.)
5. An empty pop means another client or proxy got the message first: that broker's
   notification is re-armed and the long poll goes on.
6. The long poll ends when messages are found or at the deadline (a pop in flight is
   cancelled with it; custody releases what it popped). A batch not full yet first pops,
   at once, the brokers of the signals already queued for it, then those whose watch
   reported messages that no long poll holds a signal for (StrategyBase._fill): it waits
   for nothing more, but brings what is there.

The notifications of step 2 are shared by every long poll of this proxy through the
``NotificationHub`` (``proxy.longpoll.hub``): one notification is held per broker and group,
not one per long poll, and a "has message" goes to ONE waiting long poll (the oldest not
about to end), which passes it on when its pop leaves more behind, finds nothing, or is not needed.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Coroutine, Sequence
from dataclasses import replace
from typing import Any

import anyio
from popmq.broker.contract.port import ConsumePort
from popmq.broker.contract.types import PopRequest, PopResult
from popmq.proxy.events import ProxyEvents
from popmq.proxy.longpoll.base import (
    LongPollRequest,
    PortsMoved,
    StrategyBase,
    is_broker_down,
    is_refused_request,
)
from popmq.proxy.longpoll.calls import BrokerCalls, remaining_ms
from popmq.proxy.longpoll.custody import Custody
from popmq.proxy.longpoll.deadlines import Deadlines
from popmq.proxy.longpoll.hub import Channel, NotificationHub, Subscriber

from popmq.tracing import start_span, tracing_on

# The fill window of a receive woken by a signal (``proxy.fill_window_turns``,
# ``proxy.fill_window_ms``; docs/longpolling.md, "The fill window").
FILL_TURNS = 8
FILL_MAX_MS = 2.0


class _LongPoll(Subscriber):
    """The state of one client long poll in its notify phase: what 10,000 idle long polls
    hold each, so slots and nothing made before a signal needs it. It is the hub's one
    subscriber for this long poll in every broker's channel."""

    __slots__ = ("closed", "ended", "found", "moved", "refused", "results", "wake")

    def __init__(self, deadline: float, want: int, now: float) -> None:
        super().__init__(deadline, want, now)
        # 3. The result queue: channels whose broker reported a message to this long
        # poll, made on the first signal (most idle long polls never get one).
        self.results: deque[Channel] | None = None
        self.wake: asyncio.Future[None] | None = None  # set while the poll waits for a signal
        self.found = False
        self.ended = False  # its deadline passed, or the proxy drains: answer with what it has
        self.closed = False
        self.refused: Exception | None = None  # a pop refused the request itself: ends it
        self.moved = False  # the cluster's ports changed: is one of ours a new leader's?

    def cancel(self) -> None:
        """The deadline's timer, or drain(): end the wait (not a cancellation: the long poll
        leaves its loop and answers, as a cancel scope at the deadline made it)."""
        self.ended = True
        wake = self.wake
        if wake is not None and not wake.done():
            wake.set_result(None)

    expire = cancel  # the strategy's shared deadline timer (proxy.longpoll.deadlines)

    def on_ports_changed(self) -> None:
        self.moved = True
        wake = self.wake
        if wake is not None and not wake.done():
            wake.set_result(None)

    # The cluster's change listener is the long poll itself: a bound method made for each
    # held poll (and kept by the cluster's set while it waits) was 64 B of each of 10,000.
    __call__ = on_ports_changed

    def on_signal(self, channel: Channel) -> bool:
        """The hub hands this long poll a broker's "has message"; False declines it."""
        if self.closed or self.found or self.ended:
            return False
        if self.results is None:
            self.results = deque()
        self.results.append(channel)
        wake = self.wake
        if wake is not None and not wake.done():
            wake.set_result(None)
        return True


class NotifyStrategy(StrategyBase):
    name = "notify"
    # A shared timer on the waits and a scope around each pop (StrategyBase.keeps_deadline).
    keeps_deadline = True

    def __init__(
        self,
        calls: BrokerCalls,
        metrics: ProxyEvents,
        *,
        label: str | None = None,
        probe_false_empty: bool = True,
        fill_turns: int = FILL_TURNS,
        fill_max_ms: float = FILL_MAX_MS,
    ) -> None:
        super().__init__(calls, metrics, label=label, probe_false_empty=probe_false_empty)
        # The fill window of a woken receive (_fill_window): turns of the loop, and its bound.
        self.fill_turns = fill_turns
        self.fill_max_s = fill_max_ms / 1000
        self.hub = NotificationHub(calls)
        self._deadlines = Deadlines()  # one timer for every waiting poll's deadline

    def _poll(
        self,
        brokers: Sequence[ConsumePort],
        request: LongPollRequest,
        deadline: float,
        custody: Custody,
    ) -> Coroutine[Any, Any, None]:
        # Not a coroutine itself: untraced, the first pop and the wait run in one frame, the
        # only one of this strategy's a held poll keeps (about 0.3 KiB a frame, 10,000 polls).
        if tracing_on():
            return self._traced_poll(brokers, request, deadline, custody)
        return self._notify_wait(brokers, request, deadline, custody, first_pop=True)

    async def _traced_poll(
        self,
        brokers: Sequence[ConsumePort],
        request: LongPollRequest,
        deadline: float,
        custody: Custody,
    ) -> None:
        if await self._first_pop(brokers, request, deadline, custody):
            return
        with start_span("popmq.long_poll.notify_wait"):
            await self._notify_wait(brokers, request, deadline, custody, first_pop=False)

    async def _first_pop(
        self,
        brokers: Sequence[ConsumePort],
        request: LongPollRequest,
        deadline: float,
        custody: Custody,
    ) -> bool:
        """1. The first pop, without holding -- only on a broker whose watch does not promise
        an event (armed and silent means empty): an idle group costs the brokers nothing.
        True when the receive is over (messages found, the deadline, drain)."""
        watches = self.hub.watches
        candidates = watches.candidates(brokers, request.pop)
        if candidates:
            first = self.picker.pick(candidates, request.preferred_broker)
            with start_span("popmq.long_poll.first_pop"):
                try:
                    with self.until(deadline) as scope:
                        result = await self.calls.pop(
                            first, replace(request.pop, poll_time_ms=0), custody
                        )
                    if scope.cancel_called:
                        return True  # the deadline (or drain): answer with what custody holds
                except Exception as exc:
                    # Guarded like the consume pops: a broker that is down (often one whose link
                    # was just lost) or leaderless must not fail the receive while others are
                    # up; its watch reports when it is back. If it is the only one, the base
                    # waits for its group's next leader (_retrying).
                    if not is_broker_down(exc):
                        raise
                    self.calls.note_error("pop", exc, first)
                    if len(brokers) == 1:
                        raise
                else:
                    if result.rest_num == 0:
                        watches.popped_empty(first, request.pop)  # re-arm: the broker tells us
                    if custody.count:
                        self.metrics.first_pop_hit(self.label)
                        return True
        if remaining_ms(deadline) == 0 or self.draining:
            return True
        # 2. Notifications from every broker (shared through the hub); consume tasks as
        # they report.
        self.metrics.went_past_first_pop()
        return False

    async def _notify_wait(
        self,
        brokers: Sequence[ConsumePort],
        request: LongPollRequest,
        deadline: float,
        custody: Custody,
        *,
        first_pop: bool,
    ) -> None:
        if first_pop and await self._first_pop(brokers, request, deadline, custody):
            return
        loop = asyncio.get_running_loop()
        pop = request.pop
        # One subscriber in every broker's channel: the long poll itself.
        poll = _LongPoll(deadline, pop.max_messages, loop.time())
        self.hub.join(brokers, pop, poll)
        source = request.source
        if source is not None:  # a new leader's port: the old one's watch would never report
            source.listen_changes(poll, on=True)
        moved = False
        # The deadline: the strategy's one timer ends the wait (and drain() the same way),
        # not a cancel scope or a timer held by each idle long poll.
        self._deadlines.add(deadline, poll)
        self._held.add(poll)
        if self.draining:
            poll.cancel()
        try:
            while not poll.found and not poll.ended:
                if poll.moved and source is not None:
                    poll.moved = False
                    if list(source.current_ports([p.name for p in brokers])) != list(brokers):
                        moved = True
                        break
                if not poll.results:
                    poll.wake = loop.create_future()
                    try:
                        await poll.wake
                    finally:
                        poll.wake = None
                    continue
                await self._consume(poll, request, deadline, custody)
        finally:
            self._held.discard(poll)
            # At once, whatever ended the long poll: signals this long poll holds go on to
            # other subscribers, and notifications nobody else needs are cancelled.
            poll.closed = True
            self._deadlines.done()
            if source is not None:
                source.listen_changes(poll, on=False)
            ending = self.hub.part(brokers, pop, poll)
            poll.results = None  # the deadline heap keeps the poll until its deadline
            if ending:  # a shielded scope only when there is something to wait for
                with anyio.CancelScope(shield=True):  # runs to its end even when cancelled
                    for job in ending:
                        await job.wait()
        if poll.refused is not None and not custody.count:
            raise poll.refused
        if moved and not custody.count:
            raise PortsMoved  # the base polls the new ports (a new leader) for the time left

    def _probe_targets(self, brokers: Sequence[ConsumePort], pop: PopRequest) -> list[ConsumePort]:
        # A broker whose watch is armed on a live link has promised an event for anything
        # visible: asking it again would cost the idle group one RPC per probe. The probe
        # still asks every broker that may have messages (an unanswered event, a lost link).
        return self.hub.watches.candidates(brokers, pop)

    def _fill_targets(
        self, brokers: Sequence[ConsumePort], pop: PopRequest
    ) -> Sequence[ConsumePort]:
        # A backlog nobody is sent to: the broker's watch reported something (or may have
        # lost an event) and no long poll holds a signal for it. Not a broker whose watch is
        # armed and silent (nothing visible), nor one whose signal another long poll is
        # about to pop (that pop would come back empty), nor one without a watch (no news).
        hub = self.hub
        return [
            port
            for port in brokers
            if (watch := hub.watches.get(port, pop)) is not None
            and watch.may_have
            and not hub.signalled(port, pop)
        ]

    def _filled(self, port: ConsumePort, pop: PopRequest, result: PopResult) -> None:
        if result.rest_num == 0:
            self.hub.watches.popped_empty(port, pop)  # re-arm: the broker tells us

    async def _consume(
        self, poll: _LongPoll, request: LongPollRequest, deadline: float, custody: Custody
    ) -> None:
        # 4. One pop at a time per long poll: the oldest result first.
        assert poll.results
        if not custody.count and self.fill_turns:
            await self._fill_window(poll)
        await self._pop_signalled(poll, poll.results.popleft(), request, deadline, custody)
        if not custody.count:
            return
        # 6. Found: no new signal comes to this long poll (it declines them). A batch not
        # full yet first takes the signals already queued here (other brokers that reported
        # messages): pops at once, no wait. Those left when it leaves go on to other polls.
        poll.found = True
        while (
            poll.results
            and custody.count < request.pop.max_messages
            and not poll.ended
            and poll.refused is None
        ):
            await self._pop_signalled(poll, poll.results.popleft(), request, deadline, custody)

    async def _fill_window(self, poll: _LongPoll) -> None:
        """A receive woken from its held poll lets the loop run up to ``fill_turns`` more
        turns, for at most ``fill_max_s``, before it pops the signalled broker: sends that
        land on that broker meanwhile ride this pop instead of waking another receive (no
        other receive is signalled for it while this one holds its signal), and signals of
        other brokers that come meanwhile are popped after it (step 6). As Kafka's
        fetch.min.bytes / fetch.max.wait.ms, but bounded in turns: on an idle loop a turn
        takes microseconds and nothing waits, on a busy one the sends of one burst land
        within a few turns. A poll about to end pops at once; one ended meanwhile (deadline,
        drain) leaves the window at once.
        Cancelled here, the long poll leaves as anywhere else: its signals go on
        (``hub.part``)."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        if now >= poll.ending_at:
            return
        until = min(now + self.fill_max_s, poll.ending_at)
        for _ in range(self.fill_turns):
            await asyncio.sleep(0)
            if poll.ended or poll.refused is not None or loop.time() >= until:
                return

    async def _pop_signalled(
        self,
        poll: _LongPoll,
        channel: Channel,
        request: LongPollRequest,
        deadline: float,
        custody: Custody,
    ) -> None:
        """Pop the broker of a signal this long poll holds, for what its batch still misses,
        and tell the hub what the pop did."""
        port = channel.port
        try:
            with (
                self.until(deadline) as scope,
                start_span("popmq.long_poll.consume", {"popmq.broker": port.name}),
            ):
                room = request.pop.max_messages - custody.count
                result = await self.calls.pop(
                    port, replace(request.pop, max_messages=room, poll_time_ms=0), custody
                )
            if scope.cancel_called:
                # The deadline (or drain) cut the pop: the long poll ends with what custody
                # holds, and leaving passes this signal on (it still holds it).
                poll.ended = True
                return
        except Exception as exc:  # a failing broker must not end the others' watch
            if is_refused_request(exc):
                # ... but a refused request would be refused again at every signal: the
                # receive ends with the refusal (a retry loop logged a line per attempt).
                poll.refused = exc
                poll.found = True
                channel.pass_on(poll)
                return
            self.calls.note_error("pop", exc, port)
            channel.missed(poll)
            return
        if result.messages:
            channel.used(poll, result.rest_num)  # more left: the hub signals further ones
        else:
            # 5. Empty: someone else got there first. The hub re-arms this broker's
            # notification (this long poll stays subscribed to it).
            channel.missed(poll)

    async def aclose(self) -> None:
        await self.hub.aclose()
        await super().aclose()
