"""AdminService: topics, groups, clients and stats, applied across every broker.

The proxy is the natural place for it: it already knows every broker, and `popmq admin` needs
one endpoint only. Refusals come back as a RocketMQ Status, like the messaging API.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.types import DLQ_PREFIX, RETRY_PREFIX, ConsumeMode, TopicInfo
from popmq.proxy.admin.operations import OperationsMixin
from popmq.proxy.core import validate
from popmq.proxy.grpc import status as st
from popmq.proxy.services import ProxyServices
from prometheus_client import generate_latest

from popmq.config import parse_duration_ms
from popmq.lifecycle import fan_out
from popmq.pb.admin.v1 import admin_pb2 as a
from popmq.pb.admin.v1 import admin_pb2_grpc


def _broker_topic(broker: str, info: TopicInfo) -> a.BrokerTopic:
    return a.BrokerTopic(
        broker=broker,
        queue_count=info.queue_count,
        queues=[
            a.QueueOffsets(queue_id=q.queue_id, min_offset=q.min_offset, max_offset=q.max_offset)
            for q in info.queues
        ],
    )


def _group_pb(config: Any) -> a.Group:
    return a.Group(
        name=config.name,
        consume_mode=config.consume_mode.value,
        max_attempts=config.max_attempts,
        retry_levels=list(config.retry_levels),
        fifo=config.fifo,
    )


class AdminServicer(OperationsMixin, admin_pb2_grpc.AdminServiceServicer):
    """gRPC method names are the API's (CamelCase)."""

    def __init__(self, services: ProxyServices) -> None:
        self.services = services

    async def _answer(self, response_type: type, work: Callable[[], Awaitable[Any]]) -> Any:
        try:
            return await work()
        except Exception as exc:
            return response_type(status=st.status_of(exc))

    async def _topic(self, name: str) -> a.Topic:
        infos = await self.services.cluster.topic_infos(name)
        return a.Topic(name=name, brokers=[_broker_topic(b, i) for b, i in infos.items()])

    async def CreateTopic(self, request: a.CreateTopicRequest, context: object) -> a.TopicResponse:
        async def work() -> a.TopicResponse:
            name = validate.topic_name(request.name)
            if request.queue_count < 1:
                raise RefusedError(Code.BAD_REQUEST, "queue count must be at least 1")
            cluster = self.services.cluster
            brokers = list(request.brokers) or cluster.names
            infos = await fan_out(
                cluster.port(b).create_topic(name, request.queue_count) for b in brokers
            )
            cluster.forget_topic(name)
            topic = a.Topic(
                name=name,
                brokers=[_broker_topic(b, i) for b, i in zip(brokers, infos, strict=True)],
            )
            return a.TopicResponse(status=st.ok(), topic=topic)

        return await self._answer(a.TopicResponse, work)

    async def ListTopics(
        self, request: a.ListTopicsRequest, context: object
    ) -> a.ListTopicsResponse:
        async def work() -> a.ListTopicsResponse:
            cluster = self.services.cluster
            per_broker = await fan_out(p.list_topics() for p in cluster.ports)
            topics: dict[str, a.Topic] = {}
            for broker, infos in zip(cluster.names, per_broker, strict=True):
                for info in infos:
                    system = info.name.startswith((RETRY_PREFIX, DLQ_PREFIX, "%"))
                    if system and not request.include_system:
                        continue
                    topic = topics.setdefault(info.name, a.Topic(name=info.name))
                    topic.brokers.append(_broker_topic(broker, info))
            ordered = [topics[name] for name in sorted(topics)]
            return a.ListTopicsResponse(status=st.ok(), topics=ordered)

        return await self._answer(a.ListTopicsResponse, work)

    async def DescribeTopic(
        self, request: a.DescribeTopicRequest, context: object
    ) -> a.DescribeTopicResponse:
        async def work() -> a.DescribeTopicResponse:
            name = validate.topic_name(request.name, allow_dlq=True)
            topic = await self._topic(name)
            response = a.DescribeTopicResponse(status=st.ok(), topic=topic)
            if request.group:
                group = validate.group_name(request.group)
                cluster = self.services.cluster
                brokers = [b.broker for b in topic.brokers]
                stats = await fan_out(cluster.port(b).group_stats(group, name) for b in brokers)
                for broker, rows in zip(brokers, stats, strict=True):
                    for row in rows:
                        response.group_queues.append(
                            a.GroupQueue(
                                broker=broker,
                                topic=row.topic,
                                queue_id=row.queue_id,
                                consumer_offset=row.consumer_offset,
                                max_offset=row.max_offset,
                                backlog=row.backlog,
                                inflight=row.inflight,
                            )
                        )
            return response

        return await self._answer(a.DescribeTopicResponse, work)

    async def DeleteTopic(
        self, request: a.DeleteTopicRequest, context: object
    ) -> a.DeleteTopicResponse:
        async def work() -> a.DeleteTopicResponse:
            name = validate.topic_name(request.name, allow_dlq=True)
            topic = await self._topic(name)
            cluster = self.services.cluster
            ports = [cluster.port(b.broker) for b in topic.brokers]
            await fan_out(port.delete_topic(name) for port in ports)
            cluster.forget_topic(name)
            return a.DeleteTopicResponse(status=st.ok())

        return await self._answer(a.DeleteTopicResponse, work)

    async def GetGroup(self, request: a.GetGroupRequest, context: object) -> a.GroupResponse:
        async def work() -> a.GroupResponse:
            name = validate.group_name(request.name)
            await self._require_group(name)
            config = await self.services.cluster.ports[0].get_group(name)
            return a.GroupResponse(status=st.ok(), group=_group_pb(config))

        return await self._answer(a.GroupResponse, work)

    async def UpdateGroup(self, request: a.UpdateGroupRequest, context: object) -> a.GroupResponse:
        async def work() -> a.GroupResponse:
            name = validate.group_name(request.name)
            cluster = self.services.cluster
            current = await cluster.ports[0].get_group(name)
            changes: dict[str, Any] = {}
            if request.HasField("consume_mode"):
                mode = request.consume_mode.upper()
                if mode not in ConsumeMode.__members__:
                    raise RefusedError(Code.BAD_REQUEST, "consume mode must be POP or PULL")
                changes["consume_mode"] = ConsumeMode[mode]
            if request.HasField("max_attempts"):
                if request.max_attempts < 1:
                    raise RefusedError(Code.BAD_REQUEST, "max attempts must be at least 1")
                changes["max_attempts"] = request.max_attempts
            if request.reset_retry_levels:
                changes["retry_levels"] = []
            elif request.retry_levels:
                for level in request.retry_levels:
                    try:
                        parse_duration_ms(level)
                    except ValueError as exc:
                        raise RefusedError(Code.BAD_REQUEST, str(exc)) from None
                changes["retry_levels"] = list(request.retry_levels)
            if request.HasField("fifo"):
                changes["fifo"] = request.fifo
            updated = await cluster.update_group(dataclasses.replace(current, **changes))
            return a.GroupResponse(status=st.ok(), group=_group_pb(updated))

        return await self._answer(a.GroupResponse, work)

    async def ListGroups(
        self, request: a.ListGroupsRequest, context: object
    ) -> a.ListGroupsResponse:
        async def work() -> a.ListGroupsResponse:
            cluster = self.services.cluster
            per_broker = await fan_out(p.list_groups() for p in cluster.ports)
            groups: dict[str, a.GroupSummary] = {}
            for broker, summaries in zip(cluster.names, per_broker, strict=True):
                for s in summaries:
                    row = groups.setdefault(
                        s.config.name, a.GroupSummary(group=_group_pb(s.config))
                    )
                    row.brokers.append(broker)
                    row.inflight += s.inflight
                    row.offset_queues += s.offset_queues
            ordered = [groups[name] for name in sorted(groups)]
            return a.ListGroupsResponse(status=st.ok(), groups=ordered)

        return await self._answer(a.ListGroupsResponse, work)

    async def DeleteGroup(
        self, request: a.DeleteGroupRequest, context: object
    ) -> a.DeleteGroupResponse:
        async def work() -> a.DeleteGroupResponse:
            name = validate.group_name(request.name)
            cluster = self.services.cluster
            per_broker = await fan_out(p.list_groups() for p in cluster.ports)
            holders = [
                (broker, port, summary)
                for broker, port, summaries in zip(
                    cluster.names, cluster.ports, per_broker, strict=True
                )
                for summary in summaries
                if summary.config.name == name
            ]
            if not holders:
                raise RefusedError(Code.CONSUMER_GROUP_NOT_FOUND, f"group {name!r} does not exist")
            inflight = sum(s.inflight for _, _, s in holders)
            if inflight and not request.force:  # checked before any broker changes
                raise RefusedError(
                    Code.PRECONDITION_FAILED,
                    f"group {name!r} has {inflight} messages in flight; ack them or wait for "
                    "their invisible time, or delete with force (they then revive as usual)",
                )
            done = await fan_out(
                port.delete_group(name, request.clean_offsets, request.force)
                for _, port, _ in holders
            )  # fmt: skip
            cluster.forget_group(name)
            return a.DeleteGroupResponse(
                status=st.ok(),
                brokers=[broker for broker, _, _ in holders],
                inflight=sum(d.inflight for d in done),
                offsets_removed=sum(d.offsets_removed for d in done),
            )

        return await self._answer(a.DeleteGroupResponse, work)

    async def ListClients(
        self, request: a.ListClientsRequest, context: object
    ) -> a.ListClientsResponse:
        registry = self.services.registry
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
            for c in registry.clients(request.group or None)
        ]
        proxy = f"{self.services.advertised_host}:{self.services.advertised_port}"
        return a.ListClientsResponse(status=st.ok(), clients=clients, proxy=proxy)

    async def Stats(self, request: a.StatsRequest, context: object) -> a.StatsResponse:
        text = generate_latest(self.services.metrics.registry).decode()
        return a.StatsResponse(status=st.ok(), prometheus_text=text)


def add_admin_service(server: grpc.aio.Server, services: ProxyServices) -> None:
    admin_pb2_grpc.add_AdminServiceServicer_to_server(AdminServicer(services), server)
