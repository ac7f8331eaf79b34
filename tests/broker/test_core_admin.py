import asyncio
import time

import pytest
from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.types import (
    AckEntry,
    ConsumeMode,
    GroupConfig,
    Message,
    PopRequest,
    PullRequest,
    PullStatus,
)
from popmq.broker.testing import fast_broker_config, running_broker


async def _raises(call, code: Code) -> RefusedError:
    with pytest.raises(RefusedError) as err:
        await call
    assert err.value.code == code, err.value
    return err.value


async def test_send_queue_choice(tmp_path) -> None:
    async with running_broker(fast_broker_config(tmp_path)) as broker:
        await broker.create_topic("t", 4, "MIXED")  # FIFO and normal messages
        fifo = await broker.send([Message("t", b"x", message_group="order-7") for _ in range(5)])
        assert len({r.queue_id for r in fifo}) == 1
        assert [r.queue_offset for r in fifo] == [0, 1, 2, 3, 4]
        batch = await broker.send([Message("t", b"x") for _ in range(3)])
        assert len({r.queue_id for r in batch}) == 1  # one batch, one queue
        spread = {(await broker.send([Message("u", b"x")]))[0].queue_id for _ in range(8)}
        assert spread == {0, 1, 2, 3}  # round robin over the 4 queues
        mixed = await broker.send([Message("a", b"1"), Message("b", b"2"), Message("a", b"3")], 2)
        assert [(r.topic, r.queue_id, r.queue_offset) for r in mixed] == [
            ("a", 2, 0), ("b", 2, 0), ("a", 2, 1),
        ]  # fmt: skip
        await _raises(broker.send([Message("t", b"x")], 4), Code.BAD_REQUEST)
        await _raises(broker.send([]), Code.BAD_REQUEST)
        await _raises(broker.send([Message("t", b"x", tag="a||b")]), Code.ILLEGAL_MESSAGE_TAG)


async def test_no_auto_create(tmp_path) -> None:
    config = fast_broker_config(tmp_path)
    config.topics.auto_create = False
    async with running_broker(config) as broker:
        await _raises(broker.send([Message("t", b"x")]), Code.TOPIC_NOT_FOUND)
        await _raises(broker.get_topic("t", auto_create=True), Code.TOPIC_NOT_FOUND)
        await broker.create_topic("t", 2)
        assert (await broker.send([Message("t", b"x")]))[0].queue_id in (0, 1)


async def test_delay_message(tmp_path) -> None:
    async with running_broker(fast_broker_config(tmp_path)) as broker:
        await broker.create_topic("t", 4, "MIXED")  # FIFO+delay, then delay messages
        due = int(time.time() * 1000) + 200
        (result,) = await broker.send(
            [Message("t", b"later", delivery_timestamp_ms=due, message_group="k")]
        )
        assert result.queue_offset == -1 and result.topic == "t"
        request = PopRequest("g", "t", invisible_time_ms=1000)
        assert (await broker.pop(request)).messages == []
        request.poll_time_ms = 3000
        (popped,) = (await broker.pop(request)).messages
        assert time.time() * 1000 >= due
        assert popped.message.body == b"later" and popped.message.queue_id == result.queue_id
        assert popped.message.message_id == result.message_id
        assert popped.message.delivery_timestamp_ms == due
        assert not any(key.startswith("__popmq.timer") for key in popped.message.properties)
        # a past delivery time is just an immediate send
        (now_result,) = await broker.send([Message("t", b"now", delivery_timestamp_ms=1)])
        assert now_result.queue_offset >= 0


async def test_pull_offsets_and_status(tmp_path) -> None:
    async with running_broker(fast_broker_config(tmp_path)) as broker:
        before = int(time.time() * 1000)
        await broker.send([Message("t", f"m{i}".encode(), tag="A" if i % 2 else "B")
                           for i in range(6)], 1)  # fmt: skip
        info = await broker.get_topic("t")
        assert (info.queue_count, info.queues[1].min_offset, info.queues[1].max_offset) == (4, 0, 6)
        first = await broker.pull(PullRequest("t", 1, 0, max_messages=4))
        assert first.status == PullStatus.FOUND and first.next_offset == 4
        assert [m.queue_offset for m in first.messages] == [0, 1, 2, 3]
        assert (first.min_offset, first.max_offset) == (0, 6)
        tagged = await broker.pull(PullRequest("t", 1, 0, filter=_filter("A")))
        assert [m.body for m in tagged.messages] == [b"m1", b"m3", b"m5"]
        end = await broker.pull(PullRequest("t", 1, 6))
        assert end.status == PullStatus.NO_NEW_MESSAGE and end.next_offset == 6
        beyond = await broker.pull(PullRequest("t", 1, 7))
        assert beyond.status == PullStatus.OFFSET_ILLEGAL and beyond.next_offset == 6
        assert await broker.offset_for_timestamp("t", 1, before) == 0
        assert await broker.offset_for_timestamp("t", 1, int(time.time() * 1000) + 10_000) == 6
        await _raises(broker.pull(PullRequest("t", 9, 0)), Code.BAD_REQUEST)
        await _raises(broker.pull(PullRequest("nope", 0, 0)), Code.TOPIC_NOT_FOUND)
        await _raises(broker.pull(PullRequest("t", 0, 0, max_messages=0)), Code.BAD_REQUEST)


