"""forward_to_dlq's claim at its edges: a cancelled forward, a FIFO queue, a gone message.

The claim (CheckpointLedger.forwarding) makes every other settlement of the entry wait for
the forward. A claim left behind would keep the message invisible for good (the revive loop
leaves a claimed entry, an ack is refused); a FIFO queue must move on as soon as its
in-flight message is settled, whichever way. Virtual time (looptime).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.types import AckEntry, Message, PoppedMessage, PopRequest
from popmq.broker.core import Broker
from popmq.broker.testing import fast_broker_config, running_broker

from popmq.clock import LoopClock

pytestmark = pytest.mark.looptime

GROUP, TOPIC = "g", "t"


def _hold_dlq_writes(broker: Broker) -> asyncio.Event:
    """The revive service's system appends wait forever; the event says one began."""
    entered = asyncio.Event()
    service = broker.revive_service

    async def held(topic: str, queue_id: int, messages: list[Message]) -> Any:
        entered.set()
        await asyncio.Event().wait()

    service._append_system = held  # type: ignore[method-assign]
    return entered


async def _forward_held_mid_write(
    broker: Broker, invisible_ms: int
) -> tuple[PoppedMessage, asyncio.Task[None]]:
    """One message sent and popped, its forward to the DLQ started and held in its DLQ write."""
    await broker.send([Message(TOPIC, b"m")], 0)
    pop = PopRequest(GROUP, TOPIC, max_messages=1, invisible_time_ms=invisible_ms)
    (popped,) = (await broker.pop(pop)).messages
    entered = _hold_dlq_writes(broker)
    forward = asyncio.create_task(broker.forward_to_dlq(GROUP, TOPIC, popped.receipt_handle))
    await entered.wait()
    return popped, forward


async def test_a_cancelled_forward_leaves_no_claim(tmp_path: Path) -> None:
    """The client gives up on its forward mid-write (its deadline, a proxy's cancel): the
    entry is an ordinary in-flight message again, not one claimed for good."""
    async with running_broker(fast_broker_config(tmp_path), LoopClock()) as broker:
        popped, forward = await _forward_held_mid_write(broker, invisible_ms=2_000)
        forward.cancel()
        with pytest.raises(asyncio.CancelledError):
            await forward
        assert not broker.engine._ledger.forwarding
        (acked,) = await broker.ack(GROUP, TOPIC, [AckEntry(popped.receipt_handle)])
        assert acked.code == Code.OK


async def test_a_cancelled_forward_past_the_deadline_redelivers(tmp_path: Path) -> None:
    """The revive loop passed the claimed entry over while the forward ran; the forward is
    then cancelled: the message still comes back (retry topic), it is not stuck."""
    async with running_broker(fast_broker_config(tmp_path), LoopClock()) as broker:
        _, forward = await _forward_held_mid_write(broker, invisible_ms=500)
        await asyncio.sleep(2)  # the lease ended; the revive loop left the entry to the forward
        forward.cancel()
        with pytest.raises(asyncio.CancelledError):
            await forward
        # Revives write the retry copy through the same (held) append: let them through.
        del broker.revive_service._append_system
        again = PopRequest(GROUP, TOPIC, max_messages=1, invisible_time_ms=1_000,
                           poll_time_ms=30_000)  # fmt: skip
        (back,) = (await broker.pop(again)).messages
        assert back.message.body == b"m"


def _small_segments(tmp_path: Path):  # type: ignore[no-untyped-def]
    config = fast_broker_config(tmp_path)
    config.store.segment_bytes = 4096
    config.store.retention_bytes = 3 * 4096
    return config


def _fifo(poll_ms: int = 0) -> PopRequest:
    return PopRequest(GROUP, TOPIC, queue_id=0, max_messages=1, invisible_time_ms=60_000,
                      poll_time_ms=poll_ms, fifo=True)  # fmt: skip


async def test_a_fifo_forward_of_a_gone_message_frees_the_queue_at_once(tmp_path: Path) -> None:
    """FIFO: the in-flight message blocks its queue; a waiting pop is woken when it is
    settled. A forward that finds the message gone (MESSAGE_NOT_FOUND) settles it too, so
    the waiting pop must get the next message then, not at the end of its poll time."""
    async with running_broker(_small_segments(tmp_path), LoopClock()) as broker:
        fifo = [Message(TOPIC, b"x" * 500, message_group="o") for _ in range(3)]
        await broker.send(fifo, 0)
        (first,) = (await broker.pop(_fifo())).messages
        await broker.send([Message(TOPIC, b"y" * 500, message_group="o") for _ in range(60)], 0)
        await broker.store.flush()
        broker.store.apply_retention()
        assert broker.store.min_offset(TOPIC, 0) > 2
        loop = asyncio.get_running_loop()
        waiting = asyncio.create_task(broker.pop(_fifo(poll_ms=20_000)))
        await asyncio.sleep(0.1)
        assert not waiting.done()  # blocked behind the in-flight message
        with pytest.raises(RefusedError) as refused:
            await broker.forward_to_dlq(GROUP, TOPIC, first.receipt_handle)
        assert refused.value.code == Code.MESSAGE_NOT_FOUND
        settled = loop.time()
        (after,) = (await waiting).messages
        assert after.message.queue_offset == broker.store.min_offset(TOPIC, 0)
        assert loop.time() - settled < 1.0, "the waiting pop slept through its poll time"


async def test_fifo_order_holds_around_an_in_doubt_message(tmp_path: Path) -> None:
    """The proxy's failed stream: m0's write began (in doubt: it keeps its lease), m1 and m2
    were never written (handed back). The queue stays blocked behind m0; when m0's lease
    ends the three come back in order, m0 with one more attempt counted."""
    async with running_broker(fast_broker_config(tmp_path), LoopClock()) as broker:
        await broker.send([Message(TOPIC, f"m{i}".encode(), message_group="o")
                           for i in range(3)], 0)  # fmt: skip
        pop = PopRequest(GROUP, TOPIC, queue_id=0, max_messages=3, invisible_time_ms=1_000,
                         fifo=True)  # fmt: skip
        _in_doubt, m1, m2 = (await broker.pop(pop)).messages
        assert await broker.hand_back(GROUP, TOPIC, [m1.receipt_handle, m2.receipt_handle]) == 2
        assert (await broker.pop(pop)).messages == []  # blocked behind m0, in doubt
        waiting = PopRequest(GROUP, TOPIC, queue_id=0, max_messages=3, invisible_time_ms=1_000,
                             poll_time_ms=10_000, fifo=True)  # fmt: skip
        again = (await broker.pop(waiting)).messages
        assert [(m.message.body, m.delivery_attempt) for m in again] == [
            (b"m0", 2), (b"m1", 1), (b"m2", 1)
        ]  # fmt: skip
