"""Releasing popped messages no consumer received: the proxy hands them back to the broker.

A hand-back is not a failed delivery. The message is visible again at once, in its own queue,
with the delivery attempt it had: before the hand-back existed the proxy changed the invisible
time to 0, the broker counted an attempt and revived the message through the retry topic after
the retry back-off (1 s, 5 s...), so releases alone could send a message nobody ever received
to the DLQ. Virtual time (looptime): the back-off would show as virtual seconds.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.types import (
    AckEntry,
    GroupConfig,
    Message,
    PoppedMessage,
    PopRequest,
    PullRequest,
    PullStatus,
    dlq_topic,
)
from popmq.broker.core import Broker
from popmq.broker.local import LocalBrokerPort
from popmq.broker.testing import fast_broker_config, running_broker
from popmq.proxy.longpoll.calls import BrokerCalls
from popmq.proxy.metrics import RELEASED_MESSAGES, ProxyMetrics

from popmq.clock import LoopClock

pytestmark = pytest.mark.looptime

GROUP, TOPIC = "g", "t"


def _pop(invisible_ms: int = 60_000, max_messages: int = 8) -> PopRequest:
    return PopRequest(GROUP, TOPIC, max_messages=max_messages, invisible_time_ms=invisible_ms)


async def _release(port: LocalBrokerPort, popped: list[PoppedMessage]) -> ProxyMetrics:
    """The proxy's release path (a long poll that could not deliver ``popped``)."""
    metrics = ProxyMetrics()
    calls = BrokerCalls(metrics, clock=LoopClock())
    calls.release(port, _pop(), popped)
    await calls.aclose()  # waits for the release
    return metrics


def _released(metrics: ProxyMetrics, outcome: str) -> float:
    return metrics[RELEASED_MESSAGES].labels(outcome)._value.get()


async def _dlq(broker: Broker) -> list[object]:
    try:
        result = await broker.pull(PullRequest(dlq_topic(GROUP), 0, 0))
    except RefusedError:
        return []
    return list(result.messages) if result.status == PullStatus.FOUND else []


async def test_a_released_message_comes_back_at_once_as_a_first_delivery(
    tmp_path: Path,
) -> None:
    # Real retry levels (time_scale 1): a revive through the retry topic would take 1 s.
    config = fast_broker_config(tmp_path, time_scale=1.0)
    loop = asyncio.get_running_loop()
    async with running_broker(config, LoopClock()) as broker:
        port = LocalBrokerPort(broker)
        await port.send([Message(TOPIC, b"sparse")], 0)
        first = (await port.pop(_pop())).messages
        assert [m.delivery_attempt for m in first] == [1]
        released_at = loop.time()
        metrics = await _release(port, first)
        again = (await port.pop(_pop())).messages  # no wait: visible at once
        assert loop.time() - released_at < 0.1
        assert [m.message.body for m in again] == [b"sparse"]
        assert [m.delivery_attempt for m in again] == [1]  # nobody received it before
        assert again[0].message.topic == TOPIC  # its own queue, not the retry topic
        assert _released(metrics, "handed_back") == 1


async def test_releases_alone_never_send_a_message_to_the_dlq(tmp_path: Path) -> None:
    async with running_broker(fast_broker_config(tmp_path), LoopClock()) as broker:
        port = LocalBrokerPort(broker)
        await port.update_group(GroupConfig(GROUP, max_attempts=2))
        await port.send([Message(TOPIC, b"unlucky")], 0)
        for _ in range(3):  # three long polls ended just as they popped it
            popped = (await port.pop(_pop())).messages
            assert [m.delivery_attempt for m in popped] == [1]
            await _release(port, popped)
        await asyncio.sleep(1)  # the revive loop has had every chance
        got = (await port.pop(_pop())).messages
        assert [(m.message.body, m.delivery_attempt) for m in got] == [(b"unlucky", 1)]
        assert await _dlq(broker) == []


