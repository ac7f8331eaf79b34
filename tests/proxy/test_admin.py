"""The admin API: topics, groups, clients, stats; and the gRPC health service."""

from __future__ import annotations

import base64

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from popmq.broker.contract.errors import Code
from proxy_support import Cluster, unique

from popmq.pb.admin.v1 import admin_pb2 as a
from popmq.pb.admin.v1 import admin_pb2_grpc
from popmq.pb.rocketmq.v2 import definition_pb2 as pb
from popmq.pb.rocketmq.v2 import service_pb2 as s

# One cluster for the module's checks (each uses its own topics and groups).
pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module")
def cluster(module_cluster: Cluster) -> Cluster:
    return module_cluster


async def test_topics_lifecycle_with_backlog(cluster: Cluster) -> None:
    admin = admin_pb2_grpc.AdminServiceStub(cluster.channel)
    topic, group = unique("orders"), unique("billing")
    created = await admin.CreateTopic(a.CreateTopicRequest(name=topic, queue_count=2))
    assert created.status.code == Code.OK
    assert [(b.broker, b.queue_count) for b in created.topic.brokers] == [
        ("broker-0", 2), ("broker-1", 2),
    ]  # fmt: skip
    # the route follows the new queue count at once
    route = await cluster.route(topic)
    assert len(route.message_queues) == 4

    await cluster.send(topic, b"1", b"2", b"3")
    _, received, _ = await cluster.receive(group, topic, batch=1)
    listed = await admin.ListTopics(a.ListTopicsRequest())
    assert topic in [t.name for t in listed.topics]

    described = await admin.DescribeTopic(a.DescribeTopicRequest(name=topic, group=group))
    assert described.status.code == Code.OK
    total = sum(q.max_offset - q.min_offset for b in described.topic.brokers for q in b.queues)
    assert total == 3
    rows = [g for g in described.group_queues if g.topic == topic]
    assert sum(g.inflight for g in rows) == len(received) == 1
    assert sum(g.backlog for g in rows) == 3  # nothing acked yet

    bad = await admin.CreateTopic(a.CreateTopicRequest(name="bad name", queue_count=2))
    assert bad.status.code == Code.ILLEGAL_TOPIC
    missing = await admin.DescribeTopic(a.DescribeTopicRequest(name=unique("nope")))
    assert missing.status.code == Code.TOPIC_NOT_FOUND

    deleted = await admin.DeleteTopic(a.DeleteTopicRequest(name=topic))
    assert deleted.status.code == Code.OK
    listed = await admin.ListTopics(a.ListTopicsRequest())
    assert topic not in [t.name for t in listed.topics]


async def test_groups(cluster: Cluster) -> None:
    admin = admin_pb2_grpc.AdminServiceStub(cluster.channel)
    group = unique("g")
    # a read neither invents defaults for a group nor registers it
    missing = await admin.GetGroup(a.GetGroupRequest(name=group))
    assert missing.status.code == Code.CONSUMER_GROUP_NOT_FOUND
    progress = await admin.ConsumerProgress(a.ConsumerProgressRequest(group=group))
    assert progress.status.code == Code.CONSUMER_GROUP_NOT_FOUND
    listed = await admin.ListGroups(a.ListGroupsRequest())
    assert group not in [s.group.name for s in listed.groups]
    updated = await admin.UpdateGroup(
        a.UpdateGroupRequest(name=group, consume_mode="PULL", max_attempts=4,
                             retry_levels=["2s", "4s"])
    )  # fmt: skip
    assert updated.status.code == Code.OK
    assert (updated.group.consume_mode, updated.group.max_attempts) == ("PULL", 4)
    got = await admin.GetGroup(a.GetGroupRequest(name=group))  # `groups set` created it
    assert got.status.code == Code.OK and got.group.max_attempts == 4
    # every broker has it
    for broker in cluster.brokers:
        config = await broker.get_group(group)
        assert config.max_attempts == 4 and list(config.retry_levels) == ["2s", "4s"]
    reset = await admin.UpdateGroup(a.UpdateGroupRequest(name=group, reset_retry_levels=True))
    assert list(reset.group.retry_levels) == [] and reset.group.consume_mode == "PULL"
    bad = await admin.UpdateGroup(a.UpdateGroupRequest(name=group, consume_mode="PUSH"))
    assert bad.status.code == Code.BAD_REQUEST
    bad = await admin.UpdateGroup(a.UpdateGroupRequest(name=group, retry_levels=["soon"]))
    assert bad.status.code == Code.BAD_REQUEST


