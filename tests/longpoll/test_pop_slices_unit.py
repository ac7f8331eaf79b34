"""The baseline pop and the MNS-style slices against fake brokers."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
from popmq.proxy.longpoll.calls import PROBE_SHARE_S, BrokerCalls
from popmq.proxy.longpoll.pop import PopStrategy
from popmq.proxy.longpoll.slices import SlicesStrategy
from popmq.proxy.metrics import ProxyMetrics
from support.tasks import assert_no_tasks_beyond

from popmq.clock import LoopClock

from .fake_broker import FakeBroker
from .helpers import make_request, sample, wait_until

# Virtual time (looptime): sleeps and deadlines take no real time, timing asserts are exact.
pytestmark = pytest.mark.looptime


def _pop(metrics: ProxyMetrics, probe: bool = False) -> PopStrategy:
    calls = BrokerCalls(metrics, clock=LoopClock())
    return PopStrategy(calls, metrics, probe_false_empty=probe)


def _slices(metrics: ProxyMetrics, quota: int = 8, slice_ms: int = 40) -> SlicesStrategy:
    calls = BrokerCalls(metrics)
    return SlicesStrategy(calls, metrics, quota=quota, slice_ms=slice_ms, probe_false_empty=False)


async def test_pop_holds_on_the_preferred_broker_and_wakes_on_arrival(
    metrics: ProxyMetrics, fakes: list[FakeBroker]
) -> None:
    receive = asyncio.create_task(_pop(metrics).receive(fakes, make_request(5_000, "b2")))
    await wait_until(lambda: fakes[2].held == 1)
    assert [b.held for b in fakes] == [0, 0, 1, 0]
    fakes[2].put(1)
    got = await receive
    assert [m.message.store_host for m in got] == ["b2"]
    assert sample(metrics, "popmq_proxy_broker_rpcs_total", kind="pop") == 1


async def test_pop_round_robins_without_a_preferred_broker(
    metrics: ProxyMetrics, fakes: list[FakeBroker]
) -> None:
    strategy = _pop(metrics)
    for broker in fakes:
        broker.put(1)
    hosts = [
        (await strategy.receive(fakes, make_request(1_000)))[0].message.store_host for _ in fakes
    ]
    assert sorted(hosts) == ["b0", "b1", "b2", "b3"]


async def test_pop_answers_a_false_empty_and_the_probe_counts_it(
    metrics: ProxyMetrics, fakes: list[FakeBroker]
) -> None:
    strategy = _pop(metrics, probe=True)
    loop = asyncio.get_running_loop()
    receive = asyncio.create_task(strategy.receive(fakes, make_request(120, "b0")))
    await wait_until(lambda: fakes[0].held == 1)
    fakes[3].put(1)  # on another broker: the baseline cannot see it
    started = loop.time()
    assert await receive == []
    assert loop.time() - started > 0.05  # it waited out the poll
    await strategy.aclose()
    assert sample(metrics, "popmq_proxy_empty_responses_total", strategy="pop") == 1
    assert sample(metrics, "popmq_proxy_false_empty_responses_total", strategy="pop") == 1


async def test_empty_answers_of_one_group_share_one_probe(
    metrics: ProxyMetrics, fakes: list[FakeBroker]
) -> None:
    # 10 consumers of one group, all held on b0, answer empty at about the same time while b2
    # holds a message: one probe of the brokers answers for all ten, each a false empty.
    strategy = _pop(metrics, probe=True)
    fakes[2].put(1)
    receives = [
        asyncio.create_task(strategy.receive(fakes, make_request(80, "b0"))) for _ in range(10)
    ]
    assert await asyncio.gather(*receives) == [[]] * 10
    await strategy.aclose()
    assert sample(metrics, "popmq_proxy_broker_rpcs_total", kind="notify_probe") == len(fakes)
    assert sample(metrics, "popmq_proxy_false_empty_responses_total", strategy="pop") == 10


async def test_a_probe_is_shared_only_within_its_window(
    metrics: ProxyMetrics, fakes: list[FakeBroker]
) -> None:
    # The sharing window runs on the injected clock: here virtual, so the gap is exact.
    strategy = _pop(metrics, probe=True)
    fakes[2].put(1)
    assert await strategy.receive(fakes, make_request(80, "b0")) == []
    await asyncio.sleep(PROBE_SHARE_S / 2)
    assert await strategy.receive(fakes, make_request(80, "b0")) == []  # shares the first
    await asyncio.sleep(PROBE_SHARE_S * 2)
    assert await strategy.receive(fakes, make_request(80, "b0")) == []  # probes anew
    await strategy.aclose()
    assert sample(metrics, "popmq_proxy_broker_rpcs_total", kind="notify_probe") == 2 * len(fakes)
    assert sample(metrics, "popmq_proxy_false_empty_responses_total", strategy="pop") == 3


async def test_finished_probes_of_idle_groups_are_forgotten(
    metrics: ProxyMetrics, fakes: list[FakeBroker]
) -> None:
    # Thousands of one-off groups must not leave their probes in memory.
    strategy = _pop(metrics, probe=True)
    for i in range(20):
        request = make_request(80, "b0")
        request = replace(request, pop=replace(request.pop, group=f"g{i}"))
        assert await strategy.receive(fakes, request) == []
    await asyncio.sleep(PROBE_SHARE_S * 2)
    assert await strategy.receive(fakes, make_request(80, "b0")) == []
    assert len(strategy.calls._probes) == 1  # only the newest group's
    await strategy.aclose()


async def test_pop_cancel_leaves_nothing_held(
    metrics: ProxyMetrics, fakes: list[FakeBroker]
) -> None:
    before = asyncio.all_tasks()
    receive = asyncio.create_task(_pop(metrics).receive(fakes, make_request(5_000)))
    await wait_until(lambda: sum(b.held for b in fakes) == 1)
    receive.cancel()
    await asyncio.gather(receive, return_exceptions=True)
    assert sum(b.held for b in fakes) == 0
    await assert_no_tasks_beyond(before)
    latency = "popmq_proxy_receive_duration_seconds_count"
    assert sample(metrics, latency, strategy="pop", result="cancelled") == 1


async def test_pop_retries_a_full_hold_table(
    metrics: ProxyMetrics, fakes: list[FakeBroker]
) -> None:
    fakes[0].polling_full = 2
    receive = asyncio.create_task(_pop(metrics).receive(fakes, make_request(5_000, "b0")))
    await wait_until(lambda: fakes[0].held == 1, limit_s=2.0)
    assert fakes[0].calls.count("pop-held") == 3
    fakes[0].put(1)
    assert len(await receive) == 1


async def test_pop_with_zero_poll_time_answers_at_once(
    metrics: ProxyMetrics, fakes: list[FakeBroker]
) -> None:
    assert await _pop(metrics).receive(fakes, make_request(0, "b1")) == []
    assert fakes[1].calls == ["pop"]


async def test_slices_visit_brokers_in_turn_then_find_the_message(
    metrics: ProxyMetrics, fakes: list[FakeBroker]
) -> None:
    fakes[2].put(1)
    got = await _slices(metrics).receive(fakes, make_request(5_000, "b0"))
    assert [m.message.store_host for m in got] == ["b2"]
    assert [len(b.calls) for b in fakes] == [1, 1, 1, 0]
    assert sample(metrics, "popmq_proxy_first_pop_hits_total", strategy="slices") == 0


async def test_slices_end_in_one_long_poll_after_the_quota(
    metrics: ProxyMetrics, fakes: list[FakeBroker]
) -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    receive = asyncio.create_task(_slices(metrics, quota=2).receive(fakes, make_request(400, "b0")))
    # two 40 ms slices (b0, b1), then the final long poll on b2 for the rest
    await wait_until(lambda: fakes[2].held == 1)
    assert loop.time() - started >= 0.075
    fakes[3].put(1)  # the final poll is bound to b2: a false empty, as in MNS
    assert await receive == []
    assert 0.39 <= loop.time() - started < 0.5
    assert [b.calls for b in fakes] == [["pop-held"], ["pop-held"], ["pop-held"], []]


async def test_slices_finish_on_the_deadline(
    metrics: ProxyMetrics, fakes: list[FakeBroker]
) -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await _slices(metrics, slice_ms=30).receive(fakes, make_request(100)) == []
    assert 0.095 <= loop.time() - started < 0.2
    assert sum(b.held for b in fakes) == 0
