"""Issue 9, defect 1: one entry that cannot be delivered must not block its neighbours.

The poisoned entry is a timer entry bound for a retry topic whose name is too long to exist
(what a 127-character group on a 127-character topic made before the name rules). The edge now
refuses such names, so it is written straight into the timer, as old data would be.
"""

from __future__ import annotations

import asyncio
import time

from popmq.broker.contract.types import AckEntry, Message, PopRequest, PullRequest, PullStatus
from popmq.broker.core import Broker
from popmq.broker.testing import fast_broker_config, running_broker

POISONED_DESTINATION = "%RETRY%" + "g" * 127 + "_" + "t" * 127  # 262 characters


def _now_ms() -> int:
    return int(time.time() * 1000)


async def _pop_all(broker: Broker, group: str, topic: str, want: int, timeout_s: float) -> list:
    got: list = []
    deadline = time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < deadline:
        request = PopRequest(group, topic, max_messages=32, invisible_time_ms=60_000,
                             poll_time_ms=200)  # fmt: skip
        result = await broker.pop(request)
        got += result.messages
        if result.messages:
            await broker.ack(group, topic, [AckEntry(m.receipt_handle) for m in result.messages])
    return got


async def test_poisoned_timer_entry_does_not_block_others_across_restart(tmp_path) -> None:
    config = fast_broker_config(tmp_path)
    async with running_broker(config) as broker:
        due = _now_ms() + 300
        poison = Message("t", b"poison", delivery_timestamp_ms=due)
        await broker.timer.schedule([(poison, POISONED_DESTINATION, 0)])
        await broker.send(
            [Message("delayed", f"d{i}".encode(), delivery_timestamp_ms=due) for i in range(20)]
        )
        # Another group's message is popped and not acked: its retry goes through the timer.
        await broker.send([Message("t2", b"retry-me")])
        (first,) = (
            await broker.pop(PopRequest("g2", "t2", invisible_time_ms=200, poll_time_ms=0))
        ).messages
        assert first.delivery_attempt == 1
    # Restarted with the poison still in the timer and everything due (as in the issue):
    # the poison and its neighbours come due in one batch.
    await asyncio.sleep(max(due + 50 - _now_ms(), 0) / 1000)
    async with running_broker(config) as broker:
        delayed = await _pop_all(broker, "g", "delayed", 20, timeout_s=20)
        assert sorted(m.message.body for m in delayed) == sorted(
            f"d{i}".encode() for i in range(20)
        )
        (retried,) = await _pop_all(broker, "g2", "t2", 1, timeout_s=20)
        assert retried.message.body == b"retry-me" and retried.delivery_attempt == 2

        from popmq.broker.timer import PARKED_TOPIC, PROP_TIMER_TOPIC

        for _ in range(200):  # parked at once: the name can never be valid
            if broker.timer.failures.parked:
                break
            await asyncio.sleep(0.05)
        assert broker.timer.failures.parked == 1
        parked = await broker.pull(PullRequest(PARKED_TOPIC, 0, 0))
        assert parked.status == PullStatus.FOUND
        (kept,) = parked.messages
        assert kept.body == b"poison"
        assert kept.properties[PROP_TIMER_TOPIC] == POISONED_DESTINATION
        assert broker.timer.pending == 0  # nothing left stuck behind it


async def test_failing_destination_is_retried_with_backoff_then_parked(
    tmp_path, monkeypatch
) -> None:
    """A transient-looking failure (OSError) is retried alone, then parked; the others of its
    batch and of other destinations are delivered on time."""
    async with running_broker(fast_broker_config(tmp_path)) as broker:
        broker.timer.failures.base_backoff_ms = 20
        broker.timer.failures.max_backoff_ms = 40
        real_append = broker.store.append
        attempts: list[int] = []

        async def flaky_append(topic, queue_id, messages):
            if topic == "bad":
                attempts.append(len(messages))
                raise OSError("disk says no")
            return await real_append(topic, queue_id, messages)

        monkeypatch.setattr(broker.store, "append", flaky_append)
        broker.store.create_topic("bad", 1)
        due = _now_ms() + 50
        await broker.timer.schedule(
            [(Message("bad", b"x", delivery_timestamp_ms=due), "bad", 0)]
            + [(Message("good", b"y", delivery_timestamp_ms=due), "good", 0) for _ in range(3)]
        )
        broker.store.create_topic("good", 1)
        good = await _pop_all(broker, "g", "good", 3, timeout_s=20)
        assert len(good) == 3
        for _ in range(200):
            if broker.timer.failures.parked:
                break
            await asyncio.sleep(0.05)
        assert broker.timer.failures.parked == 1
        assert len(attempts) >= broker.timer.failures.max_attempts  # retried, then parked
        assert broker.timer.failures.failed_attempts >= 5


