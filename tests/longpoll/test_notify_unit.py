"""Pop with notify against fake brokers that answer on cue."""

from __future__ import annotations

import asyncio

import pytest
from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.types import PopResult
from popmq.proxy.longpoll.calls import BrokerCalls
from popmq.proxy.longpoll.notify import NotifyStrategy
from popmq.proxy.metrics import ProxyMetrics
from support.tasks import assert_no_tasks_beyond

from .fake_broker import FakeBroker
from .helpers import make_request, sample, wait_until

# Virtual time (looptime): sleeps and deadlines take no real time, timing asserts are exact.
pytestmark = pytest.mark.looptime


def _strategy(
    metrics: ProxyMetrics, probe: bool = False, fallback_ms: int = 10_000
) -> NotifyStrategy:
    calls = BrokerCalls(metrics, fallback_invisible_ms=fallback_ms)
    return NotifyStrategy(calls, metrics, probe_false_empty=probe)


async def test_first_pop_serves_a_backlog_without_notifications(
    metrics: ProxyMetrics, fakes: list[FakeBroker]
) -> None:
    fakes[0].put(3)
    got = await _strategy(metrics).receive(fakes, make_request(5_000, preferred="b0"))
    assert len(got) == 3
    assert sample(metrics, "popmq_proxy_first_pop_hits_total", strategy="notify") == 1
    assert sample(metrics, "popmq_proxy_pop_with_notify_total") == 0
    assert all("notify" not in b.calls for b in fakes)


async def test_message_on_another_broker_arrives_within_milliseconds(
    metrics: ProxyMetrics, fakes: list[FakeBroker]
) -> None:
    strategy = _strategy(metrics)
    loop = asyncio.get_running_loop()
    before = asyncio.all_tasks()
    receive = asyncio.create_task(strategy.receive(fakes, make_request(5_000, preferred="b0")))
    await wait_until(lambda: all(b.held == 1 for b in fakes))  # one notification per broker
    assert sample(metrics, "popmq_proxy_held_notification_tasks") == 4
    sent = loop.time()
    fakes[2].put(1)
    got = await receive
    assert loop.time() - sent < 0.05
    assert [m.message.store_host for m in got] == ["b2"]
    assert sample(metrics, "popmq_proxy_pop_with_notify_total") == 1
    assert sample(metrics, "popmq_proxy_held_notification_tasks") == 0
    assert all(b.held == 0 for b in fakes)
    await assert_no_tasks_beyond(before)  # every notification task is gone


async def test_loser_of_a_race_rearms_and_keeps_waiting(
    metrics: ProxyMetrics, fakes: list[FakeBroker]
) -> None:
    receive = asyncio.create_task(_strategy(metrics).receive(fakes, make_request(5_000)))
    await wait_until(lambda: all(b.held == 1 for b in fakes))
    fakes[1].steal_next_pops = 1  # another proxy pops the message first
    fakes[1].put(1)
    await wait_until(lambda: fakes[1].calls.count("notify") == 2)  # re-armed
    assert not receive.done()
    assert fakes[1].visible == []
    fakes[3].put(1)
    got = await receive
    assert [m.message.store_host for m in got] == ["b3"]


async def test_a_refused_consume_pop_ends_the_receive_with_the_refusal(
    metrics: ProxyMetrics, fakes: list[FakeBroker]
) -> None:
    # The broker signals a message but refuses to pop it for this request (a topic it will not
    # serve): every re-armed signal would be refused again. The receive ends with the refusal
    # at once; it used to retry until its deadline, logging a warning per attempt.
    loop = asyncio.get_running_loop()
    request = make_request(5_000, preferred="b0")  # the first pop goes to b0
    receive = asyncio.create_task(_strategy(metrics).receive(fakes, request))
    await wait_until(lambda: all(b.held == 1 for b in fakes))
    fakes[1].fail_pop = RefusedError(Code.ILLEGAL_TOPIC, "not served here")
    sent = loop.time()
    fakes[1].put(1)
    with pytest.raises(RefusedError) as err:
        await receive
    assert err.value.code == Code.ILLEGAL_TOPIC
    assert loop.time() - sent < 0.05
    assert fakes[1].calls.count("pop") == 1  # the consume pop, not retried
    assert all(b.held == 0 for b in fakes)


