"""The notification hub: long polls of one proxy share one notification per broker and group."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from popmq.broker.contract.types import PopRequest, PopResult
from popmq.proxy.longpoll import hub as hub_module
from popmq.proxy.longpoll.calls import BrokerCalls
from popmq.proxy.longpoll.hub import NotificationHub, Subscription
from popmq.proxy.longpoll.notify import NotifyStrategy
from popmq.proxy.metrics import ProxyMetrics
from support.tasks import assert_no_tasks_beyond

from .fake_broker import FakeBroker
from .helpers import make_request, sample, wait_until

# Virtual time (looptime): sleeps and deadlines take no real time, timing asserts are exact.
pytestmark = pytest.mark.looptime


def _strategy(metrics: ProxyMetrics) -> NotifyStrategy:
    return NotifyStrategy(BrokerCalls(metrics), metrics, probe_false_empty=False)


def _pops(brokers: list[FakeBroker]) -> int:
    return sum(b.calls.count("pop") for b in brokers)


def _receives(
    strategy: NotifyStrategy, brokers: list[FakeBroker], count: int, **request: Any
) -> list[asyncio.Task[Any]]:
    return [
        asyncio.create_task(strategy.receive(brokers, make_request(5_000, **request)))
        for _ in range(count)
    ]


async def _subscribed(strategy: NotifyStrategy, brokers: list[FakeBroker], polls: int) -> None:
    """Every long poll is past its first pop and subscribed; every channel holds."""
    await wait_until(lambda: _pops(brokers) == polls and all(b.held == 1 for b in brokers))
    await wait_until(lambda: strategy.hub.held() == len(brokers))


async def _finish(tasks: list[asyncio.Task[Any]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_many_long_polls_hold_one_notification_per_broker(
    metrics: ProxyMetrics, fakes: list[FakeBroker]
) -> None:
    strategy = _strategy(metrics)
    before = asyncio.all_tasks()
    polls = _receives(strategy, fakes, 20)
    await _subscribed(strategy, fakes, 20)
    assert [b.calls.count("notify") for b in fakes] == [1, 1, 1, 1]  # not 20 each
    assert sample(metrics, "popmq_proxy_held_notification_tasks") == 4
    assert strategy.hub.channels == 4
    await _finish(polls)
    # The last long poll out cancelled every notification, and waited until it was gone.
    assert all(b.held == 0 for b in fakes)
    assert strategy.hub.channels == 0
    assert sample(metrics, "popmq_proxy_held_notification_tasks") == 0
    await assert_no_tasks_beyond(before)


async def test_one_message_is_popped_once_by_the_oldest_long_poll_not_about_to_end(
    metrics: ProxyMetrics, fakes: list[FakeBroker], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not a poll about to end (less than ENDING_S left): a message it pops as its client's
    poll ends reaches nobody (it is handed back, again and again). Those get a signal only
    when nobody else waits, the most time left first."""
    # Every wait counts in full (no share of it), so the 800 ms and 500 ms polls are about to
    # end from their start; the share is tested below.
    monkeypatch.setattr(hub_module, "ENDING_SHARE", 1.0)
    strategy = _strategy(metrics)
    polls: list[asyncio.Task[Any]] = []
    # Subscribed in this order, 10 ms apart; the 800 ms and 500 ms polls are about to end.
    for count, poll_ms in enumerate([800, 9_000, 5_000, 500, 7_000], start=1):
        polls.append(asyncio.create_task(strategy.receive(fakes, make_request(poll_ms))))
        await wait_until(lambda n=count: _pops(fakes) == n)
        await asyncio.sleep(0.01)
    await _subscribed(strategy, fakes, 5)
    served: list[int] = []
    for _ in range(len(polls)):
        pops = fakes[2].calls.count("pop")
        fakes[2].put(1)
        pending = [p for p in polls if not p.done()]
        done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        assert len(done) == 1
        (winner,) = done
        assert [m.message.store_host for m in winner.result()] == ["b2"]
        assert fakes[2].calls.count("pop") == pops + 1  # popped once, by the one signalled
        served.append(polls.index(winner))
        await wait_until(lambda: fakes[2].held == 1 or all(p.done() for p in polls))
    # The oldest with time left first (9 s, 5 s, 7 s), then those about to end (800, 500 ms).
    assert served == [1, 2, 4, 0, 3]
    await _finish(polls)