async def test_failing_revive_checkpoint_is_parked_and_others_revive(tmp_path, monkeypatch) -> None:
    """Revive: a checkpoint whose retry cannot be scheduled does not hold up the others due
    in the same batch; it is retried with backoff, then its messages are parked in the group's
    DLQ (counted, with the reason)."""
    from popmq.broker.contract.types import dlq_topic

    async with running_broker(fast_broker_config(tmp_path)) as broker:
        revive = broker.revive_service
        real_schedule = broker.timer.schedule

        async def schedule(entries):
            if any(topic.startswith("%RETRY%bad") for _, topic, _ in entries):
                raise OSError("cannot write this one")
            return await real_schedule(entries)

        monkeypatch.setattr(broker.timer, "schedule", schedule)
        await broker.send([Message("t", b"one"), Message("t", b"two")], 0)
        for group in ("bad", "good"):  # long invisible time: only the calls below revive
            request = PopRequest(group, "t", queue_id=0, max_messages=32, invisible_time_ms=60_000)
            assert len((await broker.pop(request)).messages) == 2
        # One batch, bad's checkpoint first (revive is driven here with a clock moved on).
        later = [_now_ms() + 61_000]
        monkeypatch.setattr(revive, "_clock", lambda: later[0])
        await revive.revive_due()
        assert revive.revived == 2  # good's two messages went on despite bad's failure
        for _ in range(10):  # bad's retries (with backoff), then it is parked
            later[0] += 61_000
            await revive.revive_due()
        assert revive.failures.parked == 1
        assert revive.failures.failed_attempts == revive.failures.max_attempts
        parked = await broker.pull(PullRequest(dlq_topic("bad"), 0, 0))
        assert parked.status == PullStatus.FOUND
        assert sorted(m.body for m in parked.messages) == [b"one", b"two"]
        assert all("__popmq.parked_reason" in m.properties for m in parked.messages)
        assert broker.timer.pending == 2  # good's retries wait for their backoff


async def test_when_every_delivery_fails_nothing_is_parked(tmp_path, monkeypatch) -> None:
    """A store that refuses every write (a full disk) is not the entries' fault: they stay in
    the timer, retried and counted, and are delivered once the store recovers."""
    async with running_broker(fast_broker_config(tmp_path)) as broker:
        broker.timer.failures.base_backoff_ms = 5
        broker.timer.failures.max_backoff_ms = 20
        real_append = broker.store.append
        broker.store.create_topic("d", 1)

        async def full_disk(topic, queue_id, messages):
            if topic.startswith("%SYS%TIMER"):  # scheduling still works; delivery does not
                return await real_append(topic, queue_id, messages)
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(broker.store, "append", full_disk)
        due = _now_ms() + 20
        await broker.timer.schedule(
            [(Message("d", f"x{i}".encode(), delivery_timestamp_ms=due), "d", 0) for i in range(2)]
        )
        for _ in range(400):
            if broker.timer.failures.failed_attempts >= 4 * broker.timer.failures.max_attempts:
                break
            await asyncio.sleep(0.02)
        assert broker.timer.failures.failed_attempts >= 4 * broker.timer.failures.max_attempts
        assert broker.timer.failures.parked == 0 and broker.timer.pending == 2
        monkeypatch.setattr(broker.store, "append", real_append)
        delivered = await _pop_all(broker, "g", "d", 2, timeout_s=20)
        assert sorted(m.message.body for m in delivered) == [b"x0", b"x1"]
