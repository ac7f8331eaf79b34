"""A large batch goes to its broker in chunks (issue 20, fewer copies of a body): a queue's
messages are sent SEND_CHUNK_BYTES of bodies at a time, one chunk after the other, and a body
left in the request (LazyBody) is read only for its chunk; a failed chunk fails the rest."""

from __future__ import annotations

from typing import Any

import pytest
from popmq.broker.contract.errors import BrokerUnavailableError, Code, RefusedError
from popmq.broker.contract.types import Message
from popmq.proxy.core import send as send_module
from popmq.proxy.core.context import RequestContext
from popmq.proxy.core.send import LazyBody, OutgoingMessage, Sender
from popmq.proxy.grpc import send as send_grpc
from popmq.proxy.grpc.convert import EAGER_BODY_BYTES, md5_hex, outgoing_from_pb
from proxy_support import Cluster, unique

from popmq.pb.rocketmq.v2 import definition_pb2 as pb

CTX = RequestContext(client_id="chunks@1")


def _record(sender: Sender, monkeypatch: pytest.MonkeyPatch, reads: list[int],
            fail_call: int | None = None) -> list[tuple[list[int], list[int]]]:  # fmt: skip
    """Each broker send: the body sizes it carried and the bodies read so far."""
    sent: list[tuple[list[int], list[int]]] = []
    for name in sender.cluster.names:
        port = sender.cluster.port(name)

        async def recording(messages: list[Message], queue_id: int = -1, real: Any = port.send):
            sent.append(([len(m.body) for m in messages], list(reads)))
            if fail_call is not None and len(sent) == fail_call:
                raise RefusedError(Code.INTERNAL_ERROR, "chunk refused")
            return await real(messages, queue_id)

        monkeypatch.setattr(port, "send", recording)
    return sent


def _lazy(reads: list[int], i: int) -> LazyBody:
    return LazyBody(400, lambda: reads.append(i) or bytes([65 + i]) * 400)


