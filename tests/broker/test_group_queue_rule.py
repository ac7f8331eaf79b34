"""One rule maps a FIFO message group to a queue (popmq.broker.contract.queues), used by the
proxy's queue choice and by a broker sending without a queue id. Its values are pinned: groups
already on disk keep their order only while new sends of the group reach the same queue."""

from __future__ import annotations

from popmq.broker.contract.queues import queue_for_group
from popmq.broker.contract.types import Message
from popmq.broker.testing import local_broker
from popmq.proxy.cluster import BrokerCluster, TopicRoute


def test_the_rule_is_pinned() -> None:
    # blake2b(digest_size=8), big-endian, modulo the queue count (the proxy's rule since the start)
    assert [queue_for_group(g, 8) for g in ("order-1", "order-2", "客户-7")] == [5, 3, 0]
    assert [queue_for_group(g, 5) for g in ("order-1", "order-2")] == [4, 1]


async def test_the_proxy_and_a_broker_follow_the_rule() -> None:
    async with local_broker() as port:
        # The proxy: over the route's queues, across brokers, in the cluster's broker order.
        cluster = BrokerCluster([port], auto_create_topics=False)
        route = TopicRoute("t", {"a": 4, "b": 4})
        for group in ("order-1", "order-2", "客户-7"):
            picked = cluster.pick_queue(route, group)
            assert picked == route.queues[queue_for_group(group, 8)]
            assert cluster.pick_queue(route, group) == picked  # and always the same one
        # A broker sent a group's messages without a queue id.
        await port.create_topic("t", 8)
        for group in ("order-1", "order-2", "客户-7"):
            results = await port.send([Message("t", b"x", message_group=group)] * 3)
            assert {r.queue_id for r in results} == {queue_for_group(group, 8)}