def _filter(expression: str):
    from popmq.broker.contract.types import FilterExpression

    return FilterExpression(expression)


async def test_retention_purges_and_pop_moves_past(tmp_path) -> None:
    config = fast_broker_config(tmp_path)
    config.store.segment_bytes = 4096
    config.store.retention_hours = 1e-9
    async with running_broker(config) as broker:
        await broker.send([Message("t", b"x" * 500) for _ in range(40)], 0)
        await broker.store.flush()
        await asyncio.sleep(0.01)
        assert broker.store.apply_retention() > 0
        low = broker.store.min_offset("t", 0)
        assert low > 0
        purged = await broker.pull(PullRequest("t", 0, 0))
        assert purged.status == PullStatus.OFFSET_PURGED and purged.next_offset == low
        popped = (
            await broker.pop(PopRequest("g", "t", queue_id=0, invisible_time_ms=1000))
        ).messages
        assert popped[0].message.queue_offset == low


async def test_consumer_offsets(tmp_path) -> None:
    async with running_broker(fast_broker_config(tmp_path)) as broker:
        await broker.send([Message("t", f"m{i}".encode()) for i in range(5)], 0)
        assert await broker.get_consumer_offset("g", "t", 0) == -1
        await broker.update_consumer_offset("g", "t", 0, 3)
        assert await broker.get_consumer_offset("g", "t", 0) == 3
        popped = (await broker.pop(PopRequest("g", "t", invisible_time_ms=1000))).messages
        assert [p.message.body for p in popped] == [b"m3", b"m4"]  # pop resumes there
        await broker.ack("g", "t", [AckEntry(p.receipt_handle) for p in popped])
        assert await broker.get_consumer_offset("g", "t", 0) == 5
        await _raises(broker.update_consumer_offset("g", "t", 0, 6), Code.ILLEGAL_OFFSET)
        await _raises(broker.update_consumer_offset("g", "t", 0, -1), Code.ILLEGAL_OFFSET)
        await _raises(broker.get_consumer_offset("g g", "t", 0), Code.ILLEGAL_CONSUMER_GROUP)


async def test_topic_admin(tmp_path) -> None:
    async with running_broker(fast_broker_config(tmp_path)) as broker:
        created = await broker.create_topic("orders", 3)
        assert (created.name, created.queue_count, len(created.queues)) == ("orders", 3, 3)
        assert (await broker.create_topic("orders", 3)).queue_count == 3  # idempotent
        await _raises(broker.create_topic("orders", 2), Code.BAD_REQUEST)
        await _raises(broker.create_topic("%DLQ%x", 1), Code.ILLEGAL_TOPIC)
        await _raises(broker.create_topic("x", 0), Code.BAD_REQUEST)
        await _raises(broker.get_topic("missing"), Code.TOPIC_NOT_FOUND)
        auto = await broker.get_topic("auto", auto_create=True)
        assert auto.queue_count == 4
        await broker.send([Message("orders", b"x", delivery_timestamp_ms=2**50)])
        names = [t.name for t in await broker.list_topics()]
        assert names == ["auto", "orders"]  # the timer's system topic is not listed
        await broker.delete_topic("orders")
        await _raises(broker.get_topic("orders"), Code.TOPIC_NOT_FOUND)
        await _raises(broker.delete_topic("orders"), Code.TOPIC_NOT_FOUND)


async def test_group_configs(tmp_path) -> None:
    config = fast_broker_config(tmp_path, max_attempts=7)
    async with running_broker(config) as broker:
        default = await broker.get_group("g")
        assert (default.name, default.max_attempts, default.fifo) == ("g", 7, False)
        assert default.consume_mode == ConsumeMode.POP
        updated = await broker.update_group(GroupConfig("g", max_attempts=2, retry_levels=["1s"]))
        assert updated.max_attempts == 2
        await _raises(broker.update_group(GroupConfig("g", max_attempts=0)), Code.BAD_REQUEST)
        await _raises(
            broker.update_group(GroupConfig("g", retry_levels=["soon"])), Code.BAD_REQUEST
        )
        await _raises(broker.update_group(GroupConfig("%bad")), Code.ILLEGAL_CONSUMER_GROUP)
        await _raises(broker.get_group("bad group"), Code.ILLEGAL_CONSUMER_GROUP)
        # returned configs are copies
        copy = await broker.get_group("g")
        copy.max_attempts = 99
        assert (await broker.get_group("g")).max_attempts == 2


