"""ForwardMessageToDeadLetterQueue: a consumer gives up on a message (push consumers do so
after their max attempts); the broker moves it to %DLQ%<group> and acks it. A message read
from %DLQ%<group> itself has used its attempts: given up on again, it goes back there."""

from __future__ import annotations

from popmq.proxy.core import validate
from popmq.proxy.core.context import RequestContext
from popmq.proxy.grpc import status as st
from popmq.proxy.services import ProxyServices

from popmq.pb.rocketmq.v2 import service_pb2 as s


async def forward_to_dlq(
    services: ProxyServices, request: s.ForwardMessageToDeadLetterQueueRequest, ctx: RequestContext
) -> s.ForwardMessageToDeadLetterQueueResponse:
    group = validate.group_name(request.group.name)
    topic = validate.topic_name(request.topic.name, allow_dlq=True)
    handle = validate.receipt_handle(request.receipt_handle)
    handle = await services.renewer.take(handle)  # a PushConsumer's renewed handle
    port = services.cluster.port_for_handle(handle)
    await port.forward_to_dlq(group, topic, handle)
    return s.ForwardMessageToDeadLetterQueueResponse(status=st.ok())
