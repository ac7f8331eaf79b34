"""The adaptive switch, driven by a fake clock, and the strategy factory."""

from __future__ import annotations

import pytest
from popmq.proxy.longpoll import make_strategy
from popmq.proxy.longpoll.adaptive import AdaptiveStrategy
from popmq.proxy.longpoll.calls import BrokerCalls
from popmq.proxy.longpoll.notify import NotifyStrategy
from popmq.proxy.longpoll.pop import PopStrategy
from popmq.proxy.longpoll.slices import SlicesStrategy
from popmq.proxy.metrics import ProxyMetrics

from popmq.clock import ManualClock
from popmq.config import ProxyConfig

from .fake_broker import FakeBroker
from .helpers import make_request, sample

# Virtual time (looptime): sleeps and deadlines take no real time, timing asserts are exact.
pytestmark = pytest.mark.looptime


def _adaptive(metrics: ProxyMetrics, now: ManualClock) -> AdaptiveStrategy:
    return AdaptiveStrategy(
        BrokerCalls(metrics), metrics, threshold_rps=10, window_s=1.0, hysteresis=0.5,
        probe_false_empty=False, clock=now, warmup_s=1.0,
    )  # fmt: skip


def _mode(metrics: ProxyMetrics) -> str:
    active = [m for m in ("notify", "pop") if sample(metrics, "popmq_proxy_adaptive_mode", mode=m)]
    assert len(active) == 1
    return active[0]


def test_adaptive_switches_both_ways_with_hysteresis(metrics: ProxyMetrics) -> None:
    now = ManualClock(1000.0)
    strategy = _adaptive(metrics, now)
    assert _mode(metrics) == "notify"
    assert strategy.decide() == "notify"  # the first request: 1/s over the 1 s warm-up
    now.now_s += 2.0  # past the warm-up, and that request left the window
    modes = [strategy.decide() for _ in range(9)]
    assert set(modes) == {"notify"}  # 9 requests in a 1 s window: 9/s < 10/s
    assert strategy.decide() == "pop"  # the 10th reaches the threshold
    assert _mode(metrics) == "pop"
    assert sample(metrics, "popmq_proxy_pop_request_rate") == 10
    # 7 requests in the next window (7/s) sit between 5/s and 10/s: hysteresis keeps pop
    now.now_s += 1.2
    for _ in range(7):
        strategy.rate.add()
    assert strategy.decide() == "pop"
    now.now_s += 1.2
    assert strategy.decide() == "notify"  # 1/s < 5/s
    assert _mode(metrics) == "notify"
    assert sample(metrics, "popmq_proxy_adaptive_switches_total", mode="pop") == 1
    assert sample(metrics, "popmq_proxy_adaptive_switches_total", mode="notify") == 1


async def test_adaptive_runs_the_chosen_strategy(metrics: ProxyMetrics) -> None:
    now = ManualClock(50.0)
    strategy = _adaptive(metrics, now)
    brokers = [FakeBroker("a"), FakeBroker("b")]
    brokers[1].put(1)
    # quiet: notify finds the message on b although the first pop went to a
    got = await strategy.receive(brokers, make_request(500, preferred="a"))
    assert len(got) == 1
    assert sample(metrics, "popmq_proxy_pop_with_notify_total") == 1
    strategy.rate.add(20)
    brokers[0].put(1)
    notifications = sum(b.calls.count("notify") for b in brokers)
    assert len(await strategy.receive(brokers, make_request(500, preferred="a"))) == 1
    assert strategy.mode == "pop"
    assert brokers[0].calls[-1] == "pop-held"  # plain pop long poll, no notification
    assert sum(b.calls.count("notify") for b in brokers) == notifications
    assert sample(metrics, "popmq_proxy_long_polls_total", strategy="adaptive") == 2


@pytest.mark.parametrize(
    ("name", "kind"),
    [("pop", PopStrategy), ("slices", SlicesStrategy), ("notify", NotifyStrategy),
     ("adaptive", AdaptiveStrategy)],
)  # fmt: skip
def test_make_strategy_follows_the_config(name: str, kind: type) -> None:
    config = ProxyConfig(strategy=name, slices_quota=3, slice_ms=77, notify_threshold_rps=42)
    strategy = make_strategy(config, ProxyMetrics())
    assert isinstance(strategy, kind)
    assert strategy.name == name
    if isinstance(strategy, SlicesStrategy):
        assert (strategy.quota, strategy.slice_ms) == (3, 77)
    if isinstance(strategy, AdaptiveStrategy):
        assert strategy.threshold_rps == 42
