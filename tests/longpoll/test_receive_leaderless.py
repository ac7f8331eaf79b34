"""A receive planned while its topic's only broker group has no leader waits for the new one
within its poll time and ends empty if none comes (issue 19: no receive may fail during a
leader change). Before, the route lookup's HA_NOT_AVAILABLE failed the client's receive: a
leader change clears the proxy's route cache, so every receive of the leaderless seconds
looked the route up again. Virtual time."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest
from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.types import GroupConfig, TopicInfo
from popmq.proxy.admission import LongPollAdmission
from popmq.proxy.cluster import BrokerCluster
from popmq.proxy.core.context import RequestContext
from popmq.proxy.core.receive import Receiver, ReceiveRequest
from popmq.proxy.discovery import LeaderlessPort
from popmq.proxy.longpoll.calls import BrokerCalls
from popmq.proxy.longpoll.notify import NotifyStrategy
from popmq.proxy.metrics import ProxyMetrics
from popmq.proxy.registry import ClientRegistry
from popmq.proxy.renewal import HandleRenewer

from popmq.clock import LoopClock
from popmq.config import ProxyConfig
from popmq.lifecycle import TaskOwner

from .fake_broker import FakeBroker

pytestmark = pytest.mark.looptime


@dataclass(frozen=True)
class Span:
    seconds: int
    nanos: int = 0


class Leader(FakeBroker):
    """The group's new leader: it knows the topic and the group."""

    async def get_topic(self, topic: str, *, auto_create: bool = False) -> TopicInfo:
        if topic != "t":
            raise RefusedError(Code.TOPIC_NOT_FOUND, f"no topic {topic}")
        return TopicInfo(topic, 4)

    async def get_group(self, name: str) -> GroupConfig:
        return GroupConfig(name)


def _receiver(cluster: BrokerCluster, metrics: ProxyMetrics) -> Receiver:
    config = ProxyConfig()
    registry = ClientRegistry()
    strategy = NotifyStrategy(BrokerCalls(metrics, clock=LoopClock()), metrics,
                              probe_false_empty=False)  # fmt: skip
    renewer = HandleRenewer(config, cluster, registry, metrics, TaskOwner("renew"))
    admission = LongPollAdmission(config, metrics)
    return Receiver(config, cluster, strategy, admission, registry, renewer, metrics)


def _request(topic: str = "t") -> ReceiveRequest:
    return ReceiveRequest("g", topic, batch_size=4, invisible_time=Span(30), poll_time=Span(6))


async def test_a_receive_of_a_leaderless_group_ends_empty_at_its_poll_time() -> None:
    metrics = ProxyMetrics()
    cluster = BrokerCluster([LeaderlessPort("g1")], dynamic=True, clock=LoopClock())
    receiver = _receiver(cluster, metrics)
    loop = asyncio.get_running_loop()
    started = loop.time()
    plan = await receiver.plan(_request(), RequestContext(client_id="c@1"))
    assert await receiver.receive(plan) == []
    assert loop.time() - started == pytest.approx(6.0, abs=0.01)
    labels = {"strategy": "notify"}
    assert metrics.registry.get_sample_value("popmq_proxy_unavailable_receives_total", labels) == 1


async def test_a_receive_finds_the_new_leader_when_it_is_elected() -> None:
    metrics = ProxyMetrics()
    cluster = BrokerCluster([LeaderlessPort("g1")], dynamic=True, clock=LoopClock())
    receiver = _receiver(cluster, metrics)
    leader = Leader("g1")
    leader.put(1)
    loop = asyncio.get_running_loop()

    async def elect() -> None:
        await asyncio.sleep(1.0)
        cluster.put_port(leader)  # type: ignore[arg-type]

    election = asyncio.create_task(elect())
    started = loop.time()
    plan = await receiver.plan(_request(), RequestContext(client_id="c@1"))
    popped = await receiver.receive(plan)
    await election
    assert [m.message.store_host for m in popped] == ["g1"]
    assert loop.time() - started == pytest.approx(1.0, abs=0.01)
    assert plan.long_poll.poll_ms == pytest.approx(5_000, abs=10)  # what was left of 6 s


async def test_an_unknown_topic_still_fails_once_a_leader_answers() -> None:
    metrics = ProxyMetrics()
    cluster = BrokerCluster([Leader("g1")], dynamic=True, clock=LoopClock())  # type: ignore[list-item]
    with pytest.raises(RefusedError) as err:
        await _receiver(cluster, metrics).plan(_request("nope"), RequestContext(client_id="c@1"))
    assert err.value.code is Code.TOPIC_NOT_FOUND


async def test_a_receive_before_any_group_joined_waits_for_the_first_one() -> None:
    """A proxy following etcd that has no broker yet (review-s10b): the route lookup said
    TOPIC_NOT_FOUND and the receive failed at once, where a leaderless group's receive waits
    for its leader within its poll time."""
    metrics = ProxyMetrics()
    cluster = BrokerCluster([], dynamic=True, clock=LoopClock())
    receiver = _receiver(cluster, metrics)
    leader = Leader("g1")
    leader.put(1)
    loop = asyncio.get_running_loop()

    async def join() -> None:
        await asyncio.sleep(1.0)
        cluster.put_port(leader)  # type: ignore[arg-type]  # the first group's first leader

    joined = asyncio.create_task(join())
    started = loop.time()
    plan = await receiver.plan(_request(), RequestContext(client_id="c@1"))
    popped = await receiver.receive(plan)
    await joined
    assert [m.message.store_host for m in popped] == ["g1"]
    assert loop.time() - started == pytest.approx(1.0, abs=0.01)
