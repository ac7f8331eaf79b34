import asyncio
import itertools

import pytest
from popmq.broker.contract.errors import Code
from popmq.broker.contract.types import (
    PROP_ORIGIN_MESSAGE_ID,
    PROP_ORIGIN_OFFSET,
    PROP_ORIGIN_QUEUE,
    PROP_ORIGIN_TOPIC,
    AckEntry,
    GroupConfig,
    Message,
    PopRequest,
    PullRequest,
    PullStatus,
    dlq_topic,
    retry_topic,
)
from popmq.broker.core import Broker
from popmq.broker.testing import fast_broker_config, running_broker

from popmq.clock import LoopClock

# Virtual time: invisible times, backoffs and the broker's loops run on the loop's clock.
pytestmark = pytest.mark.looptime


def _pop(invisible_ms: int = 20, poll_ms: int = 0, **kw: object) -> PopRequest:
    return PopRequest("g", "t", invisible_time_ms=invisible_ms, poll_time_ms=poll_ms, **kw)  # type: ignore[arg-type]


async def _dlq(broker: Broker) -> list:
    try:
        result = await broker.pull(PullRequest(dlq_topic("g"), 0, 0))
    except Exception:
        return []
    return result.messages if result.status == PullStatus.FOUND else []


async def test_unacked_message_comes_back_through_retry_topic(tmp_path) -> None:
    async with running_broker(fast_broker_config(tmp_path), LoopClock()) as broker:
        (sent,) = await broker.send([Message("t", b"payload", tag="T", keys=["k1"])], 2)
        (first,) = (await broker.pop(_pop())).messages
        assert first.delivery_attempt == 1
        (again,) = (await broker.pop(_pop(invisible_ms=5000, poll_ms=2000))).messages
        assert again.delivery_attempt == 2 and again.message.reconsume_times == 1
        message = again.message
        assert message.message_id == sent.message_id == first.message.message_id
        assert (message.body, message.tag, message.keys, message.topic) == (
            b"payload", "T", ["k1"], "t",
        )  # fmt: skip
        assert message.properties[PROP_ORIGIN_TOPIC] == "t"
        assert message.properties[PROP_ORIGIN_MESSAGE_ID] == sent.message_id
        assert message.properties[PROP_ORIGIN_QUEUE] == "2"
        assert message.properties[PROP_ORIGIN_OFFSET] == "0"
        handle = broker.engine._codec.decode(again.receipt_handle)
        assert handle.topic == retry_topic("g", "t")
        # the original's offset is committed once revived; the retry copy acks normally
        assert await broker.get_consumer_offset("g", "t", 2) == 1
        (result,) = await broker.ack("g", "t", [AckEntry(again.receipt_handle)])
        assert result.code == Code.OK
        await asyncio.sleep(0.1)
        assert (await broker.pop(_pop())).messages == []


async def test_backoff_grows_across_attempts(tmp_path) -> None:
    config = fast_broker_config(tmp_path, time_scale=1.0)
    async with running_broker(config, LoopClock()) as broker:
        levels = ["40ms", "200ms", "500ms"]
        await broker.update_group(GroupConfig("g", retry_levels=levels))
        await broker.send([Message("t", b"x")])
        seen: list[tuple[float, int]] = []
        for _ in range(4):
            (popped,) = (await broker.pop(_pop(invisible_ms=20, poll_ms=3000))).messages
            seen.append((asyncio.get_running_loop().time(), popped.delivery_attempt))
        assert [attempt for _, attempt in seen] == [1, 2, 3, 4]
        gaps = [(b[0] - a[0]) * 1000 for a, b in itertools.pairwise(seen)]
        assert gaps[0] < gaps[1] < gaps[2], gaps
        for gap, level in zip(gaps, [40, 200, 500], strict=True):
            assert gap >= 20 + level - 5, gaps  # invisible time + the attempt's backoff


async def test_dead_letter_after_max_attempts(tmp_path) -> None:
    async with running_broker(fast_broker_config(tmp_path), LoopClock()) as broker:
        await broker.update_group(GroupConfig("g", max_attempts=3))
        (sent,) = await broker.send([Message("t", b"poison")])
        attempts = []
        for _ in range(3):
            (popped,) = (await broker.pop(_pop(invisible_ms=10, poll_ms=2000))).messages
            attempts.append(popped.delivery_attempt)
        assert attempts == [1, 2, 3]
        for _ in range(100):
            if dead := await _dlq(broker):
                break
            await asyncio.sleep(0.01)
        assert len(dead) == 1
        assert dead[0].message_id == sent.message_id and dead[0].body == b"poison"
        assert dead[0].reconsume_times == 3
        assert dead[0].properties[PROP_ORIGIN_TOPIC] == "t"
        assert (await broker.pop(_pop(poll_ms=100))).messages == []  # no fourth delivery
        assert broker.revive_service.dead_lettered == 1


async def test_forward_to_dlq_now(tmp_path) -> None:
    async with running_broker(fast_broker_config(tmp_path), LoopClock()) as broker:
        await broker.send([Message("t", b"bad"), Message("t", b"good")], 0)
        bad, good = (await broker.pop(_pop(invisible_ms=100))).messages
        await broker.forward_to_dlq("g", "t", bad.receipt_handle)
        (dead,) = await _dlq(broker)
        assert dead.body == b"bad"
        (again,) = await broker.ack("g", "t", [AckEntry(bad.receipt_handle)])
        assert again.code == Code.INVALID_RECEIPT_HANDLE
        await broker.ack("g", "t", [AckEntry(good.receipt_handle)])
        assert await broker.get_consumer_offset("g", "t", 0) == 2
        await asyncio.sleep(0.15)
        assert (await broker.pop(_pop())).messages == []


async def test_change_invisible_time_on_retry_message(tmp_path) -> None:
    async with running_broker(fast_broker_config(tmp_path), LoopClock()) as broker:
        await broker.send([Message("t", b"x")])
        await broker.pop(_pop(invisible_ms=10))
        (retried,) = (await broker.pop(_pop(invisible_ms=50, poll_ms=2000))).messages
        assert retried.delivery_attempt == 2
        changed = await broker.change_invisible_time("g", "t", retried.receipt_handle, 300)
        await asyncio.sleep(0.12)
        assert (await broker.pop(_pop())).messages == []  # the change holds it back
        (result,) = await broker.ack("g", "t", [AckEntry(changed.receipt_handle)])
        assert result.code == Code.OK
        await asyncio.sleep(0.3)
        assert (await broker.pop(_pop())).messages == []


async def test_failed_revive_is_retried(tmp_path, monkeypatch) -> None:
    import popmq.broker.pop.revive as revive_module

    monkeypatch.setattr(revive_module, "_RETRY_FAILED_MS", 30)
    async with running_broker(fast_broker_config(tmp_path), LoopClock()) as broker:
        real_schedule = broker.timer.schedule
        failures = []

        async def flaky_schedule(entries):
            if not failures:
                failures.append(len(entries))
                raise OSError("disk hiccup")
            return await real_schedule(entries)

        monkeypatch.setattr(broker.timer, "schedule", flaky_schedule)
        await broker.send([Message("t", b"x")])
        await broker.pop(_pop(invisible_ms=10))
        (again,) = (await broker.pop(_pop(invisible_ms=1000, poll_ms=2000))).messages
        assert failures == [1] and again.delivery_attempt == 2