async def test_a_broker_that_has_not_made_the_group_yet_does_not_end_the_receive(
    metrics: ProxyMetrics, fakes: list[FakeBroker]
) -> None:
    # Topics and groups are created per broker on first use, within a rate ("retry later",
    # answered with the not-found code): one broker's CONSUMER_GROUP_NOT_FOUND says nothing
    # of the request or of the other brokers. The receive ended with it; it waits on.
    request = make_request(5_000, preferred="b0")
    receive = asyncio.create_task(_strategy(metrics).receive(fakes, request))
    await wait_until(lambda: all(b.held == 1 for b in fakes))
    fakes[1].fail_pop = RefusedError(
        Code.CONSUMER_GROUP_NOT_FOUND, "group 'g' does not exist and was not created: retry later"
    )
    fakes[1].put(1)
    await wait_until(lambda: fakes[1].calls.count("pop") >= 1)
    assert not receive.done()
    fakes[2].put(1)
    got = await receive
    assert [m.message.store_host for m in got] == ["b2"]


async def test_deadline_returns_empty_and_leaves_nothing_held(
    metrics: ProxyMetrics, fakes: list[FakeBroker]
) -> None:
    loop = asyncio.get_running_loop()
    before = asyncio.all_tasks()
    started = loop.time()
    got = await _strategy(metrics).receive(fakes, make_request(150))
    elapsed = loop.time() - started
    assert got == []
    assert 0.14 <= elapsed < 0.25
    assert sample(metrics, "popmq_proxy_empty_responses_total", strategy="notify") == 1
    assert all(b.held == 0 for b in fakes)
    await assert_no_tasks_beyond(before)


async def test_cancelling_the_receive_cancels_every_notification(
    metrics: ProxyMetrics, fakes: list[FakeBroker]
) -> None:
    before = asyncio.all_tasks()
    receive = asyncio.create_task(_strategy(metrics).receive(fakes, make_request(5_000)))
    await wait_until(lambda: all(b.held == 1 for b in fakes))
    receive.cancel()
    await asyncio.gather(receive, return_exceptions=True)
    assert receive.cancelled()
    assert all(b.held == 0 for b in fakes)
    assert sample(metrics, "popmq_proxy_held_notification_tasks") == 0
    await assert_no_tasks_beyond(before)


async def test_messages_popped_as_the_client_leaves_become_visible_again(
    metrics: ProxyMetrics, fakes: list[FakeBroker]
) -> None:
    strategy = _strategy(metrics)
    receive = asyncio.create_task(strategy.receive(fakes, make_request(5_000)))
    await wait_until(lambda: all(b.held == 1 for b in fakes))

    def client_leaves(result: PopResult) -> None:
        # The cancel lands after the broker answered but before the long poll resumes.
        if result.messages:
            asyncio.get_running_loop().call_soon(receive.cancel)

    fakes[2].on_pop_answer = client_leaves
    fakes[2].put(2)
    await asyncio.gather(receive, return_exceptions=True)
    assert receive.cancelled()
    await strategy.aclose()
    assert len(fakes[2].visible) == 2  # handed back, visible again at once
    assert len(fakes[2].handed_back) == 2
    assert fakes[2].changes == []  # not a change of invisible time: that counts an attempt
    assert sample(metrics, "popmq_proxy_released_messages_total", outcome="handed_back") == 2


async def test_release_to_a_broker_without_hand_back_changes_the_invisible_time(
    metrics: ProxyMetrics,
) -> None:
    broker = FakeBroker("older", knows_hand_back=False)
    strategy = _strategy(metrics)
    receive = asyncio.create_task(strategy.receive([broker], make_request(5_000)))
    await wait_until(lambda: broker.held == 1)
    broker.on_pop_answer = lambda r: (
        r.messages and asyncio.get_running_loop().call_soon(receive.cancel)
    )
    broker.put(2)
    await asyncio.gather(receive, return_exceptions=True)
    await strategy.aclose()
    assert broker.calls.count("hand_back") == 1  # one call for the batch, then the fallback
    assert broker.changes == [0, 0]
    assert len(broker.visible) == 2
    assert sample(metrics, "popmq_proxy_released_messages_total", outcome="visible_now") == 2


