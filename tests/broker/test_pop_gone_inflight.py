"""In-flight POP entries whose message retention removed before their invisible time ended.

A popped, un-acked message is invisible until its lease ends; retention may delete its
segment meanwhile. When the lease ends there is nothing to redeliver. The broker must not
crash or loop, and must not drop the entry silently: it logs it and counts it
(``popmq_broker_inflight_gone_messages_total``), and a handle of such an entry answers
INVALID_RECEIPT_HANDLE saying why. Virtual time (looptime).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.types import AckEntry, Message, PopRequest
from popmq.broker.core import Broker
from popmq.broker.testing import fast_broker_config, running_broker

from popmq.clock import LoopClock

pytestmark = pytest.mark.looptime

GROUP, TOPIC = "g", "t"


def _config(tmp_path: Path):  # type: ignore[no-untyped-def]
    config = fast_broker_config(tmp_path)
    config.store.segment_bytes = 4096
    config.store.retention_bytes = 3 * 4096
    return config


async def _purge_first(broker: Broker, offsets: list[int]) -> None:
    """Write enough after ``offsets`` that retention removes their segment."""
    await broker.send([Message(TOPIC, b"y" * 500) for _ in range(60)], 0)
    await broker.store.flush()
    broker.store.apply_retention()
    assert broker.store.min_offset(TOPIC, 0) > max(offsets)


def _gone_total(broker: Broker) -> int:
    """The exported counter (scraped as operators see it), and the engine's own count."""
    scraped = broker.metrics.registry.get_sample_value(
        "popmq_broker_inflight_gone_messages_total", {"broker": broker.name}
    )
    assert scraped == broker.engine.gone_inflight
    return broker.engine.gone_inflight


async def test_an_expired_entry_whose_message_is_gone_is_logged_and_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with running_broker(_config(tmp_path), LoopClock()) as broker:
        await broker.send([Message(TOPIC, b"x" * 500) for _ in range(3)], 0)
        pop = PopRequest(GROUP, TOPIC, queue_id=0, max_messages=3, invisible_time_ms=1_000)
        popped = (await broker.pop(pop)).messages
        assert [m.message.queue_offset for m in popped] == [0, 1, 2]
        # One is acked and one gets a new lease before retention: both answer OK.
        acked, changed, kept = popped
        (ok,) = await broker.ack(GROUP, TOPIC, [AckEntry(acked.receipt_handle)])
        assert ok.code == Code.OK
        await _purge_first(broker, [0, 1, 2])
        # Still in its lease: the body is gone but the entry is live, so a change answers OK.
        renewed = await broker.change_invisible_time(GROUP, TOPIC, changed.receipt_handle, 2_000)
        with caplog.at_level(logging.WARNING, logger="popmq.broker"):
            await asyncio.sleep(3)  # both leases end; the revive loop ran many times
        assert broker.started
        assert _gone_total(broker) == 2
        logged = [r.getMessage() for r in caplog.records]
        assert any("no longer in the store" in line for line in logged), logged
        # Nothing comes back (there is nothing to deliver) and the queue moves on.
        pop_all = PopRequest(GROUP, TOPIC, queue_id=0, max_messages=32, invisible_time_ms=1_000)
        again = (await broker.pop(pop_all)).messages
        low = broker.store.min_offset(TOPIC, 0)
        assert again and min(m.message.queue_offset for m in again) == low
        assert all(m.delivery_attempt == 1 for m in again)
        # The old handles: a clear refusal that says the message is gone, not "redelivered".
        for handle in (kept.receipt_handle, renewed.receipt_handle):
            (late,) = await broker.ack(GROUP, TOPIC, [AckEntry(handle)])
            assert late.code == Code.INVALID_RECEIPT_HANDLE
            assert "no longer in the store" in late.message, late.message
            with pytest.raises(RefusedError) as refused:
                await broker.change_invisible_time(GROUP, TOPIC, handle, 1_000)
            assert refused.value.code == Code.INVALID_RECEIPT_HANDLE


async def test_a_handed_back_message_that_is_gone_is_logged_and_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A released entry (hand-back; FIFO revives release in place too) whose body went:
    the next pop passes over it, visibly."""
    async with running_broker(_config(tmp_path), LoopClock()) as broker:
        await broker.send([Message(TOPIC, b"x" * 500) for _ in range(2)], 0)
        pop = PopRequest(GROUP, TOPIC, queue_id=0, max_messages=2, invisible_time_ms=60_000)
        popped = (await broker.pop(pop)).messages
        await broker.hand_back(GROUP, TOPIC, [popped[0].receipt_handle])
        await _purge_first(broker, [0, 1])
        with caplog.at_level(logging.WARNING, logger="popmq.broker"):
            again = (await broker.pop(pop)).messages
        assert again and again[0].message.queue_offset == broker.store.min_offset(TOPIC, 0)
        assert _gone_total(broker) == 1
        assert any("no longer in the store" in r.getMessage() for r in caplog.records)


async def test_forwarding_a_message_that_is_gone_answers_message_not_found(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with running_broker(_config(tmp_path), LoopClock()) as broker:
        await broker.send([Message(TOPIC, b"x" * 500)], 0)
        pop = PopRequest(GROUP, TOPIC, queue_id=0, max_messages=1, invisible_time_ms=60_000)
        (popped,) = (await broker.pop(pop)).messages
        await _purge_first(broker, [0])
        with caplog.at_level(logging.WARNING, logger="popmq.broker"):
            with pytest.raises(RefusedError) as refused:
                await broker.forward_to_dlq(GROUP, TOPIC, popped.receipt_handle)
        assert refused.value.code == Code.MESSAGE_NOT_FOUND
        assert "no longer in the store" in refused.value.message
        assert _gone_total(broker) == 1
        assert any("no longer in the store" in r.getMessage() for r in caplog.records)
        with pytest.raises(RefusedError) as again:  # settled: a retry says why
            await broker.forward_to_dlq(GROUP, TOPIC, popped.receipt_handle)
        assert again.value.code == Code.INVALID_RECEIPT_HANDLE
        assert "no longer in the store" in again.value.message
