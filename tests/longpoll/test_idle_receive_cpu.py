"""Guards for the per-receive Python work an idle receive does (issue 18's CPU bar; docs/
benchmarks.md, "Idle receive CPU, wave 11"): the usual case of each step takes its fast path,
counted in calls of the general path it skips. Virtual time."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest
from popmq.broker.contract.types import GroupConfig, PopRequest, TopicInfo
from popmq.broker.contract.watch import VisibilityWatch, WatchState
from popmq.proxy.admission import LongPollAdmission
from popmq.proxy.cluster import BrokerCluster
from popmq.proxy.core import receive as receive_module
from popmq.proxy.core.context import RequestContext
from popmq.proxy.core.receive import Receiver, ReceiveRequest
from popmq.proxy.longpoll import hub as hub_module
from popmq.proxy.longpoll import watches as watches_module
from popmq.proxy.longpoll.calls import BrokerCalls
from popmq.proxy.longpoll.hub import NotificationHub, Subscriber
from popmq.proxy.longpoll.notify import NotifyStrategy
from popmq.proxy.metrics import ProxyMetrics
from popmq.proxy.registry import ClientRegistry
from popmq.proxy.renewal import HandleRenewer

from popmq.clock import LoopClock
from popmq.config import ProxyConfig
from popmq.lifecycle import TaskOwner

from .fake_broker import FakeBroker

pytestmark = pytest.mark.looptime


class _Waiting(Subscriber):
    __slots__ = ()

    def on_signal(self, channel: hub_module.Channel) -> bool:
        return False


def _count(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> list[int]:
    calls = [0]
    original = getattr(owner, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    return calls


async def test_a_poll_joins_and_leaves_shared_channels_without_the_general_path(
    metrics: ProxyMetrics, monkeypatch: pytest.MonkeyPatch
) -> None:
    brokers = [FakeBroker(f"b{i}") for i in range(4)]
    hub = NotificationHub(BrokerCalls(metrics))
    pop = PopRequest(group="g", topic="t", max_messages=4)
    now = asyncio.get_running_loop().time()
    staying = _Waiting(now + 20, 4, now)
    hub.join(brokers, pop, staying)
    await asyncio.sleep(0.01)
    assert hub.held() == 4
    arms = _count(monkeypatch, hub_module.Channel, "arm")
    removes = _count(monkeypatch, hub_module.Channel, "remove")
    leaving = _Waiting(now + 30, 4, now)
    hub.join(brokers, pop, leaving)
    assert hub.part(brokers, pop, leaving) == []
    # Channels already armed and still wanted by another poll: no arm, no general removal.
    assert arms[0] == 0
    assert removes[0] == 0
    assert all(list(c.subscribers) == [staying] for c in hub._channels.values())
    assert all(c.latest == now + 30 for c in hub._channels.values())  # the join extended them
    # The last one out still cancels every notification (the general path).
    ending = hub.part(brokers, pop, staying)
    assert len(ending) == 4
    for job in ending:
        await job.wait()
    assert hub.channels == 0
    assert all(b.held == 0 for b in brokers)
    await hub.aclose()


class _Backend:
    def send_arm(self, watch: VisibilityWatch) -> bool:
        return True

    def send_cancel(self, watch: VisibilityWatch) -> None:
        pass


class _Watched(FakeBroker):
    watch_backend = _Backend()


def test_candidates_of_existing_watches_take_no_general_lookup(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    registry = watches_module.WatchRegistry()
    ports = [_Watched(f"b{i}") for i in range(4)]
    pop = PopRequest(group="g", topic="t")
    assert registry.candidates(ports, pop) == []  # made and armed: silent
    lookups = _count(monkeypatch, watches_module.WatchRegistry, "_get")
    assert registry.candidates(ports, pop) == []
    assert lookups[0] == 0
    watch = registry.get(ports[2], pop)
    assert watch is not None
    watch.state = WatchState.HAS  # its event came: that broker is a candidate
    assert registry.candidates(ports, pop) == [ports[2]]
    other = FakeBroker("x")  # no watch backend: always a candidate
    assert registry.candidates([*ports, other], pop) == [ports[2], other]


class _Leader(FakeBroker):
    async def get_topic(self, topic: str, *, auto_create: bool = False) -> TopicInfo:
        return TopicInfo(topic, 4)

    async def get_group(self, name: str) -> GroupConfig:
        return GroupConfig(name)


@dataclass(frozen=True)
class _Span:
    seconds: int
    nanos: int = 0


async def test_a_receive_plan_with_its_route_and_group_cached_asks_nothing_more(
    metrics: ProxyMetrics, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = BrokerCluster([_Leader(f"b{i}") for i in range(4)], clock=LoopClock())
    config = ProxyConfig()
    registry = ClientRegistry()
    strategy = NotifyStrategy(BrokerCalls(metrics, clock=LoopClock()), metrics)
    renewer = HandleRenewer(config, cluster, registry, metrics, TaskOwner("renew"))
    receiver = Receiver(
        config, cluster, strategy, LongPollAdmission(config, metrics), registry, renewer, metrics
    )
    request = ReceiveRequest("g", "t", batch_size=4, invisible_time=_Span(30), poll_time=_Span(6))
    context = RequestContext(client_id="c@1")
    first = await receiver.plan(request, context)
    group_lookups = _count(monkeypatch, BrokerCluster, "group")
    down_checks = _count(monkeypatch, BrokerCluster, "is_down")
    plan = await receiver.plan(request, context)
    assert group_lookups[0] == 0  # the cached group, without the single flight
    assert down_checks[0] == 0  # no broker known down: no check per broker
    assert [p.name for p in plan.brokers] == ["b0", "b1", "b2", "b3"]
    assert plan.long_poll.pop == first.long_poll.pop
    # The match-all filter is one shared object; a tag filter is still made and checked.
    assert plan.long_poll.pop.filter is receive_module.MATCH_ALL
    assert receive_module.filter_of("TAG", " a || b ").expression == "a || b"
    # A broker known down is still left out.
    monkeypatch.undo()
    cluster.note_unavailable("b1")
    assert [p.name for p in cluster.live_ports(["b0", "b1", "b2", "b3"])] == ["b0", "b2", "b3"]
