"""The request link's writes stay under the transport's message limit.

Regression: each end of a Call stream wrote everything queued as one message, so requests (or
answers) that were each fine added up past gRPC's message limit; the transport then ended the
stream and every request on it failed as "broker unavailable". A single request past the
limit did the same to its siblings. The limits are shrunk here so that a few small messages
reach them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.types import Message, PopRequest
from popmq.broker.local import LocalBrokerPort
from popmq.broker.testing import fast_broker_config, running_broker
from popmq.broker.wire import remote as remote_module
from popmq.broker.wire import request_link
from popmq.broker.wire import server as broker_server
from popmq.broker.wire.remote import RemoteBrokerPort
from popmq.broker.wire.server import BrokerGrpcServer

from popmq.config import BrokerLinkConfig
from popmq.pb.broker.v1 import broker_pb2 as pb

TOPIC = "t"
LIMIT = 2 * 1024 * 1024  # the transport's message limit in these tests
BODY = 700 * 1024  # four of these in one write pass the limit


@pytest.fixture
def small_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(broker_server, "MAX_MESSAGE_BYTES", LIMIT)  # both ways
    monkeypatch.setattr(remote_module, "MAX_MESSAGE_BYTES", LIMIT)
    monkeypatch.setattr(request_link, "FRAME_BYTES", LIMIT // 2, raising=False)


@contextlib.asynccontextmanager
async def _remote(tmp_path: Path, coalesce_ms: float = 0) -> AsyncIterator[RemoteBrokerPort]:
    async with running_broker(fast_broker_config(tmp_path / "b0", name="b0")) as broker:
        local = LocalBrokerPort(broker)
        await local.create_topic(TOPIC, 2)
        server = BrokerGrpcServer(local)
        await server.start()
        link = BrokerLinkConfig(streams=1, coalesce_ms=coalesce_ms)
        remote = RemoteBrokerPort("b0", server.address, link=link)
        try:
            yield remote
        finally:
            await remote.aclose()
            await server.aclose(0)


def _send(remote: RemoteBrokerPort, size: int) -> asyncio.Task[object]:
    return asyncio.create_task(remote.send([Message(topic=TOPIC, body=b"x" * size)]))


@pytest.mark.usefixtures("small_limits")
async def test_requests_that_add_up_past_the_limit_do_not_end_the_stream(
    tmp_path: Path,
) -> None:
    async with _remote(tmp_path) as remote:
        # Queued together before the stream opens: without frames they went as one write.
        sends = [_send(remote, BODY) for _ in range(4)]
        async with asyncio.timeout(30):
            results = await asyncio.gather(*sends, return_exceptions=True)
        assert all(isinstance(r, list) and r[0].message_id for r in results), results
        link = remote.request_link
        assert link is not None and link.streams[0].losses == 0


@pytest.mark.usefixtures("small_limits")
async def test_a_request_past_the_limit_is_refused_alone(tmp_path: Path) -> None:
    async with _remote(tmp_path) as remote:
        big, small = _send(remote, LIMIT + 1024), _send(remote, 10)
        async with asyncio.timeout(30):
            refused, sent = await asyncio.gather(big, small, return_exceptions=True)
        assert isinstance(refused, RefusedError) and refused.code == Code.PAYLOAD_TOO_LARGE
        assert isinstance(sent, list) and sent[0].message_id  # its sibling went through
        link = remote.request_link
        assert link is not None and link.streams[0].losses == 0


async def test_frames_split_at_the_byte_bound_and_end_at_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(request_link, "FRAME_BYTES", 1000)
    queue: asyncio.Queue[request_link.Encoded | None] = asyncio.Queue()
    sizes = [400, 400, 400, 3000, 10, 10]  # the 3000-byte one is larger than a frame
    for i, size in enumerate(sizes):
        answer = pb.SendResponse(status=pb.Status(message="x" * size)).SerializeToString()
        queue.put_nowait(request_link.encode(pb.LinkResponse(id=i + 1), "send", answer))
    queue.put_nowait(None)
    got = [batch async for batch in request_link.frames(queue)]
    decoded = [pb.LinkResponses.FromString(request_link.frame(batch)) for batch in got]
    assert [[r.id for r in frame.responses] for frame in decoded] == [[1, 2], [3], [4], [5, 6]]
    assert all(frame.ByteSize() <= 1000 for frame in decoded if len(frame.responses) > 1)
    assert decoded[2].responses[0].send.status.message == "x" * 3000


def test_an_encoded_request_reads_as_the_message_it_stands_for() -> None:
    """The link encodes each request once and joins the pieces into its frame (no message is
    built around a body to be copied again): what the broker decodes is what was meant."""
    send = pb.SendRequest(messages=[pb.Message(topic="t", body=b"\x00" * 300, keys=["k"])],
                          queue_id=3)  # fmt: skip
    envelope = pb.LinkRequest(id=2**40 + 7)
    envelope.trace_context["traceparent"] = "00-abc-def-01"
    items = [
        request_link.encode(envelope, "send", send.SerializeToString()),
        request_link.encoded(pb.LinkRequest(id=9, cancel=pb.LinkCancel())),
    ]
    frame = pb.LinkRequests.FromString(request_link.frame(items))
    expected = pb.LinkRequest(id=2**40 + 7, send=send)
    expected.trace_context["traceparent"] = "00-abc-def-01"
    assert list(frame.requests) == [expected, pb.LinkRequest(id=9, cancel=pb.LinkCancel())]
    assert items[0].size == expected.ByteSize()


@pytest.mark.usefixtures("small_limits")
async def test_an_answer_past_the_limit_fails_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pop whose answer is past the transport limit (bodies and batch raised by the
    operator) is refused on its own; a long poll waiting beside it on the stream lives on."""
    async with _remote(tmp_path) as remote:
        for _ in range(4):
            await remote.send([Message(topic=TOPIC, body=b"x" * BODY)], 0)
        # Waits on the empty queue 1 beside the big answer.
        beside = asyncio.create_task(remote.pop(_pop("other", queue_id=1, poll_ms=60_000)))
        for _ in range(500):
            if remote.request_link and remote.request_link.in_flight:
                break
            await asyncio.sleep(0.01)
        with pytest.raises(RefusedError) as refused:
            await remote.pop(_pop("g"))
        assert refused.value.code == Code.PAYLOAD_TOO_LARGE
        assert "max_batch" in refused.value.message
        assert not beside.done()  # the stream did not end under it
        link = remote.request_link
        assert link is not None and link.streams[0].losses == 0
        beside.cancel()
        await asyncio.wait([beside])


def _pop(group: str, queue_id: int = 0, poll_ms: int = 0) -> PopRequest:
    return PopRequest(
        group=group, topic=TOPIC, max_messages=32, invisible_time_ms=60_000, poll_time_ms=poll_ms,
        queue_id=queue_id,
    )  # fmt: skip


@pytest.mark.usefixtures("small_limits")
async def test_a_coalesced_send_past_the_limit_goes_per_caller(tmp_path: Path) -> None:
    """Two sends that fit alone but not together, coalesced into one request: refused before
    it is sent, then each caller's messages go on their own and are stored once."""
    async with _remote(tmp_path, coalesce_ms=50) as remote:
        sends = [_send(remote, LIMIT // 2 + 1024) for _ in range(2)]
        results = await asyncio.gather(*sends)
        assert all(isinstance(r, list) and r[0].message_id for r in results), results
        coalescer = remote.coalescers[1]
        assert coalescer is not None and coalescer.batches == 1  # they were one batch
        topic = await remote.get_topic(TOPIC)
        assert sum(q.max_offset for q in topic.queues) == 2  # each stored once
        link = remote.request_link
        assert link is not None and link.streams[0].losses == 0
