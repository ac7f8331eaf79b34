import asyncio

import pytest
from popmq.broker.contract.types import (
    FilterExpression,
    Message,
    NotifyRequest,
    PopRequest,
    PopStatus,
    PullRequest,
    PullStatus,
)
from popmq.broker.core import Broker
from popmq.broker.testing import fast_broker_config, running_broker

from popmq.clock import LoopClock

# Virtual time (looptime, the broker on a LoopClock): hold timeouts and wake-ups are exact.
pytestmark = pytest.mark.looptime


def _now() -> float:
    return asyncio.get_running_loop().time()


def _pop(poll_ms: int, **kw: object) -> PopRequest:
    return PopRequest("g", "t", invisible_time_ms=10_000, poll_time_ms=poll_ms, **kw)  # type: ignore[arg-type]


async def _held(broker: Broker, count: int) -> None:
    for _ in range(200):
        if broker.hold_table.total >= count:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"expected {count} held requests, have {broker.hold_table.total}")


async def _topic(broker: Broker) -> None:
    await broker.create_topic("t", 4)


async def test_held_pop_wakes_within_milliseconds_of_a_send(tmp_path) -> None:
    async with running_broker(fast_broker_config(tmp_path), LoopClock()) as broker:
        await _topic(broker)
        latencies = []
        for i in range(5):
            waiter = asyncio.create_task(broker.pop(_pop(5000)))
            await _held(broker, 1)
            started = _now()
            await broker.send([Message("t", f"m{i}".encode())])
            result = await waiter
            latencies.append((_now() - started) * 1000)
            assert [p.message.body for p in result.messages] == [f"m{i}".encode()]
        assert sorted(latencies)[2] < 20, latencies  # median, generous for a loaded machine
        assert broker.hold_table.total == 0


async def test_timeout_answers_empty(tmp_path) -> None:
    async with running_broker(fast_broker_config(tmp_path), LoopClock()) as broker:
        await _topic(broker)
        started = _now()
        result = await broker.pop(_pop(150))
        elapsed = _now() - started
        assert result.status == PopStatus.NO_MESSAGE and result.messages == []
        assert 0.14 <= elapsed < 1.0
        started = _now()
        assert (await broker.notify(NotifyRequest("g", "t", poll_time_ms=100))).has_message is False
        assert _now() - started >= 0.09
        assert broker.hold_table.total == 0


async def test_tag_aware_wake_up(tmp_path) -> None:
    async with running_broker(fast_broker_config(tmp_path), LoopClock()) as broker:
        await _topic(broker)
        waiter = asyncio.create_task(broker.pop(_pop(3000, filter=FilterExpression("A"))))
        await _held(broker, 1)
        await broker.send([Message("t", b"b", tag="B")])
        await asyncio.sleep(0.05)
        assert not waiter.done()
        await broker.send([Message("t", b"a", tag="A")])
        result = await asyncio.wait_for(waiter, 1)
        assert [p.message.body for p in result.messages] == [b"a"]


async def test_specific_queue_hold(tmp_path) -> None:
    async with running_broker(fast_broker_config(tmp_path), LoopClock()) as broker:
        await _topic(broker)
        waiter = asyncio.create_task(broker.pop(_pop(3000, queue_id=2)))
        await _held(broker, 1)
        await broker.send([Message("t", b"q1")], 1)
        await asyncio.sleep(0.05)
        assert not waiter.done()
        await broker.send([Message("t", b"q2")], 2)
        result = await asyncio.wait_for(waiter, 1)
        assert [p.message.body for p in result.messages] == [b"q2"]


