"""QueryAssignment: server-side queue assignment for push consumers (seed 002).

POP groups use allocate4Pop: with popShareQueueNum = N each consumer takes its own average
share plus the shares of the N consumers after it, so every queue has N + 1 consumers; when N
is 0 or covers everyone, every consumer gets every broker (queue id -1: "pop all queues").
PULL groups get an exclusive average share (AllocateMessageQueueAveragely), for consumers that
pull by offset. The group members are the consumers this proxy has heard from.
"""

from __future__ import annotations

from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.types import ConsumeMode
from popmq.proxy.activity.route import ACCEPTED_TYPES, MASTER_BROKER_ID, proxy_endpoints
from popmq.proxy.cluster import QueueRef
from popmq.proxy.core import validate
from popmq.proxy.core.context import RequestContext
from popmq.proxy.grpc import status as st
from popmq.proxy.registry import member_id
from popmq.proxy.services import ProxyServices

from popmq.pb.rocketmq.v2 import definition_pb2 as pb
from popmq.pb.rocketmq.v2 import service_pb2 as s

ALL_QUEUES = -1


def allocate_averagely(client: str, queues: list[QueueRef], clients: list[str]) -> list[QueueRef]:
    """RocketMQ's AllocateMessageQueueAveragely: contiguous, near-equal shares in order."""
    if client not in clients or not queues:
        return []
    index, n_queues, n_clients = clients.index(client), len(queues), len(clients)
    mod = n_queues % n_clients
    if n_queues <= n_clients:
        size = 1
    elif mod > 0 and index < mod:
        size = n_queues // n_clients + 1
    else:
        size = n_queues // n_clients
    start = index * size if mod > 0 and index < mod else index * size + mod
    count = min(size, n_queues - start)
    return [queues[(start + i) % n_queues] for i in range(max(count, 0))]


def allocate_for_pop(
    client: str, queues: list[QueueRef], clients: list[str], share_queue_num: int
) -> list[QueueRef]:
    """RocketMQ's allocate4Pop. Returns (broker, ALL_QUEUES) entries when every consumer
    reads everything."""
    if share_queue_num <= 0 or share_queue_num >= len(clients) - 1:
        brokers = dict.fromkeys(q.broker for q in queues)
        return [QueueRef(broker, ALL_QUEUES) for broker in brokers]
    if len(clients) <= len(queues):
        result = allocate_averagely(client, queues, clients)
        index = clients.index(client)
        for _ in range(share_queue_num):
            index = (index + 1) % len(clients)
            result.extend(allocate_averagely(clients[index], queues, clients))
        return list(dict.fromkeys(result))
    # More consumers than queues: each consumer one queue, queues shared round robin.
    return [queues[clients.index(client) % len(queues)]]


async def query_assignment(
    services: ProxyServices, request: s.QueryAssignmentRequest, ctx: RequestContext
) -> s.QueryAssignmentResponse:
    topic = validate.topic_name(request.topic.name, allow_dlq=True)
    group = validate.group_name(request.group.name)
    if not ctx.client_id:
        raise RefusedError(Code.CLIENT_ID_REQUIRED, "the x-mq-client-id header is required")
    route = await services.cluster.route(topic, create=ctx.create_topic(topic))
    config = await services.cluster.group(group)
    info = services.registry.get(ctx.client_id, ctx.access_key)
    topics = (info.topics if info else set()) | {topic}
    services.registry.touch(
        ctx.client_id, group=group, topics=topics, peer=ctx.peer, access_key=ctx.access_key
    )
    members = services.registry.group_members(group, topic)
    me = member_id(ctx.client_id, ctx.access_key)
    queues = sorted(route.queues, key=lambda q: (q.broker, q.queue_id))
    if config.consume_mode == ConsumeMode.PULL:
        chosen = allocate_averagely(me, queues, members)
    else:
        share = services.config.broker.pop.share_queue_num
        chosen = allocate_for_pop(me, queues, members, share)
    asked = request.endpoints if request.HasField("endpoints") else None
    endpoints = proxy_endpoints(services, asked)
    resource = pb.Resource(name=topic, resource_namespace=request.topic.resource_namespace)
    assignments = [
        pb.Assignment(
            message_queue=pb.MessageQueue(
                topic=resource,
                id=queue.queue_id,
                permission=pb.READ_WRITE,
                broker=pb.Broker(name=queue.broker, id=MASTER_BROKER_ID, endpoints=endpoints),
                accept_message_types=ACCEPTED_TYPES,
            )
        )
        for queue in chosen
    ]
    return s.QueryAssignmentResponse(status=st.ok(), assignments=assignments)
