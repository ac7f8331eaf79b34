"""rocketmq-apis' apache.rocketmq.v2.Admin on the admin port, so upstream tools can talk to
popmq: each RPC translates to one of the core's admin operations (popmq.proxy.core.admin), the
same ones `popmq admin` and the console use. RPCs popmq has no operation for are not in
protos/popmq/pb/rocketmq/v2/admin.proto, so grpc answers them UNIMPLEMENTED.

Refusals come back as the response's RocketMQ Status (ChangeLogLevelResponse has none: a refused
change aborts the call with INVALID_ARGUMENT).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.wire.undecodable import add_tolerant
from popmq.proxy.core.admin import Accumulation, Admin
from popmq.proxy.grpc import status as st
from popmq.proxy.grpc.convert import duration, stored_to_pb, timestamp

from popmq.pb.pool import Timestamp
from popmq.pb.rocketmq.v2 import admin_pb2 as ad
from popmq.pb.rocketmq.v2 import admin_pb2_grpc
from popmq.pb.rocketmq.v2 import definition_pb2 as pb

_MESSAGE_TYPES = {
    "NORMAL": pb.NORMAL, "FIFO": pb.FIFO, "DELAY": pb.DELAY, "TRANSACTION": pb.TRANSACTION,
}  # fmt: skip
_CONSUMERS = ("PUSH_CONSUMER", "SIMPLE_CONSUMER", "PULL_CONSUMER", "LITE_PUSH_CONSUMER")
_QUERY_LIMIT = 1_000  # max_message_nums above this is cut to it


def _ms(value: Timestamp) -> int:
    return value.seconds * 1000 + value.nanos // 1_000_000


def _accumulation(found: Accumulation) -> Any:
    return ad.DescribeGroupAccumulationResponse.GroupAccumulation(
        inflight_messages=found.inflight, ready_messages=found.ready,
        accumulation=found.accumulation, deliver_delay_time=duration(found.oldest_ms),
    )  # fmt: skip


class UpstreamAdminServicer(admin_pb2_grpc.AdminServicer):
    def __init__(self, admin: Admin) -> None:
        self.admin = admin

    async def _answer(self, response_type: type, work: Callable[[], Awaitable[Any]]) -> Any:
        try:
            return await work()
        except Exception as exc:
            return response_type(status=st.status_of(exc))

    async def ChangeLogLevel(
        self, request: ad.ChangeLogLevelRequest, context: grpc.aio.ServicerContext
    ) -> ad.ChangeLogLevelResponse:
        level = ad.ChangeLogLevelRequest.Level.Name(request.level)
        try:
            name = self.admin.change_log_level(level)
        except RefusedError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return ad.ChangeLogLevelResponse(remark=f"popmq's loggers at {name} on {self.admin.proxy}")

    async def DescribeTopicStatus(
        self, request: ad.DescribeTopicStatusRequest, context: object
    ) -> ad.DescribeTopicStatusResponse:
        async def work() -> ad.DescribeTopicStatusResponse:
            brokers, _ = await self.admin.describe_topic(request.topic.name, "")
            kinds = {info.message_type for _, info in brokers}
            # MIXED (any type) has no value in the upstream enum: UNSPECIFIED, as RocketMQ's
            # proxy answers a topic without a declared type.
            kind = _MESSAGE_TYPES.get(kinds.pop(), pb.MESSAGE_TYPE_UNSPECIFIED) if len(kinds) == 1 \
                else pb.MESSAGE_TYPE_UNSPECIFIED  # fmt: skip
            return ad.DescribeTopicStatusResponse(
                status=st.ok(), topic_message_type=kind,
                tags={"queues": str(sum(info.queue_count for _, info in brokers)),
                      "brokers": ",".join(name for name, _ in brokers)},
            )  # fmt: skip

        return await self._answer(ad.DescribeTopicStatusResponse, work)

    async def ListSubscription(
        self, request: ad.ListSubscriptionRequest, context: object
    ) -> ad.ListSubscriptionResponse:
        group = request.group.name if request.HasField("group") else ""
        topic = request.topic.name if request.HasField("topic") else ""
        seen: dict[tuple[str, str], Any] = {}
        for client in self.admin.clients(group):
            if client.client_type not in _CONSUMERS or not client.group:
                continue
            for name in sorted(client.topics):
                if topic and name != topic:
                    continue
                info = seen.get((client.group, name))
                if info is None:
                    info = seen[client.group, name] = ad.SubscriptionInfo(
                        group=pb.Resource(name=client.group), topic=pb.Resource(name=name),
                        message_model=ad.CLUSTERING, subscription_consistency=True,
                    )  # fmt: skip
                info.online |= client.telemetry_open
                last = int(client.last_seen * 1000)
                if last > _ms(info.last_update_timestamp):
                    info.last_update_timestamp.CopyFrom(timestamp(last))
        return ad.ListSubscriptionResponse(status=st.ok(), subscription_info=list(seen.values()))

    async def DescribeGroupAccumulation(
        self, request: ad.DescribeGroupAccumulationRequest, context: object
    ) -> ad.DescribeGroupAccumulationResponse:
        async def work() -> ad.DescribeGroupAccumulationResponse:
            if request.HasField("lite_topic"):
                raise RefusedError(Code.BAD_REQUEST, "popmq has no lite topics")
            topics = [t.name for t in request.topics]
            found = await self.admin.group_accumulation(request.group.name, topics)
            total = Accumulation()
            for one in found.values():
                total.inflight += one.inflight
                total.accumulation += one.accumulation
                total.oldest_ms = max(total.oldest_ms, one.oldest_ms)
            return ad.DescribeGroupAccumulationResponse(
                status=st.ok(), accumulation=_accumulation(total),
                topic_accumulation={name: _accumulation(one) for name, one in found.items()},
            )  # fmt: skip

        return await self._answer(ad.DescribeGroupAccumulationResponse, work)

    async def ListConsumerConnection(
        self, request: ad.ListConsumerConnectionRequest, context: object
    ) -> ad.ListConsumerConnectionResponse:
        async def work() -> ad.ListConsumerConnectionResponse:
            await self.admin.get_group(request.group.name)  # CONSUMER_GROUP_NOT_FOUND if none
            topic = request.topic.name if request.HasField("topic") else ""
            return ad.ListConsumerConnectionResponse(
                status=st.ok(),
                client_info=[
                    ad.ClientInfo(client_id=c.client_id, version=c.version, language=c.language,
                                  egress_ip=c.peer, message_model=ad.CLUSTERING)
                    for c in self.admin.clients(request.group.name)
                    if c.client_type in _CONSUMERS and (not topic or topic in c.topics)
                ],
            )  # fmt: skip

        return await self._answer(ad.ListConsumerConnectionResponse, work)

    async def ResetGroupOffset(
        self, request: ad.ResetGroupOffsetRequest, context: object
    ) -> ad.ResetGroupOffsetResponse:
        async def work() -> ad.ResetGroupOffsetResponse:
            if not request.HasField("reset_timestamp"):
                raise RefusedError(Code.BAD_REQUEST, "reset_timestamp is required")
            await self.admin.reset_offset(request.group.name, request.topic.name, "timestamp_ms",
                                          _ms(request.reset_timestamp))  # fmt: skip
            return ad.ResetGroupOffsetResponse(status=st.ok())

        return await self._answer(ad.ResetGroupOffsetResponse, work)

    async def QueryMessage(
        self, request: ad.ListMessageRequest, context: object
    ) -> ad.ListMessageResponse:
        async def work() -> ad.ListMessageResponse:
            key = request.WhichOneof("search_key")
            if key in ("subscription", "lite_topic"):
                raise RefusedError(Code.BAD_REQUEST, f"popmq does not search by {key}")
            if request.max_message_nums < 0:
                raise RefusedError(Code.BAD_REQUEST, "max_message_nums must not be negative")
            begin = _ms(request.begin_timestamp) if request.HasField("begin_timestamp") else 0
            # Upstream's end is inclusive; the core's is exclusive.
            end = _ms(request.end_timestamp) + 1 if request.HasField("end_timestamp") else 0
            found, _ = await self.admin.query_messages(
                request.message_id, request.message_key, request.topic.name,
                limit=min(request.max_message_nums or 32, _QUERY_LIMIT), start_ms=begin,
                end_ms=end,
            )  # fmt: skip
            return ad.ListMessageResponse(
                status=st.ok(), messages=[stored_to_pb(message) for _, message in found]
            )

        return await self._answer(ad.ListMessageResponse, work)

    async def AdminSendMessage(
        self, request: ad.AdminSendMessageRequest, context: object
    ) -> ad.AdminSendMessageResponse:
        async def work() -> ad.AdminSendMessageResponse:
            _, _, sent = await self.admin.send_test_message(
                request.topic.name, request.body, request.tag,
                [request.key] if request.key else [], dict(request.user_properties),
            )  # fmt: skip
            return ad.AdminSendMessageResponse(status=st.ok(), message_id=sent.message_id)

        return await self._answer(ad.AdminSendMessageResponse, work)

    async def GetTopicRoute(
        self, request: ad.GetTopicRouteRequest, context: object
    ) -> ad.GetTopicRouteResponse:
        async def work() -> ad.GetTopicRouteResponse:
            route = await self.admin.topic_route(request.topic.name)
            # RocketMQ's TopicRouteData JSON (queueDatas, brokerDatas); perm 6: read and write.
            data = {
                "queueDatas": [
                    {"brokerName": r.broker, "readQueueNums": r.queue_count,
                     "writeQueueNums": r.queue_count, "perm": 6, "topicSysFlag": 0}
                    for r in route
                ],
                "brokerDatas": [
                    {"cluster": self.admin.cluster_name, "brokerName": r.broker,
                     "brokerAddrs": {"0": r.address}}
                    for r in route
                ],
            }  # fmt: skip
            return ad.GetTopicRouteResponse(status=st.ok(), topic_route_data=json.dumps(data))

        return await self._answer(ad.GetTopicRouteResponse, work)

    async def GetProxyRuntimeStats(
        self, request: ad.GetProxyRuntimeStatsRequest, context: object
    ) -> ad.GetProxyRuntimeStatsResponse:
        status = await self.admin.cluster_status()
        clients = self.admin.clients()
        producers = sum(1 for c in clients if c.client_type == "PRODUCER")
        consumers = sum(1 for c in clients if c.client_type in _CONSUMERS)
        return ad.GetProxyRuntimeStatsResponse(
            status=st.ok(), proxy_name=status.proxy, version=status.version,
            connections=len(clients), producers=producers, consumers=consumers,
        )  # fmt: skip


def add_upstream_admin_service(
    server: grpc.aio.Server,
    admin: Admin,
    count_undecodable: Callable[[str, str], None] | None = None,
    small_request_bytes: int | None = None,
) -> None:
    add_tolerant(
        admin_pb2_grpc.add_AdminServicer_to_server,
        UpstreamAdminServicer(admin),
        server,
        count_undecodable,
        small_request_bytes=small_request_bytes,  # every admin request is small
        registered=False,  # rarely called: costs the client calls nothing (add_tolerant)
    )
