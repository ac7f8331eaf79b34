"""A broker that is down leaves the route; the proxy keeps serving with the others."""

from __future__ import annotations

import socket
from pathlib import Path

import grpc
from popmq.broker.contract.errors import Code
from popmq.broker.core import Broker
from popmq.broker.local import LocalBrokerPort
from popmq.broker.wire.remote import RemoteBrokerPort
from popmq.proxy.server import ProxyServer
from proxy_support import Cluster, make_config, unique

from popmq.pb.rocketmq.v2 import service_pb2_grpc


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def test_route_send_receive_without_the_dead_broker(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    config.proxy.port = 0
    broker = Broker(config.broker.model_copy(update={"name": "alive", "data_dir": tmp_path / "a"}))
    await broker.start()
    dead = RemoteBrokerPort("dead", f"127.0.0.1:{_closed_port()}", rpc_timeout_s=2)
    server = ProxyServer(config, [LocalBrokerPort(broker), dead])
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            cluster = Cluster(
                config, [broker], server, channel, service_pb2_grpc.MessagingServiceStub(channel),
                "c@1",
            )  # fmt: skip
            topic, group = unique("t"), unique("g")
            route = await cluster.route(topic)
            assert route.status.code == Code.OK
            assert {q.broker.name for q in route.message_queues} == {"alive"}
            sent = await cluster.send(topic, b"still-works")
            assert sent.status.code == Code.OK
            status, messages, _ = await cluster.receive(group, topic, poll_ms=500)
            assert status.code == Code.OK and [m.body for m in messages] == [b"still-works"]
    finally:
        await server.aclose(0.2)
        await broker.aclose()


async def test_every_broker_down_fails_routes_and_ends_receives_empty(tmp_path: Path) -> None:
    """With every broker down a route query fails (clients and operators see the outage), but a
    receive holds its poll time and ends empty, as across a leader change (issue 19: no receive
    may fail; docs/longpolling.md, "Brokers down or leaderless")."""
    config = make_config(tmp_path)
    config.proxy.port = 0
    dead = RemoteBrokerPort("dead", f"127.0.0.1:{_closed_port()}", rpc_timeout_s=2)
    server = ProxyServer(config, [dead])
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            cluster = Cluster(
                config, [], server, channel, service_pb2_grpc.MessagingServiceStub(channel), "c@1"
            )
            route = await cluster.route(unique("t"))
            assert route.status.code == Code.INTERNAL_SERVER_ERROR
            assert "unavailable" in route.status.message
            status, messages, _ = await cluster.receive("g", unique("t"))
            assert (status.code, messages) == (Code.MESSAGE_NOT_FOUND, [])
            unavailable = server.metrics.registry.get_sample_value(
                "popmq_proxy_unavailable_receives_total", {"strategy": config.proxy.strategy}
            )
            assert unavailable == 1
    finally:
        await server.aclose(0.2)


async def test_first_broker_down_receives_have_no_errors(tmp_path: Path) -> None:
    """Issue 9, defect 3: with the FIRST broker down, group lookups, sends and receives are
    served by the live one, and no receive answers an error."""
    config = make_config(tmp_path)
    config.proxy.port = 0
    broker = Broker(config.broker.model_copy(update={"name": "alive", "data_dir": tmp_path / "a"}))
    await broker.start()
    dead = RemoteBrokerPort("dead", f"127.0.0.1:{_closed_port()}", rpc_timeout_s=2)
    server = ProxyServer(config, [dead, LocalBrokerPort(broker)])
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            cluster = Cluster(
                config, [broker], server, channel, service_pb2_grpc.MessagingServiceStub(channel),
                "c@1",
            )  # fmt: skip
            topic, group = unique("t"), unique("g")
            bodies = {f"m{i}".encode() for i in range(10)}
            for body in sorted(bodies):
                sent = await cluster.send(topic, body)
                assert sent.status.code == Code.OK, sent.status
            got: set[bytes] = set()
            errors = []
            for _ in range(30):
                status, messages, _ = await cluster.receive(group, topic, poll_ms=400)
                if status.code not in (Code.OK, Code.MESSAGE_NOT_FOUND):
                    errors.append(status)
                got |= {m.body for m in messages}
                if got == bodies:
                    break
            assert errors == []
            assert got == bodies
    finally:
        await server.aclose(0.2)
        await broker.aclose()
