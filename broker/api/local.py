"""LocalBrokerPort: the BrokerPort of a Broker in the same process (plain method calls)."""

from __future__ import annotations

from popmq.broker.api.types import (
    AckEntry,
    AckEntryResult,
    ChangeInvisibleResult,
    GroupConfig,
    GroupDeleted,
    GroupQueueStats,
    GroupSummary,
    Message,
    NotifyRequest,
    NotifyResult,
    PopRequest,
    PopResult,
    PullRequest,
    PullResult,
    SendResult,
    TopicInfo,
)
from popmq.broker.api.watch import LocalWatchBackend
from popmq.broker.core import Broker


class LocalBrokerPort:
    """Forwards every BrokerPort call to ``broker``. ``close()`` releases the port only; the
    broker's owner stops the broker."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        self._watches: LocalWatchBackend | None = None

    @property
    def watch_backend(self) -> LocalWatchBackend:
        """Visibility watches on this broker, waited for in process (no link to lose)."""
        if self._watches is None:
            self._watches = LocalWatchBackend(self)
        return self._watches

    @property
    def broker(self) -> Broker:
        return self._broker

    @property
    def name(self) -> str:
        return self._broker.name

    async def send(self, messages: list[Message], queue_id: int = -1) -> list[SendResult]:
        return await self._broker.send(messages, queue_id)

    async def pop(self, request: PopRequest) -> PopResult:
        return await self._broker.pop(request)

    async def ack(self, group: str, topic: str, entries: list[AckEntry]) -> list[AckEntryResult]:
        return await self._broker.ack(group, topic, entries)

    async def change_invisible_time(
        self, group: str, topic: str, receipt_handle: str, invisible_time_ms: int
    ) -> ChangeInvisibleResult:
        return await self._broker.change_invisible_time(
            group, topic, receipt_handle, invisible_time_ms
        )

    async def notify(self, request: NotifyRequest) -> NotifyResult:
        return await self._broker.notify(request)

    async def forward_to_dlq(self, group: str, topic: str, receipt_handle: str) -> None:
        await self._broker.forward_to_dlq(group, topic, receipt_handle)

    async def pull(self, request: PullRequest) -> PullResult:
        return await self._broker.pull(request)

    async def get_consumer_offset(self, group: str, topic: str, queue_id: int) -> int:
        return await self._broker.get_consumer_offset(group, topic, queue_id)

    async def update_consumer_offset(
        self, group: str, topic: str, queue_id: int, offset: int
    ) -> None:
        await self._broker.update_consumer_offset(group, topic, queue_id, offset)

    async def offset_for_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        return await self._broker.offset_for_timestamp(topic, queue_id, timestamp_ms)

    async def create_topic(self, topic: str, queue_count: int) -> TopicInfo:
        return await self._broker.create_topic(topic, queue_count)

    async def get_topic(self, topic: str, auto_create: bool = False) -> TopicInfo:
        return await self._broker.get_topic(topic, auto_create)

    async def list_topics(self) -> list[TopicInfo]:
        return await self._broker.list_topics()

    async def delete_topic(self, topic: str) -> None:
        await self._broker.delete_topic(topic)

    async def get_group(self, group: str) -> GroupConfig:
        return await self._broker.get_group(group)

    async def update_group(self, config: GroupConfig) -> GroupConfig:
        return await self._broker.update_group(config)

    async def list_groups(self) -> list[GroupSummary]:
        return await self._broker.list_groups()

    async def delete_group(
        self, group: str, clean_offsets: bool = False, force: bool = False
    ) -> GroupDeleted:
        return await self._broker.delete_group(group, clean_offsets, force)

    async def group_stats(self, group: str, topic: str) -> list[GroupQueueStats]:
        return await self._broker.group_stats(group, topic)

    async def close(self) -> None:
        """Only the watches end; the broker keeps running."""
        watches, self._watches = self._watches, None
        if watches is not None:
            await watches.aclose()
