"""The messaging API end to end over real gRPC: route, send, receive, ack, change invisible."""

from __future__ import annotations

import asyncio
import time

import pytest
from popmq.broker.contract.errors import Code
from popmq.proxy.grpc.convert import md5_hex
from proxy_support import Cluster, eventually, unique

from popmq.pb.rocketmq.v2 import definition_pb2 as pb

# One cluster for the module's checks (each uses its own topics and groups); the few that
# need their own configuration make one on the test's own loop.
# slow: scheduled first in make check (tests/conftest.py)
pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]
OWN_CLUSTER = pytest.mark.asyncio(loop_scope="function")


@pytest.fixture(scope="module")
def cluster(module_cluster: Cluster) -> Cluster:
    return module_cluster


async def test_route_lists_every_broker_queue_at_the_proxy_address(cluster: Cluster) -> None:
    topic = unique("route")
    response = await cluster.route(topic)
    assert response.status.code == Code.OK
    queues = response.message_queues
    assert {(q.broker.name, q.id) for q in queues} == {
        (b, i) for b in ("broker-0", "broker-1") for i in range(4)
    }
    for queue in queues:
        assert queue.permission == pb.READ_WRITE
        assert queue.broker.id == 0
        assert queue.topic.name == topic
        assert set(queue.accept_message_types) == {pb.NORMAL, pb.FIFO, pb.DELAY, pb.TRANSACTION}
        (address,) = queue.broker.endpoints.addresses
        assert (address.host, address.port) == ("127.0.0.1", cluster.server.port)
        assert queue.broker.endpoints.scheme == pb.IPv4


async def test_send_receive_ack_roundtrip(cluster: Cluster) -> None:
    topic, group = unique("t"), unique("g")
    sent = await cluster.send(topic, b"one", b"two", tag="TagA", keys=["k1"])
    assert sent.status.code == Code.OK
    assert len(sent.entries) == 2 and all(e.status.code == Code.OK for e in sent.entries)

    status, messages, kinds = await cluster.receive(group, topic)
    assert status.code == Code.OK
    assert kinds == ["status", "message", "message", "delivery_timestamp"]
    assert sorted(m.body for m in messages) == [b"one", b"two"]
    ids = {e.message_id for e in sent.entries}
    for msg in messages:
        props = msg.system_properties
        assert props.message_id in ids
        assert props.body_encoding == pb.IDENTITY
        assert props.body_digest.type == pb.MD5
        assert props.body_digest.checksum == md5_hex(msg.body)
        assert props.delivery_attempt == 1
        assert props.tag == "TagA" and list(props.keys) == ["k1"]
        assert props.receipt_handle

    acked = await cluster.ack(group, topic, *messages)
    assert acked.status.code == Code.OK
    assert [e.status.code for e in acked.entries] == [Code.OK, Code.OK]
    status, messages, kinds = await cluster.receive(group, topic)
    assert status.code == Code.MESSAGE_NOT_FOUND and messages == []
    assert kinds == ["status", "delivery_timestamp"]


@pytest.mark.wallclock  # real timing, generous bounds (see pyproject markers)
async def test_empty_receive_holds_for_the_polling_time(cluster: Cluster) -> None:
    topic, group = unique("t"), unique("g")
    await cluster.route(topic)
    started = time.monotonic()
    status, messages, _ = await cluster.receive(group, topic, poll_ms=800)
    elapsed = time.monotonic() - started
    assert status.code == Code.MESSAGE_NOT_FOUND and not messages
    # Ended by the client's 0.8 s, not the proxy's 3 s maximum (slack for a loaded machine).
    assert 0.7 <= elapsed < 2.5


