"""QueryRoute: the queues of a topic, every one served at this proxy's address."""

from __future__ import annotations

import ipaddress

from popmq.proxy.cluster import TopicRoute
from popmq.proxy.core import validate
from popmq.proxy.core.context import RequestContext
from popmq.proxy.grpc import status as st
from popmq.proxy.services import ProxyServices

from popmq.pb.rocketmq.v2 import definition_pb2 as pb
from popmq.pb.rocketmq.v2 import service_pb2 as s

# Transactions are not supported: leaving TRANSACTION out makes clients refuse them up front.
ACCEPTED_TYPES = (pb.NORMAL, pb.FIFO, pb.DELAY)
MASTER_BROKER_ID = 0


def _scheme(host: str) -> pb.AddressScheme:
    try:
        return pb.IPv6 if ipaddress.ip_address(host).version == 6 else pb.IPv4
    except ValueError:
        return pb.DOMAIN_NAME


def proxy_endpoints(services: ProxyServices, asked: pb.Endpoints | None = None) -> pb.Endpoints:
    """The address clients must use for every later RPC.

    An explicitly advertised address wins; otherwise the address the client reached us at
    (RocketMQ's proxy does the same), else the bound address.
    """
    config = services.proxy
    if config.advertise_host:
        host = config.advertise_host
        port = config.advertise_port or services.advertised_port
    elif asked is not None and asked.addresses:
        return pb.Endpoints(scheme=asked.scheme or _scheme(asked.addresses[0].host),
                            addresses=list(asked.addresses))  # fmt: skip
    else:
        host, port = services.advertised_host, services.advertised_port
    return pb.Endpoints(scheme=_scheme(host), addresses=[pb.Address(host=host, port=port)])


def route_queues(
    route: TopicRoute, endpoints: pb.Endpoints, namespace: str = ""
) -> list[pb.MessageQueue]:
    topic = pb.Resource(name=route.topic, resource_namespace=namespace)
    return [
        pb.MessageQueue(
            topic=topic,
            id=queue.queue_id,
            permission=pb.READ_WRITE,
            broker=pb.Broker(name=queue.broker, id=MASTER_BROKER_ID, endpoints=endpoints),
            accept_message_types=ACCEPTED_TYPES,
        )
        for queue in route.queues
    ]


async def query_route(
    services: ProxyServices, request: s.QueryRouteRequest, ctx: RequestContext
) -> s.QueryRouteResponse:
    topic = validate.topic_name(request.topic.name, allow_dlq=True)
    route = await services.cluster.route(topic, create=ctx.create_topic(topic))
    asked = request.endpoints if request.HasField("endpoints") else None
    endpoints = proxy_endpoints(services, asked)
    return s.QueryRouteResponse(
        status=st.ok(),
        message_queues=route_queues(route, endpoints, request.topic.resource_namespace),
    )
