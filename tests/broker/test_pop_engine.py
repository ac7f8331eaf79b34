import asyncio
from dataclasses import replace

import pytest
from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.types import (
    AckEntry,
    FilterExpression,
    Message,
    PopRequest,
    retry_topic,
)
from popmq.broker.core import Broker
from popmq.broker.pop.handle import HandleCodec, peek_broker_name
from popmq.broker.pop.handle_keys import HandleKeyring, keyring_path
from popmq.broker.testing import fast_broker_config, running_broker

from popmq.clock import LoopClock


def _pop(group: str = "g", topic: str = "t", **kw: object) -> PopRequest:
    kw.setdefault("invisible_time_ms", 10_000)
    return PopRequest(group, topic, **kw)  # type: ignore[arg-type]


async def _send(broker: Broker, n: int, queue_id: int, topic: str = "t", **kw: object) -> None:
    await broker.send(
        [Message(topic, f"{queue_id}-{i}".encode(), **kw) for i in range(n)], queue_id
    )


async def _ack_codes(broker: Broker, handles: list[str], group: str = "g") -> list[int]:
    return [r.code for r in await broker.ack(group, "t", [AckEntry(h) for h in handles])]


async def test_out_of_order_acks_commit_only_the_done_prefix(tmp_path) -> None:
    async with running_broker(fast_broker_config(tmp_path)) as broker:
        await _send(broker, 6, 0)
        popped = (await broker.pop(_pop(queue_id=0))).messages
        handles = [p.receipt_handle for p in popped]
        assert await _ack_codes(broker, [handles[5], handles[2], handles[1]]) == [Code.OK] * 3
        assert await broker.get_consumer_offset("g", "t", 0) == -1  # nothing committed yet
        await _ack_codes(broker, [handles[0]])
        assert await broker.get_consumer_offset("g", "t", 0) == 3
        await _ack_codes(broker, [handles[3], handles[4]])
        assert await broker.get_consumer_offset("g", "t", 0) == 6
        stats = await broker.group_stats("g", "t")
        assert stats[0].inflight == 0 and stats[0].backlog == 0


async def test_two_consumers_share_a_queue_without_duplicates(tmp_path) -> None:
    async with running_broker(fast_broker_config(tmp_path)) as broker:
        await _send(broker, 10, 2)
        first = await broker.pop(_pop(max_messages=4))
        second = await broker.pop(_pop(max_messages=32))
        bodies = [p.message.body for p in first.messages + second.messages]
        assert len(bodies) == 10 and len(set(bodies)) == 10


async def test_busy_queue_is_skipped_and_counted_in_rest(tmp_path) -> None:
    async with running_broker(fast_broker_config(tmp_path)) as broker:
        await _send(broker, 3, 0)
        await _send(broker, 2, 1)
        locks = broker.engine.locks
        assert locks.try_lock(("g", "t", 0))
        result = await broker.pop(_pop())
        assert sorted(p.message.body for p in result.messages) == [b"1-0", b"1-1"]
        assert result.rest_num == 3
        locks.unlock(("g", "t", 0))
        result = await broker.pop(_pop())
        assert sorted(p.message.body for p in result.messages) == [b"0-0", b"0-1", b"0-2"]


async def test_rest_num_and_queue_rotation(tmp_path) -> None:
    async with running_broker(fast_broker_config(tmp_path)) as broker:
        for queue_id in range(4):
            await _send(broker, 5, queue_id)
        result = await broker.pop(_pop(max_messages=7))
        assert len(result.messages) == 7 and result.rest_num == 13
        firsts = set()
        for _ in range(40):
            popped = await broker.pop(_pop(max_messages=1, invisible_time_ms=1))
            if popped.messages:
                firsts.add(popped.messages[0].message.queue_id)
        assert len(firsts) > 1  # pops do not always start at the same queue


