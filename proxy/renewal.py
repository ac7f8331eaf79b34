"""Auto-renew of PushConsumer receipt handles (RocketMQ's proxy auto-renew).

A PushConsumer receives with `auto_renew` and no invisible time: the proxy pops its messages
for `renew_slice_ms` and, while the client is still processing them, extends that time slice
by slice (ChangeInvisibleDuration to the broker) until the client acks or nacks, the message
has been held for `renew_max_ms`, or the client goes away. Each renewal replaces the receipt
handle; the client keeps the one it received, so its ack / nack / DLQ forward is translated to
the latest handle here.

The state is this proxy's only (like RocketMQ's): a push consumer sticks to one proxy. If the
proxy restarts, renewal stops and the messages come back after their current slice.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass

import anyio
from popmq.broker.contract.errors import Code
from popmq.broker.contract.types import PoppedMessage
from popmq.proxy.cluster import BrokerCluster
from popmq.proxy.events import ProxyEvents
from popmq.proxy.registry import ClientRegistry

from popmq.clock import SYSTEM, Clock
from popmq.config import ProxyConfig
from popmq.errors import PopmqError
from popmq.lifecycle import Job, TaskOwner

log = logging.getLogger(__name__)

# A client that vanished: its messages come back this soon (RocketMQ's
# invisibleTimeMillisWhenClear).
RELEASE_INVISIBLE_MS = 1_000
# Renewals in flight at once, per proxy.
MAX_CONCURRENT_RENEWALS = 64
# The handle is gone for good (acked elsewhere, expired and popped again): stop renewing it.
_FINAL_CODES = frozenset({Code.INVALID_RECEIPT_HANDLE, Code.BAD_REQUEST})


@dataclass(slots=True)
class _Held:
    client_id: str
    group: str
    topic: str
    current: str  # the latest receipt handle
    received_at: float  # monotonic seconds
    visible_at: float  # when the current slice ends (monotonic seconds)
    failures: int = 0
    renewing: asyncio.Future[None] | None = None
    access_key: str = ""  # the client's, with client_id its registry entry


class HandleRenewer:
    """In-flight PushConsumer handles, keyed by the handle the client received.

    The renewal loop runs under ``tasks`` (the proxy's owner of work that outlives a request)
    and asks ``registry`` whether the client is still there."""

    def __init__(
        self,
        config: ProxyConfig,
        cluster: BrokerCluster,
        registry: ClientRegistry,
        metrics: ProxyEvents,
        tasks: TaskOwner,
        *,
        clock: Clock = SYSTEM,
    ) -> None:
        self.config = config
        self._clock = clock  # slices and the renew time limit (virtual in tests)
        self.cluster = cluster
        self.registry = registry
        self.metrics = metrics
        self.tasks = tasks
        self._held: dict[str, _Held] = {}
        self._loop_task: Job[None] | None = None

    def __len__(self) -> int:
        return len(self._held)

    def track(
        self,
        client_id: str,
        group: str,
        topic: str,
        messages: Iterable[PoppedMessage],
        *,
        access_key: str = "",
    ) -> None:
        now = self._clock.monotonic()
        slice_s = self.config.renew_slice_ms / 1000
        for message in messages:
            self._held[message.receipt_handle] = _Held(
                client_id, group, topic, message.receipt_handle, now, now + slice_s,
                access_key=access_key,
            )  # fmt: skip
        self.metrics.renewing_handles(len(self._held))
        if self._held and (self._loop_task is None or self._loop_task.done()):
            # Owned by the proxy's task owner: its aclose() ends the loop on shutdown.
            self._loop_task = self.tasks.spawn(self._run(), name="auto-renew")

    def forget(self, handles: Iterable[str]) -> None:
        for handle in handles:
            self._held.pop(handle, None)
        self.metrics.renewing_handles(len(self._held))

    async def take(self, handle: str) -> str:
        """The client is done with this handle (ack, nack, DLQ): stop renewing it and return
        the handle that is valid now (the one given, if it was never renewed here)."""
        held = self._held.pop(handle, None)
        if held is None:
            return handle
        self.metrics.renewing_handles(len(self._held))
        if held.renewing is not None:  # a renewal is changing the handle right now
            await asyncio.shield(held.renewing)
        return held.current

    # -- the renewal loop --------------------------------------------------------------------

    async def _run(self) -> None:
        period_s = self.config.renew_schedule_period_ms / 1000
        while self._held:
            await self._clock.sleep(period_s)
            await self.renew_due()
        self._loop_task = None

    async def renew_due(self) -> None:
        """One pass: renew every handle whose slice ends within renew_ahead_ms."""
        config = self.config
        now = self._clock.monotonic()
        due = [
            (handle, held)
            for handle, held in self._held.items()
            if held.renewing is None and held.visible_at - now <= config.renew_ahead_ms / 1000
        ]
        if not due:
            return
        limit = anyio.Semaphore(MAX_CONCURRENT_RENEWALS)

        async def one(handle: str, held: _Held) -> None:
            async with limit:
                try:
                    await self._renew(handle, held)
                except Exception as exc:  # one bad renewal must not stop the others
                    self.metrics.renewal("failed")
                    log.warning("auto-renew of a %s handle failed: %r", held.group, exc)

        # Structured: this pass owns its renewals and ends with them.
        async with anyio.create_task_group() as group:
            for handle, held in due:
                group.start_soon(one, handle, held)
        self.metrics.renewing_handles(len(self._held))

    async def _renew(self, handle: str, held: _Held) -> None:
        config = self.config
        if self.registry.get(held.client_id, held.access_key) is None:
            # The client terminated or went silent: give its messages back soon.
            self._held.pop(handle, None)
            await self._change(held, RELEASE_INVISIBLE_MS, "client_gone")
            return
        if self._clock.monotonic() - held.received_at >= config.renew_max_ms / 1000:
            # Held too long: stop; the message comes back when its current slice ends.
            self._held.pop(handle, None)
            self.metrics.renewal("max_time")
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        held.renewing = done
        try:
            new_handle = await self._change(held, config.renew_slice_ms, "renewed")
            if new_handle is not None:
                held.current = new_handle
                held.visible_at = self._clock.monotonic() + config.renew_slice_ms / 1000
                held.failures = 0
            elif handle in self._held:
                held.failures += 1
                if held.failures >= config.max_renew_retries:
                    self._held.pop(handle, None)
                    log.warning(
                        "auto-renew gave up on a message of group %s topic %s after %d "
                        "failures; it comes back when its invisible time ends",
                        held.group, held.topic, held.failures,
                    )  # fmt: skip
                    self.metrics.renewal("gave_up")
        finally:
            held.renewing = None
            done.set_result(None)

    async def _change(self, held: _Held, invisible_ms: int, outcome: str) -> str | None:
        try:
            port = self.cluster.port_for_handle(held.current)
            self.metrics.broker_call("change_invisible")
            result = await port.change_invisible_time(
                held.group, held.topic, held.current, invisible_ms
            )
        except PopmqError as exc:  # refused, or the broker unreachable: retried later
            if exc.code in _FINAL_CODES:
                self._drop(held)
                self.metrics.renewal("handle_gone")
            else:
                self.metrics.renewal("failed")
                log.info("auto-renew of a %s handle failed: %s", held.group, exc.message)
            return None
        except (ConnectionError, TimeoutError, OSError) as exc:
            self.metrics.renewal("failed")
            log.info("auto-renew of a %s handle failed: %s", held.group, exc)
            return None
        self.metrics.renewal(outcome)
        return result.receipt_handle

    def _drop(self, held: _Held) -> None:
        for handle, entry in list(self._held.items()):
            if entry is held:
                del self._held[handle]