async def test_a_pop_that_leaves_more_behind_passes_the_signal_on(
    metrics: ProxyMetrics, fakes: list[FakeBroker]
) -> None:
    strategy = _strategy(metrics)
    polls = _receives(strategy, fakes, 6, max_messages=2)
    await _subscribed(strategy, fakes, 6)
    first_pops = fakes[1].calls.count("pop")
    fakes[1].put(7)  # four pops of at most 2: four long polls served, two keep waiting
    await wait_until(lambda: sum(p.done() for p in polls) == 4)
    got = sorted(len(p.result()) for p in polls if p.done())
    assert got == [1, 2, 2, 2]
    assert fakes[1].visible == []
    assert fakes[1].calls.count("pop") == first_pops + 4  # no empty pop: exactly the pops needed
    await _finish(polls)
    assert all(b.held == 0 for b in fakes)


async def test_a_long_poll_whose_batch_is_full_passes_the_signal_on(
    metrics: ProxyMetrics, fakes: list[FakeBroker]
) -> None:
    strategy = _strategy(metrics)
    first = _receives(strategy, fakes, 1, max_messages=1)[0]
    await wait_until(lambda: _pops(fakes) == 1)
    second = _receives(strategy, fakes, 1, max_messages=1)[0]
    await _subscribed(strategy, fakes, 2)
    fakes[0].put(1)
    fakes[3].put(1)  # both signals go to the oldest first; its batch of 1 takes only one
    async with asyncio.timeout(1):
        a, b = await asyncio.gather(first, second)
    assert sorted(m.message.store_host for m in a + b) == ["b0", "b3"]
    assert (len(a), len(b)) == (1, 1)
    assert _pops(fakes) == 2 + 2


async def test_a_long_poll_with_room_in_its_batch_takes_every_signal_queued_for_it(
    metrics: ProxyMetrics, fakes: list[FakeBroker]
) -> None:
    """Two brokers report while the oldest long poll waits: both signals go to it, and with
    room in its batch it pops both brokers (one receive for the two, not one each); the
    younger long poll gets nothing and no pop is spent on its behalf."""
    strategy = _strategy(metrics)
    first = _receives(strategy, fakes, 1, max_messages=8)[0]
    await wait_until(lambda: _pops(fakes) == 1)
    second = _receives(strategy, fakes, 1, max_messages=8)[0]
    await _subscribed(strategy, fakes, 2)
    fakes[0].put(2)
    fakes[3].put(3)
    async with asyncio.timeout(1):
        got = await first
    assert sorted(m.message.store_host for m in got) == ["b0"] * 2 + ["b3"] * 3
    assert _pops(fakes) == 2 + 2  # the first pops, then one pop per signal
    assert not second.done()  # still waiting: nothing was there for it
    await _finish([second])


async def test_the_signal_goes_on_when_the_chosen_long_poll_is_cancelled(
    metrics: ProxyMetrics, fakes: list[FakeBroker]
) -> None:
    strategy = _strategy(metrics)
    # The most time left: the signal goes to it first.
    chosen = asyncio.create_task(strategy.receive(fakes, make_request(9_000)))
    await wait_until(lambda: _pops(fakes) == 1)
    others = _receives(strategy, fakes, 2)
    await _subscribed(strategy, fakes, 3)
    # The chosen long poll's pop hangs until its client goes away.
    broker = fakes[1]
    gate = asyncio.Event()

    async def pop_stuck(request: PopRequest) -> PopResult:
        gate.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    broker.pop = pop_stuck  # type: ignore[method-assign]
    broker.put(1)
    await gate.wait()
    del broker.pop  # later pops are the fake's own again
    chosen.cancel()
    await asyncio.gather(chosen, return_exceptions=True)
    # Its signal went on at once to the next subscriber, which pops the message.
    async with asyncio.timeout(1):
        done, _ = await asyncio.wait(others, return_when=asyncio.FIRST_COMPLETED)
    assert done == {others[0]}
    assert [m.message.store_host for m in others[0].result()] == ["b1"]
    await _finish(others)


