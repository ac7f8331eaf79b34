"""Offset-based consumption: pull, query an offset, a group's committed offset and its update.

Queues are addressed as the route names them: (broker name, queue id). The Spark connector
reads topics through these.
"""

from __future__ import annotations

from dataclasses import dataclass

from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.port import BrokerPort
from popmq.broker.contract.types import PullRequest, PullResult, QueueInfo, TopicInfo
from popmq.proxy.cluster import BrokerCluster
from popmq.proxy.core import validate
from popmq.proxy.core.context import RequestContext
from popmq.proxy.core.receive import filter_of
from popmq.proxy.core.times import SecondsNanos, polling_duration_ms, timestamp_ms

from popmq.config import ProxyConfig


@dataclass(frozen=True, slots=True)
class QueueAddress:
    """A queue as a client names it (nothing checked yet)."""

    topic: str
    broker: str
    queue_id: int


@dataclass(slots=True)
class QueueTarget:
    port: BrokerPort
    topic: str
    queue_id: int


def _queue_info(info: TopicInfo, queue_id: int) -> QueueInfo:
    for queue in info.queues:
        if queue.queue_id == queue_id:
            return queue
    raise RefusedError(Code.INTERNAL_ERROR, f"broker sent no offsets for queue {queue_id}")


def pull_poll_ms(requested_ms: int, remaining_ms: int | None, config: ProxyConfig) -> int:
    poll = min(max(requested_ms, 0), config.max_long_polling_ms)
    if remaining_ms is not None:
        poll = min(poll, max(remaining_ms - config.long_polling_reserve_ms, 0))
    return poll


class Offsets:
    def __init__(self, config: ProxyConfig, cluster: BrokerCluster) -> None:
        self.config = config
        self.cluster = cluster

    async def _queue(self, queue: QueueAddress) -> tuple[QueueTarget, TopicInfo]:
        topic = validate.topic_name(queue.topic, allow_dlq=True)
        if not queue.broker:
            raise RefusedError(Code.BAD_REQUEST, "message_queue.broker.name is required")
        port = self.cluster.port(queue.broker)
        info = await port.get_topic(topic)
        if not 0 <= queue.queue_id < info.queue_count:
            raise RefusedError(
                Code.BAD_REQUEST,
                f"topic {topic!r} has queues 0..{info.queue_count - 1} on {port.name}, "
                f"not {queue.queue_id}",
            )
        return QueueTarget(port, topic, queue.queue_id), info

    async def pull(
        self,
        group: str,
        queue: QueueAddress,
        offset: int,
        batch_size: int,
        poll_time: SecondsNanos,
        filter_kind: str,
        filter_expression: str,
        ctx: RequestContext,
    ) -> PullResult:
        """Messages of one queue from ``offset`` on (``group`` is optional: checked if given)."""
        if group:
            validate.group_name(group)
        target, _ = await self._queue(queue)
        if offset < 0:
            raise RefusedError(Code.ILLEGAL_OFFSET, f"offset {offset} is negative")
        max_batch = self.config.max_batch
        batch = batch_size or max_batch
        if batch < 0 or batch > max_batch:
            raise RefusedError(
                Code.BAD_REQUEST, f"batch size must be in 1..{max_batch}, not {batch}"
            )
        poll_ms = pull_poll_ms(polling_duration_ms(poll_time), ctx.remaining_ms(), self.config)
        return await target.port.pull(
            PullRequest(
                topic=target.topic,
                queue_id=target.queue_id,
                offset=offset,
                max_messages=batch,
                poll_time_ms=poll_ms,
                filter=filter_of(filter_kind, filter_expression),
            )
        )

    async def query_offset(
        self, queue: QueueAddress, policy: str, timestamp: SecondsNanos | None
    ) -> int:
        """``policy``: BEGINNING, END or TIMESTAMP (then ``timestamp``, None if not given);
        anything else is refused."""
        target, info = await self._queue(queue)
        queue_info = _queue_info(info, target.queue_id)
        if policy == "BEGINNING":
            return queue_info.min_offset
        if policy == "END":
            return queue_info.max_offset
        if policy == "TIMESTAMP":
            if timestamp is None:
                raise RefusedError(Code.BAD_REQUEST, "the TIMESTAMP policy needs a timestamp")
            return await target.port.offset_for_timestamp(
                target.topic,
                target.queue_id,
                timestamp_ms(timestamp, Code.BAD_REQUEST, "offset timestamp"),
            )
        raise RefusedError(Code.BAD_REQUEST, f"unknown query offset policy {policy}")

    async def get_offset(self, group: str, queue: QueueAddress) -> int:
        """The group's committed offset; -1 when it never committed on that queue."""
        group = validate.group_name(group)
        target, _ = await self._queue(queue)
        return await target.port.get_consumer_offset(group, target.topic, target.queue_id)

    async def update_offset(self, group: str, queue: QueueAddress, offset: int) -> None:
        group = validate.group_name(group)
        target, info = await self._queue(queue)
        queue_info = _queue_info(info, target.queue_id)
        if not 0 <= offset <= queue_info.max_offset:
            raise RefusedError(
                Code.ILLEGAL_OFFSET,
                f"offset {offset} is outside 0..{queue_info.max_offset} of that queue",
            )
        await target.port.update_consumer_offset(group, target.topic, target.queue_id, offset)
