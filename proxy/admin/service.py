"""AdminService on the wire: topics, groups, clients and stats, over the core's Admin.

The proxy is the natural place for it: it already knows every broker, and `popmq admin` needs
one endpoint only. Refusals come back as a RocketMQ Status, like the messaging API. The
operations themselves (popmq.proxy.core.admin) take and return domain objects; this module and
operations.py only translate.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from popmq.broker.contract.types import GroupConfig, TopicInfo
from popmq.broker.wire.undecodable import add_tolerant
from popmq.proxy.admin.console_ops import ConsoleOpsMixin
from popmq.proxy.admin.operations import OperationsMixin
from popmq.proxy.core.admin import Admin, GroupChanges, TopicBrokers
from popmq.proxy.grpc import status as st

from popmq.pb.admin.v1 import admin_pb2 as a
from popmq.pb.admin.v1 import admin_pb2_grpc


def _broker_topic(broker: str, info: TopicInfo) -> a.BrokerTopic:
    return a.BrokerTopic(
        broker=broker,
        queue_count=info.queue_count,
        message_type=info.message_type,
        queues=[
            a.QueueOffsets(queue_id=q.queue_id, min_offset=q.min_offset, max_offset=q.max_offset)
            for q in info.queues
        ],
    )


def _topic_pb(name: str, brokers: TopicBrokers) -> a.Topic:
    return a.Topic(name=name, brokers=[_broker_topic(b, i) for b, i in brokers])


def _group_pb(config: GroupConfig) -> a.Group:
    return a.Group(
        name=config.name,
        consume_mode=config.consume_mode.value,
        max_attempts=config.max_attempts,
        retry_levels=list(config.retry_levels),
        fifo=config.fifo,
    )


class AdminServicer(OperationsMixin, ConsoleOpsMixin, admin_pb2_grpc.AdminServiceServicer):
    """gRPC method names are the API's (CamelCase)."""

    def __init__(self, admin: Admin) -> None:
        self.admin = admin

    async def _answer(self, response_type: type, work: Callable[[], Awaitable[Any]]) -> Any:
        try:
            return await work()
        except Exception as exc:
            return response_type(status=st.status_of(exc))

    async def CreateTopic(self, request: a.CreateTopicRequest, context: object) -> a.TopicResponse:
        async def work() -> a.TopicResponse:
            brokers = await self.admin.create_topic(
                request.name, request.queue_count, list(request.brokers), request.message_type
            )
            return a.TopicResponse(status=st.ok(), topic=_topic_pb(request.name, brokers))

        return await self._answer(a.TopicResponse, work)

    async def ListTopics(
        self, request: a.ListTopicsRequest, context: object
    ) -> a.ListTopicsResponse:
        async def work() -> a.ListTopicsResponse:
            topics = await self.admin.list_topics(request.include_system)
            return a.ListTopicsResponse(
                status=st.ok(), topics=[_topic_pb(name, brokers) for name, brokers in topics]
            )

        return await self._answer(a.ListTopicsResponse, work)

    async def DescribeTopic(
        self, request: a.DescribeTopicRequest, context: object
    ) -> a.DescribeTopicResponse:
        async def work() -> a.DescribeTopicResponse:
            brokers, rows = await self.admin.describe_topic(request.name, request.group)
            return a.DescribeTopicResponse(
                status=st.ok(),
                topic=_topic_pb(request.name, brokers),
                group_queues=[
                    a.GroupQueue(
                        broker=broker, topic=row.topic, queue_id=row.queue_id,
                        consumer_offset=row.consumer_offset, max_offset=row.max_offset,
                        backlog=row.backlog, inflight=row.inflight,
                    )
                    for broker, row in rows
                ],
            )  # fmt: skip

        return await self._answer(a.DescribeTopicResponse, work)

    async def DeleteTopic(
        self, request: a.DeleteTopicRequest, context: object
    ) -> a.DeleteTopicResponse:
        async def work() -> a.DeleteTopicResponse:
            await self.admin.delete_topic(request.name)
            return a.DeleteTopicResponse(status=st.ok())

        return await self._answer(a.DeleteTopicResponse, work)

    async def GetGroup(self, request: a.GetGroupRequest, context: object) -> a.GroupResponse:
        async def work() -> a.GroupResponse:
            config = await self.admin.get_group(request.name)
            return a.GroupResponse(status=st.ok(), group=_group_pb(config))

        return await self._answer(a.GroupResponse, work)

    async def UpdateGroup(self, request: a.UpdateGroupRequest, context: object) -> a.GroupResponse:
        async def work() -> a.GroupResponse:
            changes = GroupChanges(
                consume_mode=request.consume_mode if request.HasField("consume_mode") else None,
                max_attempts=request.max_attempts if request.HasField("max_attempts") else None,
                retry_levels=list(request.retry_levels),
                reset_retry_levels=request.reset_retry_levels,
                fifo=request.fifo if request.HasField("fifo") else None,
            )
            updated = await self.admin.update_group(request.name, changes)
            return a.GroupResponse(status=st.ok(), group=_group_pb(updated))

        return await self._answer(a.GroupResponse, work)

    async def ListGroups(
        self, request: a.ListGroupsRequest, context: object
    ) -> a.ListGroupsResponse:
        async def work() -> a.ListGroupsResponse:
            rows = await self.admin.list_groups()
            return a.ListGroupsResponse(
                status=st.ok(),
                groups=[
                    a.GroupSummary(
                        group=_group_pb(row.config), brokers=row.brokers,
                        inflight=row.inflight, offset_queues=row.offset_queues,
                    )
                    for row in rows
                ],
            )  # fmt: skip

        return await self._answer(a.ListGroupsResponse, work)

    async def ListTransactions(
        self, request: a.ListTransactionsRequest, context: object
    ) -> a.ListTransactionsResponse:
        async def work() -> a.ListTransactionsResponse:
            rows = await self.admin.list_transactions()
            return a.ListTransactionsResponse(
                status=st.ok(),
                transactions=[
                    a.HalfTransaction(
                        broker=broker, topic=h.topic, message_id=h.message_id,
                        transaction_id=h.transaction_id, stored_ms=h.stored_ms, checks=h.checks,
                        parked=h.parked,
                    )
                    for broker, h in rows
                ],
            )  # fmt: skip

        return await self._answer(a.ListTransactionsResponse, work)

    async def ResolveTransaction(
        self, request: a.ResolveTransactionRequest, context: object
    ) -> a.ResolveTransactionResponse:
        async def work() -> a.ResolveTransactionResponse:
            broker, topic = await self.admin.resolve_transaction(request.message_id, request.commit)
            return a.ResolveTransactionResponse(status=st.ok(), broker=broker, topic=topic)

        return await self._answer(a.ResolveTransactionResponse, work)

    async def DeleteGroup(
        self, request: a.DeleteGroupRequest, context: object
    ) -> a.DeleteGroupResponse:
        async def work() -> a.DeleteGroupResponse:
            done = await self.admin.delete_group(request.name, request.clean_offsets, request.force)
            return a.DeleteGroupResponse(
                status=st.ok(), brokers=done.brokers, inflight=done.inflight,
                offsets_removed=done.offsets_removed,
            )  # fmt: skip

        return await self._answer(a.DeleteGroupResponse, work)

    async def ListClients(
        self, request: a.ListClientsRequest, context: object
    ) -> a.ListClientsResponse:
        async def work() -> a.ListClientsResponse:
            page, next_token = self.admin.clients_page(
                request.group, request.page_size, request.page_token
            )
            clients = [
                a.Client(
                    client_id=c.client_id,
                    client_type=c.client_type,
                    group=c.group,
                    topics=sorted(c.topics),
                    language=c.language,
                    version=c.version,
                    peer=c.peer,
                    first_seen=c.first_seen,
                    last_seen=c.last_seen,
                    telemetry_open=c.telemetry_open,
                )
                for c in page
            ]
            return a.ListClientsResponse(
                status=st.ok(), clients=clients, proxy=self.admin.proxy, next_page_token=next_token
            )

        return await self._answer(a.ListClientsResponse, work)

    async def Stats(self, request: a.StatsRequest, context: object) -> a.StatsResponse:
        return a.StatsResponse(status=st.ok(), prometheus_text=self.admin.stats_text())


def add_admin_service(
    server: grpc.aio.Server,
    admin: Admin,
    count_undecodable: Callable[[str, str], None] | None = None,
    small_request_bytes: int | None = None,
) -> None:
    # Undecodable bodies answer INVALID_ARGUMENT (counted, logged at a bounded rate), as on
    # the MessagingService: never UNKNOWN with a traceback.
    add_tolerant(
        admin_pb2_grpc.add_AdminServiceServicer_to_server,
        AdminServicer(admin),
        server,
        count_undecodable,
        small_request_bytes=small_request_bytes,  # every admin request is small
        registered=False,  # rarely called: costs the client calls nothing (add_tolerant)
    )
