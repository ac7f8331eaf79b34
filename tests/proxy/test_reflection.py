"""gRPC server reflection and per-service health on the proxy and the broker (issue 13,
item 3): what grpcurl / grpcui do, with grpc's own reflection client."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import descriptor_pool, message_factory
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)
from popmq.broker.local import LocalBrokerPort
from popmq.broker.testing import fast_broker_config, running_broker
from popmq.broker.wire.server import SERVICE_NAME as BROKER_SERVICE
from popmq.broker.wire.server import BrokerGrpcServer

from popmq.pb.rocketmq.v2 import definition_pb2 as pb
from popmq.pb.rocketmq.v2 import service_pb2 as s

MESSAGING = "apache.rocketmq.v2.MessagingService"
ADMIN = "popmq.admin.v1.AdminService"
REFLECTION = "grpc.reflection.v1alpha.ServerReflection"
HEALTH = "grpc.health.v1.Health"


def _reflect(address: str, service: str) -> dict[str, Any]:
    """List the services, then describe `service` and its methods from reflection alone."""
    with grpc.insecure_channel(address) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        services = set(database.get_services())
        pool = descriptor_pool.DescriptorPool(database)
        described = pool.FindServiceByName(service)
        return {
            "services": services,
            "methods": {
                m.name: (m.input_type.full_name, m.output_type.full_name) for m in described.methods
            },
            "pool": pool,
        }


def _health(address: str, names: list[str]) -> dict[str, Any]:
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        answers: dict[str, Any] = {}
        for name in names:
            try:
                answers[name] = stub.Check(health_pb2.HealthCheckRequest(service=name)).status
            except grpc.RpcError as error:
                answers[name] = error.code()
        return answers


def _call_query_route(address: str, pool: Any, metadata: Any, topic: str) -> bytes:
    """QueryRoute built only from reflected descriptors, like grpcurl does."""
    method = pool.FindServiceByName(MESSAGING).methods_by_name["QueryRoute"]
    request_class = message_factory.GetMessageClass(method.input_type)
    response_class = message_factory.GetMessageClass(method.output_type)
    request = request_class()
    request.topic.name = topic
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(
            f"/{MESSAGING}/QueryRoute",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=response_class.FromString,
        )
        response = call(request, metadata=metadata, timeout=5)
    return response.SerializeToString(deterministic=True)


async def test_proxy_reflection_lists_and_calls_its_services(cluster) -> None:  # type: ignore[no-untyped-def]
    address = cluster.address
    found = await asyncio.to_thread(_reflect, address, MESSAGING)
    assert {MESSAGING, ADMIN, HEALTH, REFLECTION} <= found["services"]
    assert found["methods"]["ReceiveMessage"] == (
        "apache.rocketmq.v2.ReceiveMessageRequest",
        "apache.rocketmq.v2.ReceiveMessageResponse",
    )
    assert len(found["methods"]) >= 16
    admin = await asyncio.to_thread(_reflect, address, ADMIN)
    assert "ListTopics" in admin["methods"]

    reflected = await asyncio.to_thread(
        _call_query_route, address, found["pool"], cluster.metadata(), "reflected"
    )
    typed = await cluster.stub.QueryRoute(
        s.QueryRouteRequest(topic=pb.Resource(name="reflected")), metadata=cluster.metadata()
    )
    decoded = s.QueryRouteResponse.FromString(reflected)
    assert decoded.status.code == typed.status.code
    assert [q.broker.name for q in decoded.message_queues] == [
        q.broker.name for q in typed.message_queues
    ]


async def test_proxy_health_per_service(cluster) -> None:  # type: ignore[no-untyped-def]
    serving = health_pb2.HealthCheckResponse.SERVING
    answers = await asyncio.to_thread(_health, cluster.address, ["", MESSAGING, ADMIN, "nope.X"])
    assert answers == {
        "": serving, MESSAGING: serving, ADMIN: serving, "nope.X": grpc.StatusCode.NOT_FOUND,
    }  # fmt: skip


async def test_proxy_registers_no_method(make_cluster, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """For every call it accepts, grpc.aio's server awaits one pending future per registered
    method (asyncio.wait over all of them), and a registered method's handler is served
    without the edge's lookup (proxy/grpc/edge.py): every service, the MessagingService too
    (main registered its 17 methods), is served through the one generic handler, and answers."""
    registered: list[str] = []
    original = grpc.aio._server.Server.add_registered_method_handlers

    def record(server: Any, service: str, handlers: Any) -> None:
        registered.append(service)
        original(server, service, handlers)

    monkeypatch.setattr(grpc.aio._server.Server, "add_registered_method_handlers", record)
    cluster = await make_cluster(brokers=1)
    assert registered == []
    serving = health_pb2.HealthCheckResponse.SERVING
    answers = await asyncio.to_thread(_health, cluster.address, ["", ADMIN])
    assert answers == {"": serving, ADMIN: serving}
    admin = await asyncio.to_thread(_reflect, cluster.address, ADMIN)
    assert {MESSAGING, ADMIN, HEALTH, REFLECTION} <= admin["services"]
    assert "ListTopics" in admin["methods"]


async def test_broker_reflection_and_health(tmp_path: Path) -> None:
    async with running_broker(fast_broker_config(tmp_path / "b", name="broker-a")) as broker:
        server = BrokerGrpcServer(LocalBrokerPort(broker), "127.0.0.1", 0)
        await server.start()
        try:
            found = await asyncio.to_thread(_reflect, server.address, BROKER_SERVICE)
            answers = await asyncio.to_thread(_health, server.address, ["", BROKER_SERVICE])
        finally:
            await server.aclose(0)
    assert {BROKER_SERVICE, HEALTH, REFLECTION} <= found["services"]
    assert found["methods"]["Pop"] == ("popmq.broker.v1.PopRequest", "popmq.broker.v1.PopResponse")
    serving = health_pb2.HealthCheckResponse.SERVING
    assert answers == {"": serving, BROKER_SERVICE: serving}
