"""popmq.client against a real `popmq serve` process (2 embedded brokers) on loopback."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from popmq.broker.contract.errors import Code
from popmq.broker.contract.types import Message

from popmq.client import AsyncClient, Client, OffsetPolicy, ProxyError
from popmq.client.local_server import LocalServer

pytestmark = pytest.mark.subprocess  # starts popmq or another process

SETTINGS = {
    "broker.topics.auto_create": "false",
    "proxy.min_long_polling_ms": 100,
    "proxy.min_invisible_ms": 500,
    "broker.pop.min_invisible_ms": 500,
    "broker.pop.time_scale": 0.01,
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    with LocalServer(tmp_path_factory.mktemp("serve"), brokers=2, settings=SETTINGS) as running:
        yield running


@pytest.fixture
def topic(server: LocalServer, request: pytest.FixtureRequest) -> str:
    name = request.node.name.replace("[", "_").replace("]", "")[:60]
    server.create_topic(name, queues=2)
    return name


def test_route_covers_both_brokers(server: LocalServer, topic: str) -> None:
    with Client(server.endpoint) as client:
        queues = client.query_route(topic)
    assert sorted({q.broker for q in queues}) == ["broker-0", "broker-1"]
    assert len(queues) == 4 and all(q.endpoint == server.endpoint for q in queues)


def test_unknown_topic(server: LocalServer) -> None:
    with Client(server.endpoint) as client, pytest.raises(ProxyError) as info:
        client.query_route("never-created")
    assert info.value.code == Code.TOPIC_NOT_FOUND


def test_send_pull_and_offsets(server: LocalServer, topic: str) -> None:
    sent_at = int(time.time() * 1000)
    with Client(server.endpoint) as client:
        queues = client.query_route(topic)
        receipts = []
        for i in range(6):  # one request per queue pick: spread over the queues
            batch = [
                Message(topic=topic, body=f"{i}-{j}".encode(), tag="T", keys=[f"k{i}{j}"])
                for j in range(5)
            ]
            receipts += client.send(batch)
        ends = client.query_offsets(queues, OffsetPolicy.END)
        begins = client.query_offsets(queues, OffsetPolicy.BEGINNING)
        got = []
        for queue in queues:
            offset = begins[queue.key]
            while offset < ends[queue.key]:
                result = client.pull(queue, offset, batch_size=4)
                assert len(result.messages) <= 4
                got += result.messages
                offset = result.next_offset
            assert client.pull(queue, offset).messages == []
            with pytest.raises(ProxyError) as info:
                client.pull(queue, offset + 1)
            assert info.value.code == Code.ILLEGAL_OFFSET
        at = client.query_offsets(queues, OffsetPolicy.TIMESTAMP, sent_at - 1000)
    assert sum(ends.values()) == 30 and at == begins
    assert sorted(m.message_id for m in got) == sorted(r.message_id for r in receipts)
    first = next(m for m in got if m.body == b"0-0")
    assert first.tag == "T" and first.keys == ["k00"] and first.store_timestamp_ms >= sent_at


def test_group_offsets(server: LocalServer, topic: str) -> None:
    with Client(server.endpoint) as client:
        queue = client.query_route(topic)[0]
        client.send([Message(topic=topic, body=b"x") for _ in range(3)])
        assert client.get_offset("offset-group", queue) == -1
        end = client.query_offset(queue, OffsetPolicy.END)
        client.update_offset("offset-group", queue, end)
        assert client.get_offset("offset-group", queue) == end


def test_receive_ack_and_redelivery(server: LocalServer, topic: str) -> None:
    with Client(server.endpoint) as client:
        queue = client.query_route(topic)[0]
        client.send([Message(topic=topic, body=f"m{i}".encode()) for i in range(4)])
        popped = []
        deadline = time.monotonic() + 10
        while len(popped) < 4 and time.monotonic() < deadline:
            popped += client.receive("g", queue, invisible_ms=60_000, long_polling_ms=200)
        assert sorted(m.body for m in popped) == [b"m0", b"m1", b"m2", b"m3"]
        keep, release = popped[:3], popped[3]
        outcomes = client.ack("g", topic, [(m.message_id, m.receipt_handle) for m in keep])
        assert all(o.ok for o in outcomes)
        handle = client.change_invisible_duration(
            "g", topic, release.message_id, release.receipt_handle, 500
        )
        assert handle and handle != release.receipt_handle
        again = []
        deadline = time.monotonic() + 10
        while not again and time.monotonic() < deadline:
            again = client.receive("g", queue, invisible_ms=60_000, long_polling_ms=500)
    assert [m.body for m in again] == [b"m3"]
    assert again[0].delivery_attempt == 2


def test_an_ack_whose_every_handle_failed_answers_per_entry(
    server: LocalServer, topic: str
) -> None:
    # The proxy's top status is then the entries' one (INVALID_RECEIPT_HANDLE): the client
    # raised it, and a Spark batch whose handles had all expired failed its query.
    with Client(server.endpoint) as client:
        client.query_route(topic)
        outcomes = client.ack("g", topic, [("id1", "forged"), ("id2", "also-forged")])
    assert [(o.message_id, o.code) for o in outcomes] == [
        ("id1", Code.INVALID_RECEIPT_HANDLE),
        ("id2", Code.INVALID_RECEIPT_HANDLE),
    ]


async def test_async_client_against_the_proxy(server: LocalServer, topic: str) -> None:
    async with AsyncClient(server.endpoint) as client:
        queues = await client.query_route(topic)
        await client.send([Message(topic=topic, body=b"a")])
        ends = {q.key: await client.query_offset(q, OffsetPolicy.END) for q in queues}
        (queue,) = [q for q in queues if ends[q.key] == 1]
        result = await client.pull(queue, 0)
    assert [m.body for m in result.messages] == [b"a"] and result.next_offset == 1
