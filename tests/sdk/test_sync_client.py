"""popmq.client.Client against the in-memory fake server (wire shapes, codes, conversions)."""

from __future__ import annotations

import time

import pytest
from popmq.broker.contract.errors import Code
from popmq.broker.contract.types import Message
from support.fake_proxy import FakeProxy

from popmq.client import Client, OffsetPolicy, ProxyError, ProxyUnavailable


def test_route_lists_every_queue_of_every_broker(fake_proxy: FakeProxy) -> None:
    with Client(fake_proxy.endpoint) as client:
        queues = client.query_route("orders")
    assert [q.key for q in queues] == [
        ("broker-a", 0),
        ("broker-a", 1),
        ("broker-b", 0),
        ("broker-b", 1),
    ]
    assert all(q.endpoint == fake_proxy.endpoint and q.readable and q.writable for q in queues)


def test_unknown_topic_raises_topic_not_found(fake_proxy: FakeProxy) -> None:
    with Client(fake_proxy.endpoint) as client, pytest.raises(ProxyError) as info:
        client.query_route("nope")
    assert info.value.code == Code.TOPIC_NOT_FOUND
    assert "nope" in str(info.value)


def test_send_then_pull_round_trips_every_field(fake_proxy: FakeProxy) -> None:
    before = int(time.time() * 1000)
    message = Message(
        topic="orders",
        body=b"\x00payload\xff",
        tag="TagA",
        keys=["k1", "k2"],
        properties={"region": "eu"},
        born_timestamp_ms=before - 5,
    )
    with Client(fake_proxy.endpoint) as client:
        (receipt,) = client.send([message])
        queues = client.query_route("orders")
        found = []
        for queue in queues:
            result = client.pull(queue, 0)
            found.extend(result.messages)
            assert result.next_offset == len(result.messages)
    assert len(found) == 1
    got = found[0]
    assert got.message_id == receipt.message_id and len(got.message_id) == 34
    assert (got.topic, got.body, got.tag) == ("orders", b"\x00payload\xff", "TagA")
    assert got.keys == ["k1", "k2"] and got.properties == {"region": "eu"}
    assert got.born_timestamp_ms == before - 5
    assert got.store_timestamp_ms >= before
    assert got.offset == 0 and got.broker in {"broker-a", "broker-b"}


def test_pull_respects_batch_size_and_reports_next_offset(fake_proxy: FakeProxy) -> None:
    with Client(fake_proxy.endpoint) as client:
        queue = client.query_route("events")[0]
        fake_proxy.state.next_queue = 0
        # Round robin over 4 queues: every 4th message lands on queue 0 of broker-a.
        client.send([Message(topic="events", body=str(i).encode()) for i in range(20)])
        first = client.pull(queue, 0, batch_size=3)
        second = client.pull(queue, first.next_offset, batch_size=3)
        tail = client.pull(queue, 5)
    assert [m.body for m in first.messages] == [b"0", b"4", b"8"]
    assert first.next_offset == 3
    assert [m.body for m in second.messages] == [b"12", b"16"]
    assert second.next_offset == 5
    assert tail.messages == [] and tail.next_offset == 5  # MESSAGE_NOT_FOUND: an empty result


def test_pull_past_the_end_is_illegal_offset(fake_proxy: FakeProxy) -> None:
    with Client(fake_proxy.endpoint) as client:
        queue = client.query_route("orders")[0]
        with pytest.raises(ProxyError) as info:
            client.pull(queue, 99)
    assert info.value.code == Code.ILLEGAL_OFFSET


