"""Telemetry settings, heartbeats, the client registry and QueryAssignment."""

from __future__ import annotations

import asyncio

import pytest
from popmq.broker.contract.errors import Code
from popmq.broker.contract.types import ConsumeMode, GroupConfig
from proxy_support import Cluster, unique

from popmq.pb.rocketmq.v2 import definition_pb2 as pb
from popmq.pb.rocketmq.v2 import service_pb2 as s

# One cluster for the module's checks (each uses its own topics and groups); the few that
# need their own configuration make one on the test's own loop.
pytestmark = pytest.mark.asyncio(loop_scope="module")
OWN_CLUSTER = pytest.mark.asyncio(loop_scope="function")


@pytest.fixture(scope="module")
def cluster(module_cluster: Cluster) -> Cluster:
    return module_cluster


async def _settings(cluster: Cluster, settings: pb.Settings, client_id: str) -> pb.Settings:
    call = cluster.stub.Telemetry(metadata=cluster.metadata(client_id), timeout=5)
    await call.write(s.TelemetryCommand(settings=settings))
    reply = await call.read()
    await call.done_writing()
    assert reply.status.code == Code.OK, reply.status
    assert reply.WhichOneof("command") == "settings"
    call.cancel()
    return reply.settings


async def test_producer_settings(cluster: Cluster) -> None:
    settings = pb.Settings(
        client_type=pb.PRODUCER,
        publishing=pb.Publishing(topics=[pb.Resource(name="t1")], max_body_size=128 << 20),
    )
    reply = await _settings(cluster, settings, "producer@1")
    assert reply.publishing.max_body_size == cluster.config.proxy.max_body_bytes > 0
    assert reply.publishing.validate_message_type
    assert reply.backoff_policy.WhichOneof("strategy") == "exponential_backoff"
    assert reply.backoff_policy.max_attempts == 3
    assert reply.backoff_policy.exponential_backoff.initial.ToMilliseconds() > 0
    info = cluster.server.registry.get("producer@1")
    assert info is not None and info.client_type == "PRODUCER" and info.topics == {"t1"}


async def test_consumer_settings_follow_the_group(cluster: Cluster) -> None:
    group = unique("g")
    await cluster.server.cluster.update_group(
        GroupConfig(name=group, max_attempts=5, retry_levels=["1s", "2s"], fifo=True)
    )
    settings = pb.Settings(
        client_type=pb.PUSH_CONSUMER,
        subscription=pb.Subscription(
            group=pb.Resource(name=group),
            subscriptions=[pb.SubscriptionEntry(topic=pb.Resource(name="t1"))],
        ),
    )
    reply = await _settings(cluster, settings, "push@1")
    assert reply.subscription.fifo is True
    assert reply.subscription.receive_batch_size == 32
    assert reply.subscription.long_polling_timeout.ToMilliseconds() == 3_000
    assert reply.backoff_policy.max_attempts == 5
    delays = [d.ToMilliseconds() for d in reply.backoff_policy.customized_backoff.next]
    assert delays == [1_000, 2_000]
    assert cluster.server.registry.group_members(group) == ["push@1"]


async def test_bad_consumer_settings_get_an_error_status(cluster: Cluster) -> None:
    settings = pb.Settings(
        client_type=pb.SIMPLE_CONSUMER,
        subscription=pb.Subscription(group=pb.Resource(name="bad group")),
    )
    call = cluster.stub.Telemetry(metadata=cluster.metadata("c@1"), timeout=5)
    await call.write(s.TelemetryCommand(settings=settings))
    reply = await call.read()
    assert reply.status.code == Code.ILLEGAL_CONSUMER_GROUP
    call.cancel()


async def test_heartbeat_and_termination(cluster: Cluster) -> None:
    group = unique("g")
    beat = await cluster.stub.Heartbeat(
        s.HeartbeatRequest(group=pb.Resource(name=group), client_type=pb.SIMPLE_CONSUMER),
        metadata=cluster.metadata("simple@1"),
    )
    assert beat.status.code == Code.OK
    registry = cluster.server.registry
    assert [c.client_id for c in registry.clients(group)] == ["simple@1"]
    done = await cluster.stub.NotifyClientTermination(
        s.NotifyClientTerminationRequest(group=pb.Resource(name=group)),
        metadata=cluster.metadata("simple@1"),
    )
    assert done.status.code == Code.OK
    assert registry.clients(group) == []


async def _assign(cluster: Cluster, topic: str, group: str, client: str) -> list[tuple[str, int]]:
    response = await cluster.stub.QueryAssignment(
        s.QueryAssignmentRequest(topic=pb.Resource(name=topic), group=pb.Resource(name=group)),
        metadata=cluster.metadata(client),
    )
    assert response.status.code == Code.OK
    for a in response.assignments:
        (address,) = a.message_queue.broker.endpoints.addresses
        assert address.port == cluster.server.port
    return sorted((a.message_queue.broker.name, a.message_queue.id) for a in response.assignments)


async def test_pop_assignment_shares_all_brokers_with_few_consumers(cluster: Cluster) -> None:
    topic, group = unique("t"), unique("g")
    await cluster.route(topic)
    first = await _assign(cluster, topic, group, "c1")
    second = await _assign(cluster, topic, group, "c2")
    # popShareQueueNum 1 with 2 consumers: everyone pops everything (queue id -1)
    assert first == second == [("broker-0", -1), ("broker-1", -1)]


@OWN_CLUSTER
async def test_pop_assignment_with_many_consumers_shares_each_queue_twice(
    make_cluster,
) -> None:
    cluster = await make_cluster(brokers=2)
    topic, group = unique("t"), unique("g")
    await cluster.route(topic)
    clients = [f"c{i}" for i in range(4)]
    for client in clients:  # register all of them first
        await _assign(cluster, topic, group, client)
    shares = [await _assign(cluster, topic, group, c) for c in clients]
    counts: dict[tuple[str, int], int] = {}
    for share in shares:
        for queue in share:
            counts[queue] = counts.get(queue, 0) + 1
    assert len(counts) == 8 and set(counts.values()) == {2}


async def test_pull_assignment_is_exclusive(cluster: Cluster) -> None:
    topic, group = unique("t"), unique("g")
    await cluster.route(topic)
    await cluster.server.cluster.update_group(
        GroupConfig(name=group, consume_mode=ConsumeMode.PULL)
    )
    await _assign(cluster, topic, group, "a")
    await _assign(cluster, topic, group, "b")
    first, second = await asyncio.gather(
        _assign(cluster, topic, group, "a"), _assign(cluster, topic, group, "b")
    )
    assert len(first) == len(second) == 4
    assert not set(first) & set(second)
    assert all(queue_id >= 0 for _, queue_id in first + second)


async def test_settings_topics_are_bounded_and_must_be_topic_names(cluster: Cluster) -> None:
    """Issue 20, defect 4: producer settings kept any number of unvalidated topic names
    (40 client ids x 6.2 MB grew a proxy by 486 MB)."""
    for topics, code in (
        ([f"t{i}" for i in range(1025)], Code.BAD_REQUEST),
        (["x" * 100_000], Code.ILLEGAL_TOPIC),
    ):
        settings = pb.Settings(
            client_type=pb.PRODUCER,
            publishing=pb.Publishing(topics=[pb.Resource(name=t) for t in topics]),
        )
        call = cluster.stub.Telemetry(metadata=cluster.metadata("big@1"), timeout=5)
        await call.write(s.TelemetryCommand(settings=settings))
        reply = await call.read()
        call.cancel()
        assert reply.status.code == code
    assert cluster.server.registry.get("big@1") is None
