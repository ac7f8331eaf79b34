"""Memory at the proxy's edges (issue 20), in process: receivers that stop reading (defect 3)
are ended within proxy.write_stall_timeout_ms, their long-poll slot freed and what they did not
take visible again at once; bytes in flight draw from proxy.max_inflight_bytes (defect 2);
keys and receipt handles are bounded (defects 5 and 10)."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from proxy_support import Cluster, eventually, unique

from popmq.pb.rocketmq.v2 import definition_pb2 as pb
from popmq.pb.rocketmq.v2 import service_pb2 as s

pytestmark = pytest.mark.slow  # scheduled first in make check (tests/conftest.py)

BODY = 1 << 20  # a few of these fill any HTTP/2 window a reader that reads nothing grants
COUNT = 8
STALL_MS = 500


async def _stalled_cluster(make_cluster: Any) -> Cluster:
    return await make_cluster(brokers=1, **{"proxy.write_stall_timeout_ms": STALL_MS})


def _receive_request(group: str, topic: str) -> s.ReceiveMessageRequest:
    request = s.ReceiveMessageRequest(
        group=pb.Resource(name=group),
        message_queue=pb.MessageQueue(topic=pb.Resource(name=topic)),
        filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"),
        batch_size=COUNT,
    )
    request.invisible_duration.FromMilliseconds(600_000)  # released, or gone for 10 minutes
    request.long_polling_timeout.FromMilliseconds(300)
    return request


def _stalled(cluster: Cluster, method: str) -> float:
    value = cluster.server.metrics.registry.get_sample_value(
        "popmq_proxy_stalled_streams_total", {"method": method}
    )
    return value or 0.0


async def test_a_receiver_that_stops_reading_is_ended_and_its_messages_come_back(
    make_cluster: Any,
) -> None:
    cluster = await _stalled_cluster(make_cluster)
    topic, group = unique("t-stall"), unique("g-stall")
    await cluster.route(topic)
    sent = await cluster.send(topic, *(bytes([65 + i]) * BODY for i in range(COUNT)))
    assert all(e.status.code == pb.OK for e in sent.entries)

    # A raw call whose client never reads: grpc stops taking frames once its window is full.
    stalled = cluster.stub.ReceiveMessage(
        _receive_request(group, topic), metadata=cluster.metadata(), timeout=60
    )
    admission = cluster.server.admission
    await eventually(lambda: admission.active == 1, within_s=5)
    await eventually(lambda: _stalled(cluster, "ReceiveMessage") == 1, within_s=10)
    assert admission.active == 0  # the slot is free

    # What the stalled reader did not take is visible again now, not in 10 minutes.
    got: list[pb.Message] = []
    for _ in range(20):
        _status, messages, _kinds = await cluster.receive(group, topic, batch=COUNT)
        got += messages
        if len(got) >= COUNT - 1:
            break
        await asyncio.sleep(0.2)
    # The frame stuck in the transport when the stream was given up may still reach the
    # stalled reader; everything else comes back at once.
    assert len(got) >= COUNT - 1
    stalled.cancel()


async def test_a_puller_that_stops_reading_is_ended(make_cluster: Any) -> None:
    cluster = await _stalled_cluster(make_cluster)
    topic, group = unique("t-stall"), unique("g-stall")
    await cluster.route(topic)
    await cluster.send(topic, *(bytes([65 + i]) * BODY for i in range(COUNT)))
    request = s.PullMessageRequest(
        group=pb.Resource(name=group),
        message_queue=pb.MessageQueue(topic=pb.Resource(name=topic), id=-1),
        offset=0,
        batch_size=COUNT,
        filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"),
    )
    routes = await cluster.route(topic)
    request.message_queue.CopyFrom(routes.message_queues[0])
    for queue in routes.message_queues:  # the queue that holds the messages
        request.message_queue.CopyFrom(queue)
        probe = s.PullMessageRequest()
        probe.CopyFrom(request)
        probe.batch_size = 1
        frames = [f async for f in cluster.stub.PullMessage(probe, metadata=cluster.metadata())]
        if any(f.WhichOneof("content") == "message" for f in frames):
            break
    stalled = cluster.stub.PullMessage(request, metadata=cluster.metadata(), timeout=60)
    await eventually(lambda: _stalled(cluster, "PullMessage") == 1, within_s=10)
    stalled.cancel()
    assert isinstance(stalled, grpc.aio.Call)


async def test_a_send_past_the_memory_budget_is_too_many_requests(make_cluster: Any) -> None:
    """Issue 20, defect 2: bytes in flight draw from proxy.max_inflight_bytes. Here a stalled
    receive holds 8 MiB of answers; a 1 MiB send waits briefly, then is refused with
    TOO_MANY_REQUESTS (clients back off), and passes once the stalled stream is given up."""
    cluster = await make_cluster(
        brokers=1,
        **{"proxy.write_stall_timeout_ms": 3_000, "proxy.max_inflight_bytes": COUNT * BODY},
    )
    topic, group = unique("t-budget"), unique("g-budget")
    await cluster.route(topic)
    await cluster.send(topic, *(bytes([65 + i]) * BODY for i in range(COUNT)))
    stalled = cluster.stub.ReceiveMessage(
        _receive_request(group, topic), metadata=cluster.metadata(), timeout=60
    )
    refused = await cluster.send(topic, b"x" * BODY)
    for _ in range(50):  # until the receive has popped and holds its bytes
        if refused.status.code == pb.TOO_MANY_REQUESTS:
            break
        await asyncio.sleep(0.1)
        refused = await cluster.send(topic, b"x" * BODY)
    assert refused.status.code == pb.TOO_MANY_REQUESTS
    assert [e.status.code for e in refused.entries] == [pb.TOO_MANY_REQUESTS]
    await eventually(lambda: _stalled(cluster, "ReceiveMessage") == 1, within_s=10)
    accepted = await cluster.send(topic, b"x" * BODY)
    assert accepted.status.code == pb.OK
    stalled.cancel()


async def test_oversized_keys_and_receipt_handles_are_refused_on_the_wire(
    make_cluster: Any,
) -> None:
    """Issue 20, defects 5 and 10, end to end: a 1-byte body with 1 MiB of keys is refused
    (ILLEGAL_MESSAGE_KEY), and an ack of 64 KB handles answers INVALID_RECEIPT_HANDLE per
    entry without echoing the handles back."""
    cluster = await make_cluster(brokers=1)
    topic, group = unique("t-limits"), unique("g-limits")
    await cluster.route(topic)
    sent = await cluster.send(topic, b"x", keys=["k" * (1 << 20)])
    assert sent.status.code == pb.ILLEGAL_MESSAGE_KEY
    entries = [s.AckMessageEntry(message_id="m", receipt_handle="h" * 65_536) for _ in range(64)]
    answer = await cluster.ack_handles(group, topic, entries)
    assert {e.status.code for e in answer.entries} == {pb.INVALID_RECEIPT_HANDLE}
    assert answer.ByteSize() < 64 * 1024


async def test_one_connection_holds_a_bounded_number_of_streams(make_cluster: Any) -> None:
    """Issue 20, defect 11: one connection opened thousands of health watches. Past
    proxy.max_streams_per_connection the client's own gRPC queues new calls."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    cluster = await make_cluster(brokers=1, **{"proxy.max_streams_per_connection": 16})
    health = health_pb2_grpc.HealthStub(cluster.channel)
    watches = [health.Watch(health_pb2.HealthCheckRequest()) for _ in range(16)]
    for watch in watches:
        assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
    with pytest.raises(grpc.aio.AioRpcError) as err:  # a 17th stream waits for a free one
        await health.Check(health_pb2.HealthCheckRequest(), timeout=1)
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    watches[0].cancel()
    answer = await health.Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert answer.status == health_pb2.HealthCheckResponse.SERVING
    for watch in watches[1:]:
        watch.cancel()


