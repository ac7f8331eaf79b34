"""Broker calls made by the long-poll strategies, counted in the proxy's metrics.

``BrokerCalls`` also owns the strategies' background work in one TaskOwner: pops that must
finish even when their caller is gone, releasing popped messages nobody will receive, and
probing for false empty responses. ``aclose()`` drains them for up to CLOSE_GRACE_S (releases
protect messages), then cancels the rest, so nothing outlives the proxy.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, replace
from typing import Any

from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.port import ConsumePort, in_process
from popmq.broker.contract.types import (
    NotifyRequest,
    NotifyResult,
    PoppedMessage,
    PopRequest,
    PopResult,
    PopStatus,
)
from popmq.proxy.events import ProxyEvents
from popmq.proxy.longpoll.custody import Custody

from popmq.clock import SYSTEM, Clock
from popmq.errors import PopmqError
from popmq.lifecycle import AsyncClosing, TaskOwner, fan_out
from popmq.tracing import start_span

log = logging.getLogger(__name__)

# Back-off when a broker's hold table is full or a broker call fails, doubling up to the max.
BACKOFF_START_S = 0.05
BACKOFF_MAX_S = 1.0
# Empty answers of one group within this time of a false-empty probe share its result, so
# thousands of idle consumers of a group cost a few probes per second, not one per answer.
PROBE_SHARE_S = 0.5
# How long aclose() lets releases and probes finish before it cancels them.
CLOSE_GRACE_S = 10.0
# An in-process broker's pop is made this many turns of the loop after the call, as when it
# ran in a TaskOwner job (BrokerCalls.pop).
IN_PROCESS_TURNS_BEFORE = 2


def remaining_ms(deadline: float) -> int:
    """Whole milliseconds left until a loop-clock deadline (never negative)."""
    return max(0, int((deadline - asyncio.get_running_loop().time()) * 1000))


def notify_request(pop: PopRequest, poll_time_ms: int) -> NotifyRequest:
    return NotifyRequest(
        group=pop.group,
        topic=pop.topic,
        queue_id=-1,
        poll_time_ms=poll_time_ms,
        filter=pop.filter,
        fifo=pop.fifo,
    )


@dataclass(slots=True)
class _Probe:
    """One false-empty probe of a group and the empty answers that share it."""

    started: float
    label: str
    found: bool | None = None  # None while the brokers have not all answered
    waiting: int = 1  # empty answers counted when the result comes


class BrokerCalls(AsyncClosing):
    def __init__(
        self, metrics: ProxyEvents, *, fallback_invisible_ms: int = 10_000, clock: Clock = SYSTEM
    ) -> None:
        self.metrics = metrics
        self._clock = clock  # invisible-time arithmetic and probe sharing (virtual in tests)
        # Used to release a message when the broker refuses an invisible time of 0.
        self.fallback_invisible_ms = fallback_invisible_ms
        self.tasks = TaskOwner("longpoll-calls", grace_s=CLOSE_GRACE_S)
        self._probes: dict[tuple[Any, ...], _Probe] = {}
        # Brokers whose last call failed, with the error's code: an outage (a leader change,
        # a dead broker) is logged when it starts, changes and ends, not once per call.
        self._failing: dict[str, str] = {}
        self._next_sweep = 0.0

    # -- pop -----------------------------------------------------------------------------------
    async def pop(self, port: ConsumePort, request: PopRequest, custody: Custody) -> PopResult:
        """One pop; its messages go into custody the moment the broker answers.

        A remote pop runs in its own task, which fills custody: if the caller is cancelled
        just as the answer arrives, the messages are still found and released. An in-process
        broker's pop (``in_process``) runs on the caller's task: it has no turn of the loop
        between taking messages and returning them, so there is no such moment, and a task,
        its host and their wake-ups per pop would be all it adds.
        """
        self.metrics.broker_call("pop")
        attributes: dict[str, str | int] = {
            "popmq.broker": port.name,
            "popmq.poll_ms": request.poll_time_ms,
        }
        with start_span("popmq.broker.pop", attributes) as span:
            if in_process(port):
                if self.tasks.refuses():  # closing: no new broker work, as below
                    raise RefusedError(Code.PROXY_TIMEOUT, "the proxy is shutting down")
                # The loop's turns a job took (its host task, then its own task: the pop two
                # turns after the call, the caller back on the third), kept: arrivals of those
                # turns ride this pop. Popping at once left receives a third less full under
                # `bench e2e` (2,400 receives for 40,000 messages against 1,650) and cost more
                # per message than the task saved (docs/benchmarks.md, wave 10).
                for _ in range(IN_PROCESS_TURNS_BEFORE):
                    await asyncio.sleep(0)
                # Cancelled while it holds (the caller's deadline, the client gone), the
                # broker's wait ends and nothing was taken; a wake it had is passed on.
                result = await self._pop_into(port, request, custody)
                await asyncio.sleep(0)  # the caller's turn after the job's
                span.set_attribute("messaging.batch.message_count", len(result.messages))
                return result
            job = self.tasks.spawn(
                self._pop_into(port, request, custody), f"pop:{port.name}", log_errors=False
            )
            if job is None:  # closing: no new broker work
                raise RefusedError(Code.PROXY_TIMEOUT, "the proxy is shutting down")
            if request.poll_time_ms > 0:
                try:
                    result = await job.result()
                except BaseException:
                    # A held pop: cancelling it releases the broker's hold (an answer that
                    # was already on its way is handed back by the remote port: _late_pop).
                    job.cancel()
                    raise
            else:
                # A pop without hold is not cancelled with its caller: over gRPC the broker may
                # already have popped, and a cancelled call would drop its answer, leaving the
                # messages invisible for the whole invisible time. It finishes in the background
                # and its messages land in custody, which releases them once the poll is over.
                result = await job.result()
            span.set_attribute("messaging.batch.message_count", len(result.messages))
            return result

    async def _pop_into(
        self, port: ConsumePort, request: PopRequest, custody: Custody
    ) -> PopResult:
        result = await port.pop(request)
        custody.keep(port, result.messages)  # no await in between: nothing is lost
        if self._failing:
            self._answered(port)
        return result

    async def hold_pop(
        self, port: ConsumePort, request: PopRequest, deadline: float, custody: Custody
    ) -> PopResult:
        """A pop long poll until the deadline; a full hold table is retried with back-off."""
        backoff = BACKOFF_START_S
        while True:
            poll = replace(request, poll_time_ms=remaining_ms(deadline))
            result = await self.pop(port, poll, custody)
            if result.status is not PopStatus.POLLING_FULL or poll.poll_time_ms == 0:
                return result
            await asyncio.sleep(min(backoff, remaining_ms(deadline) / 1000))
            backoff = min(backoff * 2, BACKOFF_MAX_S)

    # -- notification --------------------------------------------------------------------------
    async def notify(self, port: ConsumePort, request: NotifyRequest, kind: str = "notify") -> bool:
        """One notification call: True when the broker has a visible message for the group."""
        self.metrics.broker_call(kind)
        self.metrics.notification_held(1)
        attributes: dict[str, str | int] = {
            "popmq.broker": port.name,
            "popmq.poll_ms": request.poll_time_ms,
        }
        try:
            with start_span(f"popmq.broker.{kind}", attributes):
                result: NotifyResult = await port.notify(request)
        finally:
            self.metrics.notification_held(-1)
        if self._failing:
            self._answered(port)
        if result.polling_full:
            raise _PollingFull
        return result.has_message

    async def watch(
        self, port: ConsumePort, pop: PopRequest, deadline: Callable[[], float]
    ) -> bool:
        """Long-poll notifications on one broker until it reports a message (True) or the
        deadline passes (False). ``deadline()`` is read at every (re-)arm, so it may move
        later while watching. Broker errors and a full hold table are retried."""
        backoff = BACKOFF_START_S
        loop = asyncio.get_running_loop()
        while True:
            poll_ms = remaining_ms(deadline())
            if poll_ms == 0:
                return False
            asked = loop.time()
            try:
                if await self.notify(port, notify_request(pop, poll_ms)):
                    return True
            except _PollingFull:
                pass
            except Exception as exc:  # one failing broker must not end the long poll
                self.note_error("notify", exc, port)
            else:
                # "No" before our deadline: the broker capped the hold. Re-arm, but never spin.
                if loop.time() - asked >= poll_ms / 2000:
                    backoff = BACKOFF_START_S
                    continue
            await asyncio.sleep(min(backoff, remaining_ms(deadline()) / 1000))
            backoff = min(backoff * 2, BACKOFF_MAX_S)

    def note_error(self, kind: str, exc: Exception, port: ConsumePort) -> None:
        """Count a failed broker call; log it when the broker's state changes (it answered
        before, or failed with another code): a leader change or an outage makes thousands
        of failed calls, and the metric counts them all."""
        code = exc.code.name if isinstance(exc, PopmqError) else type(exc).__name__
        self.metrics.broker_call_failed(kind, code)
        if self._failing.get(port.name) != code:
            self._failing[port.name] = code
            log.warning(
                "%s on %s failed: %s (logged again when this changes; "
                "popmq_proxy_broker_rpc_errors_total counts each)",
                kind,
                port.name,
                exc,
            )

    def _answered(self, port: ConsumePort) -> None:
        if self._failing.pop(port.name, None) is not None:
            log.info("broker %s answers the long polls again", port.name)

    # -- background work -----------------------------------------------------------------------
    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        self.tasks.spawn(coro, name)

    def release(self, port: ConsumePort, pop: PopRequest, messages: list[PoppedMessage]) -> None:
        """Make popped-but-undelivered messages visible again, in the background."""
        self._spawn(self._release(port, pop, messages), f"release:{port.name}")

    async def _release(
        self, port: ConsumePort, pop: PopRequest, messages: list[PoppedMessage]
    ) -> None:
        """Hand the messages back: visible at once, no delivery attempt counted ('handed_back';
        'gone' for those no longer pending: acked, expired or changed meanwhile). A broker
        without hand-back gets a change of invisible time to 0 per message, as before (which
        it counts as a failed delivery)."""
        released = self.metrics.released
        handles = [popped.receipt_handle for popped in messages]
        try:
            self.metrics.broker_call("hand_back")
            count = await port.hand_back(pop.group, pop.topic, handles)
        except PopmqError as exc:
            if exc.code is not Code.NOT_IMPLEMENTED:
                log.warning("could not release %d message(s) on %s: %s",
                            len(messages), port.name, exc)  # fmt: skip
                released("kept", len(messages))
                return
        else:
            released("handed_back", count)
            if count < len(messages):
                released("gone", len(messages) - count)
            return
        for popped in messages:  # an older broker
            released(await self._release_one(port, pop, popped))

    async def _release_one(self, port: ConsumePort, pop: PopRequest, popped: PoppedMessage) -> str:
        """Without hand-back: 'visible_now' (through the retry topic, one delivery attempt
        counted), 'shortened' (the broker's minimum applied) or 'kept' (the message comes back
        at its original invisible time, as it would without a release)."""
        handle = popped.receipt_handle
        try:
            self.metrics.broker_call("change_invisible")
            await port.change_invisible_time(pop.group, pop.topic, handle, 0)
            return "visible_now"
        except PopmqError as exc:
            if exc.code is not Code.ILLEGAL_INVISIBLE_TIME:
                log.warning("could not release %s on %s: %s", handle, port.name, exc)
                return "kept"
        left_ms = popped.invisible_until_ms - self._clock.now_ms()
        if left_ms <= self.fallback_invisible_ms:
            return "kept"
        try:
            self.metrics.broker_call("change_invisible")
            fallback = self.fallback_invisible_ms
            await port.change_invisible_time(pop.group, pop.topic, handle, fallback)
            return "shortened"
        except PopmqError as exc:
            log.warning("could not release %s on %s: %s", handle, port.name, exc)
            return "kept"

    def probe_false_empty(
        self, brokers: Sequence[ConsumePort], pop: PopRequest, label: str
    ) -> None:
        """After an empty answer, ask every broker at once (no hold) whether a message is
        visible for the group; if one is, the answer was a false empty. Empty answers of the
        same group within PROBE_SHARE_S of a probe share its result instead of probing again."""
        key = (pop.group, pop.topic, pop.filter, pop.fifo, label,
               tuple(port.name for port in brokers))  # fmt: skip
        now = self._clock.monotonic()
        if now >= self._next_sweep:  # a sweep per sharing time, not a scan per empty answer
            self._forget_old_probes(now)
            self._next_sweep = now + PROBE_SHARE_S
        probe = self._probes.get(key)
        if probe is not None and probe.found is not None and now - probe.started >= PROBE_SHARE_S:
            probe = None  # finished and past its sharing time: probe anew
        if probe is not None:
            if probe.found is None:
                probe.waiting += 1
            elif probe.found:
                self.metrics.false_empty(label)
            return
        probe = self._probes[key] = _Probe(started=now, label=label)
        self._spawn(self._probe(probe, list(brokers), pop), "false-empty-probe")

    def _forget_old_probes(self, now: float) -> None:
        """Drop finished probes past their sharing time (the next empty answer probes anew)."""
        old = [key for key, probe in self._probes.items()
               if probe.found is not None and now - probe.started >= PROBE_SHARE_S]  # fmt: skip
        for key in old:
            del self._probes[key]

    async def _probe(self, probe: _Probe, brokers: list[ConsumePort], pop: PopRequest) -> None:
        request = notify_request(pop, 0)
        try:
            answers: list[Any]
            if all(in_process(port) for port in brokers):
                # A zero-wait notify of an in-process broker is a plain look at its queues:
                # one after another, without a task group and a task per broker.
                answers = []
                for port in brokers:
                    try:
                        answers.append(await self.notify(port, request, kind="notify_probe"))
                    except Exception as exc:
                        answers.append(exc)
            else:
                answers = await fan_out(
                    [self.notify(port, request, kind="notify_probe") for port in brokers],
                    return_exceptions=True,
                )
            probe.found = any(answer is True for answer in answers)
            if probe.found:
                self.metrics.false_empty(probe.label, probe.waiting)
        finally:
            if probe.found is None:
                probe.found = False

    async def aclose(self) -> None:
        """Refuse new calls, let releases (they protect messages) and probes (zero-wait calls)
        end for up to CLOSE_GRACE_S, then cancel what is left."""
        await self.tasks.aclose()


class _PollingFull(Exception):
    """The broker's hold table is full: back off and retry."""
