import asyncio

import pytest
from popmq.broker.contract.types import (
    AckEntry,
    GroupConfig,
    Message,
    NotifyRequest,
    PopRequest,
    PullRequest,
    dlq_topic,
)
from popmq.broker.core import Broker
from popmq.broker.testing import fast_broker_config, running_broker

from popmq.clock import LoopClock

# Virtual time (looptime, the broker on a LoopClock): hold timeouts and wake-ups are exact.
pytestmark = pytest.mark.looptime


def _now() -> float:
    return asyncio.get_running_loop().time()


def _fifo(max_messages: int = 32, invisible_ms: int = 10_000, poll_ms: int = 0) -> PopRequest:
    return PopRequest(
        "g",
        "t",
        max_messages=max_messages,
        invisible_time_ms=invisible_ms,
        poll_time_ms=poll_ms,
        fifo=True,
    )


async def _send_group(broker: Broker, bodies: list[str], group: str = "order-1") -> None:
    await broker.send([Message("t", b.encode(), message_group=group) for b in bodies])


def _bodies(result) -> list[bytes]:
    return [p.message.body for p in result.messages]


async def test_queue_blocked_until_acked(tmp_path) -> None:
    async with running_broker(fast_broker_config(tmp_path), LoopClock()) as broker:
        await _send_group(broker, ["m0", "m1", "m2"])
        first = await broker.pop(_fifo(max_messages=1))
        assert _bodies(first) == [b"m0"]
        assert _bodies(await broker.pop(_fifo())) == []  # blocked: m0 is in flight
        await broker.ack("g", "t", [AckEntry(first.messages[0].receipt_handle)])
        assert _bodies(await broker.pop(_fifo())) == [b"m1", b"m2"]


async def test_other_queues_not_blocked(tmp_path) -> None:
    async with running_broker(fast_broker_config(tmp_path), LoopClock()) as broker:
        await broker.send([Message("t", b"a0", message_group="a")], 0)
        await broker.send([Message("t", b"b0", message_group="b")], 1)
        first = await broker.pop(_fifo(max_messages=1))
        second = await broker.pop(_fifo(max_messages=1))
        assert sorted(_bodies(first) + _bodies(second)) == [b"a0", b"b0"]


async def test_unacked_redelivered_in_place_and_in_order(tmp_path) -> None:
    async with running_broker(fast_broker_config(tmp_path), LoopClock()) as broker:
        await _send_group(broker, ["m0", "m1", "m2", "m3"])
        first = await broker.pop(_fifo(max_messages=3, invisible_ms=40))
        assert _bodies(first) == [b"m0", b"m1", b"m2"]
        # m1 is acked, m0 and m2 are not
        await broker.ack("g", "t", [AckEntry(first.messages[1].receipt_handle)])
        started = _now()
        again = await broker.pop(_fifo(invisible_ms=5000, poll_ms=2000))
        assert _now() - started >= 0.02  # only after the invisible time
        assert _bodies(again) == [b"m0", b"m2", b"m3"]
        assert [p.delivery_attempt for p in again.messages] == [2, 2, 1]
        queue_id = first.messages[0].message.queue_id
        assert {p.message.queue_id for p in again.messages} == {queue_id}
        handle = broker.engine._codec.decode(again.messages[0].receipt_handle)
        assert handle.topic == "t"  # in place, not through the retry topic
        assert broker.store.get_topic("%RETRY%g+t") is None
        await broker.ack("g", "t", [AckEntry(p.receipt_handle) for p in again.messages])
        assert await broker.get_consumer_offset("g", "t", queue_id) == 4


async def test_fifo_dead_letters_at_max_attempts_then_moves_on(tmp_path) -> None:
    async with running_broker(fast_broker_config(tmp_path), LoopClock()) as broker:
        await broker.update_group(GroupConfig("g", max_attempts=2, fifo=True))
        await _send_group(broker, ["poison", "next"])
        request = PopRequest("g", "t", max_messages=1, invisible_time_ms=20, poll_time_ms=2000)
        attempts = [(await broker.pop(request)).messages[0] for _ in range(2)]
        assert [(p.message.body, p.delivery_attempt) for p in attempts] == [
            (b"poison", 1), (b"poison", 2),
        ]  # fmt: skip
        nxt = await broker.pop(request)  # fifo from the group config
        assert _bodies(nxt) == [b"next"]
        dead = await broker.pull(PullRequest(dlq_topic("g"), 0, 0))
        assert [m.body for m in dead.messages] == [b"poison"]


async def test_fifo_never_reads_retry_topic(tmp_path) -> None:
    async with running_broker(fast_broker_config(tmp_path), LoopClock()) as broker:
        await broker.send([Message("t", b"plain")], 0)
        await broker.pop(PopRequest("g", "t", invisible_time_ms=5))  # concurrent pop, not acked
        for _ in range(100):
            if broker.store.get_topic("%RETRY%g+t") is not None:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        assert broker.store.max_offset("%RETRY%g+t", 0) == 1
        assert _bodies(await broker.pop(_fifo())) == []
        assert (await broker.notify(NotifyRequest("g", "t", fifo=True))).has_message is False
        assert (await broker.notify(NotifyRequest("g", "t"))).has_message is True


async def test_held_fifo_pop_wakes_when_queue_unblocks(tmp_path) -> None:
    async with running_broker(fast_broker_config(tmp_path), LoopClock()) as broker:
        await _send_group(broker, ["m0", "m1"])
        first = await broker.pop(_fifo(max_messages=1))
        waiter = asyncio.create_task(broker.pop(_fifo(poll_ms=3000)))
        await asyncio.sleep(0.05)
        assert not waiter.done()
        started = _now()
        await broker.ack("g", "t", [AckEntry(first.messages[0].receipt_handle)])
        result = await asyncio.wait_for(waiter, 1)
        assert _bodies(result) == [b"m1"]
        assert _now() - started < 0.1