async def test_a_shorter_long_poll_leaving_keeps_the_others_notification(
    metrics: ProxyMetrics, fakes: list[FakeBroker]
) -> None:
    strategy = _strategy(metrics)
    short = asyncio.create_task(strategy.receive(fakes, make_request(100)))
    long = _receives(strategy, fakes, 1)[0]
    await _subscribed(strategy, fakes, 2)
    assert await short == []  # its deadline
    assert all(b.held == 1 for b in fakes)  # still held for the long poll
    fakes[3].put(1)
    async with asyncio.timeout(1):
        assert [m.message.store_host for m in await long] == ["b3"]


async def test_deadlines_of_later_subscribers_extend_the_held_notification(
    metrics: ProxyMetrics,
) -> None:
    broker = FakeBroker("b")
    strategy = _strategy(metrics)
    first = asyncio.create_task(strategy.receive([broker], make_request(80)))
    await wait_until(lambda: broker.held == 1)
    second = asyncio.create_task(strategy.receive([broker], make_request(400)))
    assert await first == []
    # The notification asked for the first poll's time answered "no" and was re-armed for
    # the second: a message now still reaches it.
    await wait_until(lambda: broker.calls.count("notify") == 2)
    broker.put(1)
    async with asyncio.timeout(1):
        assert len(await second) == 1


async def test_subscriptions_directly(metrics: ProxyMetrics) -> None:
    """The hub's contract on its own: one signal at a time, hand-off, re-arm, no leaks."""
    broker = FakeBroker("b")
    hub = NotificationHub(BrokerCalls(metrics))
    pop = PopRequest(group="g", topic="t", max_messages=1)
    deadline = asyncio.get_running_loop().time() + 5
    signalled: list[int] = []

    def subscriber(index: int) -> Callable[[Subscription], bool]:
        def on_signal(sub: Subscription) -> bool:
            signalled.append(index)
            return True

        return on_signal

    subs = [hub.subscribe(broker, pop, deadline, subscriber(i)) for i in range(3)]
    other_group = hub.subscribe(broker, PopRequest(group="h", topic="t"), deadline, subscriber(9))
    await wait_until(lambda: broker.held == 2)  # one per group
    broker.put(1)
    await wait_until(lambda: signalled == [0, 9])
    assert broker.held == 0  # no notification held while the signal is out
    assert subs[0].holds_signal
    # The holder leaves without popping: the next one gets it.
    await hub.leave([subs[0]])
    assert signalled == [0, 9, 1]
    # It pops and leaves one more behind: the signal goes on once more.
    broker.visible.clear()
    subs[1].used(rest_num=1)
    assert signalled == [0, 9, 1, 2]
    # An empty pop: nobody holds the signal, the notification is armed again.
    subs[2].missed()
    assert not any(sub.holds_signal for sub in subs)
    await wait_until(lambda: broker.held == 1)
    other_group.pass_on()  # nobody else in that group: it re-arms too
    await wait_until(lambda: broker.held == 2)
    subs[1].pass_on()  # not holding a signal: ignored
    assert signalled == [0, 9, 1, 2]
    await hub.leave([*subs[1:], other_group])
    assert broker.held == 0
    assert hub.channels == 0
    await hub.aclose()


