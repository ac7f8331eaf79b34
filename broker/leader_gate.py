"""LeaderGatedPort: a broker group node serves proxies only while it is the fenced leader.

Wraps the node's own port. Every call is refused with HA_NOT_AVAILABLE (RocketMQ's code for
"the HA pair cannot serve this now"; clients and proxies retry it) unless the node leads its
group and its lease still holds (``GroupMember.may_write``, the fence). A follower's state may
be behind the leader's, so it answers nothing, reads included: proxies follow the leader key.
With ``replication sync``, a send is also refused while the in-sync set is smaller than
``min_in_sync`` (never acknowledged and then lost).
"""

from __future__ import annotations

from collections.abc import Iterable

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
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from popmq.config import ReplicationConfig
from popmq.coord.group import GroupMember
from popmq.lifecycle import AsyncClosing


class LeaderGatedPort(AsyncClosing):
    """The node's port, open only while it is its group's fenced leader."""

    def __init__(self, port: BrokerPort, replication: ReplicationConfig) -> None:
        self._port = port
        # Set once the node has joined its group (it needs its bound address first).
        self.member: GroupMember | None = None
        self._min_in_sync = replication.min_in_sync if replication.mode == "sync" else 1

    @property
    def name(self) -> str:
        return self._port.name

    def _check(self) -> GroupMember:
        member = self.member
        if member is None:
            raise RefusedError(Code.HA_NOT_AVAILABLE, "this node has not joined its group yet")
        if member.may_write():
            return member
        settings, role = member.settings, member.role
        if role.is_leader:
            why = "its lease to lead could not be renewed in time (fenced)"
        elif role.has_leader:
            why = f"it is a follower; the leader is {role.leader_name} (epoch {role.epoch})"
        else:
            why = "the group has no leader now"
        raise RefusedError(
            Code.HA_NOT_AVAILABLE, f"node {settings.name} of group {settings.group}: {why}"
        )

    def _check_send(self) -> None:
        member = self._check()
        in_sync = member.in_sync
        if len(in_sync) < self._min_in_sync:
            raise RefusedError(
                Code.HA_NOT_AVAILABLE,
                f"group {member.settings.group} has {len(in_sync)} in-sync node(s) "
                f"({', '.join(in_sync)}), fewer than min_in_sync {self._min_in_sync}",
            )

    async def send(self, messages: list[Message], queue_id: int = -1) -> list[SendResult]:
        self._check_send()
        results = await self._port.send(messages, queue_id)
        self._check()  # fenced while writing: not acknowledged (a retry may duplicate, not lose)
        return results

    async def pop(self, request: PopRequest) -> PopResult:
        self._check()
        return await self._port.pop(request)

    async def change_invisible_time(
        self, group: str, topic: str, receipt_handle: str, invisible_time_ms: int
    ) -> ChangeInvisibleResult:
        self._check()
        result = await self._port.change_invisible_time(
            group, topic, receipt_handle, invisible_time_ms
        )
        self._check()
        return result

    async def hand_back(self, group: str, topic: str, receipt_handles: list[str]) -> int:
        self._check()
        return await self._port.hand_back(group, topic, receipt_handles)

    async def notify(self, request: NotifyRequest) -> NotifyResult:
        self._check()
        return await self._port.notify(request)

    async def ack(self, group: str, topic: str, entries: list[AckEntry]) -> list[AckEntryResult]:
        self._check()
        results = await self._port.ack(group, topic, entries)
        self._check()
        return results

    async def recall(self, topic: str, recall_handle: str) -> str:
        self._check()
        return await self._port.recall(topic, recall_handle)

    async def end_transaction(
        self, topic: str, message_id: str, transaction_id: str, commit: bool, source: str = ""
    ) -> None:
        self._check()
        await self._port.end_transaction(topic, message_id, transaction_id, commit, source)

    async def claim_transaction_checks(
        self, topics: list[str], limit: int = 64
    ) -> list[TransactionCheck]:
        self._check()
        return await self._port.claim_transaction_checks(topics, limit)

    async def list_transactions(self) -> list[HalfMessageInfo]:
        self._check()
        return await self._port.list_transactions()

    async def forward_to_dlq(self, group: str, topic: str, receipt_handle: str) -> None:
        self._check()
        await self._port.forward_to_dlq(group, topic, receipt_handle)

    async def pull(self, request: PullRequest) -> PullResult:
        self._check()
        return await self._port.pull(request)

    async def get_consumer_offset(self, group: str, topic: str, queue_id: int) -> int:
        self._check()
        return await self._port.get_consumer_offset(group, topic, queue_id)

    async def update_consumer_offset(
        self, group: str, topic: str, queue_id: int, offset: int
    ) -> None:
        self._check()
        await self._port.update_consumer_offset(group, topic, queue_id, offset)

    async def offset_for_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        self._check()
        return await self._port.offset_for_timestamp(topic, queue_id, timestamp_ms)

    async def create_topic(self, topic: str, queue_count: int, message_type: str = "") -> TopicInfo:
        self._check()
        return await self._port.create_topic(topic, queue_count, message_type)

    async def get_topic(self, topic: str, auto_create: bool = False) -> TopicInfo:
        self._check()
        return await self._port.get_topic(topic, auto_create)

    async def list_topics(self) -> list[TopicInfo]:
        self._check()
        return await self._port.list_topics()

    async def delete_topic(self, topic: str) -> None:
        self._check()
        await self._port.delete_topic(topic)

    async def get_group(self, group: str) -> GroupConfig:
        self._check()
        return await self._port.get_group(group)

    async def update_group(self, config: GroupConfig) -> GroupConfig:
        self._check()
        return await self._port.update_group(config)

    async def list_groups(self) -> list[GroupSummary]:
        self._check()
        return await self._port.list_groups()

    async def delete_group(
        self, group: str, clean_offsets: bool = False, force: bool = False
    ) -> GroupDeleted:
        self._check()
        return await self._port.delete_group(group, clean_offsets, force)

    async def group_stats(self, group: str, topic: str) -> list[GroupQueueStats]:
        self._check()
        return await self._port.group_stats(group, topic)

    async def aclose(self) -> None:
        await self._port.aclose()


