"""AdminService verbs on par with mqadmin, on the wire: consumer progress, offset reset by
time, message query, DLQ list and resend, topic route and cluster status (the operations are
popmq.proxy.core.admin's)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from popmq.broker.contract.types import PROP_ORIGIN_MESSAGE_ID, PROP_ORIGIN_TOPIC, StoredMessage
from popmq.proxy.core.admin import Admin
from popmq.proxy.grpc import status as st

from popmq.pb.admin.v1 import admin_pb2 as a


def _view(broker: str, m: StoredMessage, include_body: bool) -> a.StoredMessageView:
    return a.StoredMessageView(
        broker=broker, topic=m.topic, queue_id=m.queue_id, queue_offset=m.queue_offset,
        message_id=m.message_id, tag=m.tag, keys=list(m.keys),
        born_timestamp_ms=m.born_timestamp_ms, store_timestamp_ms=m.store_timestamp_ms,
        reconsume_times=m.reconsume_times, body_size=len(m.body),
        body=bytes(m.body) if include_body else b"",
        origin_topic=m.properties.get(PROP_ORIGIN_TOPIC, ""),
        origin_message_id=m.properties.get(PROP_ORIGIN_MESSAGE_ID, ""),
        properties={k: v for k, v in m.properties.items() if not k.startswith("__popmq.")},
    )  # fmt: skip


def _group_status(group: dict[str, Any]) -> a.BrokerGroup:
    return a.BrokerGroup(
        name=group["name"], leader=group["leader"] or "", epoch=group["epoch"],
        in_sync=group["in_sync"], draining=group["draining"],
        nodes=[
            a.GroupNode(name=n["name"], role=n["role"], lag_bytes=n["lag_bytes"] or 0,
                        lag_s=n["lag_s"] or 0.0, lag_known=n["lag_bytes"] is not None)
            for n in group["nodes"]
        ],
    )  # fmt: skip


class OperationsMixin:
    """Mixed into AdminServicer (which provides ``admin`` and ``_answer``)."""

    admin: Admin
    _answer: Callable[[type, Callable[[], Awaitable[Any]]], Awaitable[Any]]

    # -- consumer progress ---------------------------------------------------------------
    async def ConsumerProgress(
        self, request: a.ConsumerProgressRequest, context: object
    ) -> a.ConsumerProgressResponse:
        async def work() -> a.ConsumerProgressResponse:
            rows = await self.admin.consumer_progress(request.group, request.topic)
            return a.ConsumerProgressResponse(
                status=st.ok(),
                queues=[
                    a.QueueProgress(
                        broker=p.broker, topic=p.stats.topic, queue_id=p.stats.queue_id,
                        consumer_offset=p.stats.consumer_offset, max_offset=p.stats.max_offset,
                        lag=p.stats.backlog, inflight=p.stats.inflight,
                        lag_latency_ms=p.lag_latency_ms,
                    )
                    for p in rows
                ],
            )  # fmt: skip

        return await self._answer(a.ConsumerProgressResponse, work)

    async def ResetOffset(
        self, request: a.ResetOffsetRequest, context: object
    ) -> a.ResetOffsetResponse:
        async def work() -> a.ResetOffsetResponse:
            done = await self.admin.reset_offset(
                request.group, request.topic, request.WhichOneof("to"), request.timestamp_ms
            )
            return a.ResetOffsetResponse(
                status=st.ok(),
                queues=[
                    a.OffsetReset(
                        broker=r.broker, queue_id=r.queue_id, old_offset=r.old_offset,
                        new_offset=r.new_offset,
                    )
                    for r in done
                ],
            )  # fmt: skip

        return await self._answer(a.ResetOffsetResponse, work)

    # -- messages ------------------------------------------------------------------------
    async def QueryMessages(
        self, request: a.QueryMessagesRequest, context: object
    ) -> a.QueryMessagesResponse:
        async def work() -> a.QueryMessagesResponse:
            found, truncated = await self.admin.query_messages(
                request.message_id, request.key, request.topic, request.max_scan, request.limit,
                start_ms=request.start_ms, end_ms=request.end_ms,
            )  # fmt: skip
            return a.QueryMessagesResponse(
                status=st.ok(), truncated=truncated,
                messages=[_view(b, m, request.include_body) for b, m in found],
            )  # fmt: skip

        return await self._answer(a.QueryMessagesResponse, work)

    # -- dead-letter queues --------------------------------------------------------------
    async def ListDlq(self, request: a.ListDlqRequest, context: object) -> a.ListDlqResponse:
        async def work() -> a.ListDlqResponse:
            found, total, truncated = await self.admin.list_dlq(request.group, request.limit)
            return a.ListDlqResponse(
                status=st.ok(), total=total, truncated=truncated,
                messages=[_view(b, m, include_body=False) for b, m in found],
            )  # fmt: skip

        return await self._answer(a.ListDlqResponse, work)

    async def ResendDlq(self, request: a.ResendDlqRequest, context: object) -> a.ResendDlqResponse:
        async def work() -> a.ResendDlqResponse:
            resent = await self.admin.resend_dlq(
                request.group, list(request.message_ids), request.all
            )
            response = a.ResendDlqResponse(status=st.ok())
            for r in resent:
                view = _view(r.broker, r.original, include_body=False)
                view.topic, view.queue_id = r.topic, r.sent.queue_id
                view.queue_offset, view.message_id = r.sent.queue_offset, r.sent.message_id
                response.resent.append(view)
            return response

        return await self._answer(a.ResendDlqResponse, work)

    # -- cluster -------------------------------------------------------------------------
    async def TopicRoute(
        self, request: a.TopicRouteRequest, context: object
    ) -> a.TopicRouteResponse:
        async def work() -> a.TopicRouteResponse:
            brokers = await self.admin.topic_route(request.topic)
            return a.TopicRouteResponse(
                status=st.ok(), topic=request.topic, proxy=self.admin.proxy,
                brokers=[
                    a.RouteBroker(broker=b.broker, address=b.address, queue_count=b.queue_count)
                    for b in brokers
                ],
            )  # fmt: skip

        return await self._answer(a.TopicRouteResponse, work)

    async def ClusterStatus(
        self, request: a.ClusterStatusRequest, context: object
    ) -> a.ClusterStatusResponse:
        status = await self.admin.cluster_status()
        return a.ClusterStatusResponse(
            status=st.ok(), proxy=status.proxy, version=status.version, clients=status.clients,
            brokers=[
                a.BrokerStatus(
                    broker=b.broker, address=b.address, reachable=b.reachable,
                    rtt_ms=b.rtt_ms, topics=b.topics, error=b.error,
                )
                for b in status.brokers
            ],
            groups=[_group_status(g) for g in status.groups],
        )  # fmt: skip
