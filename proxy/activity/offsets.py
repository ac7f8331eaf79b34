"""Offset-based consumption: PullMessage, QueryOffset, GetOffset, UpdateOffset.

Queues are addressed as the route names them: (broker name, queue id). The Spark connector
reads topics through these.
"""

from __future__ import annotations

from dataclasses import dataclass

from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.port import BrokerPort
from popmq.broker.contract.types import PullRequest, PullResult, PullStatus, QueueInfo, TopicInfo
from popmq.proxy.activity.receive import filter_of
from popmq.proxy.core import validate
from popmq.proxy.core.context import RequestContext
from popmq.proxy.core.times import polling_duration_ms, timestamp_ms
from popmq.proxy.grpc import status as st
from popmq.proxy.services import ProxyServices

from popmq.pb.rocketmq.v2 import definition_pb2 as pb
from popmq.pb.rocketmq.v2 import service_pb2 as s

PULL_STATUS = {
    PullStatus.FOUND: (Code.OK, "OK"),
    PullStatus.NO_NEW_MESSAGE: (Code.MESSAGE_NOT_FOUND, "no new message"),
    PullStatus.OFFSET_ILLEGAL: (Code.ILLEGAL_OFFSET, "offset is beyond the end of the queue"),
    PullStatus.OFFSET_PURGED: (Code.ILLEGAL_OFFSET, "offset was removed by retention"),
    PullStatus.POLLING_FULL: (Code.TOO_MANY_REQUESTS, "polling full"),
}


@dataclass(slots=True)
class QueueTarget:
    port: BrokerPort
    topic: str
    queue_id: int


async def _queue(services: ProxyServices, queue: pb.MessageQueue) -> tuple[QueueTarget, TopicInfo]:
    topic = validate.topic_name(queue.topic.name, allow_dlq=True)
    if not queue.broker.name:
        raise RefusedError(Code.BAD_REQUEST, "message_queue.broker.name is required")
    port = services.cluster.port(queue.broker.name)
    info = await port.get_topic(topic)
    if not 0 <= queue.id < info.queue_count:
        raise RefusedError(
            Code.BAD_REQUEST,
            f"topic {topic!r} has queues 0..{info.queue_count - 1} on {port.name}, not {queue.id}",
        )
    return QueueTarget(port, topic, queue.id), info


def _queue_info(info: TopicInfo, queue_id: int) -> QueueInfo:
    for queue in info.queues:
        if queue.queue_id == queue_id:
            return queue
    raise RefusedError(Code.INTERNAL_ERROR, f"broker sent no offsets for queue {queue_id}")


def pull_poll_ms(requested_ms: int, remaining_ms: int | None, services: ProxyServices) -> int:
    poll = min(max(requested_ms, 0), services.proxy.max_long_polling_ms)
    if remaining_ms is not None:
        poll = min(poll, max(remaining_ms - services.proxy.long_polling_reserve_ms, 0))
    return poll


async def pull_message(
    services: ProxyServices, request: s.PullMessageRequest, ctx: RequestContext
) -> PullResult:
    if request.group.name:
        validate.group_name(request.group.name)
    target, _ = await _queue(services, request.message_queue)
    if request.offset < 0:
        raise RefusedError(Code.ILLEGAL_OFFSET, f"offset {request.offset} is negative")
    batch = request.batch_size or services.proxy.max_batch
    if batch < 0 or batch > services.proxy.max_batch:
        raise RefusedError(
            Code.BAD_REQUEST, f"batch size must be in 1..{services.proxy.max_batch}, not {batch}"
        )
    poll_ms = pull_poll_ms(
        polling_duration_ms(request.long_polling_timeout),
        ctx.remaining_ms(),
        services,
    )
    return await target.port.pull(
        PullRequest(
            topic=target.topic,
            queue_id=target.queue_id,
            offset=request.offset,
            max_messages=batch,
            poll_time_ms=poll_ms,
            filter=filter_of(request.filter_expression),
        )
    )


async def query_offset(
    services: ProxyServices, request: s.QueryOffsetRequest, ctx: RequestContext
) -> s.QueryOffsetResponse:
    target, info = await _queue(services, request.message_queue)
    queue = _queue_info(info, target.queue_id)
    policy = request.query_offset_policy
    if policy == pb.BEGINNING:
        offset = queue.min_offset
    elif policy == pb.END:
        offset = queue.max_offset
    elif policy == pb.TIMESTAMP:
        if not request.HasField("timestamp"):
            raise RefusedError(Code.BAD_REQUEST, "the TIMESTAMP policy needs a timestamp")
        offset = await target.port.offset_for_timestamp(
            target.topic,
            target.queue_id,
            timestamp_ms(request.timestamp, Code.BAD_REQUEST, "offset timestamp"),
        )
    else:
        raise RefusedError(Code.BAD_REQUEST, f"unknown query offset policy {policy}")
    return s.QueryOffsetResponse(status=st.ok(), offset=offset)


async def get_offset(
    services: ProxyServices, request: s.GetOffsetRequest, ctx: RequestContext
) -> s.GetOffsetResponse:
    """The group's committed offset; -1 when it never committed on that queue."""
    group = validate.group_name(request.group.name)
    target, _ = await _queue(services, request.message_queue)
    offset = await target.port.get_consumer_offset(group, target.topic, target.queue_id)
    return s.GetOffsetResponse(status=st.ok(), offset=offset)


async def update_offset(
    services: ProxyServices, request: s.UpdateOffsetRequest, ctx: RequestContext
) -> s.UpdateOffsetResponse:
    group = validate.group_name(request.group.name)
    target, info = await _queue(services, request.message_queue)
    queue = _queue_info(info, target.queue_id)
    if not 0 <= request.offset <= queue.max_offset:
        raise RefusedError(
            Code.ILLEGAL_OFFSET,
            f"offset {request.offset} is outside 0..{queue.max_offset} of that queue",
        )
    await target.port.update_consumer_offset(group, target.topic, target.queue_id, request.offset)
    return s.UpdateOffsetResponse(status=st.ok())