@pytest.mark.wallclock  # real timing, generous bounds (see pyproject markers)
async def test_long_poll_returns_when_a_message_arrives_on_any_broker(cluster: Cluster) -> None:
    topic, group = unique("t"), unique("g")
    await cluster.route(topic)
    receive = asyncio.create_task(cluster.receive(group, topic, poll_ms=3_000, broker="broker-0"))
    await eventually(lambda: sum(b.hold_table.total for b in cluster.brokers) > 0)
    started = time.monotonic()
    # round robin: two sends land on two different queues (one of them on broker-1 at least)
    await cluster.send(topic, b"late")
    status, messages, _ = await receive
    assert status.code == Code.OK and [m.body for m in messages] == [b"late"]
    # Woken by the message, not found by a last look when the 3 s poll ended.
    assert time.monotonic() - started < 2.5


async def test_unacked_message_is_redelivered_after_invisible_time(cluster: Cluster) -> None:
    topic, group = unique("t"), unique("g")
    await cluster.send(topic, b"again")
    popping = time.monotonic()
    _, first, _ = await cluster.receive(group, topic, invisible_ms=600)
    assert len(first) == 1 and first[0].system_properties.delivery_attempt == 1
    deadline = time.monotonic() + 6
    again: list[pb.Message] = []
    while not again and time.monotonic() < deadline:
        _, again, _ = await cluster.receive(group, topic, poll_ms=300)
    # Not back before its invisible time ended (measured from before the pop, so a slow
    # machine only makes the figure larger).
    assert time.monotonic() - popping >= 0.6
    assert [m.body for m in again] == [b"again"]
    assert again[0].system_properties.delivery_attempt == 2
    assert again[0].system_properties.message_id == first[0].system_properties.message_id
    assert again[0].topic.name == topic
    assert (await cluster.ack(group, topic, *again)).status.code == Code.OK


async def test_change_invisible_duration_gives_a_new_handle(cluster: Cluster) -> None:
    topic, group = unique("t"), unique("g")
    await cluster.send(topic, b"slow")
    _, (msg,), _ = await cluster.receive(group, topic, invisible_ms=600)
    old = msg.system_properties.receipt_handle
    changed = await cluster.change_invisible(group, topic, old, 10_000)
    assert changed.status.code == Code.OK
    assert changed.receipt_handle and changed.receipt_handle != old
    await asyncio.sleep(1.0)  # past the first invisible time: still invisible now
    _, none, _ = await cluster.receive(group, topic, poll_ms=300)
    assert none == []
    stale = await cluster.ack_handles(group, topic, [_entry(msg.system_properties.message_id, old)])
    assert stale.status.code == Code.INVALID_RECEIPT_HANDLE
    fresh = await cluster.ack_handles(
        group, topic, [_entry(msg.system_properties.message_id, changed.receipt_handle)]
    )
    assert fresh.status.code == Code.OK


async def test_fifo_group_stays_on_one_queue_in_order(cluster: Cluster) -> None:
    topic, group = unique("fifo"), unique("g")
    for i in range(6):
        sent = await cluster.send(topic, f"m{i}".encode(), group="order-42")
        assert sent.status.code == Code.OK
    _, messages, _ = await cluster.receive(group, topic, batch=32)
    assert [m.body for m in messages] == [f"m{i}".encode() for i in range(6)]
    assert len({(m.system_properties.queue_id) for m in messages}) == 1
    assert all(m.system_properties.message_group == "order-42" for m in messages)
    assert all(m.system_properties.message_type == pb.FIFO for m in messages)


async def test_delay_message_waits_for_its_delivery_time(cluster: Cluster) -> None:
    topic, group = unique("delay"), unique("g")
    due = int(time.time() * 1000) + 1_200
    assert (await cluster.send(topic, b"later", delivery_ms=due)).status.code == Code.OK
    # Usually the first receives come back empty; what is checked is the cause, which holds
    # however slow the machine: it is not delivered before it is due.
    deadline = time.monotonic() + 10
    _, got, _ = await cluster.receive(group, topic, poll_ms=300)
    while not got and time.monotonic() < deadline:
        _, got, _ = await cluster.receive(group, topic, poll_ms=1_000)
    assert [m.body for m in got] == [b"later"]
    assert time.time() * 1000 >= due - 50
    assert got[0].system_properties.message_type == pb.DELAY