async def test_long_polls_that_leave_do_not_pile_up_in_the_choice_of_who_is_signalled(
    metrics: ProxyMetrics,
) -> None:
    """Thousands of short polls coming and going beside a long one leave nothing behind in
    the channel, and the signal goes to the oldest poll not about to end."""
    broker = FakeBroker("b")
    hub = NotificationHub(BrokerCalls(metrics))
    pop = PopRequest(group="g", topic="t", max_messages=1)
    now = asyncio.get_running_loop().time()
    signalled: list[str] = []

    def on_signal(name: str) -> Callable[[Subscription], bool]:
        return lambda sub: signalled.append(name) is None

    stays = hub.subscribe(broker, pop, now + 30, on_signal("stays"))
    for _ in range(2_000):  # each leaves before anything arrives
        hub.unsubscribe(hub.subscribe(broker, pop, now + 1, on_signal("short")))
    assert list(stays.channel.subscribers) == [stays]
    late = hub.subscribe(broker, pop, now + 60, on_signal("late"))
    await wait_until(lambda: broker.held == 1)
    broker.put(1)
    await wait_until(lambda: signalled == ["stays"])  # the oldest, with 30 s left
    await hub.leave([stays, late])
    await hub.aclose()


async def test_random_arrivals_and_departures_leave_no_message_behind(
    metrics: ProxyMetrics, fakes: list[FakeBroker]
) -> None:
    """Consumers loop long receives (some clients give up mid-poll) while messages land on
    random brokers: each is delivered within milliseconds -- never left waiting for a poll to
    end while others wait -- exactly once, and nothing leaks."""
    import random
    import time

    rng = random.Random(7)
    strategy = _strategy(metrics)
    latencies: dict[str, float] = {}
    total = 60

    async def consumer(index: int) -> None:
        while True:
            request = make_request(rng.choice((10_000, 20_000)), max_messages=rng.randint(1, 3))
            receive = asyncio.create_task(strategy.receive(fakes, request))
            if index % 3 == 0 and rng.random() < 0.5:  # a client that goes away
                await asyncio.sleep(rng.random() * 0.05)
                receive.cancel()
            try:
                got = await receive
            except asyncio.CancelledError:
                if asyncio.current_task().cancelling():  # type: ignore[union-attr]
                    raise  # the test stops this consumer
                await asyncio.sleep(0.3)  # its client comes back later
                continue
            now_ms = time.time() * 1000
            for m in got:
                assert m.message.message_id not in latencies, "delivered twice"
                latencies[m.message.message_id] = now_ms - m.message.store_timestamp_ms

    consumers = [asyncio.create_task(consumer(i)) for i in range(12)]
    await asyncio.sleep(0.05)
    for _ in range(total):
        rng.choice(fakes).put(rng.choice((1, 1, 2)) if len(latencies) < total else 1)
        await asyncio.sleep(rng.random() * 0.01)
    sent = sum(1 for b in fakes for _ in b.inflight) + sum(len(b.visible) for b in fakes)
    await wait_until(lambda: len(latencies) >= sent and not any(b.visible for b in fakes), 8)
    await _finish(consumers)
    await strategy.aclose()
    # Polls last 10-20 s: a message missed by the hub would wait for one to end. Delivery takes
    # milliseconds; the bound leaves a loaded 2-core host seconds of slack (1.2 s was seen).
    assert max(latencies.values()) < 5_000, sorted(latencies.values())[-5:]
    assert strategy.hub.channels == 0
    assert sample(metrics, "popmq_proxy_held_notification_tasks") == 0


async def test_sparse_messages_are_shared_by_consumers_whose_polls_have_time_left(
    metrics: ProxyMetrics,
) -> None:
    """Two consumers of a group re-poll as soon as they get a message; messages come one at
    a time, far apart. Each poll has seconds left, so none is about to end: the one waiting
    longest gets the next message. (Most time left first gave every message to whoever had
    just re-polled: one consumer got them all while the other waited out its whole poll.)"""
    broker = FakeBroker("b")
    strategy = _strategy(metrics)
    got = {"a": 0, "b": 0}

    async def consumer(name: str) -> None:
        while True:
            messages = await strategy.receive([broker], make_request(20_000))
            got[name] += len(messages)
            await asyncio.sleep(0.01)  # processing, then the next long poll

    clients = [asyncio.create_task(consumer("a"))]
    await wait_until(lambda: broker.held == 1)
    clients.append(asyncio.create_task(consumer("b")))
    await wait_until(lambda: broker.calls.count("pop") == 2)
    for sent in range(1, 21):
        broker.put(1)
        await wait_until(lambda n=sent: sum(got.values()) == n)
        await asyncio.sleep(0.5)  # sparse: both consumers are waiting again long before
    await _finish(clients)
    assert min(got.values()) >= 8, got


