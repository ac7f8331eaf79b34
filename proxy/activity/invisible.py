"""ChangeInvisibleDuration: move a popped message's next-visible time; a new handle replaces
the old one. The official clients adopt the response's handle before checking its status, so
a failure answers with the handle they sent (still their best one)."""

from __future__ import annotations

from popmq.proxy.core import validate
from popmq.proxy.core.context import RequestContext
from popmq.proxy.core.times import invisible_duration_ms
from popmq.proxy.grpc import status as st
from popmq.proxy.services import ProxyServices

from popmq.pb.rocketmq.v2 import service_pb2 as s


async def change_invisible_duration(
    services: ProxyServices, request: s.ChangeInvisibleDurationRequest, ctx: RequestContext
) -> s.ChangeInvisibleDurationResponse:
    group = validate.group_name(request.group.name)
    topic = validate.topic_name(request.topic.name, allow_dlq=True)
    handle = validate.receipt_handle(request.receipt_handle)
    # RocketMQ: any duration from 0 up to the maximum (the receive minimum does not apply).
    invisible_ms = validate.invisible_time(
        invisible_duration_ms(request.invisible_duration),
        0,
        services.proxy.max_invisible_ms,
    )
    handle = await services.renewer.take(handle)  # a PushConsumer nack: stop renewing
    port = services.cluster.port_for_handle(handle)
    result = await port.change_invisible_time(group, topic, handle, invisible_ms)
    return s.ChangeInvisibleDurationResponse(status=st.ok(), receipt_handle=result.receipt_handle)