async def test_release_falls_back_to_the_brokers_minimum_invisible_time(
    metrics: ProxyMetrics,
) -> None:
    broker = FakeBroker("strict", min_invisible_ms=10_000, knows_hand_back=False)
    strategy = _strategy(metrics, fallback_ms=10_000)
    receive = asyncio.create_task(strategy.receive([broker], make_request(5_000)))
    await wait_until(lambda: broker.held == 1)
    broker.on_pop_answer = lambda r: (
        r.messages and asyncio.get_running_loop().call_soon(receive.cancel)
    )
    broker.put(1)
    await asyncio.gather(receive, return_exceptions=True)
    await strategy.aclose()
    assert broker.changes == [0, 10_000]  # 0 refused; 10 s instead of the remaining 60 s
    assert sample(metrics, "popmq_proxy_released_messages_total", outcome="shortened") == 1


async def test_one_consume_at_a_time_returns_one_batch(
    metrics: ProxyMetrics, fakes: list[FakeBroker]
) -> None:
    # A batch of 1: full after the first pop (a batch with room pops every broker that
    # reported: test_hub_unit, the long poll with room in its batch).
    receive = asyncio.create_task(
        _strategy(metrics).receive(fakes, make_request(5_000, max_messages=1))
    )
    await wait_until(lambda: all(b.held == 1 for b in fakes))
    for broker in fakes:
        broker.put(1)  # every broker reports at once
    got = await receive
    assert len(got) == 1
    pops_after_first = sum(b.calls.count("pop") for b in fakes) - 1
    assert pops_after_first == 1  # the other results were never popped
    assert sum(len(b.visible) for b in fakes) == 3


async def test_a_failing_broker_does_not_stop_the_others(
    metrics: ProxyMetrics, fakes: list[FakeBroker]
) -> None:
    fakes[0].fail_notify = RefusedError(Code.INTERNAL_ERROR, "disk on fire")
    receive = asyncio.create_task(_strategy(metrics).receive(fakes, make_request(5_000)))
    await wait_until(lambda: all(b.held == 1 for b in fakes[1:]))
    fakes[3].put(1)
    assert len(await receive) == 1
    errors = "popmq_proxy_broker_rpc_errors_total"
    assert sample(metrics, errors, kind="notify", code="INTERNAL_ERROR") >= 1


async def test_full_hold_table_is_retried(metrics: ProxyMetrics, fakes: list[FakeBroker]) -> None:
    fakes[1].polling_full = 1
    receive = asyncio.create_task(_strategy(metrics).receive(fakes, make_request(5_000)))
    await wait_until(lambda: all(b.held == 1 for b in fakes), limit_s=2.0)
    fakes[1].put(1)
    assert len(await receive) == 1


async def test_a_true_empty_answer_is_not_a_false_empty(
    metrics: ProxyMetrics, fakes: list[FakeBroker]
) -> None:
    strategy = _strategy(metrics, probe=True)
    assert await strategy.receive(fakes, make_request(30)) == []
    await strategy.aclose()
    assert sample(metrics, "popmq_proxy_empty_responses_total", strategy="notify") == 1
    assert sample(metrics, "popmq_proxy_false_empty_responses_total", strategy="notify") == 0
    assert sample(metrics, "popmq_proxy_broker_rpcs_total", kind="notify_probe") == 4


async def test_an_idle_receive_holds_a_timer_not_a_cancel_scope_and_ends_at_its_deadline(
    metrics: ProxyMetrics, fakes: list[FakeBroker]
) -> None:
    import anyio

    strategy = _strategy(metrics)
    loop = asyncio.get_running_loop()
    started = loop.time()
    receive = asyncio.create_task(strategy.receive(fakes, make_request(5_000)))
    await wait_until(lambda: all(b.held == 1 for b in fakes))
    # What drain() would end: the poll's own wait (10,000 idle polls held a scope each).
    assert len(strategy._held) == 1
    assert not isinstance(next(iter(strategy._held)), anyio.CancelScope)
    assert await receive == []
    assert loop.time() - started == pytest.approx(5.0, abs=0.001)
    assert not strategy._held
    assert sample(metrics, "popmq_proxy_held_notification_tasks") == 0


async def test_drain_ends_an_idle_notify_receive_at_once(
    metrics: ProxyMetrics, fakes: list[FakeBroker]
) -> None:
    strategy = _strategy(metrics)
    loop = asyncio.get_running_loop()
    receive = asyncio.create_task(strategy.receive(fakes, make_request(5_000)))
    await wait_until(lambda: all(b.held == 1 for b in fakes))
    drained = loop.time()
    strategy.drain()
    assert await receive == []
    assert loop.time() - drained < 0.01
    assert all(b.held == 0 for b in fakes)