async def test_handles_no_longer_pending_are_skipped(tmp_path: Path) -> None:
    async with running_broker(fast_broker_config(tmp_path), LoopClock()) as broker:
        port = LocalBrokerPort(broker)
        await port.send([Message(TOPIC, b"a"), Message(TOPIC, b"b"), Message(TOPIC, b"c")], 0)
        acked, changed, kept = (await port.pop(_pop())).messages
        await port.ack(GROUP, TOPIC, [AckEntry(acked.receipt_handle)])
        await port.change_invisible_time(GROUP, TOPIC, changed.receipt_handle, 60_000)
        handles = [acked.receipt_handle, changed.receipt_handle, kept.receipt_handle]
        handles.append("not-a-handle")
        assert await port.hand_back(GROUP, TOPIC, handles) == 1  # only the pending one
        assert await port.hand_back(GROUP, TOPIC, handles) == 0  # a repeat is a no-op
        got = (await port.pop(_pop())).messages
        assert [m.message.body for m in got] == [b"c"]  # not the acked one, nor the changed
        # Expired: past its invisible time the message is being revived; nothing to hand back.
        await port.send([Message(TOPIC, b"d")], 0)
        (late,) = (await port.pop(_pop(invisible_ms=100))).messages
        await asyncio.sleep(0.2)
        assert await port.hand_back(GROUP, TOPIC, [late.receipt_handle]) == 0


async def test_hand_back_checks_the_group_as_an_ack_does(tmp_path: Path) -> None:
    async with running_broker(fast_broker_config(tmp_path), LoopClock()) as broker:
        port = LocalBrokerPort(broker)
        await port.send([Message(TOPIC, b"mine")], 0)
        popped = (await port.pop(_pop())).messages
        # Another group cannot hand back this group's message.
        assert await port.hand_back("other", TOPIC, [popped[0].receipt_handle]) == 0
        assert (await port.pop(_pop())).messages == []  # still invisible
        with pytest.raises(RefusedError) as bad:
            await port.hand_back("bad group!", TOPIC, [popped[0].receipt_handle])
        assert bad.value.code != Code.INTERNAL_ERROR


async def test_fifo_hand_back_keeps_the_order_and_frees_the_queue(tmp_path: Path) -> None:
    async with running_broker(fast_broker_config(tmp_path), LoopClock()) as broker:
        port = LocalBrokerPort(broker)
        await port.update_group(GroupConfig(GROUP, fifo=True))
        bodies = [b"1", b"2", b"3", b"4"]
        await port.send([Message(TOPIC, b, message_group="order-7") for b in bodies], 0)
        batch = (await port.pop(_pop(max_messages=4))).messages
        assert [m.message.body for m in batch] == bodies
        assert (await port.pop(_pop())).messages == []  # FIFO: blocked while in flight
        # The client got the first two; the rest were popped for a poll that ended.
        await port.ack(GROUP, TOPIC, [AckEntry(m.receipt_handle) for m in batch[:2]])
        assert await port.hand_back(GROUP, TOPIC, [m.receipt_handle for m in batch[2:]]) == 2
        again = (await port.pop(_pop(max_messages=4))).messages  # the queue is free at once
        assert [(m.message.body, m.delivery_attempt) for m in again] == [(b"3", 1), (b"4", 1)]


async def test_a_replayed_journal_counts_no_attempt_for_a_hand_back(tmp_path: Path) -> None:
    """The entry's state travels in the pop journal (what followers copy and a promoted node
    or a restarted broker replays): replayed, it must not count an attempt either."""
    config = fast_broker_config(tmp_path)
    async with running_broker(config, LoopClock()) as broker:
        port = LocalBrokerPort(broker)
        await port.send([Message(TOPIC, b"journaled")], 0)
        popped = (await port.pop(_pop())).messages
        broker.journal_in_flight()  # as a replicated leader does after every pop
        assert await port.hand_back(GROUP, TOPIC, [popped[0].receipt_handle]) == 1
        journal = (tmp_path / "pop" / "journal.log").read_bytes()
    async with running_broker(config, LoopClock()) as broker:
        got = (await LocalBrokerPort(broker).pop(_pop())).messages
        assert [(m.message.body, m.delivery_attempt) for m in got] == [(b"journaled", 1)]
    assert b'"s":6' in journal  # HANDED_BACK, not RELEASED (4)