async def test_clients_and_stats(cluster: Cluster) -> None:
    admin = admin_pb2_grpc.AdminServiceStub(cluster.channel)
    group = unique("g")
    await cluster.stub.Heartbeat(
        s.HeartbeatRequest(group=pb.Resource(name=group), client_type=pb.SIMPLE_CONSUMER),
        metadata=cluster.metadata("c@9"),
    )
    clients = await admin.ListClients(a.ListClientsRequest(group=group))
    assert [(c.client_id, c.client_type, c.language) for c in clients.clients] == [
        ("c@9", "SIMPLE_CONSUMER", "PYTHON")
    ]
    assert clients.proxy.endswith(f":{cluster.server.port}")
    stats = await admin.Stats(a.StatsRequest())
    assert 'popmq_proxy_rpc_requests_total{code="OK",method="Heartbeat"} 1.0' in (
        stats.prometheus_text
    )


async def test_list_clients_pages_its_answer(cluster: Cluster) -> None:
    """ListClients answered every client in one message (40 big entries were past grpc's
    limit): it pages, in a stable order, and a bad page request is BAD_REQUEST."""
    admin = admin_pb2_grpc.AdminServiceStub(cluster.channel)
    group = unique("g")
    ids = [f"c@{i:02d}" for i in range(7)]
    for client_id in ids:
        await cluster.stub.Heartbeat(
            s.HeartbeatRequest(group=pb.Resource(name=group), client_type=pb.SIMPLE_CONSUMER),
            metadata=cluster.metadata(client_id),
        )
    seen: list[str] = []
    request = a.ListClientsRequest(group=group, page_size=3)
    pages = 0
    while True:
        page = await admin.ListClients(request)
        assert page.status.code == Code.OK and len(page.clients) <= 3
        seen += [c.client_id for c in page.clients]
        pages += 1
        if not page.next_page_token:
            break
        request.page_token = page.next_page_token
    assert (seen, pages) == (ids, 3)
    whole = await admin.ListClients(a.ListClientsRequest(group=group))
    assert [c.client_id for c in whole.clients] == ids and not whole.next_page_token
    for bad in (
        a.ListClientsRequest(page_size=1_001),
        a.ListClientsRequest(page_size=-1),
        a.ListClientsRequest(page_token="not-a-token"),
        a.ListClientsRequest(page_token="WzFd"),  # base64 of [1]
    ):
        assert (await admin.ListClients(bad)).status.code == Code.BAD_REQUEST


async def test_list_clients_refuses_a_deeply_nested_page_token(cluster: Cluster) -> None:
    """A forged token of nested JSON arrays made the decoder recurse past Python's limit:
    INTERNAL_ERROR (a RecursionError) instead of BAD_REQUEST."""
    admin = admin_pb2_grpc.AdminServiceStub(cluster.channel)
    forged = base64.urlsafe_b64encode(b"[" * 100_000).decode()
    answer = await admin.ListClients(a.ListClientsRequest(page_token=forged))
    assert answer.status.code == Code.BAD_REQUEST, answer.status


async def test_health_service(cluster: Cluster) -> None:
    stub = health_pb2_grpc.HealthStub(cluster.channel)
    for service in ("", "apache.rocketmq.v2.MessagingService"):
        answer = await stub.Check(health_pb2.HealthCheckRequest(service=service))
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
    try:
        await stub.Check(health_pb2.HealthCheckRequest(service="nope"))
    except grpc.aio.AioRpcError as exc:
        assert exc.code() == grpc.StatusCode.NOT_FOUND


async def test_send_test_message_refuses_internal_properties_and_bad_tags(cluster: Cluster) -> None:
    """SendTestMessage stored any property: `__popmq.transaction` made a half message no
    producer would ever check back, `__popmq.tx_trace` a spoofed trace; a bad tag or key went
    in too. It checks them as a producer's send does."""
    admin = admin_pb2_grpc.AdminServiceStub(cluster.channel)
    topic = unique("t")
    assert (await cluster.route(topic)).status.code == Code.OK
    for bad, code in (
        (a.SendTestMessageRequest(topic=topic, body=b"x", properties={"__popmq.transaction": "1"}),
         Code.ILLEGAL_MESSAGE_PROPERTY_KEY),
        (a.SendTestMessageRequest(topic=topic, body=b"x", properties={"__popmq.tx_trace": "00"}),
         Code.ILLEGAL_MESSAGE_PROPERTY_KEY),
        (a.SendTestMessageRequest(topic=topic, body=b"x", tag="a|b"), Code.ILLEGAL_MESSAGE_TAG),
        (a.SendTestMessageRequest(topic=topic, body=b"x", keys=[" "]), Code.ILLEGAL_MESSAGE_KEY),
    ):  # fmt: skip
        assert (await admin.SendTestMessage(bad)).status.code == code
    fine = a.SendTestMessageRequest(topic=topic, body=b"x", tag="t", properties={"k": "v"})
    assert (await admin.SendTestMessage(fine)).status.code == Code.OK
