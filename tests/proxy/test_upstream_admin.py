"""rocketmq-apis' apache.rocketmq.v2.Admin on the proxy's admin port, called by a plain grpc
client with the upstream service and method names: each RPC answers from popmq's own admin
operations; the ones popmq cannot answer are UNIMPLEMENTED; with an ACL only admins may call
it."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from popmq.broker.contract.errors import Code
from proxy_support import Cluster, unique

from popmq.pb.admin.v1 import admin_pb2 as a
from popmq.pb.admin.v1.admin_pb2_grpc import AdminServiceStub
from popmq.pb.pool import Timestamp
from popmq.pb.rocketmq.v2 import admin_pb2 as ad
from popmq.pb.rocketmq.v2 import admin_pb2_grpc
from popmq.pb.rocketmq.v2 import definition_pb2 as pb
from popmq.pb.rocketmq.v2 import service_pb2 as s
from popmq.security.signature import signed_metadata

ADMIN = ("root", "root-secret-0001")
USER = ("user", "user-secret-0001")


def _r(name: str) -> pb.Resource:
    return pb.Resource(name=name)


@pytest.fixture
async def upstream(make_cluster: Any) -> Any:
    cluster = await make_cluster(brokers=2, **{"proxy.admin_port": 0})
    assert cluster.server.admin_port and cluster.server.admin_port != cluster.server.port
    async with grpc.aio.insecure_channel(f"127.0.0.1:{cluster.server.admin_port}") as channel:
        yield cluster, admin_pb2_grpc.AdminStub(channel), AdminServiceStub(channel), channel


async def test_upstream_admin_rpcs_answer_from_popmqs_operations(upstream: Any) -> None:
    cluster: Cluster
    cluster, stub, popmq_admin, _ = upstream
    topic, group = unique("up"), unique("g")
    created = await popmq_admin.CreateTopic(
        a.CreateTopicRequest(name=topic, queue_count=2, message_type="NORMAL")
    )
    assert created.status.code == Code.OK
    await cluster.send(topic, b"a", b"b", b"c", keys=["k-1"])
    status, received, _ = await cluster.receive(group, topic, batch=1)
    assert status.code == Code.OK and len(received) == 1  # 1 in flight, 2 ready
    beat = await cluster.stub.Heartbeat(
        s.HeartbeatRequest(group=_r(group), client_type=pb.SIMPLE_CONSUMER),
        metadata=cluster.metadata(),
    )
    assert beat.status.code == Code.OK

    described = await stub.DescribeTopicStatus(ad.DescribeTopicStatusRequest(topic=_r(topic)))
    assert described.status.code == Code.OK
    assert described.topic_message_type == pb.NORMAL
    mixed_topic = unique("mixed")
    await cluster.send(mixed_topic, b"x")  # auto-created: MIXED, which upstream cannot name
    mixed = await stub.DescribeTopicStatus(ad.DescribeTopicStatusRequest(topic=_r(mixed_topic)))
    assert mixed.topic_message_type == pb.MESSAGE_TYPE_UNSPECIFIED
    missing = await stub.DescribeTopicStatus(ad.DescribeTopicStatusRequest(topic=_r("nope-x")))
    assert missing.status.code == Code.TOPIC_NOT_FOUND

    accumulation = await stub.DescribeGroupAccumulation(
        ad.DescribeGroupAccumulationRequest(group=_r(group), topics=[_r(topic)])
    )
    assert accumulation.status.code == Code.OK
    total = accumulation.accumulation
    assert (total.accumulation, total.inflight_messages, total.ready_messages) == (3, 1, 2)
    assert accumulation.topic_accumulation[topic].accumulation == 3

    route = await stub.GetTopicRoute(ad.GetTopicRouteRequest(topic=_r(topic)))
    data = json.loads(route.topic_route_data)
    assert {b["brokerName"] for b in data["brokerDatas"]} == {"broker-0", "broker-1"}
    assert all(q["writeQueueNums"] > 0 for q in data["queueDatas"])

    by_key = await stub.QueryMessage(
        ad.ListMessageRequest(topic=_r(topic), message_key="k-1", max_message_nums=10)
    )
    assert by_key.status.code == Code.OK
    assert sorted(m.body for m in by_key.messages) == [b"a", b"b", b"c"]
    one_id = by_key.messages[0].system_properties.message_id
    by_id = await stub.QueryMessage(ad.ListMessageRequest(topic=_r(topic), message_id=one_id))
    assert [m.system_properties.message_id for m in by_id.messages] == [one_id]
    by_sub = await stub.QueryMessage(ad.ListMessageRequest(topic=_r(topic), subscription="*"))
    assert by_sub.status.code == Code.BAD_REQUEST

    sent = await stub.AdminSendMessage(
        ad.AdminSendMessageRequest(topic=_r(topic), body=b"from-admin", tag="t", key="k-2")
    )
    assert sent.status.code == Code.OK and sent.message_id

    consumers = await stub.ListConsumerConnection(ad.ListConsumerConnectionRequest(group=_r(group)))
    assert consumers.status.code == Code.OK
    assert [c.client_id for c in consumers.client_info] == [cluster.client_id]
    subscriptions = await stub.ListSubscription(ad.ListSubscriptionRequest(group=_r(group)))
    assert subscriptions.status.code == Code.OK

    # Reset to "now": everything stored before is skipped, the message sent after is not.
    now = Timestamp()
    now.GetCurrentTime()
    reset = await stub.ResetGroupOffset(
        ad.ResetGroupOffsetRequest(group=_r(group), topic=_r(topic), reset_timestamp=now)
    )
    assert reset.status.code == Code.OK
    await cluster.send(topic, b"after")
    after = await stub.DescribeGroupAccumulation(
        ad.DescribeGroupAccumulationRequest(group=_r(group), topics=[_r(topic)])
    )
    assert after.accumulation.ready_messages == 1

    stats = await stub.GetProxyRuntimeStats(ad.GetProxyRuntimeStatsRequest())
    assert stats.status.code == Code.OK and stats.version and stats.consumers >= 1

    before = logging.getLogger("popmq").level
    try:
        changed = await stub.ChangeLogLevel(
            ad.ChangeLogLevelRequest(level=ad.ChangeLogLevelRequest.WARN)
        )
        assert "WARNING" in changed.remark
        assert logging.getLogger("popmq").level == logging.WARNING
    finally:
        logging.getLogger("popmq").setLevel(before)


async def test_rpcs_popmq_cannot_answer_are_unimplemented(upstream: Any) -> None:
    *_, channel = upstream
    # VerifyMessage is upstream's; popmq's transcription leaves it out.
    call = channel.unary_unary(
        "/apache.rocketmq.v2.Admin/VerifyMessage",
        request_serializer=lambda _: b"", response_deserializer=lambda raw: raw,
    )  # fmt: skip
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await call(None)
    assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_with_an_acl_only_admins_may_call_it(make_cluster: Any, tmp_path: Path) -> None:
    acl = tmp_path / "acl.yaml"
    acl.write_text(yaml.safe_dump({"users": [
        {"access_key": ADMIN[0], "secret_key": ADMIN[1], "admin": True},
        {"access_key": USER[0], "secret_key": USER[1], "allow": [{"publish": "*"}]},
    ]}))  # fmt: skip
    cluster = await make_cluster(brokers=1, **{"proxy.acl": str(acl), "proxy.admin_port": 0})
    async with grpc.aio.insecure_channel(f"127.0.0.1:{cluster.server.admin_port}") as channel:
        stub = admin_pb2_grpc.AdminStub(channel)
        request = ad.GetProxyRuntimeStatsRequest()
        nobody = await stub.GetProxyRuntimeStats(request)
        assert nobody.status.code == Code.UNAUTHORIZED
        user = await stub.GetProxyRuntimeStats(request, metadata=signed_metadata(*USER))
        assert user.status.code == Code.FORBIDDEN
        admin = await stub.GetProxyRuntimeStats(request, metadata=signed_metadata(*ADMIN))
        assert admin.status.code == Code.OK
        # ChangeLogLevelResponse has no Status: refused as a gRPC error, level untouched.
        level = logging.getLogger("popmq").level
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.ChangeLogLevel(
                ad.ChangeLogLevelRequest(level=ad.ChangeLogLevelRequest.DEBUG),
                metadata=signed_metadata(*USER),
            )
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert logging.getLogger("popmq").level == level
