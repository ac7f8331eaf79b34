"""Bad input gets the right RocketMQ code, never a crash, never a leaked task."""

from __future__ import annotations

import asyncio
import base64
import time
from dataclasses import replace

import grpc
import pytest
from popmq.broker.contract.errors import Code
from popmq.broker.pop.handle import HandleCodec, peek_broker_name
from popmq.broker.pop.handle_keys import HandleKeyring, keyring_path
from popmq.proxy.metrics import RELEASED_MESSAGES
from proxy_support import Cluster, message, unique

from popmq.pb.rocketmq.v2 import definition_pb2 as pb
from popmq.pb.rocketmq.v2 import service_pb2 as s

# One cluster for the module's checks (each uses its own topics and groups); the few that
# need their own configuration make one on the test's own loop.
pytestmark = pytest.mark.asyncio(loop_scope="module")
OWN_CLUSTER = pytest.mark.asyncio(loop_scope="function")


@pytest.fixture(scope="module")
def cluster(module_cluster: Cluster) -> Cluster:
    return module_cluster


def _tampered(handle: str) -> str:
    """The same handle with one byte of its sealed part changed."""
    prefix, sealed = handle.rsplit(".", 1)
    raw = bytearray(base64.urlsafe_b64decode(sealed + "=" * (-len(sealed) % 4)))
    raw[20] ^= 1
    return prefix + "." + base64.urlsafe_b64encode(bytes(raw)).rstrip(b"=").decode()


async def _one_received(cluster: Cluster, group: str, topic: str) -> pb.Message:
    await cluster.send(topic, b"payload")
    _, (msg,), _ = await cluster.receive(group, topic, invisible_ms=5_000)
    return msg


@pytest.mark.parametrize(
    "handle", ["", "garbage", "a.b.c", "bm90anNvbg.c2ln", base64.b64encode(b"[1,2]").decode()]
)
async def test_malformed_handles(cluster: Cluster, handle: str) -> None:
    topic, group = unique("t"), unique("g")
    entry = s.AckMessageEntry(message_id="X", receipt_handle=handle)
    acked = await cluster.ack_handles(group, topic, [entry])
    assert acked.status.code == Code.INVALID_RECEIPT_HANDLE
    assert acked.entries[0].status.code == Code.INVALID_RECEIPT_HANDLE
    changed = await cluster.change_invisible(group, topic, handle, 1_000)
    assert changed.status.code == Code.INVALID_RECEIPT_HANDLE
    assert changed.receipt_handle == handle  # clients adopt it before checking the status


async def test_forged_handles_are_refused_and_nothing_is_lost(cluster: Cluster) -> None:
    topic, group = unique("t"), unique("g")
    msg = await _one_received(cluster, group, topic)
    real = msg.system_properties.receipt_handle
    owner = next(b for b in cluster.brokers if b.name == peek_broker_name(real))
    codec = HandleCodec(HandleKeyring(keyring_path(owner.config)))
    decoded = codec.decode(real)
    for forged in (
        _tampered(real),  # one sealed byte changed
        HandleCodec(HandleKeyring(None)).encode(decoded),  # sealed by someone else
        codec.encode(replace(decoded, broker="broker-9")),  # routed nowhere
        real[:-4] + ("AAAA" if not real.endswith("AAAA") else "BBBB"),  # altered tag
    ):
        acked = await cluster.ack_handles(group, topic, [s.AckMessageEntry(receipt_handle=forged)])
        assert acked.status.code == Code.INVALID_RECEIPT_HANDLE, forged
    # the real handle still works: the forgeries changed nothing
    assert (await cluster.ack(group, topic, msg)).status.code == Code.OK


async def test_handle_of_another_group_is_refused(cluster: Cluster) -> None:
    topic, group = unique("t"), unique("g")
    msg = await _one_received(cluster, group, topic)
    other = await cluster.ack(unique("other"), topic, msg)
    assert other.status.code == Code.INVALID_RECEIPT_HANDLE
    assert (await cluster.ack(group, topic, msg)).status.code == Code.OK


async def test_mixed_batch_ack_reports_each_entry(cluster: Cluster) -> None:
    topic, group = unique("t"), unique("g")
    msg = await _one_received(cluster, group, topic)
    entries = [
        s.AckMessageEntry(message_id=msg.system_properties.message_id,
                          receipt_handle=msg.system_properties.receipt_handle),
        s.AckMessageEntry(message_id="bad", receipt_handle="nonsense"),
    ]  # fmt: skip
    acked = await cluster.ack_handles(group, topic, entries)
    assert acked.status.code == Code.MULTIPLE_RESULTS
    assert [e.status.code for e in acked.entries] == [Code.OK, Code.INVALID_RECEIPT_HANDLE]
    # each entry its own id and handle, and its own status's message
    assert [(e.message_id, e.receipt_handle) for e in acked.entries] == [
        (x.message_id, x.receipt_handle) for x in entries
    ]
    assert acked.entries[0].status.message == "OK"
    assert "receipt handle" in acked.entries[1].status.message


