"""ReceiveMessage: the message whose write was in progress when the stream failed.

Its frame may have reached the client: grpc.aio queues a write in grpc-core before it
completes, and a stalled write stays queued (popmq.proxy.grpc.stall) and is still read if the
client resumes before the stream ends. Handing that message back (visible at once, no delivery
attempt counted) delivered it twice when the frame got through, and a message that breaks its
client mid-write (too large for it, a crash on decode) looped forever with attempt 1, never
reaching the DLQ. Rule: a message whose write began counts as delivered; it stays invisible
and its lease decides (an ack with the handle the client got works; otherwise it comes back
with an attempt counted). Messages never written are handed back as before. Virtual time.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from popmq.broker.contract.types import AckEntry, Message, PopRequest
from popmq.broker.local import LocalBrokerPort
from popmq.broker.testing import fast_broker_config, running_broker
from popmq.proxy.grpc.servicer import MessagingServicer
from popmq.proxy.metrics import RELEASED_MESSAGES
from popmq.proxy.server import ProxyServer
from proxy_support import StubContext, make_config

from popmq.clock import LoopClock
from popmq.pb.rocketmq.v2 import definition_pb2 as pb
from popmq.pb.rocketmq.v2 import service_pb2 as s

pytestmark = pytest.mark.looptime

GROUP, TOPIC = "g", "t"
STALL_MS = 1_000
INVISIBLE_MS = 4_000


class _StalledClient(StubContext):
    """A ServicerContext whose client takes the status and ``take`` message frames, then
    stops reading: the next frame is queued (it may still reach the client) and never done."""

    def __init__(self, take: int) -> None:
        self._take = take
        self.messages: list[pb.Message] = []  # what reached the client (queued included)

    async def write(self, frame: s.ReceiveMessageResponse) -> None:
        if frame.WhichOneof("content") != "message":
            return
        self.messages.append(frame.message)
        if len(self.messages) > self._take:
            await asyncio.Event().wait()  # queued in the transport, the client reads no more


def _receive_request() -> s.ReceiveMessageRequest:
    request = s.ReceiveMessageRequest(
        group=pb.Resource(name=GROUP),
        message_queue=pb.MessageQueue(topic=pb.Resource(name=TOPIC)),
        filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"),
        batch_size=8,
    )
    request.invisible_duration.FromMilliseconds(INVISIBLE_MS)
    request.long_polling_timeout.FromMilliseconds(1_000)
    return request


def _pop(poll_ms: int = 0) -> PopRequest:
    return PopRequest(GROUP, TOPIC, max_messages=8, invisible_time_ms=60_000,
                      poll_time_ms=poll_ms)  # fmt: skip


async def test_the_message_being_written_when_the_stream_failed_counts_as_delivered(
    tmp_path: Path,
) -> None:
    config = make_config(
        tmp_path, **{"proxy.write_stall_timeout_ms": STALL_MS, "proxy.strategy": "pop"}
    )
    async with running_broker(
        fast_broker_config(tmp_path / "b", revive_scan_interval_ms=200), LoopClock()
    ) as broker:
        port = LocalBrokerPort(broker)
        await port.send([Message(TOPIC, body) for body in (b"m0", b"m1", b"m2")], 0)
        server = ProxyServer(config, [port])
        servicer = MessagingServicer(server.core, server.metrics, config.proxy)
        client = _StalledClient(take=1)
        try:
            with pytest.raises(asyncio.CancelledError):  # how a stalled stream ends
                await servicer.ReceiveMessage(_receive_request(), client)
            await server.tasks.aclose()
            await server.strategy.aclose()  # lets the background release finish
        finally:
            await server.cluster.aclose()
        written, in_doubt = client.messages  # m0 was taken; m1's frame is queued
        assert [written.body, in_doubt.body] == [b"m0", b"m1"]
        # m2 was never written: handed back, visible at once, no attempt counted.
        again = (await port.pop(_pop())).messages
        assert [(m.message.body, m.delivery_attempt) for m in again] == [(b"m2", 1)]
        await port.ack(GROUP, TOPIC, [AckEntry(m.receipt_handle) for m in again])
        # m1 is not delivered a second time while the client may hold it ...
        assert (await port.pop(_pop())).messages == []
        # ... and its lease ends as m0's does (taken, never acked): one attempt counted, so
        # a message that breaks its client mid-write still reaches the DLQ.
        later = (await port.pop(_pop(poll_ms=INVISIBLE_MS + 5_000))).messages
        got = sorted((m.message.body, m.delivery_attempt) for m in later)
        assert got == [(b"m0", 2), (b"m1", 2)]
        assert server.metrics[RELEASED_MESSAGES].labels("in_doubt")._value.get() == 1
        assert server.metrics[RELEASED_MESSAGES].labels("handed_back")._value.get() == 1


async def test_the_client_can_ack_the_message_whose_write_was_in_doubt(tmp_path: Path) -> None:
    config = make_config(
        tmp_path, **{"proxy.write_stall_timeout_ms": STALL_MS, "proxy.strategy": "pop"}
    )
    async with running_broker(
        fast_broker_config(tmp_path / "b", revive_scan_interval_ms=200), LoopClock()
    ) as broker:
        port = LocalBrokerPort(broker)
        await port.send([Message(TOPIC, b"only")], 0)
        server = ProxyServer(config, [port])
        servicer = MessagingServicer(server.core, server.metrics, config.proxy)
        client = _StalledClient(take=0)
        try:
            with pytest.raises(asyncio.CancelledError):
                await servicer.ReceiveMessage(_receive_request(), client)
            await server.tasks.aclose()
            await server.strategy.aclose()
        finally:
            await server.cluster.aclose()
        (got,) = client.messages  # the frame got through after all; the client acks it
        (result,) = await port.ack(GROUP, TOPIC, [AckEntry(got.system_properties.receipt_handle)])
        assert result.code == 20000, result.message
        await asyncio.sleep(INVISIBLE_MS / 1000 + 5)
        assert (await port.pop(_pop())).messages == []  # never delivered twice
        in_doubt = server.metrics[RELEASED_MESSAGES].labels("in_doubt")._value.get()
        assert in_doubt == 1


async def test_an_in_doubt_message_is_no_longer_renewed(tmp_path: Path) -> None:
    """A push consumer that never saw the frame would never nack it: renewed, the message
    could stay invisible for renew_max_ms. Its lease is its current slice."""
    config = make_config(tmp_path)
    async with running_broker(fast_broker_config(tmp_path / "b"), LoopClock()) as broker:
        port = LocalBrokerPort(broker)
        await port.send([Message(TOPIC, b"m")], 0)
        server = ProxyServer(config, [port])
        try:
            popped = (await port.pop(_pop())).messages
            server.renewer.track("c@1", GROUP, TOPIC, popped)
            assert len(server.renewer) == 1
            server.core.receiver.keep_in_doubt(popped[0])
            assert len(server.renewer) == 0
        finally:
            await server.tasks.aclose()
            await server.cluster.aclose()


async def test_a_client_gone_while_its_answer_waits_for_the_memory_budget_loses_nothing(
    tmp_path: Path,
) -> None:
    """Regression: a receive whose messages were popped waits for room in the proxy's memory
    budget before it writes them; a client that went away during that wait left them invisible
    for their whole invisible time (only a refusal by the budget released them). They are
    handed back at once now."""
    config = make_config(tmp_path, **{"proxy.strategy": "pop", "proxy.inflight_wait_ms": 10_000})
    async with running_broker(fast_broker_config(tmp_path / "b"), LoopClock()) as broker:
        port = LocalBrokerPort(broker)
        await port.send([Message(TOPIC, b"m")], 0)
        server = ProxyServer(config, [port])
        servicer = MessagingServicer(server.core, server.metrics, config.proxy)
        servicer._budget.take(servicer._budget.limit)  # full: other answers in flight
        try:
            receive = asyncio.ensure_future(
                servicer.ReceiveMessage(_receive_request(), _StalledClient(take=1))
            )
            await asyncio.sleep(1)  # popped; waits for the budget
            assert not receive.done()
            receive.cancel()  # the client goes away
            with pytest.raises(asyncio.CancelledError):
                await receive
            await server.tasks.aclose()
            await server.strategy.aclose()  # lets the background release finish
        finally:
            await server.cluster.aclose()
        again = (await port.pop(_pop())).messages
        assert [(m.message.body, m.delivery_attempt) for m in again] == [(b"m", 1)]