async def test_tag_filter_skips_count_as_consumed(tmp_path) -> None:
    async with running_broker(fast_broker_config(tmp_path)) as broker:
        tags = ["A", "B", "A", "C", "B"]
        await broker.send([Message("t", f"{i}".encode(), tag=tag) for i, tag in enumerate(tags)], 0)
        result = await broker.pop(_pop(filter=FilterExpression("A || C")))
        assert [p.message.tag for p in result.messages] == ["A", "A", "C"]
        await _ack_codes(broker, [p.receipt_handle for p in result.messages])
        assert await broker.get_consumer_offset("g", "t", 0) == 5  # the filtered read passed the B
        assert (await broker.pop(_pop(filter=FilterExpression("A")))).messages == []


# Virtual time: windows of 100-400 ms, which a loaded machine's stalls would overrun.
@pytest.mark.looptime
async def test_change_invisible_time(tmp_path) -> None:
    async with running_broker(fast_broker_config(tmp_path), LoopClock()) as broker:
        await _send(broker, 1, 0)
        (popped,) = (await broker.pop(_pop(invisible_time_ms=100))).messages
        changed = await broker.change_invisible_time("g", "t", popped.receipt_handle, 400)
        assert changed.receipt_handle != popped.receipt_handle
        assert changed.invisible_until_ms > popped.invisible_until_ms
        # the old handle stops working
        (old,) = await broker.ack("g", "t", [AckEntry(popped.receipt_handle)])
        assert old.code == Code.INVALID_RECEIPT_HANDLE and "superseded" in old.message
        with pytest.raises(RefusedError) as err:
            await broker.change_invisible_time("g", "t", popped.receipt_handle, 100)
        assert err.value.code == Code.INVALID_RECEIPT_HANDLE
        await asyncio.sleep(0.2)  # past the first invisible time: still invisible
        assert (await broker.pop(_pop())).messages == []
        assert await _ack_codes(broker, [changed.receipt_handle]) == [Code.OK]
        await asyncio.sleep(0.3)
        assert (await broker.pop(_pop())).messages == []  # acked: never comes back


async def test_change_invisible_time_range_checked(tmp_path) -> None:
    async with running_broker(fast_broker_config(tmp_path, max_invisible_ms=1000)) as broker:
        await _send(broker, 1, 0)
        (popped,) = (await broker.pop(_pop(invisible_time_ms=500))).messages
        with pytest.raises(RefusedError) as err:
            await broker.change_invisible_time("g", "t", popped.receipt_handle, 1001)
        assert err.value.code == Code.ILLEGAL_INVISIBLE_TIME


async def test_change_invisible_time_zero_is_a_nack(tmp_path) -> None:
    # Pops must ask at least min_invisible_ms, but a change may go down to 0 (RocketMQ lets a
    # consumer give a message back at once); the message then revives through the retry topic.
    config = fast_broker_config(tmp_path, min_invisible_ms=400)
    async with running_broker(config) as broker:
        await _send(broker, 1, 0)
        (popped,) = (await broker.pop(_pop(invisible_time_ms=400))).messages
        changed = await broker.change_invisible_time("g", "t", popped.receipt_handle, 0)
        assert changed.invisible_until_ms <= popped.invisible_until_ms
        again = await broker.pop(_pop(invisible_time_ms=400, poll_time_ms=2_000))
        assert [m.message.message_id for m in again.messages] == [popped.message.message_id]
        assert again.messages[0].delivery_attempt == 2


