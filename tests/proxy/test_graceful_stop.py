"""A stopping proxy answers held receives at once with an ordinary empty answer
(MESSAGE_NOT_FOUND, then the delivery timestamp), refuses new calls, loses no message and
leaves no task behind."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from popmq.broker.contract.types import Message, PopRequest
from popmq.broker.local import LocalBrokerPort
from popmq.proxy.longpoll import LongPollRequest
from popmq.proxy.metrics import BROKER_RPCS
from proxy_support import Cluster, eventually, unique

NOT_FOUND = 40401

pytestmark = pytest.mark.wallclock  # a held receive must end at once on stop (real time)


def held_anywhere(cluster: Cluster) -> int:
    return sum(broker.hold_table.total for broker in cluster.brokers)


@pytest.mark.parametrize("strategy", ["pop", "notify", "adaptive", "slices"])
async def test_held_receive_ends_empty_when_the_proxy_stops(make_cluster, strategy: str) -> None:
    cluster = await make_cluster(
        **{"proxy.strategy": strategy, "proxy.max_long_polling_ms": 20_000}
    )
    topic, group = unique("stop"), unique("g")
    await cluster.route(topic)  # creates the topic
    before = asyncio.all_tasks()
    receive = asyncio.create_task(cluster.receive(group, topic, poll_ms=15_000, deadline_s=20))
    await eventually(lambda: held_anywhere(cluster) > 0)

    started = time.monotonic()
    await cluster.server.aclose(1.0)
    status, messages, kinds = await asyncio.wait_for(receive, 10)
    answered_s = time.monotonic() - started
    assert (status.code, messages, kinds) == (NOT_FOUND, [], ["status", "delivery_timestamp"])
    # At once, not at the end of its 15 s poll: a generous bound for a loaded CI machine.
    assert answered_s < 5, f"the held receive took {answered_s:.2f} s to end"

    # Nothing left holding on the brokers or running in the proxy.
    await eventually(lambda: held_anywhere(cluster) == 0, within_s=10)
    await eventually(lambda: asyncio.all_tasks() <= before | {asyncio.current_task()}, 10)
    # New calls are refused (the port is closed), and nothing was popped on the way out: a
    # message sent now is there for the next consumer.
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await cluster.receive(group, topic, poll_ms=1_000, deadline_s=2)
    assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
    port = LocalBrokerPort(cluster.brokers[0])
    await port.send([Message(topic, b"after")])
    popped = await port.pop(PopRequest(group, topic, invisible_time_ms=60_000))
    assert [p.message.body for p in popped.messages] == [b"after"]


async def test_a_receive_arriving_while_draining_is_answered_empty_without_broker_calls(
    cluster: Cluster,
) -> None:
    topic, group = unique("drain"), unique("g")
    await cluster.send(topic, b"waiting")
    strategy = cluster.server.strategy
    strategy.drain()
    calls = cluster.server.metrics[BROKER_RPCS]
    before = {kind: calls.labels(kind)._value.get() for kind in ("pop", "notify")}
    ports = [LocalBrokerPort(b) for b in cluster.brokers]
    request = LongPollRequest(PopRequest(group, topic, invisible_time_ms=60_000), poll_ms=5_000)
    # at once, not after its 5 s poll (slack for a loaded machine)
    assert await asyncio.wait_for(strategy.receive(ports, request), 2.5) == []
    assert {kind: calls.labels(kind)._value.get() for kind in ("pop", "notify")} == before
    # The message stayed where it was.
    found = [
        p.message.body
        for port in ports
        for p in (await port.pop(PopRequest(group, topic, invisible_time_ms=60_000))).messages
    ]
    assert found == [b"waiting"]
