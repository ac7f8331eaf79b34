"""What a consumer does with a received message, by its receipt handle: ack it, change its
invisible time (nack), or give up on it (forward to the DLQ).

Each goes to the broker its handle names. A PushConsumer acts with the handle it received:
if this proxy renewed it meanwhile (renewal.py), the renewed one is used and renewal stops.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict

import anyio
from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.types import AckEntry, AckEntryResult
from popmq.proxy.cluster import BrokerCluster
from popmq.proxy.core import validate
from popmq.proxy.core.times import SecondsNanos, invisible_duration_ms
from popmq.proxy.longpoll.base import is_broker_down
from popmq.proxy.longpoll.calls import BACKOFF_MAX_S, BACKOFF_START_S
from popmq.proxy.renewal import HandleRenewer

from popmq.config import ProxyConfig
from popmq.errors import PopmqError
from popmq.lifecycle import fan_out

MAX_ACK_ENTRIES = 1024
# How long an ack to a replicated group between leaders waits for the next one: a failover
# takes 2-3 s (docs/reliability.md), and the official clients give an ack 3 s or more.
ACK_LEADER_WAIT_S = 2.5


class Handles:
    def __init__(self, config: ProxyConfig, cluster: BrokerCluster, renewer: HandleRenewer) -> None:
        self.config = config
        self.cluster = cluster
        self.renewer = renewer

    async def ack(self, group: str, topic: str, entries: list[AckEntry]) -> list[AckEntryResult]:
        """One result per entry, in order (each with the handle that was acked)."""
        group = validate.group_name(group)
        topic = validate.topic_name(topic, allow_dlq=True)
        if not entries:
            raise RefusedError(Code.BAD_REQUEST, "AckMessage needs at least one entry")
        if len(entries) > MAX_ACK_ENTRIES:
            raise RefusedError(Code.BAD_REQUEST, f"at most {MAX_ACK_ENTRIES} entries per ack")
        cluster = self.cluster
        results: list[AckEntryResult | None] = [None] * len(entries)
        by_broker: dict[str, list[int]] = defaultdict(list)
        if len(self.renewer):  # a PushConsumer acks with the handle it got: use the latest
            for entry in entries:
                entry.receipt_handle = await self.renewer.take(entry.receipt_handle)
        for index, entry in enumerate(entries):
            if len(entry.receipt_handle) > validate.MAX_RECEIPT_HANDLE_LENGTH:
                # Not one of ours: refused, and not echoed back at the caller's size.
                results[index] = AckEntryResult(
                    "", entry.message_id, int(Code.INVALID_RECEIPT_HANDLE),
                    f"receipt handle longer than {validate.MAX_RECEIPT_HANDLE_LENGTH} characters",
                )  # fmt: skip
                continue
            try:
                port = cluster.port_for_handle(entry.receipt_handle)
            except RefusedError as exc:
                results[index] = AckEntryResult(
                    entry.receipt_handle, entry.message_id, int(exc.code), exc.message
                )
                continue
            by_broker[port.name].append(index)

        async def ack_on(broker: str, indexes: list[int]) -> None:
            batch = [entries[i] for i in indexes]
            try:
                answers = await self._ack_through_leader_change(broker, group, topic, batch)
            except PopmqError as exc:  # the whole call failed: every entry shares its code
                answers = [
                    AckEntryResult(e.receipt_handle, e.message_id, int(exc.code), exc.message)
                    for e in batch
                ]
            for i, answer in zip(indexes, answers, strict=True):
                results[i] = answer

        if len(by_broker) == 1:  # handles of one receive come from one broker: no task needed
            await ack_on(*next(iter(by_broker.items())))
        else:  # one task per broker, owned here: a failure cancels the others, nothing dangles
            await fan_out(ack_on(broker, indexes) for broker, indexes in by_broker.items())
        return [r for r in results if r is not None]

    async def _ack_through_leader_change(
        self, broker: str, group: str, topic: str, batch: list[AckEntry]
    ) -> list[AckEntryResult]:
        """An ack to a replicated group that cannot answer now (its leader died with the ack's
        request link, or no leader yet) is tried again on the group's next leader, within
        ACK_LEADER_WAIT_S: the new leader accepts the old one's handles, and an entry the old
        leader had acked and copied answers OK again (an ack is applied once). A broker that
        is not in a replicated group gets no next leader: its failure is answered at once."""
        cluster = self.cluster
        loop = asyncio.get_running_loop()
        deadline = loop.time() + ACK_LEADER_WAIT_S
        backoff = BACKOFF_START_S
        while True:
            changed = cluster.membership_changed()  # before the call: a change during it counts
            try:
                return await cluster.port(broker).ack(group, topic, batch)
            except PopmqError as exc:
                left = deadline - loop.time()
                if broker not in cluster.group_views or not is_broker_down(exc) or left <= 0:
                    raise
            with anyio.move_on_after(min(backoff, left)):
                await changed.wait()
            backoff = min(backoff * 2, BACKOFF_MAX_S)

    async def change_invisible_time(
        self, group: str, topic: str, handle: str, invisible_time: SecondsNanos
    ) -> str:
        """Move a popped message's next-visible time; returns the handle that replaces the
        old one."""
        group = validate.group_name(group)
        topic = validate.topic_name(topic, allow_dlq=True)
        handle = validate.receipt_handle(handle)
        # RocketMQ: any duration from 0 up to the maximum (the receive minimum does not apply).
        invisible_ms = validate.invisible_time(
            invisible_duration_ms(invisible_time), 0, self.config.max_invisible_ms
        )
        handle = await self.renewer.take(handle)  # a PushConsumer nack: stop renewing
        port = self.cluster.port_for_handle(handle)
        result = await port.change_invisible_time(group, topic, handle, invisible_ms)
        return result.receipt_handle

    async def forward_to_dlq(self, group: str, topic: str, handle: str) -> None:
        """A consumer gives up on a message (push consumers do so after their max attempts):
        the broker moves it to %DLQ%<group> and acks it. A message read from %DLQ%<group>
        itself has used its attempts: given up on again, it goes back there."""
        group = validate.group_name(group)
        topic = validate.topic_name(topic, allow_dlq=True)
        handle = validate.receipt_handle(handle)
        handle = await self.renewer.take(handle)  # a PushConsumer's renewed handle
        port = self.cluster.port_for_handle(handle)
        await port.forward_to_dlq(group, topic, handle)
