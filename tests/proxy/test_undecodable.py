"""Issue 9, defect 10: a request body that does not decode answers INVALID_ARGUMENT (not
UNKNOWN), the server logs no traceback for it and at most one line per interval, and the
server goes on serving."""

from __future__ import annotations

import logging

import grpc
import pytest
from popmq.broker.local import LocalBrokerPort
from popmq.broker.wire.server import BrokerGrpcServer
from proxy_support import Cluster

# One cluster for the module's checks (each uses its own topics and groups); the few that
# need their own configuration make one on the test's own loop.
pytestmark = pytest.mark.asyncio(loop_scope="module")
OWN_CLUSTER = pytest.mark.asyncio(loop_scope="function")


@pytest.fixture(scope="module")
def cluster(module_cluster: Cluster) -> Cluster:
    return module_cluster


GARBAGE = b"\xff\xff\xff\xff not protobuf"
MESSAGING = "/apache.rocketmq.v2.MessagingService/"


async def _unary(channel: grpc.aio.Channel, path: str) -> grpc.StatusCode:
    call = channel.unary_unary(path)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call(GARBAGE, timeout=5)
    return err.value.code()


async def test_undecodable_bodies_on_every_proxy_rpc(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    unary = ["QueryRoute", "Heartbeat", "SendMessage", "QueryAssignment", "AckMessage",
             "ForwardMessageToDeadLetterQueue", "ChangeInvisibleDuration",
             "NotifyClientTermination", "UpdateOffset", "GetOffset", "QueryOffset"]  # fmt: skip
    for _ in range(5):
        for method in unary:
            assert await _unary(cluster.channel, MESSAGING + method) == (
                grpc.StatusCode.INVALID_ARGUMENT
            ), method
        for method in ("ReceiveMessage", "PullMessage"):
            call = cluster.channel.unary_stream(MESSAGING + method)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                async for _frame in call(GARBAGE, timeout=5):
                    pass
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, method
        telemetry = cluster.channel.stream_stream(MESSAGING + "Telemetry")
        call = telemetry(iter([GARBAGE]), timeout=5)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _frame in call:
                pass
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
    lines = [r for r in caplog.records if "undecodable" in r.getMessage()]
    assert 1 <= len(lines) <= 2  # rate-limited: 70 bad requests, one line
    route = await cluster.route("still-serving")  # and the server goes on
    assert route.status.code == 20000


async def test_undecodable_bodies_on_the_broker_port(cluster: Cluster) -> None:
    server = BrokerGrpcServer(LocalBrokerPort(cluster.brokers[0]))
    await server.start()
    try:
        async with grpc.aio.insecure_channel(server.address) as channel:
            for method in ("Send", "Pop", "GetGroup", "CreateTopic"):
                code = await _unary(channel, f"/popmq.broker.v1.BrokerService/{method}")
                assert code == grpc.StatusCode.INVALID_ARGUMENT, method
    finally:
        await server.aclose(0.2)


async def test_undecodable_admin_bodies_answer_invalid_argument(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 20, defect 6: the AdminService answered UNKNOWN with a logged traceback."""
    caplog.set_level(logging.WARNING)
    for method in ("ListTopics", "CreateTopic", "ListClients", "Stats"):
        path = f"/popmq.admin.v1.AdminService/{method}"
        assert await _unary(cluster.channel, path) == grpc.StatusCode.INVALID_ARGUMENT, method
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"


@OWN_CLUSTER
async def test_oversized_requests_of_small_methods_are_refused_before_decoding(
    make_cluster, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 20, defect 10: 8 acks of 64 MiB of handles were decoded (and echoed back), a
    gigabyte of proxy. Any method but SendMessage (the admin services' included) takes
    proxy.max_small_request_bytes at most: past it, RESOURCE_EXHAUSTED, without decoding; a
    send of that size goes through."""
    caplog.set_level(logging.WARNING)
    cluster = await make_cluster(brokers=1, **{"proxy.max_small_request_bytes": 65_536})
    big = b"\x0a" + b"\xff" * 70_000  # neither decodable nor small
    ack = cluster.channel.unary_unary(MESSAGING + "AckMessage")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await ack(big, timeout=5)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "65536" in (err.value.details() or "")
    telemetry = cluster.channel.stream_stream(MESSAGING + "Telemetry")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for _frame in telemetry(iter([big]), timeout=5):
            pass
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    for admin in (
        "/popmq.admin.v1.AdminService/ListTopics",
        "/apache.rocketmq.v2.Admin/ChangeLogLevel",
    ):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await cluster.channel.unary_unary(admin)(big, timeout=5)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, admin
    await cluster.route("sized")
    sent = await cluster.send("sized", b"x" * 70_000)
    assert sent.status.code == 20000
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
    assert any("oversized AckMessage" in r.getMessage() for r in caplog.records)
    refused = cluster.server.metrics.registry.get_sample_value
    for method in ("AckMessage", "Telemetry", "ListTopics", "ChangeLogLevel"):  # counted too
        labels = {"method": method, "code": "RESOURCE_EXHAUSTED"}
        assert refused("popmq_proxy_rpc_requests_total", labels) == 1, method


async def test_the_health_service_answers_every_rpc_without_a_traceback(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    """Found by the ACL fuzz over every service (issue 20): an undecodable health Check raised
    out of grpc's deserializer (UNKNOWN, a traceback logged), and List, which grpcio's health
    servicer leaves unimplemented, logged a NotImplementedError traceback per call."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    caplog.set_level(logging.WARNING)
    assert await _unary(cluster.channel, "/grpc.health.v1.Health/Check") == (
        grpc.StatusCode.INVALID_ARGUMENT
    )
    listed = await health_pb2_grpc.HealthStub(cluster.channel).List(
        health_pb2.HealthListRequest(), timeout=5
    )
    serving = health_pb2.HealthCheckResponse.SERVING
    assert listed.statuses[""].status == serving
    assert listed.statuses["apache.rocketmq.v2.MessagingService"].status == serving
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
