"""PullMessage, QueryOffset, GetOffset, UpdateOffset (what the Spark connector uses)."""

from __future__ import annotations

import time

import pytest
from popmq.broker.contract.errors import Code
from proxy_support import Cluster, eventually, unique

from popmq.pb.rocketmq.v2 import definition_pb2 as pb
from popmq.pb.rocketmq.v2 import service_pb2 as s


def _queue(topic: str, broker: str, queue_id: int) -> pb.MessageQueue:
    return pb.MessageQueue(
        topic=pb.Resource(name=topic), id=queue_id, broker=pb.Broker(name=broker)
    )


async def _pull(cluster: Cluster, queue: pb.MessageQueue, offset: int, poll_ms: int = 0):
    request = s.PullMessageRequest(
        group=pb.Resource(name="reader"), message_queue=queue, offset=offset, batch_size=32
    )
    request.long_polling_timeout.FromMilliseconds(poll_ms)
    frames = [
        f async for f in cluster.stub.PullMessage(request, metadata=cluster.metadata(), timeout=5)
    ]
    kinds = [f.WhichOneof("content") for f in frames]
    status = frames[0].status
    messages = [f.message for f in frames if f.WhichOneof("content") == "message"]
    next_offset = frames[-1].next_offset if kinds[-1] == "next_offset" else None
    return status, messages, next_offset, kinds


async def test_pull_by_offset_and_offsets(make_cluster) -> None:
    cluster = await make_cluster(brokers=1, **{"broker.topics.queue_count": 1})
    topic = unique("t")
    before = int(time.time() * 1000)
    await cluster.send(topic, b"a", b"b", b"c")
    queue = _queue(topic, "broker-0", 0)

    status, messages, next_offset, kinds = await _pull(cluster, queue, 0)
    assert status.code == Code.OK
    assert kinds == ["status", "message", "message", "message", "next_offset"]
    assert [m.body for m in messages] == [b"a", b"b", b"c"]
    assert [m.system_properties.queue_offset for m in messages] == [0, 1, 2]
    assert next_offset == 3

    status, messages, next_offset, _ = await _pull(cluster, queue, 3)
    assert status.code == Code.MESSAGE_NOT_FOUND and not messages and next_offset == 3
    status, _, _, _ = await _pull(cluster, queue, 99)
    assert status.code == Code.ILLEGAL_OFFSET

    async def query(policy: int, at_ms: int | None = None) -> int:
        request = s.QueryOffsetRequest(message_queue=queue, query_offset_policy=policy)
        if at_ms is not None:
            request.timestamp.FromMilliseconds(at_ms)
        response = await cluster.stub.QueryOffset(request, metadata=cluster.metadata())
        assert response.status.code == Code.OK
        return response.offset

    assert await query(pb.BEGINNING) == 0
    assert await query(pb.END) == 3
    assert await query(pb.TIMESTAMP, before - 1_000) == 0
    assert await query(pb.TIMESTAMP, int(time.time() * 1000) + 60_000) == 3

    group = pb.Resource(name=unique("g"))
    got = await cluster.stub.GetOffset(
        s.GetOffsetRequest(group=group, message_queue=queue), metadata=cluster.metadata()
    )
    assert got.status.code == Code.OK and got.offset == -1
    updated = await cluster.stub.UpdateOffset(
        s.UpdateOffsetRequest(group=group, message_queue=queue, offset=2),
        metadata=cluster.metadata(),
    )
    assert updated.status.code == Code.OK
    got = await cluster.stub.GetOffset(
        s.GetOffsetRequest(group=group, message_queue=queue), metadata=cluster.metadata()
    )
    assert got.offset == 2
    bad = await cluster.stub.UpdateOffset(
        s.UpdateOffsetRequest(group=group, message_queue=queue, offset=-5),
        metadata=cluster.metadata(),
    )
    assert bad.status.code == Code.ILLEGAL_OFFSET


@pytest.mark.wallclock  # real timing, generous bounds (see pyproject markers)
async def test_pull_long_polls_until_a_message_arrives(make_cluster) -> None:
    import asyncio

    cluster = await make_cluster(brokers=1, **{"broker.topics.queue_count": 1})
    topic = unique("t")
    await cluster.route(topic)
    queue = _queue(topic, "broker-0", 0)
    pull = asyncio.create_task(_pull(cluster, queue, 0, poll_ms=3_000))
    await eventually(lambda: cluster.brokers[0].hold_table.total > 0)  # the pull is held
    started = time.monotonic()
    await cluster.send(topic, b"wake")
    status, messages, _, _ = await pull
    assert status.code == Code.OK and [m.body for m in messages] == [b"wake"]
    # Woken by the send, not found when the 3 s poll ended (slack for a loaded machine).
    assert time.monotonic() - started < 2.5


async def test_bad_queue_addresses(cluster: Cluster) -> None:
    topic = unique("t")
    await cluster.route(topic)
    status, _, _, _ = await _pull(cluster, _queue(topic, "broker-9", 0), 0)
    assert status.code == Code.NOT_FOUND
    status, _, _, _ = await _pull(cluster, _queue(topic, "broker-0", 77), 0)
    assert status.code == Code.BAD_REQUEST
    status, _, _, _ = await _pull(cluster, _queue(topic, "", 0), 0)
    assert status.code == Code.BAD_REQUEST