async def test_polling_full(tmp_path) -> None:
    config = fast_broker_config(tmp_path)
    config.polling.max_held_per_key = 2
    config.polling.max_held_total = 3
    async with running_broker(config, LoopClock()) as broker:
        await _topic(broker)
        held = [asyncio.create_task(broker.pop(_pop(5000))) for _ in range(2)]
        await _held(broker, 2)
        started = _now()
        full = await broker.pop(_pop(5000))
        assert full.status == PopStatus.POLLING_FULL
        assert _now() - started < 0.1
        held.append(asyncio.create_task(broker.pull(PullRequest("t", 0, 0, poll_time_ms=5000))))
        await _held(broker, 3)
        pulled = await broker.pull(PullRequest("t", 1, 0, poll_time_ms=5000))
        assert pulled.status == PullStatus.POLLING_FULL
        notified = await broker.notify(NotifyRequest("g", "t", poll_time_ms=5000))
        assert notified.polling_full and not notified.has_message
        for task in held:
            task.cancel()
        await asyncio.gather(*held, return_exceptions=True)
        assert broker.hold_table.total == 0


async def test_cancelled_callers_leave_nothing_held(tmp_path) -> None:
    async with running_broker(fast_broker_config(tmp_path), LoopClock()) as broker:
        await _topic(broker)
        tasks = [asyncio.create_task(broker.pop(_pop(10_000))) for _ in range(5)]
        tasks += [
            asyncio.create_task(broker.notify(NotifyRequest("g", "t", poll_time_ms=10_000)))
            for _ in range(5)
        ]
        tasks += [
            asyncio.create_task(broker.pull(PullRequest("t", 0, 0, poll_time_ms=10_000)))
            for _ in range(5)
        ]
        await _held(broker, 15)
        for task in tasks:
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(r, asyncio.CancelledError) for r in results)
        assert broker.hold_table.total == 0
        # nothing stale is woken or consumed later: the next pop gets the message
        await broker.send([Message("t", b"after")])
        result = await broker.pop(_pop(0))
        assert [p.message.body for p in result.messages] == [b"after"]


async def test_pull_long_polling(tmp_path) -> None:
    async with running_broker(fast_broker_config(tmp_path), LoopClock()) as broker:
        await _topic(broker)
        await broker.send([Message("t", b"old")], 0)
        waiter = asyncio.create_task(broker.pull(PullRequest("t", 0, 1, poll_time_ms=3000)))
        await _held(broker, 1)
        await broker.send([Message("t", b"new")], 0)
        result = await asyncio.wait_for(waiter, 1)
        assert result.status == PullStatus.FOUND
        assert [m.body for m in result.messages] == [b"new"] and result.next_offset == 2
        empty = await broker.pull(PullRequest("t", 0, 2, poll_time_ms=50))
        assert empty.status == PullStatus.NO_NEW_MESSAGE and empty.next_offset == 2


async def test_notify_never_pops_and_wakes_on_arrival(tmp_path) -> None:
    async with running_broker(fast_broker_config(tmp_path), LoopClock()) as broker:
        await _topic(broker)
        assert (await broker.notify(NotifyRequest("g", "t"))).has_message is False
        waiter = asyncio.create_task(broker.notify(NotifyRequest("g", "t", poll_time_ms=3000)))
        await _held(broker, 1)
        await broker.send([Message("t", b"x")], 3)
        assert (await asyncio.wait_for(waiter, 1)).has_message is True
        assert (await broker.notify(NotifyRequest("g", "t", queue_id=3))).has_message is True
        assert (await broker.notify(NotifyRequest("g", "t", queue_id=1))).has_message is False
        popped = await broker.pop(_pop(0))
        assert [p.message.body for p in popped.messages] == [b"x"]  # notify did not take it
        assert (await broker.notify(NotifyRequest("g", "t"))).has_message is False  # in flight
        assert (await broker.notify(NotifyRequest("other", "t"))).has_message is True


async def test_held_pop_wakes_when_delayed_message_is_due(tmp_path) -> None:
    clock = LoopClock()
    async with running_broker(fast_broker_config(tmp_path), clock) as broker:
        await _topic(broker)
        due = clock.now_ms() + 150
        await broker.send([Message("t", b"later", delivery_timestamp_ms=due)])
        result = await broker.pop(_pop(3000))
        now = clock.now_ms()
        assert [p.message.body for p in result.messages] == [b"later"]
        assert due <= now < due + 200


