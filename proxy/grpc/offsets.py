"""PullMessage, QueryOffset, GetOffset and UpdateOffset on the wire."""

from __future__ import annotations

from popmq.broker.contract.errors import Code
from popmq.broker.contract.types import PullResult, PullStatus
from popmq.proxy.core.context import RequestContext
from popmq.proxy.core.offsets import QueueAddress
from popmq.proxy.core.processor import ProxyCore
from popmq.proxy.grpc import status as st
from popmq.proxy.grpc.receive import filter_kind

from popmq.pb.rocketmq.v2 import definition_pb2 as pb
from popmq.pb.rocketmq.v2 import service_pb2 as s

PULL_STATUS = {
    PullStatus.FOUND: (Code.OK, "OK"),
    PullStatus.NO_NEW_MESSAGE: (Code.MESSAGE_NOT_FOUND, "no new message"),
    PullStatus.OFFSET_ILLEGAL: (Code.ILLEGAL_OFFSET, "offset is beyond the end of the queue"),
    PullStatus.OFFSET_PURGED: (Code.ILLEGAL_OFFSET, "offset was removed by retention"),
    PullStatus.POLLING_FULL: (Code.TOO_MANY_REQUESTS, "polling full"),
}
POLICIES = {pb.BEGINNING: "BEGINNING", pb.END: "END", pb.TIMESTAMP: "TIMESTAMP"}


def queue_address(queue: pb.MessageQueue) -> QueueAddress:
    return QueueAddress(queue.topic.name, queue.broker.name, queue.id)


def pull_status(result: PullResult) -> tuple[Code, str]:
    """The status a pull answers with (FOUND but nothing matched the filter: not found)."""
    if result.status == PullStatus.FOUND and not result.messages:
        return Code.MESSAGE_NOT_FOUND, "no matching message"
    return PULL_STATUS[result.status]


async def pull_message(
    core: ProxyCore, request: s.PullMessageRequest, ctx: RequestContext
) -> PullResult:
    """The pull itself; the servicer streams the result."""
    expression = request.filter_expression
    return await core.offsets.pull(
        request.group.name,
        queue_address(request.message_queue),
        request.offset,
        request.batch_size,
        request.long_polling_timeout,
        filter_kind(expression.type),
        expression.expression,
        ctx,
    )


async def query_offset(
    core: ProxyCore, request: s.QueryOffsetRequest, ctx: RequestContext
) -> s.QueryOffsetResponse:
    policy = request.query_offset_policy
    offset = await core.offsets.query_offset(
        queue_address(request.message_queue),
        POLICIES.get(policy, str(policy)),
        request.timestamp if request.HasField("timestamp") else None,
    )
    return s.QueryOffsetResponse(status=st.ok(), offset=offset)


async def get_offset(
    core: ProxyCore, request: s.GetOffsetRequest, ctx: RequestContext
) -> s.GetOffsetResponse:
    """The group's committed offset; -1 when it never committed on that queue."""
    offset = await core.offsets.get_offset(request.group.name, queue_address(request.message_queue))
    return s.GetOffsetResponse(status=st.ok(), offset=offset)


async def update_offset(
    core: ProxyCore, request: s.UpdateOffsetRequest, ctx: RequestContext
) -> s.UpdateOffsetResponse:
    await core.offsets.update_offset(
        request.group.name, queue_address(request.message_queue), request.offset
    )
    return s.UpdateOffsetResponse(status=st.ok())
