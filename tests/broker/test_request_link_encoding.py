"""The request link's hand-made encoding (``encode``/``frame``) is read by protobuf exactly as
the LinkRequests/LinkResponses message it stands for, and ``frames`` keeps the queue's order."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st
from popmq.broker.wire import request_link
from popmq.broker.wire.request_link import Encoded, encode, encoded, frame, frames
from support.examples import examples

from popmq.pb.broker.v1 import broker_pb2 as pb

ids = st.integers(min_value=0, max_value=2**64 - 1)
bodies = st.binary(max_size=300) | st.sampled_from([b"", b"\x00" * 200, b"\xff" * 16_500])
texts = st.text(max_size=20)


@st.composite
def send_requests(draw: st.DrawFn) -> pb.SendRequest:
    request = pb.SendRequest(queue_id=draw(st.integers(min_value=-1, max_value=2**31 - 1)))
    for body in draw(st.lists(bodies, max_size=4)):
        message = request.messages.add()
        message.topic = draw(texts)
        message.body = body
    return request


@st.composite
def link_requests(draw: st.DrawFn) -> tuple[pb.LinkRequest, Encoded]:
    envelope = pb.LinkRequest(id=draw(ids))
    traced = draw(st.dictionaries(texts, texts, max_size=3))
    envelope.trace_context.update(traced)
    kind = draw(st.sampled_from(["send", "pop", "ack", "notify", "pull", "cancel"]))
    if kind == "send":
        payload_message = draw(send_requests())
    elif kind == "pop":
        payload_message = pb.PopRequest(group=draw(texts), topic=draw(texts),
                                        max_messages=draw(st.integers(0, 2**31 - 1)))  # fmt: skip
    else:  # an empty message of its type
        payload_message = type(getattr(pb.LinkRequest(), kind))()
    expected = pb.LinkRequest()
    expected.CopyFrom(envelope)
    getattr(expected, kind).CopyFrom(payload_message)
    if kind == "cancel" and not traced and draw(st.booleans()):
        return expected, encoded(expected)  # how the link sends its cancels
    return expected, encode(envelope, kind, payload_message.SerializeToString())


@settings(max_examples=examples(150), deadline=None)
@given(st.lists(link_requests(), max_size=6))
def test_a_frame_reads_as_the_requests_it_carries(
    items: list[tuple[pb.LinkRequest, Encoded]],
) -> None:
    data = frame([e for _, e in items])
    expected = pb.LinkRequests(requests=[m for m, _ in items])
    assert pb.LinkRequests.FromString(data) == expected
    for message, item in items:
        assert item.size == len(message.SerializeToString())
        assert pb.LinkRequest.FromString(b"".join(item.parts)) == message
    if not any(m.trace_context for m, _ in items):  # maps aside, the very bytes protobuf writes
        assert data == expected.SerializeToString()


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.tuples(ids, st.sampled_from(["send", "pop", "ack", "pull"]),
                          st.binary(max_size=200)), max_size=5))  # fmt: skip
def test_a_frame_reads_as_the_answers_it_carries(rows: list[tuple[int, str, bytes]]) -> None:
    items, expected = [], pb.LinkResponses()
    for answer_id, kind, body in rows:
        answer = type(getattr(pb.LinkResponse(), kind))()
        if kind == "pop":
            answer.messages.add().message.body = body
        answer.status.message = body.hex()[:10]
        items.append(encode(pb.LinkResponse(id=answer_id), kind, answer.SerializeToString()))
        getattr(expected.responses.add(id=answer_id), kind).CopyFrom(answer)
    data = frame(items)
    assert pb.LinkResponses.FromString(data) == expected
    assert data == expected.SerializeToString()


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=5000), max_size=30),
       st.integers(min_value=1, max_value=9000))  # fmt: skip
def test_frames_keep_the_order_and_the_bound(sizes: list[int], bound: int) -> None:
    async def run() -> list[list[Encoded]]:
        queue: asyncio.Queue[Encoded | None] = asyncio.Queue()
        for size in sizes:
            queue.put_nowait(Encoded([b"x" * size]))
        queue.put_nowait(None)
        return [batch async for batch in frames(queue)]

    old = request_link.FRAME_BYTES
    request_link.FRAME_BYTES = bound
    try:
        batches = asyncio.run(run())
    finally:
        request_link.FRAME_BYTES = old
    assert [item.size for batch in batches for item in batch] == sizes
    for batch in batches:
        assert batch and (len(batch) == 1 or sum(item.size for item in batch) <= bound)
