"""A SQL92 subscription over the proxy, in every long-poll strategy: a held receive is not
answered by arrivals the filter leaves out, and gets exactly the matching message."""

from __future__ import annotations

import anyio
import pytest
from popmq.broker.contract.errors import Code
from proxy_support import Cluster, unique

from popmq.pb.rocketmq.v2 import definition_pb2 as pb
from popmq.pb.rocketmq.v2 import service_pb2 as s

pytestmark = pytest.mark.slow  # scheduled first in make check (tests/conftest.py)


async def _receive_sql(cluster: Cluster, group: str, topic: str, expression: str, poll_ms: int):
    request = s.ReceiveMessageRequest(
        group=pb.Resource(name=group),
        message_queue=pb.MessageQueue(topic=pb.Resource(name=topic)),
        filter_expression=pb.FilterExpression(type=pb.SQL, expression=expression),
        batch_size=16,
    )
    request.invisible_duration.FromMilliseconds(30_000)
    request.long_polling_timeout.FromMilliseconds(poll_ms)
    status, bodies = pb.Status(), []
    call = cluster.stub.ReceiveMessage(
        request, metadata=cluster.metadata(), timeout=poll_ms / 1000 + 5
    )
    async for frame in call:
        if frame.WhichOneof("content") == "status":
            status = frame.status
        elif frame.WhichOneof("content") == "message":
            bodies.append(frame.message.body)
    return status, bodies


@pytest.mark.parametrize("strategy", ["pop", "slices", "notify", "adaptive"])
async def test_held_sql_receive_in_every_strategy(make_cluster, strategy: str) -> None:
    # pop long-polls one broker (RocketMQ's false empties when the message is on another).
    brokers = 1 if strategy == "pop" else 2
    cluster = await make_cluster(brokers, **{"proxy.strategy": strategy})
    topic, group = unique("sql"), unique("g")
    for broker in cluster.brokers:
        await broker.create_topic(topic, 2, "NORMAL")
    answers: list = []
    done = anyio.Event()

    async def held() -> None:
        answers.append(await _receive_sql(cluster, group, topic, "color = 'red' AND n > 1", 6_000))
        done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(held)
        await anyio.sleep(0.5)
        for n in range(5):  # none of these match
            sent = await cluster.send(topic, b"no", properties={"color": "blue", "n": str(n)})
            assert sent.status.code == Code.OK
        sent = await cluster.send(topic, b"no", properties={"color": "red", "n": "1"})
        await anyio.sleep(0.5)
        assert answers == []  # still held
        await cluster.send(topic, b"yes", properties={"color": "red", "n": "2"})
        with anyio.fail_after(8):
            await done.wait()
    status, bodies = answers[0]
    assert status.code == Code.OK and bodies == [b"yes"], (status, bodies)


@pytest.mark.parametrize(
    ("expression", "code"),
    [("a > AND", Code.ILLEGAL_FILTER_EXPRESSION), ("a > 1 AND region IN ('eu')", Code.OK)],
)
async def test_telemetry_settings_check_sql_filters(cluster: Cluster, expression, code) -> None:
    call = cluster.stub.Telemetry(metadata=cluster.metadata())
    sql = pb.FilterExpression(type=pb.SQL, expression=expression)
    settings = pb.Settings(
        client_type=pb.SIMPLE_CONSUMER,
        subscription=pb.Subscription(
            group=pb.Resource(name=unique("g")),
            subscriptions=[pb.SubscriptionEntry(topic=pb.Resource(name="t"), expression=sql)],
        ),
    )
    await call.write(s.TelemetryCommand(settings=settings))
    answer = await call.read()
    call.cancel()
    assert answer.status.code == code, answer.status
    if code != Code.OK:
        assert "SQL92" in answer.status.message
