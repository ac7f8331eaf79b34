"""Visibility watches: "tell me when group G has a visible message on topic T".

A watch is one subscription per (group, topic, filter, fifo) on one broker, never one per long
poll. Its state on the caller's side is what the proxy's long polls read before they pop:

- ``ARMED``: the broker has (or will have, in stream order) the arm, and answers it with an
  event the moment anything is visible -- at once if something already is. Popping an ARMED
  broker is useless, so long polls skip it: an idle group costs the broker nothing.
- ``HAS``: the broker's event came; a pop may find messages. Whoever pops re-arms after an
  empty (or draining) pop.
- ``UNKNOWN``: never armed yet, or the link to the broker was lost since the arm (broker
  restart, network): an event may have been lost, so a long poll pops this broker once and
  re-arms it.

Arming is level-triggered (the broker checks "anything visible?" when the arm arrives, then
waits for a wake), so no event is missed between an empty pop and the re-arm. See
docs/longpolling.md for the whole argument.

Both transports share this: ``LocalWatchBackend`` runs the broker-side wait in process,
``popmq.broker.wire.link.BrokerLink`` multiplexes the arms of one proxy over one gRPC stream.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import logging
from dataclasses import dataclass
from typing import Protocol

from popmq.broker.contract.errors import RefusedError
from popmq.broker.contract.port import BrokerPort
from popmq.broker.contract.types import FilterExpression, NotifyRequest

from popmq.lifecycle import AsyncClosing, Job, TaskOwner

log = logging.getLogger(__name__)

# How long the broker-side wait holds in the hold table before it looks again (locally: no
# message crosses the network when it re-holds).
BROKER_HOLD_MS = 60_000


class WatchState(enum.Enum):
    UNKNOWN = "unknown"
    ARMED = "armed"
    HAS = "has"


@dataclass(frozen=True, slots=True)
class WatchKey:
    group: str
    topic: str
    filter: FilterExpression
    fifo: bool


class WatchBackend(Protocol):
    def send_arm(self, watch: VisibilityWatch) -> bool:
        """Hand the arm to the broker; True when it is on its way over a live link (or in
        process), False when the link is down (it is re-sent when the link is back)."""
        ...

    def send_cancel(self, watch: VisibilityWatch) -> None: ...


_ids = itertools.count(1)


class VisibilityWatch:
    """The caller's side of one subscription."""

    __slots__ = ("_fired", "backend", "closed", "id", "key", "pending", "seq", "state")

    def __init__(self, key: WatchKey, backend: WatchBackend) -> None:
        self.id = next(_ids)
        self.key = key
        self.backend = backend
        self.state = WatchState.UNKNOWN
        self.seq = 0
        self.pending = False  # armed and not answered yet
        self.closed = False
        self._fired = asyncio.Event()
        self._fired.set()  # UNKNOWN: a waiter should pop once

    @property
    def may_have(self) -> bool:
        """False only while the broker has promised an event and sent none."""
        return self.state is not WatchState.ARMED

    def arm(self) -> None:
        """Ask the broker to tell when something is visible (now or later). No-op while an
        arm is pending."""
        if self.closed or self.pending:
            return
        self.seq += 1
        self.pending = True
        self._fired.clear()
        self.state = WatchState.ARMED if self.backend.send_arm(self) else WatchState.UNKNOWN

    def on_event(self, seq: int) -> None:
        """The broker's answer to arm ``seq`` (older answers are ignored)."""
        if seq != self.seq or not self.pending:
            return
        self.pending = False
        self.state = WatchState.HAS
        self._fired.set()

    def on_link_lost(self) -> None:
        """The link broke: an event may be lost. Pop once; the arm is re-sent on reconnect."""
        if self.state is WatchState.ARMED:
            self.state = WatchState.UNKNOWN
            self._fired.set()

    def on_link_up(self) -> None:
        """The link is back and a pending arm was re-sent on it."""
        if self.pending:
            self.state = WatchState.ARMED
            self._fired.clear()  # the re-sent arm's level check covers the time it was down

    async def wait(self) -> None:
        """Until the broker reports something (HAS) or the link was lost (UNKNOWN)."""
        await self._fired.wait()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.pending = False
            self.backend.send_cancel(self)


async def wait_visible(port: BrokerPort, key: WatchKey) -> None:
    """Broker side of an arm: return once the group has a visible message on the topic (at
    once if it has one now). A refusal (unknown topic...) returns too, by raising it: the
    caller's pop will report it. A full hold table returns (a spurious event costs one pop;
    a missing one would cost a message)."""
    request = NotifyRequest(
        group=key.group, topic=key.topic, queue_id=-1, poll_time_ms=BROKER_HOLD_MS,
        filter=key.filter, fifo=key.fifo,
    )  # fmt: skip
    loop = asyncio.get_running_loop()
    while True:
        asked = loop.time()
        result = await port.notify(request)
        if result.has_message or result.polling_full:
            return
        if loop.time() - asked < BROKER_HOLD_MS / 2000:
            return  # answered "no" early: the broker is stopping; never spin


class LocalWatchBackend(AsyncClosing):
    """Watches on a broker in the same process: each arm is a task running wait_visible."""

    def __init__(self, port: BrokerPort) -> None:
        self._port = port
        self._tasks: dict[int, Job[None]] = {}
        self._owner = TaskOwner(f"watches:{port.name}", grace_s=0)

    def send_arm(self, watch: VisibilityWatch) -> bool:
        old = self._tasks.pop(watch.id, None)
        if old is not None:
            old.cancel()
        job = self._owner.spawn(self._wait(watch, watch.seq), f"watch:{self._port.name}")
        if job is None:  # closed
            return False
        self._tasks[watch.id] = job
        return True

    async def _wait(self, watch: VisibilityWatch, seq: int) -> None:
        try:
            await wait_visible(self._port, watch.key)
        except RefusedError as exc:
            log.debug("watch %s on %s ends: %s", watch.key, self._port.name, exc)
        except Exception:  # an event too many costs a pop; one too few a message
            log.exception("watch %s on %s failed", watch.key, self._port.name)
        finally:
            job = self._tasks.get(watch.id)
            if job is not None and job.is_current():
                del self._tasks[watch.id]
        watch.on_event(seq)

    def send_cancel(self, watch: VisibilityWatch) -> None:
        task = self._tasks.pop(watch.id, None)
        if task is not None:
            task.cancel()

    async def aclose(self) -> None:
        self._tasks.clear()
        await self._owner.aclose()
