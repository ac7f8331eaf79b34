"""The BrokerPort a node of a replicated group serves.

While the node leads, calls go to its broker; the writes a client is answered for (send, ack,
change of invisible time, DLQ, offsets, topics, groups) and pops that handed out messages
return only after the sync barrier (leader.py), and a send is refused before it is written
when too few nodes are in sync. While it follows (or between roles), every call is refused
with HA_NOT_AVAILABLE, naming the leader: a follower serves no writes and no reads.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import anyio
from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.port import BrokerPort
from popmq.broker.contract.types import (
    AckEntry,
    AckEntryResult,
    ChangeInvisibleResult,
    GroupConfig,
    GroupDeleted,
    GroupQueueStats,
    GroupSummary,
    HalfMessageInfo,
    Message,
    NotifyRequest,
    NotifyResult,
    PopRequest,
    PopResult,
    PullRequest,
    PullResult,
    SendResult,
    TopicInfo,
    TransactionCheck,
)
from popmq.broker.core import Broker
from popmq.broker.local import LocalBrokerPort
from popmq.broker.replication.leader import ReplicationLeader

from popmq.lifecycle import AsyncClosing


@dataclass(slots=True)
class Leading:
    broker: Broker
    port: LocalBrokerPort
    replication: ReplicationLeader


# How long a call waits for a node that won its election and is opening its store (the open
# runs off the event loop, so the node's server answers meanwhile): as long as the open took
# when it blocked the loop, then a clear refusal. A proxy moves its calls at the election.
PROMOTION_WAIT_S = 5.0


class NodePort(AsyncClosing):
    def __init__(self, name: str) -> None:
        self._name = name
        self.leading: Leading | None = None
        self.refusal = "this node is starting"
        self._promotion: anyio.Event | None = None  # set while the node opens to lead

    def promotion_started(self) -> None:
        """Calls from now on wait (bounded) for the node to lead, instead of a refusal."""
        self._promotion = anyio.Event()

    def promotion_ended(self) -> None:
        """The node leads, or could not: the waiting calls go on (served, or refused)."""
        promotion, self._promotion = self._promotion, None
        if promotion is not None:
            promotion.set()

    @property
    def name(self) -> str:
        return self._name

    async def _leader(self) -> Leading:
        leading = self.leading
        if leading is None and self._promotion is not None:
            with anyio.move_on_after(PROMOTION_WAIT_S):
                await self._promotion.wait()
            leading = self.leading
        if leading is None:
            raise RefusedError(Code.HA_NOT_AVAILABLE, self.refusal)
        if not leading.replication.leads():
            raise RefusedError(
                Code.HA_NOT_AVAILABLE,
                f"{self._name}: this node's lease to lead could not be renewed in time "
                "(fenced); it answers again once renewed, or another node leads",
            )
        return leading

    async def _writer(self) -> Leading:
        """The leader, for a write: refused before anything is written when too few nodes
        are in sync."""
        leading = await self._leader()
        leading.replication.check_available()
        return leading

    async def _broker(self) -> tuple[Broker, LocalBrokerPort]:
        leading = await self._leader()
        return leading.broker, leading.port

    async def _replicated(self, leading: Leading, *, journal: bool = False) -> None:
        if journal:
            leading.broker.journal_in_flight()
        await leading.replication.replicated()

    # -- writes ------------------------------------------------------------------------------
    async def send(self, messages: list[Message], queue_id: int = -1) -> list[SendResult]:
        leading = await self._writer()
        results = await leading.port.send(messages, queue_id)
        await self._replicated(leading)
        return results

    async def pop(self, request: PopRequest) -> PopResult:
        leading = await self._leader()
        result = await leading.port.pop(request)
        if result.messages:
            try:
                await self._replicated(leading, journal=True)
            except BaseException:
                # Refused (timeout, in-sync set shrank, fenced) or cancelled (the caller gave
                # up): nobody gets these messages; they are visible again at once rather than
                # after the invisible time.
                handles = [m.receipt_handle for m in result.messages]
                with contextlib.suppress(RefusedError):  # stopped: they revive when due
                    leading.broker.engine.hand_back(request.group, request.topic, handles)
                raise
        return result

    async def ack(self, group: str, topic: str, entries: list[AckEntry]) -> list[AckEntryResult]:
        leading = await self._writer()
        leading.broker.journal_in_flight()
        results = await leading.port.ack(group, topic, entries)
        await self._replicated(leading, journal=True)
        return results

    async def change_invisible_time(
        self, group: str, topic: str, receipt_handle: str, invisible_time_ms: int
    ) -> ChangeInvisibleResult:
        leading = await self._writer()
        leading.broker.journal_in_flight()
        result = await leading.port.change_invisible_time(
            group, topic, receipt_handle, invisible_time_ms
        )
        await self._replicated(leading, journal=True)
        return result

    async def hand_back(self, group: str, topic: str, receipt_handles: list[str]) -> int:
        """Like a change of invisible time, the entries' new state travels in the pop
        journal. Allowed while the in-sync set is short (it only makes messages visible
        sooner, as a failed pop barrier does); once handed back here the messages are
        visible on the leader, so a barrier that fails afterwards is not an error: a
        follower promoted without the record revives them when their invisible time ends."""
        leading = await self._leader()
        leading.broker.journal_in_flight()  # the entries' state changes are journaled
        count = await leading.port.hand_back(group, topic, receipt_handles)
        if count:
            with contextlib.suppress(RefusedError):
                await self._replicated(leading, journal=True)
        return count

    async def recall(self, topic: str, recall_handle: str) -> str:
        leading = await self._writer()
        message_id = await leading.port.recall(topic, recall_handle)
        await self._replicated(leading)
        return message_id

    async def end_transaction(
        self, topic: str, message_id: str, transaction_id: str, commit: bool, source: str = ""
    ) -> None:
        leading = await self._writer()
        await leading.port.end_transaction(topic, message_id, transaction_id, commit, source)
        await self._replicated(leading)

    async def claim_transaction_checks(
        self, topics: list[str], limit: int = 64
    ) -> list[TransactionCheck]:
        leading = await self._writer()  # each claim is counted with a CHECK op record
        checks = await leading.port.claim_transaction_checks(topics, limit)
        if checks:
            await self._replicated(leading)
        return checks

    async def list_transactions(self) -> list[HalfMessageInfo]:
        return await (await self._broker())[1].list_transactions()

    async def forward_to_dlq(self, group: str, topic: str, receipt_handle: str) -> None:
        leading = await self._writer()
        leading.broker.journal_in_flight()
        await leading.port.forward_to_dlq(group, topic, receipt_handle)
        await self._replicated(leading, journal=True)

    async def update_consumer_offset(
        self, group: str, topic: str, queue_id: int, offset: int
    ) -> None:
        leading = await self._writer()
        await leading.port.update_consumer_offset(group, topic, queue_id, offset)
        await leading.broker.store.checkpoint()  # the offsets document is what travels
        await self._replicated(leading)

    async def create_topic(self, topic: str, queue_count: int, message_type: str = "") -> TopicInfo:
        leading = await self._writer()
        info = await leading.port.create_topic(topic, queue_count, message_type)
        await self._replicated(leading)
        return info

    async def delete_topic(self, topic: str) -> None:
        leading = await self._writer()
        await leading.port.delete_topic(topic)
        await self._replicated(leading)

    async def update_group(self, config: GroupConfig) -> GroupConfig:
        leading = await self._writer()
        result = await leading.port.update_group(config)
        await self._replicated(leading)
        return result

    async def delete_group(
        self, group: str, clean_offsets: bool = False, force: bool = False
    ) -> GroupDeleted:
        leading = await self._writer()
        result = await leading.port.delete_group(group, clean_offsets, force)
        if clean_offsets:  # the offsets document is what travels (as update_consumer_offset)
            await leading.broker.store.flush_offsets()
        await self._replicated(leading)
        return result

    # -- reads -------------------------------------------------------------------------------
    async def notify(self, request: NotifyRequest) -> NotifyResult:
        return await (await self._broker())[1].notify(request)

    async def pull(self, request: PullRequest) -> PullResult:
        return await (await self._broker())[1].pull(request)

    async def get_consumer_offset(self, group: str, topic: str, queue_id: int) -> int:
        return await (await self._broker())[1].get_consumer_offset(group, topic, queue_id)

    async def offset_for_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        return await (await self._broker())[1].offset_for_timestamp(topic, queue_id, timestamp_ms)

    async def get_topic(self, topic: str, auto_create: bool = False) -> TopicInfo:
        leading = await self._leader()
        info = await leading.port.get_topic(topic, auto_create)
        if auto_create:
            await self._replicated(leading)
        return info

    async def list_topics(self) -> list[TopicInfo]:
        return await (await self._broker())[1].list_topics()

    async def get_group(self, group: str) -> GroupConfig:
        return await (await self._broker())[1].get_group(group)

    async def list_groups(self) -> list[GroupSummary]:
        return await (await self._broker())[1].list_groups()

    async def group_stats(self, group: str, topic: str) -> list[GroupQueueStats]:
        return await (await self._broker())[1].group_stats(group, topic)

    async def aclose(self) -> None:
        return None


def _is_a_port(port: NodePort) -> BrokerPort:  # mypy: NodePort is a whole BrokerPort
    return port
