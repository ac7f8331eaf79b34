"""A receive whose broker group is leaderless or down ends empty (or finds the new leader), in
every strategy: issue 19's "a receive in flight may end empty; no receive may fail".

The chaos runs counted 27-179 failed receives per leader kill: with one group behind the
proxy, its only broker answering HA_NOT_AVAILABLE (a group without a leader, a fenced
leader) or nothing at all (the killed leader's link) failed the client's receive.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from popmq.broker.contract.errors import BrokerUnavailableError, Code, RefusedError
from popmq.proxy.cluster import BrokerCluster
from popmq.proxy.discovery import LeaderlessPort
from popmq.proxy.longpoll.adaptive import AdaptiveStrategy
from popmq.proxy.longpoll.base import LongPollStrategy
from popmq.proxy.longpoll.calls import BrokerCalls
from popmq.proxy.longpoll.notify import NotifyStrategy
from popmq.proxy.longpoll.pop import PopStrategy
from popmq.proxy.longpoll.slices import SlicesStrategy
from popmq.proxy.metrics import ProxyMetrics

from popmq.clock import LoopClock

from .fake_broker import FakeBroker
from .helpers import make_request, sample

pytestmark = pytest.mark.looptime

Make = Callable[[ProxyMetrics], LongPollStrategy]


def _calls(metrics: ProxyMetrics) -> BrokerCalls:
    return BrokerCalls(metrics, clock=LoopClock())


STRATEGIES: dict[str, tuple[Make, str]] = {
    "notify": (lambda m: NotifyStrategy(_calls(m), m, probe_false_empty=False), "notify"),
    "pop": (lambda m: PopStrategy(_calls(m), m, probe_false_empty=False), "pop"),
    "slices": (
        lambda m: SlicesStrategy(_calls(m), m, slice_ms=40, probe_false_empty=False),
        "slices",
    ),
    # Adaptive in each of its modes: notify while quiet, pop past its threshold (0 here).
    "adaptive-notify": (
        lambda m: AdaptiveStrategy(_calls(m), m, probe_false_empty=False),
        "adaptive",
    ),
    "adaptive-pop": (
        lambda m: AdaptiveStrategy(_calls(m), m, threshold_rps=0.0, probe_false_empty=False),
        "adaptive",
    ),
}

# Made per test: a module-level instance kept its last traceback, and with it a receive's
# frames (a later test in the same worker counted them as leaked Custody objects).
OUTAGES: dict[str, Callable[[], Exception]] = {
    "leaderless": lambda: RefusedError(Code.HA_NOT_AVAILABLE, "this node no longer leads"),
    "down": lambda: BrokerUnavailableError("g1", "connection refused"),
}


@pytest.fixture(params=sorted(STRATEGIES))
def strategy(request: pytest.FixtureRequest, metrics: ProxyMetrics) -> tuple[LongPollStrategy, str]:
    make, label = STRATEGIES[request.param]
    return make(metrics), label


@pytest.mark.parametrize("outage", sorted(OUTAGES))
async def test_a_receive_on_an_unavailable_only_broker_ends_empty_at_its_deadline(
    strategy: tuple[LongPollStrategy, str], metrics: ProxyMetrics, outage: str
) -> None:
    receiving, label = strategy
    broker = FakeBroker("g1")
    broker.fail_pop = broker.fail_notify = OUTAGES[outage]()  # type: ignore[assignment]
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await receiving.receive([broker], make_request(2_000)) == []
    assert loop.time() - started == pytest.approx(2.0, abs=0.01)  # held its poll time
    assert sample(metrics, "popmq_proxy_unavailable_receives_total", strategy=label) == 1
    assert broker.calls.count("pop") + broker.calls.count("pop-held") > 1  # it kept asking
    await receiving.aclose()


async def test_a_receive_moves_to_the_new_leader_as_soon_as_it_is_routed(
    strategy: tuple[LongPollStrategy, str], metrics: ProxyMetrics
) -> None:
    # The group is leaderless when the receive starts; 1.5 s later discovery routes it to the
    # new leader, which holds a message: the receive gets it then, not at its deadline.
    receiving, _ = strategy
    cluster = BrokerCluster([LeaderlessPort("g1")], dynamic=True, clock=LoopClock())
    leader = FakeBroker("g1")
    leader.put(1)
    request = make_request(10_000)
    request.source = cluster
    loop = asyncio.get_running_loop()

    async def elect() -> None:
        await asyncio.sleep(1.5)
        cluster.put_port(leader)  # type: ignore[arg-type]

    started = loop.time()
    election = asyncio.create_task(elect())
    got = await receiving.receive(cluster.ports, request)
    await election
    assert [m.message.store_host for m in got] == ["g1"]
    assert loop.time() - started == pytest.approx(1.5, abs=0.01)
    await receiving.aclose()


@pytest.mark.parametrize(
    "code", [Code.FORBIDDEN, Code.ILLEGAL_FILTER_EXPRESSION, Code.ILLEGAL_CONSUMER_GROUP]
)
async def test_a_refused_request_still_fails(
    strategy: tuple[LongPollStrategy, str], metrics: ProxyMetrics, code: Code
) -> None:
    receiving, label = strategy
    broker = FakeBroker("g1")
    broker.fail_pop = RefusedError(code, "the client's own mistake")
    with pytest.raises(RefusedError) as err:
        await receiving.receive([broker], make_request(2_000))
    assert err.value.code is code
    assert sample(metrics, "popmq_proxy_unavailable_receives_total", strategy=label) == 0
    await receiving.aclose()


@pytest.mark.parametrize("make", ["notify", "adaptive-notify"])
async def test_a_receive_waiting_for_notifications_follows_a_new_leader(
    metrics: ProxyMetrics, make: str
) -> None:
    # The receive is past its first pop, waiting for the old leader's notification, when the
    # group elects a new leader holding a message: it pops the new leader at once instead of
    # waiting on the old port until its deadline.
    receiving = STRATEGIES[make][0](metrics)
    old = FakeBroker("g1")
    cluster = BrokerCluster([old], dynamic=True, clock=LoopClock())  # type: ignore[list-item]
    new = FakeBroker("g1")
    new.put(1)
    request = make_request(10_000)
    request.source = cluster
    loop = asyncio.get_running_loop()

    async def elect() -> None:
        await asyncio.sleep(1.0)
        cluster.put_port(new)  # type: ignore[arg-type]

    started = loop.time()
    election = asyncio.create_task(elect())
    got = await receiving.receive(cluster.ports, request)
    await election
    assert [m.message.store_host for m in got] == ["g1"] and new.visible == []
    assert loop.time() - started == pytest.approx(1.0, abs=0.01)
    assert old.held == 0 and new.held == 0
    await receiving.aclose()
