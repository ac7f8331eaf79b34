"""forward_to_dlq racing other settlements of the same receipt handle.

The forward writes the DLQ copy (an await) before it marks the entry done. Before the claim,
a hand-back arriving in that window put the message back in its queue: it was then both in
the DLQ and delivered again. Now the forward claims the entry before it awaits: the second
operation is a no-op with a clear answer (hand-back skips it, ack/change/forward answer
INVALID_RECEIPT_HANDLE, a revive leaves it to the forward). Virtual time (looptime).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.types import AckEntry, Message, PopRequest, PullRequest, dlq_topic
from popmq.broker.core import Broker
from popmq.broker.testing import fast_broker_config, running_broker

from popmq.clock import LoopClock

pytestmark = pytest.mark.looptime

GROUP, TOPIC = "g", "t"


def _pop(invisible_ms: int = 60_000) -> PopRequest:
    return PopRequest(GROUP, TOPIC, max_messages=8, invisible_time_ms=invisible_ms)


class _HeldDlqWrite:
    """Holds the revive service's system appends until ``go`` is set (the forward's window)."""

    def __init__(self, broker: Broker, fail: bool = False) -> None:
        self.entered = asyncio.Event()
        self.go = asyncio.Event()
        service = broker.revive_service
        real = service._append_system

        async def held(topic: str, queue_id: int, messages: list[Message]) -> Any:
            self.entered.set()
            await self.go.wait()
            if fail:
                raise OSError("disk full")
            return await real(topic, queue_id, messages)

        service._append_system = held  # type: ignore[method-assign]


async def _dlq_bodies(broker: Broker) -> list[bytes]:
    if broker.store.get_topic(dlq_topic(GROUP)) is None:
        return []
    result = await broker.pull(PullRequest(dlq_topic(GROUP), 0, 0))
    return [m.body for m in result.messages]


async def _start_forward(broker: Broker, handle: str) -> tuple[asyncio.Task[None], _HeldDlqWrite]:
    held = _HeldDlqWrite(broker)
    task = asyncio.create_task(broker.forward_to_dlq(GROUP, TOPIC, handle))
    await held.entered.wait()
    return task, held


async def test_a_hand_back_during_a_forward_does_not_redeliver(tmp_path: Path) -> None:
    async with running_broker(fast_broker_config(tmp_path), LoopClock()) as broker:
        await broker.send([Message(TOPIC, b"poison")], 0)
        (popped,) = (await broker.pop(_pop())).messages
        task, held = await _start_forward(broker, popped.receipt_handle)
        # The proxy's release of the same handle (e.g. its stream failed) in the window.
        assert await broker.hand_back(GROUP, TOPIC, [popped.receipt_handle]) == 0
        held.go.set()
        await task
        assert await _dlq_bodies(broker) == [b"poison"]
        await asyncio.sleep(1)  # any redelivery would have come
        assert (await broker.pop(_pop())).messages == []


async def test_other_settlements_during_a_forward_answer_clearly(tmp_path: Path) -> None:
    async with running_broker(fast_broker_config(tmp_path), LoopClock()) as broker:
        await broker.send([Message(TOPIC, b"poison")], 0)
        (popped,) = (await broker.pop(_pop(invisible_ms=500))).messages
        handle = popped.receipt_handle
        task, held = await _start_forward(broker, handle)
        (acked,) = await broker.ack(GROUP, TOPIC, [AckEntry(handle)])
        assert acked.code == Code.INVALID_RECEIPT_HANDLE
        assert "being forwarded to the dead-letter queue" in acked.message
        for attempt in (
            broker.change_invisible_time(GROUP, TOPIC, handle, 10_000),
            broker.forward_to_dlq(GROUP, TOPIC, handle),  # a client's retry: no second copy
        ):
            with pytest.raises(RefusedError) as refused:
                await attempt
            assert refused.value.code == Code.INVALID_RECEIPT_HANDLE
            assert "being forwarded" in refused.value.message
        await asyncio.sleep(1)  # the invisible time ends: the revive loop must leave it be
        held.go.set()
        await task
        await asyncio.sleep(1)
        assert await _dlq_bodies(broker) == [b"poison"]
        assert (await broker.pop(_pop())).messages == []
        assert broker.revive_service.revived == 0
        # Settled: a later forward or ack of the handle says so.
        with pytest.raises(RefusedError) as late:
            await broker.forward_to_dlq(GROUP, TOPIC, handle)
        assert late.value.code == Code.INVALID_RECEIPT_HANDLE


async def test_a_forward_that_fails_leaves_the_message_to_revive(tmp_path: Path) -> None:
    async with running_broker(fast_broker_config(tmp_path), LoopClock()) as broker:
        await broker.send([Message(TOPIC, b"m")], 0)
        (popped,) = (await broker.pop(_pop(invisible_ms=200))).messages
        held = _HeldDlqWrite(broker, fail=True)
        held.go.set()
        with pytest.raises(OSError):
            await broker.forward_to_dlq(GROUP, TOPIC, popped.receipt_handle)
        again = (await broker.pop(PopRequest(GROUP, TOPIC, invisible_time_ms=1_000,
                                             poll_time_ms=5_000))).messages  # fmt: skip
        assert [(m.message.body, m.delivery_attempt) for m in again] == [(b"m", 2)]