async def test_not_started(tmp_path) -> None:
    from popmq.broker.core import Broker

    broker = Broker(fast_broker_config(tmp_path))
    await _raises(broker.send([Message("t", b"x")]), Code.INTERNAL_ERROR)
    await broker.aclose()  # harmless


async def test_delete_topic_with_messages_in_flight(tmp_path) -> None:
    config = fast_broker_config(tmp_path)
    async with running_broker(config) as broker:
        await broker.send([Message("t", b"x")], 0)
        await broker.pop(PopRequest("g", "t", invisible_time_ms=30))
        await broker.delete_topic("t")
        for _ in range(100):
            if not broker.ledger.live:
                break
            await asyncio.sleep(0.01)
        assert not broker.ledger.live  # dropped, not retried forever
    async with running_broker(config) as broker:
        await broker.send([Message("t", b"fresh")], 0)
        popped = (await broker.pop(PopRequest("g", "t", invisible_time_ms=100))).messages
        assert [p.message.body for p in popped] == [b"fresh"]


async def test_progress_beyond_queue_end_is_clamped(tmp_path) -> None:
    async with running_broker(fast_broker_config(tmp_path)) as broker:
        await broker.send([Message("t", b"a")], 0)
        broker.ledger.reset_queue("g", "t", 0, 50)  # as if the store lost its tail
        popped = (
            await broker.pop(PopRequest("g", "t", queue_id=0, invisible_time_ms=100))
        ).messages
        assert popped == []
        await broker.send([Message("t", b"b")], 0)
        popped = (
            await broker.pop(PopRequest("g", "t", queue_id=0, invisible_time_ms=100))
        ).messages
        assert [p.message.body for p in popped] == [b"b"]


async def test_list_and_delete_groups(tmp_path) -> None:
    config = fast_broker_config(tmp_path)
    async with running_broker(config) as broker:
        await broker.create_topic("t", 1)
        await broker.send([Message("t", b"a"), Message("t", b"b")])
        await broker.update_group(GroupConfig("idle", max_attempts=3))
        popped = await broker.pop(PopRequest("busy", "t", max_messages=1,
                                             invisible_time_ms=60_000))  # fmt: skip
        assert len(popped.messages) == 1
        listed = {s.config.name: s for s in await broker.list_groups()}
        assert set(listed) == {"idle", "busy"}
        assert (listed["busy"].inflight, listed["idle"].inflight) == (1, 0)
        assert listed["idle"].config.max_attempts == 3

        # in flight: refused without force, nothing changed
        await _raises(broker.delete_group("busy"), Code.PRECONDITION_FAILED)
        assert "busy" in {s.config.name for s in await broker.list_groups()}
        await _raises(broker.delete_group("nope"), Code.CONSUMER_GROUP_NOT_FOUND)
        await _raises(broker.delete_group("bad group"), Code.ILLEGAL_CONSUMER_GROUP)

        await broker.ack("busy", "t", [AckEntry(popped.messages[0].receipt_handle)])
        done = await broker.delete_group("busy", clean_offsets=True)
        assert done.inflight == 0 and done.offsets_removed == 1
        assert await broker.get_consumer_offset("busy", "t", 0) == -1
        deleted = await broker.delete_group("idle", force=True)
        assert deleted.offsets_removed == 0
        assert await broker.list_groups() == []
    # the deletions are durable
    async with running_broker(config) as broker:
        assert await broker.list_groups() == []
        # a client's next use re-creates the group with the defaults, from the queue's start
        again = await broker.pop(PopRequest("busy", "t", max_messages=2))
        assert [m.message.body for m in again.messages] == [b"a", b"b"]


async def test_force_delete_keeps_inflight_messages(tmp_path) -> None:
    config = fast_broker_config(tmp_path)
    async with running_broker(config) as broker:
        await broker.create_topic("t", 1)
        await broker.send([Message("t", b"x")])
        popped = await broker.pop(PopRequest("g", "t", max_messages=1, invisible_time_ms=200))
        assert len(popped.messages) == 1
        done = await broker.delete_group("g", clean_offsets=True, force=True)
        assert done.inflight == 1
        # the message is not dropped: it comes back once its invisible time ends
        for _ in range(100):
            got = await broker.pop(PopRequest("g", "t", max_messages=1, poll_time_ms=200))
            if got.messages:
                break
        assert [m.message.body for m in got.messages] == [b"x"]