def test_query_offsets_by_policy(fake_proxy: FakeProxy) -> None:
    with Client(fake_proxy.endpoint) as client:
        queues = client.query_route("events")
        fake_proxy.state.next_queue = 0
        client.send([Message(topic="events", body=b"old") for _ in range(4)])
        time.sleep(0.01)
        middle = int(time.time() * 1000)
        client.send([Message(topic="events", body=b"new") for _ in range(8)])
        begin = client.query_offsets(queues, OffsetPolicy.BEGINNING)
        end = client.query_offsets(queues, OffsetPolicy.END)
        at = client.query_offset(queues[0], OffsetPolicy.TIMESTAMP, middle)
    assert set(begin.values()) == {0}
    assert end == {q.key: 3 for q in queues}
    assert at == 1


def test_group_offsets_update_and_get(fake_proxy: FakeProxy) -> None:
    with Client(fake_proxy.endpoint) as client:
        queue = client.query_route("orders")[1]
        with pytest.raises(ProxyError):
            client.get_offset("g1", queue)  # never committed
        client.update_offset("g1", queue, 42)
        assert client.get_offset("g1", queue) == 42


def test_receive_ack_and_change_invisible_duration(fake_proxy: FakeProxy) -> None:
    with Client(fake_proxy.endpoint) as client:
        queue = client.query_route("orders")[0]
        client.send([Message(topic="orders", body=f"m{i}".encode()) for i in range(3)])
        popped = client.receive("g", queue, batch_size=2, invisible_ms=60_000)
        assert len(popped) == 2 and all(m.receipt_handle for m in popped)
        assert all(m.delivery_attempt == 1 for m in popped)
        first, second = popped
        outcomes = client.ack("g", "orders", [(first.message_id, first.receipt_handle)])
        assert [o.ok for o in outcomes] == [True]
        new_handle = client.change_invisible_duration(
            "g", "orders", second.message_id, second.receipt_handle, 0
        )
        assert new_handle != second.receipt_handle
        again = client.receive("g", queue, batch_size=32, invisible_ms=60_000)
    # The acked one stays gone; the one made visible again comes back, with a second attempt.
    bodies = sorted(m.body for m in again)
    assert first.body not in bodies and second.body in bodies
    assert next(m for m in again if m.body == second.body).delivery_attempt == 2


def test_ack_with_a_stale_handle_fails_only_that_entry(fake_proxy: FakeProxy) -> None:
    with Client(fake_proxy.endpoint) as client:
        queue = client.query_route("orders")[0]
        client.send([Message(topic="orders", body=b"x")])
        (message,) = client.receive("g", queue, invisible_ms=60_000)
        outcomes = client.ack(
            "g", "orders", [(message.message_id, message.receipt_handle), ("id", "forged")]
        )
    assert [o.code for o in outcomes] == [Code.OK, Code.INVALID_RECEIPT_HANDLE]


def test_receive_nothing_is_an_empty_list(fake_proxy: FakeProxy) -> None:
    with Client(fake_proxy.endpoint) as client:
        queue = client.query_route("orders")[0]
        assert client.receive("g", queue, long_polling_ms=0) == []


def test_send_async_pipelines_requests(fake_proxy: FakeProxy) -> None:
    with Client(fake_proxy.endpoint) as client:
        pending = [
            client.send_async([Message(topic="orders", body=f"{i}-{j}".encode()) for j in range(4)])
            for i in range(5)
        ]
        receipts = [r for p in pending for r in p.result()]
        ends = client.query_offsets(client.query_route("orders"), OffsetPolicy.END)
    assert len(receipts) == 20 and len({r.message_id for r in receipts}) == 20
    assert sum(ends.values()) == 20


def test_unreachable_endpoint_raises_proxy_unavailable() -> None:
    with Client("127.0.0.1:1", timeout_s=1.0, read_attempts=1) as client:
        with pytest.raises(ProxyUnavailable) as info:
            client.query_route("orders")
    assert "127.0.0.1:1" in str(info.value)


@pytest.mark.parametrize("endpoint", ["", "localhost", "host:notaport", ":8081", "h:70000"])
def test_bad_endpoint_is_a_clear_value_error(endpoint: str) -> None:
    with pytest.raises(ValueError, match="HOST:PORT"):
        Client(endpoint)