@OWN_CLUSTER
async def test_two_proxies_receive_on_one_ack_on_the_other(make_cluster) -> None:
    first: Cluster = await make_cluster(brokers=2)
    # a second proxy over the same brokers
    from popmq.broker.local import LocalBrokerPort
    from popmq.proxy.server import ProxyServer

    second = ProxyServer(first.config, [LocalBrokerPort(b) for b in first.brokers])
    await second.start()
    try:
        import grpc

        from popmq.pb.rocketmq.v2 import service_pb2_grpc

        async with grpc.aio.insecure_channel(f"127.0.0.1:{second.port}") as channel:
            other = Cluster(
                first.config, first.brokers, second, channel,
                service_pb2_grpc.MessagingServiceStub(channel), "other@1",
            )  # fmt: skip
            topic, group = unique("t"), unique("g")
            await first.send(topic, b"x", b"y")
            _, messages, _ = await first.receive(group, topic, invisible_ms=2_000)
            assert len(messages) == 2
            acked = await other.ack(group, topic, *messages)
            assert acked.status.code == Code.OK
            await asyncio.sleep(2.3)  # past the invisible time: acked, so never again
            _, again, _ = await first.receive(group, topic, poll_ms=500)
            assert again == []
    finally:
        await second.aclose(0.2)


def _entry(message_id: str, handle: str):
    from popmq.pb.rocketmq.v2 import service_pb2 as s

    return s.AckMessageEntry(message_id=message_id, receipt_handle=handle)


async def _forward_to_dlq(cluster: Cluster, group: str, topic: str, msg, attempt: int = 1):  # type: ignore[no-untyped-def]
    """ForwardMessageToDeadLetterQueue for a received message (16 attempts allowed)."""
    from popmq.pb.rocketmq.v2 import service_pb2 as s

    return await cluster.stub.ForwardMessageToDeadLetterQueue(
        s.ForwardMessageToDeadLetterQueueRequest(
            group=pb.Resource(name=group), topic=pb.Resource(name=topic),
            receipt_handle=msg.system_properties.receipt_handle,
            message_id=msg.system_properties.message_id, delivery_attempt=attempt,
            max_delivery_attempts=16,
        ),
        metadata=cluster.metadata(),
    )  # fmt: skip


async def test_a_group_receives_its_own_dead_letters(cluster: Cluster, caplog) -> None:
    """%DLQ%group is readable by ReceiveMessage, as the proxy's validation allows: the broker
    refused to pop it ("reserved system prefix"), so a receive waited out its whole poll and
    the proxy logged a warning per retry."""
    from popmq.pb.rocketmq.v2 import service_pb2 as s

    topic, group = unique("t"), unique("g")
    await cluster.send(topic, b"poison")
    _, (msg,), _ = await cluster.receive(group, topic, invisible_ms=60_000)
    forwarded = await _forward_to_dlq(cluster, group, topic, msg)
    assert forwarded.status.code == Code.OK
    dlq = f"%DLQ%{group}"
    caplog.clear()
    status, dead, _ = await cluster.receive(group, dlq, invisible_ms=60_000, poll_ms=20_000)
    assert status.code == Code.OK
    assert [m.body for m in dead] == [b"poison"]
    acked = await cluster.stub.AckMessage(
        s.AckMessageRequest(
            group=pb.Resource(name=group), topic=pb.Resource(name=dlq),
            entries=[_entry(dead[0].system_properties.message_id,
                            dead[0].system_properties.receipt_handle)],
        ),
        metadata=cluster.metadata(),
    )  # fmt: skip
    assert acked.status.code == Code.OK
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


