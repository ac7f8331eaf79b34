"""QueryRoute and QueryAssignment on the wire: every queue is served at this proxy's address."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from popmq.proxy.cluster import QueueRef
from popmq.proxy.core.address import ProxyAddress
from popmq.proxy.core.context import RequestContext
from popmq.proxy.core.processor import ProxyCore
from popmq.proxy.grpc import status as st

from popmq.pb.rocketmq.v2 import definition_pb2 as pb
from popmq.pb.rocketmq.v2 import service_pb2 as s

MASTER_BROKER_ID = 0


def scheme(host: str) -> pb.AddressScheme:
    try:
        return pb.IPv6 if ipaddress.ip_address(host).version == 6 else pb.IPv4
    except ValueError:
        return pb.DOMAIN_NAME


def proxy_endpoints(address: ProxyAddress, asked: pb.Endpoints | None = None) -> pb.Endpoints:
    """The address clients must use for every later RPC (ProxyAddress.for_client)."""
    chosen = address.for_client(asked is not None and bool(asked.addresses))
    if chosen is None and asked is not None:  # the address the client reached us at
        return pb.Endpoints(scheme=asked.scheme or scheme(asked.addresses[0].host),
                            addresses=list(asked.addresses))  # fmt: skip
    assert chosen is not None
    return pb.Endpoints(
        scheme=scheme(chosen.host), addresses=[pb.Address(host=chosen.host, port=chosen.port)]
    )


def queues_pb(
    topic: str,
    queues: list[QueueRef],
    endpoints: pb.Endpoints,
    namespace: str = "",
    accepts: Sequence[str] = ("NORMAL", "FIFO", "DELAY"),
) -> list[pb.MessageQueue]:
    """``accepts``: the MessageType names the topic's type lets in (TopicRoute.accepts); the
    official clients refuse other sends before sending."""
    resource = pb.Resource(name=topic, resource_namespace=namespace)
    accept_message_types = list(accepts)  # enum value names
    return [
        pb.MessageQueue(
            topic=resource,
            id=queue.queue_id,
            permission=pb.READ_WRITE,
            broker=pb.Broker(name=queue.broker, id=MASTER_BROKER_ID, endpoints=endpoints),
            accept_message_types=accept_message_types,
        )
        for queue in queues
    ]


async def query_route(
    core: ProxyCore, request: s.QueryRouteRequest, ctx: RequestContext
) -> s.QueryRouteResponse:
    route = await core.routes.route(request.topic.name, ctx)
    asked = request.endpoints if request.HasField("endpoints") else None
    endpoints = proxy_endpoints(core.address, asked)
    namespace = request.topic.resource_namespace
    queues = queues_pb(route.topic, route.queues, endpoints, namespace, route.accepts)
    return s.QueryRouteResponse(status=st.ok(), message_queues=queues)


async def query_assignment(
    core: ProxyCore, request: s.QueryAssignmentRequest, ctx: RequestContext
) -> s.QueryAssignmentResponse:
    chosen = await core.routes.assignment(request.topic.name, request.group.name, ctx)
    accepts = (await core.routes.route(request.topic.name, ctx)).accepts  # cached
    asked = request.endpoints if request.HasField("endpoints") else None
    endpoints = proxy_endpoints(core.address, asked)
    namespace = request.topic.resource_namespace
    queues = queues_pb(request.topic.name, chosen, endpoints, namespace, accepts)
    return s.QueryAssignmentResponse(
        status=st.ok(), assignments=[pb.Assignment(message_queue=q) for q in queues]
    )
