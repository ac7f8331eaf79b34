"""Routes show a topic's message type (accept_message_types, what official clients check before
sending), and the proxy refuses a send of another type with MESSAGE_PROPERTY_CONFLICT_WITH_TYPE."""

from __future__ import annotations

import time

from popmq.broker.contract.errors import Code
from proxy_support import Cluster, unique

from popmq.pb.rocketmq.v2 import definition_pb2 as pb


async def _accepts(cluster: Cluster, topic: str) -> set[int]:
    route = await cluster.route(topic)
    assert route.status.code == Code.OK, route.status
    kinds = {tuple(q.accept_message_types) for q in route.message_queues}
    assert len(kinds) == 1  # every queue says the same
    return set(kinds.pop())


async def test_routes_follow_the_topic_type(cluster: Cluster) -> None:
    for kind, accepted in (
        ("FIFO", {pb.FIFO}),
        ("DELAY", {pb.DELAY}),
        ("NORMAL", {pb.NORMAL}),
        ("MIXED", {pb.NORMAL, pb.FIFO, pb.DELAY, pb.TRANSACTION}),
        ("TRANSACTION", {pb.TRANSACTION}),
    ):
        topic = unique(kind.lower())
        for broker in cluster.brokers:
            await broker.create_topic(topic, 2, kind)
        assert await _accepts(cluster, topic) == accepted, kind


async def test_an_auto_created_topic_is_typed_by_its_first_message(cluster: Cluster) -> None:
    topic = unique("auto")
    untyped = {pb.NORMAL, pb.FIFO, pb.DELAY, pb.TRANSACTION}
    assert await _accepts(cluster, topic) == untyped  # untyped yet
    sent = await cluster.send(topic, b"f", group="g1")
    assert sent.status.code == Code.OK, sent.status
    assert await _accepts(cluster, topic) == {pb.FIFO}  # the send made the route be re-read
    later = int(time.time() * 1000) + 60_000
    for props in ({}, {"delivery_ms": later}):
        refused = await cluster.send(topic, b"x", **props)
        assert refused.status.code == Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, refused.status
        assert "FIFO" in refused.status.message