def _inflight(cluster: Cluster) -> float:
    return cluster.server.metrics.registry.get_sample_value("popmq_proxy_inflight_bytes") or 0.0


async def _pull_frames(cluster: Cluster, group: str, topic: str) -> list[s.PullMessageResponse]:
    """A pull of the one queue of ``topic`` that holds its message (the last answer)."""
    frames: list[s.PullMessageResponse] = []
    for queue in (await cluster.route(topic)).message_queues:
        request = s.PullMessageRequest(
            group=pb.Resource(name=group), message_queue=queue, offset=0, batch_size=4,
            filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"),
        )  # fmt: skip
        call = cluster.stub.PullMessage(request, metadata=cluster.metadata(), timeout=10)
        frames = [f async for f in call]
        kinds = {f.WhichOneof("content") for f in frames}
        if "message" in kinds or frames[0].status.code == pb.TOO_MANY_REQUESTS:
            return frames
    return frames


async def test_a_pull_past_the_memory_budget_is_too_many_requests(make_cluster: Any) -> None:
    """A pull's messages draw from proxy.max_inflight_bytes until written, as a receive's:
    while a stalled receive holds the budget a pull is refused with TOO_MANY_REQUESTS, and it
    passes once the stalled stream is given up."""
    cluster = await make_cluster(
        brokers=1,
        **{"proxy.write_stall_timeout_ms": 2_000, "proxy.max_inflight_bytes": COUNT * BODY},
    )
    topic, group = unique("t-budget"), unique("g-budget")
    pulled_topic = unique("t-pulled")
    await cluster.route(topic)
    await cluster.route(pulled_topic)
    await cluster.send(topic, *(bytes([65 + i]) * BODY for i in range(COUNT)))
    await cluster.send(pulled_topic, b"p" * BODY)
    stalled = cluster.stub.ReceiveMessage(
        _receive_request(group, topic), metadata=cluster.metadata(), timeout=60
    )
    await eventually(lambda: _inflight(cluster) >= COUNT * BODY, within_s=10)
    refused = await _pull_frames(cluster, unique("g-pull"), pulled_topic)
    assert [f.status.code for f in refused] == [pb.TOO_MANY_REQUESTS]
    await eventually(lambda: _stalled(cluster, "ReceiveMessage") == 1, within_s=10)
    pulled = await _pull_frames(cluster, unique("g-pull"), pulled_topic)
    assert pulled[0].status.code == pb.OK
    assert [f.message.body for f in pulled if f.WhichOneof("content") == "message"] == [b"p" * BODY]
    stalled.cancel()