class GroupCollector(Collector):
    """popmq_ha_* series of this node, read at scrape time from its GroupMember."""

    def __init__(self, member: GroupMember) -> None:
        self._member = member

    def collect(self) -> Iterable[Metric]:
        member = self._member
        labels = ["group", "node"]
        values = [member.settings.group, member.settings.name]
        role = member.role
        for name, text, value in (
            ("popmq_ha_epoch", "the group's epoch as this node sees it (0: no leader)",
             role.epoch),
            # role and fenced, not may_write(): a scrape runs on the HTTP server's thread, off
            # the loop (fenced is set when the lease deadline passes).
            ("popmq_ha_is_leader", "1 while this node leads its group",
             1 if role.is_leader and not member.fenced else 0),
            ("popmq_ha_has_leader", "1 while this node knows a leader of its group",
             1 if role.has_leader else 0),
            ("popmq_ha_in_sync_size", "nodes in the group's in-sync set",
             len(member.in_sync)),
        ):  # fmt: skip
            gauge = GaugeMetricFamily(name, text, labels=labels)
            gauge.add_metric(values, value)
            yield gauge
        won = CounterMetricFamily(
            "popmq_ha_elections_won", "elections this node won", labels=labels
        )
        won.add_metric(values, member.elections_won)
        yield won
        declined = CounterMetricFamily(
            "popmq_ha_empty_copy_declines",
            "times this node declined to lead because its copy holds no data (even with "
            "unclean election)", labels=labels,
        )  # fmt: skip
        declined.add_metric(values, member.empty_copy_declines)
        yield declined
        given_up = CounterMetricFamily(
            "popmq_ha_leadership_given_up",
            "times this node gave its leadership back because it could not take up the role "
            "(its promotion failed)", labels=labels,
        )  # fmt: skip
        given_up.add_metric(values, member.leadership_given_up)
        yield given_up