async def test_stop_answers_held_requests(tmp_path) -> None:
    async with running_broker(fast_broker_config(tmp_path), LoopClock()) as broker:
        await _topic(broker)
        tasks = [
            asyncio.create_task(broker.pop(_pop(10_000))),
            asyncio.create_task(broker.pull(PullRequest("t", 0, 0, poll_time_ms=10_000))),
            asyncio.create_task(broker.notify(NotifyRequest("g", "t", poll_time_ms=10_000))),
        ]
        await _held(broker, 3)
        started = _now()
    pop, pull, notify = await asyncio.wait_for(asyncio.gather(*tasks), 2)
    assert _now() - started < 1
    assert pop.messages == [] and pull.status == PullStatus.NO_NEW_MESSAGE
    assert notify.has_message is False
    assert broker.hold_table.total == 0


async def test_one_message_wakes_one_held_pop_of_the_group(tmp_path) -> None:
    async with running_broker(fast_broker_config(tmp_path), LoopClock()) as broker:
        await _topic(broker)
        held = [asyncio.create_task(broker.pop(_pop(3000, max_messages=1))) for _ in range(4)]
        await _held(broker, 4)
        await broker.send([Message("t", b"one")])
        await asyncio.sleep(0.05)
        done = [t for t in held if t.done()]
        assert len(done) == 1 and len(done[0].result().messages) == 1
        assert broker.hold_table.total == 3
        # three at once: each woken pop takes one and passes the wake on
        await broker.send([Message("t", f"m{i}".encode()) for i in range(3)], 0)
        results = await asyncio.wait_for(asyncio.gather(*held), 2)
        assert sorted(len(r.messages) for r in results) == [1, 1, 1, 1]
        assert broker.hold_table.total == 0


async def test_notify_respects_tag_filter(tmp_path) -> None:
    async with running_broker(fast_broker_config(tmp_path), LoopClock()) as broker:
        await _topic(broker)
        await broker.send([Message("t", b"b", tag="B")])
        only_a = NotifyRequest("g", "t", filter=FilterExpression("A"))
        assert (await broker.notify(only_a)).has_message is False
        waiter = asyncio.create_task(
            broker.notify(NotifyRequest("g", "t", poll_time_ms=3000, filter=FilterExpression("A")))
        )
        await _held(broker, 1)
        await broker.send([Message("t", b"b2", tag="B")])
        await asyncio.sleep(0.05)
        assert not waiter.done()
        await broker.send([Message("t", b"a", tag="A")])
        assert (await asyncio.wait_for(waiter, 1)).has_message is True


async def test_notify_decides_from_the_index_without_reading_messages(
    tmp_path, monkeypatch
) -> None:
    async with running_broker(fast_broker_config(tmp_path), LoopClock()) as broker:
        await _topic(broker)
        await broker.send([Message("t", b"a", tag="A"), Message("t", b"b", tag="B")], 2)

        def no_fetch(*args: object, **kwargs: object) -> None:
            raise AssertionError("notify must not fetch and decode records")

        with monkeypatch.context() as patch:
            patch.setattr("popmq.broker.store.reads.fetch_messages", no_fetch)
            assert (await broker.notify(NotifyRequest("g", "t"))).has_message is True
            only_c = NotifyRequest("g", "t", filter=FilterExpression("C"))
            assert (await broker.notify(only_c)).has_message is False
            only_b = NotifyRequest("g", "t", filter=FilterExpression("B"))
            assert (await broker.notify(only_b)).has_message is True
        popped = await broker.pop(_pop(0, filter=FilterExpression("B")))
        assert [p.message.body for p in popped.messages] == [b"b"]
        with monkeypatch.context() as patch:
            patch.setattr("popmq.broker.store.reads.fetch_messages", no_fetch)
            # g's B is in flight (and g's cursor passed A); another group sees both.
            assert (await broker.notify(only_b)).has_message is False
            assert (await broker.notify(NotifyRequest("g", "t"))).has_message is False
            assert (await broker.notify(NotifyRequest("other", "t"))).has_message is True
        everything = await broker.pop(PopRequest("other", "t", invisible_time_ms=10_000))
        assert [p.message.body for p in everything.messages] == [b"a", b"b"]
        assert (await broker.notify(NotifyRequest("other", "t"))).has_message is False