async def test_short_polls_are_not_all_about_to_end(metrics: ProxyMetrics) -> None:
    """With 1 s polls (bench e2e's) every poll had less than ENDING_S left from its start, so
    each signal went to the most time left, the poll that re-polled last: one consumer got
    every message and the others' polls ended empty. A poll counts as ending only in the last
    ENDING_SHARE of its wait, so the oldest waiting poll gets the message."""
    broker = FakeBroker("b")
    strategy = _strategy(metrics)
    got = {"a": 0, "b": 0}

    async def consumer(name: str) -> None:
        while True:
            messages = await strategy.receive([broker], make_request(1_000))
            got[name] += len(messages)
            await asyncio.sleep(0.01)

    clients = [asyncio.create_task(consumer("a"))]
    await wait_until(lambda: broker.held == 1)
    clients.append(asyncio.create_task(consumer("b")))
    await wait_until(lambda: broker.calls.count("pop") == 2)
    for sent in range(1, 21):
        broker.put(1)
        await wait_until(lambda n=sent: sum(got.values()) == n)
        await asyncio.sleep(0.05)  # both wait again, far from their polls' ends
    await _finish(clients)
    assert min(got.values()) >= 8, got


async def test_signalled_tells_a_channel_whose_signal_is_out(metrics: ProxyMetrics) -> None:
    # The channel key (broker, group, topic, filter text and kind, fifo) is built in one place:
    # a lookup built another way found no channel, and a signalled broker looked idle.
    broker = FakeBroker("b")
    hub = NotificationHub(BrokerCalls(metrics))
    pop = PopRequest(group="g", topic="t", max_messages=1)
    deadline = asyncio.get_running_loop().time() + 5
    sub = hub.subscribe(broker, pop, deadline, lambda sub: True)
    await wait_until(lambda: broker.held == 1)
    assert not hub.signalled(broker, pop)
    broker.put(1)
    await wait_until(lambda: sub.holds_signal)
    assert hub.signalled(broker, PopRequest(group="g", topic="t", max_messages=8))
    assert not hub.signalled(broker, PopRequest(group="h", topic="t"))
    await hub.leave([sub])
    await hub.aclose()


async def test_long_polls_may_leave_after_the_hub_closed(metrics: ProxyMetrics) -> None:
    """Teardown in either order: the proxy's strategy may close the hub while long polls are
    still on their way out; their unsubscribe must not raise (it raised KeyError), hand a
    signal on, or arm a notification on the closed hub."""
    broker = FakeBroker("b")
    hub = NotificationHub(BrokerCalls(metrics))
    pop = PopRequest(group="g", topic="t", max_messages=1)
    deadline = asyncio.get_running_loop().time() + 5
    signalled: list[Subscription] = []

    def on_signal(sub: Subscription) -> bool:
        signalled.append(sub)
        return True

    subs = [hub.subscribe(broker, pop, deadline, on_signal) for _ in range(2)]
    alone = hub.subscribe(broker, PopRequest(group="h", topic="t"), deadline, on_signal)
    await wait_until(lambda: broker.held == 2)
    broker.put(1)
    await wait_until(lambda: len(signalled) == 2)  # one signal out per group
    assert signalled == [subs[0], alone]
    before = asyncio.all_tasks()
    await hub.aclose()
    assert broker.held == 0
    await hub.leave([subs[0]])  # held the signal: not handed on (nobody is served now)
    assert signalled == [subs[0], alone] and hub.held() == 0
    hub.unsubscribe(subs[1])
    await hub.leave([alone, subs[1]])  # the last of a channel, and one already gone
    assert hub.channels == 0 and broker.held == 0
    await assert_no_tasks_beyond(before)