async def test_a_dead_letter_given_up_on_again_goes_back_to_the_dlq(cluster: Cluster) -> None:
    """A message read from %DLQ%group has used its attempts, so a consumer failing it again
    forwards it to the dead-letter queue (a FIFO push consumer does so on its first failure).
    The proxy refused that with ILLEGAL_TOPIC, though the broker takes it: the official
    client re-forwards a refused message forever, and its message group stays blocked."""

    topic, group = unique("t"), unique("g")
    dlq = f"%DLQ%{group}"
    await cluster.send(topic, b"poison")
    _, (msg,), _ = await cluster.receive(group, topic, invisible_ms=60_000)
    first = await _forward_to_dlq(cluster, group, topic, msg, attempt=17)
    assert first.status.code == Code.OK
    _, (dead,), _ = await cluster.receive(group, dlq, invisible_ms=60_000, poll_ms=20_000)
    again = await _forward_to_dlq(cluster, group, dlq, dead, attempt=17)
    assert again.status.code == Code.OK, again.status.message
    # nothing is lost: it waits in the dead-letter queue once more, readable as before
    _, (back,), _ = await cluster.receive(group, dlq, invisible_ms=60_000, poll_ms=20_000)
    assert back.body == b"poison"


async def test_forward_to_dead_letter_queue(cluster: Cluster) -> None:
    from popmq.pb.rocketmq.v2 import service_pb2 as s

    topic, group = unique("t"), unique("g")
    await cluster.send(topic, b"poison")
    _, (msg,), _ = await cluster.receive(group, topic, invisible_ms=600)
    forwarded = await _forward_to_dlq(cluster, group, topic, msg)
    assert forwarded.status.code == Code.OK
    await asyncio.sleep(1.0)  # past its invisible time: it was acked, so it never comes back
    _, again, _ = await cluster.receive(group, topic, poll_ms=300)
    assert again == []
    # it waits in the group's dead-letter topic, readable by offset
    route = await cluster.route(f"%DLQ%{group}")
    assert route.status.code == Code.OK
    dlq_queue = route.message_queues[0]
    request = s.PullMessageRequest(
        group=pb.Resource(name="dlq-reader"), message_queue=dlq_queue, offset=0, batch_size=8
    )
    frames = [f async for f in cluster.stub.PullMessage(request, metadata=cluster.metadata())]
    dead = [f.message for f in frames if f.WhichOneof("content") == "message"]
    assert [m.body for m in dead] == [b"poison"]
    # a forged handle is refused
    bad = await cluster.stub.ForwardMessageToDeadLetterQueue(
        s.ForwardMessageToDeadLetterQueueRequest(
            group=pb.Resource(name=group), topic=pb.Resource(name=topic), receipt_handle="x.y"
        ),
        metadata=cluster.metadata(),
    )
    assert bad.status.code == Code.INVALID_RECEIPT_HANDLE


@OWN_CLUSTER
async def test_advertised_address_goes_into_routes(make_cluster) -> None:
    cluster = await make_cluster(
        brokers=1, **{"proxy.advertise_host": "mq.example.com", "proxy.advertise_port": 9876}
    )
    response = await cluster.route(unique("t"))
    endpoints = {
        (q.broker.endpoints.scheme, a.host, a.port)
        for q in response.message_queues
        for a in q.broker.endpoints.addresses
    }
    assert endpoints == {(pb.DOMAIN_NAME, "mq.example.com", 9876)}


async def test_route_echoes_the_address_the_client_used(cluster: Cluster) -> None:
    from popmq.pb.rocketmq.v2 import service_pb2 as s

    asked = pb.Endpoints(scheme=pb.IPv4, addresses=[pb.Address(host="127.0.0.1", port=1234)])
    response = await cluster.stub.QueryRoute(
        s.QueryRouteRequest(topic=pb.Resource(name=unique("t")), endpoints=asked),
        metadata=cluster.metadata(),
    )
    assert {a.port for q in response.message_queues for a in q.broker.endpoints.addresses} == {1234}