@pytest.mark.parametrize(
    ("topic", "group", "code"),
    [
        ("bad topic", "g", Code.ILLEGAL_TOPIC),
        ("%SYS%x", "g", Code.ILLEGAL_TOPIC),
        ("t" * 200, "g", Code.ILLEGAL_TOPIC),
        ("ok-topic", "bad group", Code.ILLEGAL_CONSUMER_GROUP),
        ("ok-topic", "", Code.ILLEGAL_CONSUMER_GROUP),
    ],
)
async def test_bad_names(cluster: Cluster, topic: str, group: str, code: Code) -> None:
    status, messages, kinds = await cluster.receive(group, topic)
    assert status.code == code and not messages
    assert kinds == ["status", "delivery_timestamp"]
    if group == "g":
        sent = await cluster.send(topic, b"x")
        assert sent.status.code == code
        assert len(sent.entries) == 1 and sent.entries[0].status.code == code
        assert (await cluster.route(topic)).status.code == code


@OWN_CLUSTER
async def test_unknown_topic_without_auto_create(make_cluster) -> None:
    cluster = await make_cluster(brokers=1, **{"broker.topics.auto_create": False})
    topic = unique("missing")
    assert (await cluster.route(topic)).status.code == Code.TOPIC_NOT_FOUND
    assert (await cluster.send(topic, b"x")).status.code == Code.TOPIC_NOT_FOUND
    status, _, _ = await cluster.receive("g", topic)
    assert status.code == Code.TOPIC_NOT_FOUND


@OWN_CLUSTER
async def test_empty_and_oversize_bodies(make_cluster) -> None:
    cluster = await make_cluster(brokers=1, **{"proxy.max_body_bytes": 1024})
    topic = unique("t")
    assert (await cluster.send(topic, b"")).status.code == Code.MESSAGE_BODY_EMPTY
    assert (await cluster.send(topic, b"x" * 1025)).status.code == Code.MESSAGE_BODY_TOO_LARGE
    assert (await cluster.send(topic, b"x" * 1024)).status.code == Code.OK
    # far beyond the limit still gets a status, not a transport error
    assert (await cluster.send(topic, b"x" * (2 << 20))).status.code == Code.MESSAGE_BODY_TOO_LARGE


def _transactional(msg: pb.Message) -> pb.Message:
    msg.system_properties.message_type = pb.TRANSACTION
    return msg


