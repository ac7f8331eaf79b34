"""RecallMessage: cancel a delay message before its delivery time, by the recall handle its
SendReceipt carried. The handle names its broker in clear (routing); that broker opens the
sealed rest and refuses forged, altered, foreign or other-topic handles (BAD_REQUEST)."""

from __future__ import annotations

from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.recall_handle import peek_recall_broker
from popmq.proxy.core import validate
from popmq.proxy.core.context import RequestContext
from popmq.proxy.grpc import status as st
from popmq.proxy.services import ProxyServices

from popmq.pb.rocketmq.v2 import service_pb2 as s

MAX_HANDLE_CHARS = 1024


async def recall_message(
    services: ProxyServices, request: s.RecallMessageRequest, ctx: RequestContext
) -> s.RecallMessageResponse:
    topic = validate.topic_name(request.topic.name)
    handle = request.recall_handle
    if not handle:
        raise RefusedError(Code.BAD_REQUEST, "the recall handle is empty")
    if len(handle) > MAX_HANDLE_CHARS:
        raise RefusedError(Code.BAD_REQUEST, "invalid recall handle: too long")
    broker = peek_recall_broker(handle)
    if broker not in services.cluster.names:
        raise RefusedError(Code.BAD_REQUEST, f"invalid recall handle: no broker {broker!r} here")
    message_id = await services.cluster.port(broker).recall(topic, handle)
    return s.RecallMessageResponse(status=st.ok(), message_id=message_id)