async def test_bad_handles_rejected_per_entry(tmp_path) -> None:
    async with running_broker(
        fast_broker_config(tmp_path, revive_scan_interval_ms=5_000)
    ) as broker:
        await _send(broker, 3, 0)
        popped = (await broker.pop(_pop(queue_id=0, invisible_time_ms=10_000))).messages
        good = popped[0].receipt_handle
        codec = HandleCodec(HandleKeyring(keyring_path(broker.config)))
        handle = codec.decode(popped[1].receipt_handle)
        text = popped[1].receipt_handle
        forged = text[:-2] + ("AA" if not text.endswith("AA") else "BB")
        other_broker = codec.encode(replace(handle, broker="broker-z"))
        other_secret = HandleCodec(HandleKeyring(None)).encode(handle)
        entries = [good, "garbage", forged, other_broker, other_secret]
        results = await broker.ack("g", "t", [AckEntry(h, f"id{i}") for i, h in enumerate(entries)])
        assert [r.code for r in results] == [Code.OK] + [Code.INVALID_RECEIPT_HANDLE] * 4
        assert [r.message_id for r in results] == [f"id{i}" for i in range(5)]
        assert "malformed" in results[1].message
        assert "does not open" in results[2].message and "key unknown" in results[4].message
        assert "broker-z" in results[3].message
        assert peek_broker_name(other_broker) == "broker-z"
        # another group cannot ack it; another topic neither
        (other_group,) = await broker.ack("h", "t", [AckEntry(popped[2].receipt_handle)])
        assert other_group.code == Code.INVALID_RECEIPT_HANDLE and "group" in other_group.message
        (other_topic,) = await broker.ack("g", "u", [AckEntry(popped[2].receipt_handle)])
        assert other_topic.code == Code.INVALID_RECEIPT_HANDLE and "topic" in other_topic.message
        # a repeated ack is idempotent
        assert await _ack_codes(broker, [good]) == [Code.OK]


async def test_expired_handle_rejected(tmp_path) -> None:
    async with running_broker(fast_broker_config(tmp_path)) as broker:
        await _send(broker, 1, 0)
        (popped,) = (await broker.pop(_pop(invisible_time_ms=30))).messages
        await asyncio.sleep(0.06)
        (result,) = await broker.ack("g", "t", [AckEntry(popped.receipt_handle)])
        assert result.code == Code.INVALID_RECEIPT_HANDLE and "expired" in result.message


async def test_retry_first_ratio_about_one_in_five(tmp_path) -> None:
    config = fast_broker_config(tmp_path, max_batch=64)
    async with running_broker(config) as broker:
        await _send(broker, 120, 0)
        # pop everything once and let it all go to the retry topic
        while (await broker.pop(_pop(max_messages=64, invisible_time_ms=1))).messages:
            pass
        for _ in range(200):
            stats = await broker.group_stats("g", "t")
            retry = [s for s in stats if s.topic == retry_topic("g", "t")]
            if retry and retry[0].max_offset == 120:
                break
            await asyncio.sleep(0.01)
        else:
            pytest.fail("messages did not reach the retry topic")
        await _send(broker, 200, 1)
        retried = 0
        for _ in range(200):
            (popped,) = (await broker.pop(_pop(max_messages=1))).messages
            retried += popped.delivery_attempt > 1
            await _ack_codes(broker, [popped.receipt_handle])
        assert 0.10 <= retried / 200 <= 0.32, retried


# Virtual time: the sleep lets the revive scan run; on a loaded machine a real one might not.
@pytest.mark.looptime
async def test_pop_reads_retry_topic_when_not_full(tmp_path) -> None:
    async with running_broker(
        fast_broker_config(tmp_path, retry_first_percent=0), LoopClock()
    ) as broker:
        await _send(broker, 2, 0)
        await broker.pop(_pop(invisible_time_ms=1))
        await asyncio.sleep(0.1)
        await _send(broker, 1, 1)
        result = await broker.pop(_pop())
        assert [p.delivery_attempt for p in result.messages] == [1, 2, 2]
        assert result.messages[0].message.body == b"1-0"  # normal queues first
        # a retried message shows its user topic, and is acked against it
        retried = result.messages[1]
        assert retried.message.topic == "t"
        assert (
            await _ack_codes(broker, [p.receipt_handle for p in result.messages]) == [Code.OK] * 3
        )