async def test_bad_message_fields(cluster: Cluster) -> None:
    topic = unique("t")
    cases = [
        (message(topic, b"x", tag="a|b"), Code.ILLEGAL_MESSAGE_TAG),
        (message(topic, b"x", keys=[" "]), Code.ILLEGAL_MESSAGE_KEY),
        (message(topic, b"x", group="g" * 100), Code.ILLEGAL_MESSAGE_GROUP),
        (message(topic, b"x", properties={"__popmq.origin_topic": "x"}),
         Code.ILLEGAL_MESSAGE_PROPERTY_KEY),
        (message(topic, b"x", message_type=pb.FIFO), Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
        (_transactional(message(topic, b"x", group="g1")),
         Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
        (message(topic, b"x", delivery_ms=int(time.time() * 1000) + 10 * 86_400_000),
         Code.ILLEGAL_DELIVERY_TIME),
    ]  # fmt: skip
    for msg, code in cases:
        sent = await cluster.stub.SendMessage(
            s.SendMessageRequest(messages=[msg]), metadata=cluster.metadata()
        )
        assert sent.status.code == code, (msg, sent.status)
    empty = await cluster.stub.SendMessage(s.SendMessageRequest(), metadata=cluster.metadata())
    assert empty.status.code == Code.BAD_REQUEST


async def test_invisible_time_out_of_range(cluster: Cluster) -> None:
    topic, group = unique("t"), unique("g")
    for invisible in (None, 100, 13 * 3_600_000):
        status, _, _ = await cluster.receive(group, topic, invisible_ms=invisible)
        assert status.code == Code.ILLEGAL_INVISIBLE_TIME, invisible
    msg = await _one_received(cluster, group, topic)
    handle = msg.system_properties.receipt_handle
    changed = await cluster.change_invisible(group, topic, handle, 13 * 3_600_000)
    assert changed.status.code == Code.ILLEGAL_INVISIBLE_TIME
    assert changed.receipt_handle == handle


@pytest.mark.wallclock  # real timing, generous bounds (see pyproject markers)
@OWN_CLUSTER
async def test_polling_time_out_of_range(make_cluster) -> None:
    # What a poll clamped to the deadline leaves for its answer: 1 s here. RocketMQ's default
    # (100 ms) is less than a loaded CI machine may stall this process (proxy and client share
    # it): the answer then missed the 1.5 s deadline below by a few ms.
    cluster = await make_cluster(**{"proxy.long_polling_reserve_ms": 1_000})
    topic, group = unique("t"), unique("g")
    status, _, _ = await cluster.receive(group, topic, poll_ms=100)  # below min (300 ms)
    assert status.code == Code.ILLEGAL_POLLING_TIME
    # a deadline too short for the minimum poll
    status, _, _ = await cluster.receive(group, topic, poll_ms=1_000, deadline_s=0.35)
    assert status.code == Code.ILLEGAL_POLLING_TIME
    # above max is clamped, and never past the client's deadline: the whole answer came
    # before grpc's 1.5 s deadline (else the call raises DEADLINE_EXCEEDED), which is the
    # bound that matters; a clock read here would add a loaded machine's stalls to it.
    status, _, _ = await cluster.receive(group, topic, poll_ms=60_000, deadline_s=1.5)
    assert status.code == Code.MESSAGE_NOT_FOUND


@pytest.mark.parametrize("batch", [0, -1, 33, 1000])
async def test_batch_size_out_of_range(cluster: Cluster, batch: int) -> None:
    status, _, _ = await cluster.receive(unique("g"), unique("t"), batch=batch)
    assert status.code == Code.BAD_REQUEST


@pytest.mark.parametrize("expression", ["a >", "a = 1 AND", "a IN ()", "a == 1", "", "(a = 1"])
async def test_malformed_sql_filter_is_refused(cluster: Cluster, expression: str) -> None:
    request = s.ReceiveMessageRequest(
        group=pb.Resource(name="g"),
        message_queue=pb.MessageQueue(topic=pb.Resource(name=unique("t"))),
        filter_expression=pb.FilterExpression(type=pb.SQL, expression=expression),
        batch_size=1,
    )
    request.invisible_duration.FromMilliseconds(5_000)
    frames = [f async for f in cluster.stub.ReceiveMessage(request, metadata=cluster.metadata())]
    assert frames[0].status.code == Code.ILLEGAL_FILTER_EXPRESSION
    assert "SQL92" in frames[0].status.message


async def test_ack_without_entries(cluster: Cluster) -> None:
    assert (await cluster.ack_handles("g", "t", [])).status.code == Code.BAD_REQUEST


@pytest.mark.parametrize(
    "transaction_id", ["", "t", "r1.x.y.z", "t1.x.y.z", "t1.YnJva2VyLXo.k.AAAA", "x" * 5000]
)
async def test_bad_transaction_ids_are_refused(cluster: Cluster, transaction_id: str) -> None:
    request = s.EndTransactionRequest(
        topic=pb.Resource(name=unique("t")), message_id="M1", transaction_id=transaction_id,
        resolution=pb.COMMIT, source=pb.SOURCE_CLIENT,
    )  # fmt: skip
    end = await cluster.stub.EndTransaction(request, metadata=cluster.metadata(), timeout=5)
    assert end.status.code == Code.INVALID_TRANSACTION_ID, end.status
    assert "transaction id" in end.status.message


async def test_end_transaction_of_another_message_or_topic_is_refused(cluster: Cluster) -> None:
    topic = unique("t")
    sent = await cluster.send(topic, b"half", message_type=pb.TRANSACTION)
    assert sent.status.code == Code.OK, sent.status
    entry = sent.entries[0]
    assert entry.transaction_id.startswith("t1.")

    async def end(topic_name: str, message_id: str, resolution: int = pb.COMMIT) -> int:
        request = s.EndTransactionRequest(
            topic=pb.Resource(name=topic_name), message_id=message_id,
            transaction_id=entry.transaction_id, resolution=resolution, source=pb.SOURCE_CLIENT,
        )  # fmt: skip
        answer = await cluster.stub.EndTransaction(request, metadata=cluster.metadata())
        return answer.status.code

    assert await end(unique("other"), entry.message_id) == Code.INVALID_TRANSACTION_ID
    assert await end(topic, "ANOTHER") == Code.INVALID_TRANSACTION_ID
    assert await end(topic, entry.message_id, pb.TRANSACTION_RESOLUTION_UNSPECIFIED) == Code.OK
    assert await end(topic, entry.message_id, pb.ROLLBACK) == Code.OK
    assert await end(topic, entry.message_id, pb.ROLLBACK) == Code.OK  # idempotent
    assert await end(topic, entry.message_id) == Code.INVALID_TRANSACTION_ID  # rolled back


@pytest.mark.parametrize("handle", ["", "h", "r1.x.y.z", "r1.YnJva2VyLXo.k.AAAA", "x" * 5000])
async def test_bad_recall_handles_are_refused(cluster: Cluster, handle: str) -> None:
    request = s.RecallMessageRequest(topic=pb.Resource(name=unique("t")), recall_handle=handle)
    recall = await cluster.stub.RecallMessage(request, metadata=cluster.metadata(), timeout=5)
    assert recall.status.code == Code.BAD_REQUEST, recall.status
    assert "recall handle" in recall.status.message


async def test_missing_client_id(cluster: Cluster) -> None:
    response = await cluster.stub.Heartbeat(
        s.HeartbeatRequest(client_type=pb.PRODUCER), metadata=(("x-mq-language", "PYTHON"),)
    )
    assert response.status.code == Code.CLIENT_ID_REQUIRED


@pytest.mark.wallclock  # real timing, generous bounds (see pyproject markers)
async def test_client_disconnect_mid_long_poll(cluster: Cluster) -> None:
    topic, group = unique("t"), unique("g")
    await cluster.route(topic)
    baseline = asyncio.all_tasks()
    request = s.ReceiveMessageRequest(
        group=pb.Resource(name=group),
        message_queue=pb.MessageQueue(topic=pb.Resource(name=topic)),
        filter_expression=pb.FilterExpression(expression="*"),
        batch_size=8,
    )
    request.invisible_duration.FromMilliseconds(60_000)
    request.long_polling_timeout.FromMilliseconds(3_000)
    call = cluster.stub.ReceiveMessage(request, metadata=cluster.metadata(), timeout=10)
    await asyncio.sleep(0.3)  # the proxy is now holding the poll on the brokers
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call.read()
    await asyncio.sleep(0.3)
    # the abandoned poll took nothing: a new message goes to the next receive at once
    await cluster.send(topic, b"after")
    started = time.monotonic()
    _, messages, _ = await cluster.receive(group, topic, poll_ms=2_000)
    # at once: well before the 2 s poll ends (slack for a loaded machine)
    assert [m.body for m in messages] == [b"after"] and time.monotonic() - started < 1.8
    # and nothing of the cancelled call is left running
    await asyncio.sleep(0.2)
    left = sorted(t.get_name() for t in asyncio.all_tasks() - baseline)
    # Armed watches of the now idle group stay (by design, in their owner); no pop, notify,
    # consume or release of the cancelled long poll is left.
    strategy = ("pop:", "notify:", "consume:", "release", "owner:longpoll", "owner:notification")
    assert not [name for name in left if name.startswith(strategy)], left
    assert len([name for name in left if name.startswith("Task-")]) <= 2, left
    assert len(cluster.server.tasks) == 0


@pytest.mark.wallclock  # real timing, generous bounds (see pyproject markers)
async def test_undelivered_messages_are_released_quickly(cluster: Cluster) -> None:
    """The release path the servicer takes when writing to a vanished client fails."""
    from popmq.proxy.grpc.receive import receive_request

    topic, group = unique("t"), unique("g")
    await cluster.send(topic, b"orphan")
    request = s.ReceiveMessageRequest(
        group=pb.Resource(name=group),
        message_queue=pb.MessageQueue(topic=pb.Resource(name=topic)),
        batch_size=4,
    )
    request.invisible_duration.FromMilliseconds(60_000)
    request.long_polling_timeout.FromMilliseconds(300)
    from popmq.proxy.core.context import RequestContext

    receiver = cluster.server.core.receiver
    plan = await receiver.plan(receive_request(request), RequestContext(client_id="x"))
    popped = await receiver.receive(plan)
    assert len(popped) == 1
    receiver.release_unsent(plan, popped)  # as if the client vanished
    started = time.monotonic()
    got: list[pb.Message] = []
    while not got and time.monotonic() - started < 5:
        _, got, _ = await cluster.receive(group, topic, poll_ms=1_000)
    assert [m.body for m in got] == [b"orphan"]
    assert time.monotonic() - started < 3  # well before the 60 s invisible time
    released = cluster.server.metrics[RELEASED_MESSAGES].labels("handed_back")._value.get()
    assert released >= 1


async def test_garbage_bytes_do_not_break_the_server(cluster: Cluster) -> None:
    """A request that is not a valid protobuf fails in the transport; the server lives on."""
    method = cluster.channel.unary_unary(
        "/apache.rocketmq.v2.MessagingService/QueryRoute",
        request_serializer=lambda raw: raw,
        response_deserializer=lambda raw: raw,
    )
    with pytest.raises(grpc.aio.AioRpcError):
        await method(b"\xff\xff\xff\xff", timeout=2)
    assert (await cluster.route(unique("t"))).status.code == Code.OK