async def test_bodies_are_read_chunk_by_chunk(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    sender = cluster.server.core.sender
    monkeypatch.setattr(send_module, "SEND_CHUNK_BYTES", 1000)
    reads: list[int] = []
    sent = _record(sender, monkeypatch, reads)
    topic = unique("t")
    outcomes = await sender.send([OutgoingMessage(topic, _lazy(reads, i)) for i in range(5)], CTX)
    assert [o.error for o in outcomes] == [None] * 5
    assert [sizes for sizes, _ in sent] == [[400, 400], [400, 400], [400]]
    # Each chunk's bodies were read just before it went, not the whole batch at once.
    assert [seen for _, seen in sent] == [[0, 1], [0, 1, 2, 3], [0, 1, 2, 3, 4]]
    offsets = [o.result.queue_offset for o in outcomes if o.result is not None]
    assert offsets == sorted(offsets) and len({o.result.queue_id for o in outcomes}) == 1  # type: ignore[union-attr]


async def test_a_failed_chunk_fails_the_rest_and_keeps_what_was_stored(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    sender = cluster.server.core.sender
    monkeypatch.setattr(send_module, "SEND_CHUNK_BYTES", 1000)
    reads: list[int] = []
    sent = _record(sender, monkeypatch, reads, fail_call=2)
    topic = unique("t")
    outgoing = [OutgoingMessage(topic, _lazy(reads, i), message_group="g") for i in range(5)]
    outcomes = await sender.send(outgoing, CTX)
    assert [o.result is not None for o in outcomes] == [True, True, False, False, False]
    assert {str(o.error) for o in outcomes[2:]} == {str(outcomes[2].error)}
    assert len(sent) == 2  # nothing after the failed chunk was sent (a FIFO group has no gap)
    assert reads == [0, 1, 2, 3]  # and the last body was never read


def test_large_bodies_stay_in_the_request_until_sent() -> None:
    small = pb.Message(topic=pb.Resource(name="t"), body=b"s" * EAGER_BODY_BYTES)
    large = pb.Message(topic=pb.Resource(name="t"), body=b"L" * (EAGER_BODY_BYTES + 1))
    assert outgoing_from_pb(small).body == b"s" * EAGER_BODY_BYTES
    lazy = outgoing_from_pb(large).body
    assert isinstance(lazy, LazyBody) and lazy.size == EAGER_BODY_BYTES + 1
    assert lazy.read() == b"L" * (EAGER_BODY_BYTES + 1)


async def test_a_queue_batch_with_a_fifo_group_never_moves_to_another_broker(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A FIFO group and unordered messages that share a queue go in one batch; when a later
    chunk of it starts with an unordered message and its broker is down, it must not move
    (with the FIFO messages in it, and every chunk after it) to another broker: the group
    would be split over two queues."""
    sender = cluster.server.core.sender
    monkeypatch.setattr(send_module, "SEND_CHUNK_BYTES", 500)
    real_pick = sender.cluster.pick_queue
    monkeypatch.setattr(  # the group's queue and the round robin's land on the same queue
        sender.cluster, "pick_queue", lambda route, group="": real_pick(route, "g")
    )
    calls: list[tuple[str, list[str]]] = []
    for name in sender.cluster.names:
        port = sender.cluster.port(name)

        async def recording(messages: list[Message], queue_id: int = -1, real: Any = port.send,
                            name: str = name) -> Any:  # fmt: skip
            calls.append((name, [m.message_group for m in messages]))
            if len(calls) == 2:
                raise BrokerUnavailableError(name, "down for this test")
            return await real(messages, queue_id)

        monkeypatch.setattr(port, "send", recording)
    topic = unique("t")
    groups = ["g", None, "g", "g"]
    outgoing = [OutgoingMessage(topic, bytes([65 + i]) * 400, message_group=group)
                for i, group in enumerate(groups)]  # fmt: skip
    outcomes = await sender.send(outgoing, CTX)
    assert {name for name, groups in calls if "g" in groups} == {calls[0][0]}
    assert outcomes[0].result is not None
    assert [o.result is None for o in outcomes[1:]] == [True, True, True]


async def test_a_client_gets_each_message_s_status_in_order_when_a_chunk_fails(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through SendMessage: the stored messages OK with their offsets, every later one the
    failed chunk's error under its own message id, in the request's order; and exactly the
    stored ones are delivered."""
    sender = cluster.server.core.sender
    monkeypatch.setattr(send_module, "SEND_CHUNK_BYTES", 1000)
    reads: list[int] = []
    sent = _record(sender, monkeypatch, reads, fail_call=2)
    topic = unique("t")
    bodies = [bytes([65 + i]) * 400 for i in range(5)]
    response = await cluster.send(topic, *bodies, group="g")
    ids = [e.message_id for e in response.entries]
    assert len(ids) == 5 and len(set(ids)) == 5 and len(sent) == 2
    assert response.status.code == Code.MULTIPLE_RESULTS
    assert [e.status.code for e in response.entries] == [Code.OK] * 2 + [Code.INTERNAL_ERROR] * 3
    assert "chunk refused" in response.entries[4].status.message
    assert response.entries[1].offset == response.entries[0].offset + 1
    _, received, _ = await cluster.receive(unique("g"), topic)
    assert [m.body for m in received] == bodies[:2]
    assert [m.system_properties.message_id for m in received] == ids[:2]


async def test_a_large_batch_s_bodies_are_sent_from_the_request_bytes(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through SendMessage, a batch past SPLIT_FROM_BYTES is decoded without its bodies
    (popmq.broker.wire.bodies): each body goes to the broker from its view of grpc's bytes, and
    comes back intact (with its digest), with the other fields as sent."""
    taken: list[int] = []
    real_take = send_grpc.take_bodies

    def recording_take(request: Any) -> Any:
        bodies = real_take(request)
        taken.append(-1 if bodies is None else len(bodies))
        return bodies

    monkeypatch.setattr(send_grpc, "take_bodies", recording_take)
    topic, group = unique("t"), unique("g")
    bodies = [bytes([65 + i]) * (400_000 + i) for i in range(3)] + [b"small"]
    response = await cluster.send(topic, *bodies, tag="TagA", keys=["k1"])
    assert response.status.code == Code.OK, response.status
    assert taken == [4]  # split: the request was past SPLIT_FROM_BYTES
    _, received, _ = await cluster.receive(group, topic)
    assert sorted(m.body for m in received) == sorted(bodies)
    for m in received:
        assert m.system_properties.body_digest.checksum == md5_hex(m.body)
        assert m.system_properties.tag == "TagA" and list(m.system_properties.keys) == ["k1"]
