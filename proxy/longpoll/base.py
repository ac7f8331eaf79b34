"""The long-poll contract between the proxy's ReceiveMessage handler and the strategies.

A strategy turns one client receive into broker calls: it returns as soon as messages are
found on any broker, or ``[]`` when ``poll_ms`` has passed. ``StrategyBase`` holds what every
strategy shares: the deadline, the custody of popped messages, the per-call metrics and the
false-empty probe; a concrete strategy only implements ``_poll``.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import itertools
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, runtime_checkable

import anyio
from popmq.broker.contract.port import ConsumePort
from popmq.broker.contract.types import PROP_TRACE_CONTEXT, PoppedMessage, PopRequest, PopResult
from popmq.proxy.events import ProxyEvents
from popmq.proxy.longpoll.calls import BACKOFF_MAX_S, BACKOFF_START_S, BrokerCalls
from popmq.proxy.longpoll.custody import Custody

from popmq.errors import Code, PopmqError, RefusedError, TransportError
from popmq.lifecycle import AsyncClosing
from popmq.tracing import link_to, start_span, tracing_on


class BrokerSource(Protocol):
    """Where a receive finds the current port of a broker (group) it was planned on: a
    leader change replaces the port while the receive holds (the proxy's BrokerCluster)."""

    def current_ports(self, names: Sequence[str]) -> Sequence[ConsumePort]:
        """The ports now behind these names (names gone from the cluster are left out)."""
        ...

    def membership_changed(self) -> anyio.Event:
        """An event set at the next change of ports (a new leader, a leaderless group)."""
        ...

    def listen_changes(self, listener: Callable[[], None], *, on: bool) -> None:
        """Call ``listener`` at each change of ports (``on``), or stop calling it: a receive
        waiting for notifications learns of a new leader without a task of its own."""
        ...


@dataclass(slots=True)
class LongPollRequest:
    # group, topic, max_messages, invisible_time_ms, filter, fifo; queue_id -1.
    # Its poll_time_ms is ignored: the strategy sets it per broker call.
    pop: PopRequest
    # How long this call may hold, already clamped by the proxy to [min, max] long polling
    # and to the client's deadline minus a reserve.
    poll_ms: int
    # The broker of the client's message_queue, if any (the plain pop strategy goes there).
    preferred_broker: str | None = None
    # Where the brokers' current ports are found when every one of them is unavailable (a
    # leader change): the receive waits for a change there and asks the new ports.
    source: BrokerSource | None = None


@runtime_checkable
class LongPollStrategy(Protocol):
    name: str
    calls: BrokerCalls  # its broker calls: receive releases undelivered messages through them

    async def receive(
        self, brokers: Sequence[ConsumePort], request: LongPollRequest
    ) -> list[PoppedMessage]:
        """Messages from any broker as soon as found, or [] after request.poll_ms.

        Cancelling the awaiting task cancels every broker call it started; messages popped
        but not handed over are made visible again.
        """
        ...

    def drain(self) -> None:
        """The proxy is stopping: end every held receive now as if its poll time were up (an
        empty answer unless it already holds messages) and answer new ones empty at once."""
        ...

    async def aclose(self) -> None:
        """Finish background work (releases of undelivered messages, false-empty probes)."""
        ...


class BrokerPicker:
    """Round robin over the brokers, unless the client named one (its message queue's)."""

    def __init__(self) -> None:
        self._turn = itertools.count()

    def pick(self, brokers: Sequence[ConsumePort], preferred: str | None = None) -> ConsumePort:
        if preferred is not None:
            for port in brokers:
                if port.name == preferred:
                    return port
        return brokers[next(self._turn) % len(brokers)]

    def start_index(self, brokers: Sequence[ConsumePort], preferred: str | None = None) -> int:
        return brokers.index(self.pick(brokers, preferred))


def is_refused_request(exc: BaseException) -> bool:
    """The client's request itself is wrong (a 4xx code other than "too many requests", a
    timeout or "not found"): asking again, or another broker, gets the same answer, so the
    receive ends with it instead of retrying until its deadline. Not found is one broker's
    state, not the request's: topics and groups are made per broker on first use, within a
    rate (a refusal there says "retry later" with the not-found code), so another broker, or
    the same one a moment later, may serve it."""
    if not isinstance(exc, RefusedError):
        return False
    family = exc.code.value // 100
    return 400 <= family < 500 and family not in (404, 408, 429)


# A replicated group that cannot serve now: no leader, a fenced leader or a follower
# (HA_NOT_AVAILABLE), or a write whose sync barrier timed out (its in-sync follower lost).
_GROUP_UNAVAILABLE = frozenset(
    {Code.HA_NOT_AVAILABLE, Code.MASTER_PERSISTENCE_TIMEOUT, Code.SLAVE_PERSISTENCE_TIMEOUT}
)


def is_broker_down(exc: BaseException) -> bool:
    """A broker that cannot answer (down, unreachable, hung) or a broker group that cannot
    serve now (a leader change): another broker, or the same group's next leader, may serve
    the receive. Any other error (a refused request) would be the same on every broker."""
    if isinstance(exc, TransportError):
        return True
    return isinstance(exc, PopmqError) and exc.code in _GROUP_UNAVAILABLE


class PortsMoved(Exception):
    """A held receive's broker got a new port (its group elected another leader): the base
    polls the current ports for the rest of the poll time."""


class Held(Protocol):
    """What drain() ends early: a held receive's cancel scope, or the wait of a strategy
    that keeps its deadline itself."""

    def cancel(self) -> None: ...


class StrategyBase(AsyncClosing):
    """Deadline, custody, metrics and false-empty probe around one strategy's ``_poll``."""

    name = "base"
    # A strategy that keeps the deadline itself (a timer on its wait, a cancel scope from
    # ``until`` around each broker call) runs without a scope around the whole long poll:
    # an idle long poll then holds a timer, not a scope (about 1 KiB each, tracemalloc), and
    # ends at its deadline without a cancellation thrown through its frames.
    keeps_deadline = False

    def __init__(
        self,
        calls: BrokerCalls,
        metrics: ProxyEvents,
        *,
        label: str | None = None,
        probe_false_empty: bool = True,
    ) -> None:
        self.calls = calls
        self.metrics = metrics
        # The metric label: the configured strategy (adaptive labels its inner strategies
        # "adaptive" so dashboards follow the configuration, not the mode of the moment).
        self.label = label or self.name
        self.probe_false_empty = probe_false_empty
        self.picker = BrokerPicker()
        # The deadlines of the receives holding now, so drain() can bring them forward.
        self._held: set[Held] = set()  # deadlines of the held long polls
        self.draining = False

    @property
    def calls(self) -> BrokerCalls:
        return self._calls

    @calls.setter
    def calls(self, calls: BrokerCalls) -> None:
        self._calls = calls
        # One bound method for every receive's custody, not one made per receive: each of
        # 10,000 held polls kept its own (64 B).
        self._release = calls.release

    @abc.abstractmethod
    async def _poll(
        self,
        brokers: Sequence[ConsumePort],
        request: LongPollRequest,
        deadline: float,
        custody: Custody,
    ) -> None:
        """Pop until custody holds messages; the caller stops it at the deadline."""

    def receive(
        self, brokers: Sequence[ConsumePort], request: LongPollRequest
    ) -> Coroutine[Any, Any, list[PoppedMessage]]:
        # Not a coroutine itself: every frame of a held receive's stack is kept by each of
        # 10,000 idle long polls (about 300 B each), so without tracing it is _receive's.
        if tracing_on():
            return self._traced_receive(brokers, request)
        return self._receive(brokers, request)

    async def _traced_receive(
        self, brokers: Sequence[ConsumePort], request: LongPollRequest
    ) -> list[PoppedMessage]:
        attributes: dict[str, str | int] = {
            "popmq.strategy": self.label, "messaging.consumer.group.name": request.pop.group,
            "messaging.destination.name": request.pop.topic, "popmq.poll_ms": request.poll_ms,
        }  # fmt: skip
        with start_span("popmq.receive", attributes) as span:
            messages = await self._receive(brokers, request)
            if span.is_recording():
                span.set_attribute("messaging.batch.message_count", len(messages))
                for popped in messages:  # link each message to its producer's span
                    link = link_to(popped.message.properties.get(PROP_TRACE_CONTEXT, ""))
                    if link is not None:
                        span.add_link(link.context)
            return messages

    async def _receive(
        self, brokers: Sequence[ConsumePort], request: LongPollRequest
    ) -> list[PoppedMessage]:
        if not brokers or self.draining:
            return []
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + max(request.poll_ms, 0) / 1000
        self.metrics.receive_started(self.label)
        custody = Custody(self._release, request.pop)
        try:
            if request.poll_ms > 0 and not self.keeps_deadline:
                await self._retrying(brokers, request, deadline, custody, None)
            else:
                # The first poll straight from this frame: a held poll keeps no frame of the
                # outage loop's (about 0.3 KiB each of 10,000 idle polls); the loop takes
                # over only after an outage or a move of ports.
                try:
                    await self._poll(brokers, request, deadline, custody)
                    if 0 < custody.count < request.pop.max_messages and len(brokers) > 1:
                        await self._fill(brokers, request, deadline, custody)
                except Exception as failed:
                    if not (isinstance(failed, PortsMoved) or is_broker_down(failed)):
                        raise
                    await self._retrying(brokers, request, deadline, custody, failed)
        except BaseException as exc:
            # Client gone (cancelled) or a broker error: nothing popped may be lost.
            custody.abandon()
            result = "cancelled" if isinstance(exc, asyncio.CancelledError) else "error"
            self.metrics.receive_ended(self.label, result, loop.time() - started, 0)
            raise
        messages = custody.hand_over()
        elapsed = loop.time() - started
        if messages:
            self.metrics.receive_ended(self.label, "found", elapsed, len(messages))
        else:
            self.metrics.receive_ended(self.label, "empty", elapsed, 0)
            if self.probe_false_empty and not self.draining:
                targets = self._probe_targets(brokers, request.pop)
                self.calls.probe_false_empty(targets, request.pop, self.label)
        return messages

    async def _retrying(
        self,
        brokers: Sequence[ConsumePort],
        request: LongPollRequest,
        deadline: float,
        custody: Custody,
        failed: Exception | None,
    ) -> None:
        """``_poll``, but a receive whose every broker is unavailable (down, or its group
        without a leader: a leader change) does not fail: it waits for the next change of
        ports (or a back-off) and polls the current ports again, until messages are found or
        the deadline ends it empty. Each strategy already skips one unavailable broker while
        others answer; this is the case of all of them. A refused request still fails. The
        outage stays visible: each broker call's error is counted and logged once per state
        change (BrokerCalls.note_error), and these receives in unavailable_receives.
        ``failed``: how a first poll made by the caller ended (None: none made)."""
        names = [port.name for port in brokers]
        backoff = BACKOFF_START_S
        counted = False
        while True:
            exc, failed = failed, None
            if exc is None:
                try:
                    if request.poll_ms <= 0 or self.keeps_deadline:
                        await self._poll_and_fill(brokers, request, deadline, custody)
                        return
                    # The deadline is a cancel scope: it cancels _poll (a broker's own
                    # timeout still raises); drain() ends it early the same way.
                    scope = anyio.CancelScope(deadline=deadline)
                    self._held.add(scope)
                    try:
                        with scope:
                            await self._poll_and_fill(brokers, request, deadline, custody)
                    finally:
                        self._held.discard(scope)
                    return
                except Exception as error:
                    exc = error
            if isinstance(exc, PortsMoved):
                if custody.count or request.source is None:
                    return
                brokers = request.source.current_ports(names) or brokers
                continue
            if not is_broker_down(exc):
                raise exc
            if custody.count:
                return  # popped before the error: hand those over
            if not counted:
                self.metrics.receive_waited_unavailable(self.label)
                counted = True
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0 or request.poll_ms <= 0:
                return  # an empty answer: the client polls again
            source = request.source
            changed = source.membership_changed() if source is not None else None
            with self.until(asyncio.get_running_loop().time() + min(backoff, left)):
                if changed is not None:
                    await changed.wait()
                else:
                    await anyio.sleep_forever()
            if self.draining:
                return
            backoff = min(backoff * 2, BACKOFF_MAX_S)
            if source is not None:
                brokers = source.current_ports(names) or brokers

    async def _poll_and_fill(
        self,
        brokers: Sequence[ConsumePort],
        request: LongPollRequest,
        deadline: float,
        custody: Custody,
    ) -> None:
        """``_poll``; a batch it left short is filled from the other brokers (``_fill``)."""
        await self._poll(brokers, request, deadline, custody)
        if 0 < custody.count < request.pop.max_messages and len(brokers) > 1:
            await self._fill(brokers, request, deadline, custody)

    def _probe_targets(self, brokers: Sequence[ConsumePort], pop: PopRequest) -> list[ConsumePort]:
        """The brokers a false-empty probe asks (notify trusts armed watches: see there)."""
        return list(brokers)

    async def _fill(
        self,
        brokers: Sequence[ConsumePort],
        request: LongPollRequest,
        deadline: float,
        custody: Custody,
    ) -> None:
        """A receive that found fewer messages than its batch takes more from the other
        brokers at once, as RocketMQ's broker goes on to a topic's next queue until the batch
        is full: one pop without hold per broker ``_fill_targets`` names, one after another,
        each for what is still missing, until the batch is full. Without it a receive brings
        one broker's share (often one send batch) while the others' backlog waits for later
        receives, and every per-receive cost is paid again for them. It never waits for an
        arrival: a receive that has messages is answered as soon as these pops are answered.
        A failing broker is skipped (the receive keeps what it has). A FIFO group's messages
        all sit in one queue of one broker, whose pop hands out a group's next messages only
        when none is in flight, so its order holds whichever receive takes them."""
        pop = request.pop
        candidates = self._fill_targets(brokers, pop)
        if not candidates:  # pop and slices; notify when no other broker has a backlog
            return
        popped = custody.ports()
        targets = [port for port in candidates if port not in popped]
        # Start after the broker that answered, so the brokers share the extra pops evenly.
        last = brokers.index(popped[-1]) if popped[-1] in brokers else -1
        targets.sort(key=lambda port: (brokers.index(port) - last - 1) % len(brokers))
        loop = asyncio.get_running_loop()
        with self.until(deadline):
            for port in targets:
                room = pop.max_messages - custody.count
                if room <= 0 or self.draining or loop.time() >= deadline:
                    break
                try:
                    result = await self.calls.pop(
                        port, replace(pop, max_messages=room, poll_time_ms=0), custody
                    )
                except Exception as exc:  # the receive keeps what it has
                    self.calls.note_error("pop", exc, port)
                    self.metrics.fill_pop(self.label, "failed")
                    continue
                self.metrics.fill_pop(self.label, "found" if result.messages else "empty")
                self._filled(port, pop, result)

    def _fill_targets(
        self, brokers: Sequence[ConsumePort], pop: PopRequest
    ) -> Sequence[ConsumePort]:
        """The brokers a partly filled receive pops further: none here. Only notify knows
        where a backlog waits for nobody (its watches and signals); elsewhere the other
        brokers' arrivals go to their own held pops, and blind pops there came back empty
        (99 of 100 under `bench e2e --strategy pop`)."""
        return ()

    def _filled(self, port: ConsumePort, pop: PopRequest, result: PopResult) -> None:
        """What a fill pop tells the strategy (notify: a broker left empty re-arms its
        watch)."""

    @contextlib.contextmanager
    def until(self, deadline: float) -> Iterator[anyio.CancelScope]:
        """A cancel scope to ``deadline`` that drain() ends too: one step of a strategy that
        keeps its deadline itself (check ``cancel_called`` after it)."""
        scope = anyio.CancelScope(deadline=deadline)
        if self.draining:
            scope.cancel()
        self._held.add(scope)
        try:
            with scope:
                yield scope
        finally:
            self._held.discard(scope)

    def drain(self) -> None:
        self.draining = True
        for scope in list(self._held):
            # Cancelling the scope ends _poll exactly as the deadline would: broker calls
            # are cancelled and whatever was popped is handed over (or released).
            scope.cancel()

    async def aclose(self) -> None:
        await self.calls.aclose()
