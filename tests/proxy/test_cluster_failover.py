"""Issue 9, defect 3: no proxy path depends on one particular broker (BrokerCluster)."""

from __future__ import annotations

import base64

import anyio
import pytest
from popmq.broker.contract.errors import BrokerUnavailableError, Code
from popmq.broker.contract.types import (
    AckEntry,
    AckEntryResult,
    GroupConfig,
    QueueInfo,
    TopicInfo,
)
from popmq.proxy import cluster as cluster_module
from popmq.proxy.cluster import BrokerCluster
from popmq.proxy.core.handles import Handles
from proxy_support import NoRenewals

from popmq.config import ProxyConfig
from popmq.coord.directory import GroupView


class FakePort:
    def __init__(self, name: str, max_attempts: int) -> None:
        self.name = name
        self.up = True
        self.max_attempts = max_attempts
        self.calls = 0

    async def get_group(self, name: str) -> GroupConfig:
        self.calls += 1
        if not self.up:
            raise BrokerUnavailableError(self.name, "connection refused")
        return GroupConfig(name, max_attempts=self.max_attempts)

    async def aclose(self) -> None:
        pass


async def test_group_settings_from_any_live_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cluster_module, "CACHE_TTL_S", 0.0)  # every call asks the brokers
    first, second = FakePort("a", 3), FakePort("b", 3)
    cluster = BrokerCluster([first, second])  # type: ignore[list-item]
    assert (await cluster.group("g")).max_attempts == 3
    first.up = False
    assert (await cluster.group("g")).max_attempts == 3  # from the second broker
    assert cluster.is_down("a") is False  # marks expire at once with a TTL of 0
    second.up = False
    stale = await cluster.group("g")  # nobody answers: the last copy seen
    assert stale.max_attempts == 3
    with pytest.raises(BrokerUnavailableError):
        await cluster.group("never-seen")


async def test_a_broker_seen_down_is_asked_last() -> None:
    first, second = FakePort("a", 1), FakePort("b", 2)
    cluster = BrokerCluster([first, second])  # type: ignore[list-item]
    first.up = False
    assert (await cluster.group("g1")).max_attempts == 2
    assert cluster.is_down("a")
    first.up = True  # still marked down for a few seconds: not asked first
    calls = first.calls
    assert (await cluster.group("g2")).max_attempts == 2
    assert first.calls == calls
    assert [p.name for p in cluster.live_ports()] == ["b"]


class TopicPort:
    """A broker that knows topic T (2 queues)."""

    def __init__(self, name: str) -> None:
        self.name = name

    async def get_topic(self, topic: str, auto_create: bool = False) -> TopicInfo:
        return TopicInfo(topic, 2, [QueueInfo(0, 0, 0), QueueInfo(1, 0, 0)], "NORMAL")

    async def aclose(self) -> None:
        pass


async def test_a_broker_marked_down_that_answers_a_route_lookup_is_routed() -> None:
    """A leader change: the old leader's request link was lost (the group is marked down for a
    few seconds), the new leader answers the route lookup. That answer is the route; it was
    dropped as "only known-but-down brokers", and receives failed with TOPIC_NOT_FOUND."""
    cluster = BrokerCluster([TopicPort("ga")])  # type: ignore[list-item]
    cluster.note_unavailable("ga")  # as after "request link lost"
    route = await cluster.route("T")
    assert route.brokers == {"ga": 2}
    assert not cluster.is_down("ga")


class AckPort:
    """A broker group's leader for acks: a dead one loses the request link."""

    def __init__(self, name: str, alive: bool) -> None:
        self.name = name
        self.alive = alive
        self.acked: list[str] = []
        self.tried = anyio.Event()

    async def ack(self, group: str, topic: str, entries: list[AckEntry]) -> list[AckEntryResult]:
        self.tried.set()
        if not self.alive:
            raise BrokerUnavailableError(self.name, "request link lost")
        self.acked += [e.receipt_handle for e in entries]
        return [AckEntryResult(e.receipt_handle, e.message_id, Code.OK) for e in entries]

    async def aclose(self) -> None:
        pass


def _handle_of(broker: str) -> str:
    return "2." + base64.urlsafe_b64encode(broker.encode()).decode().rstrip("=") + ".k1.sealed"


@pytest.mark.parametrize("replicated", [True, False])
async def test_an_ack_caught_by_a_leader_change_goes_to_the_next_leader(replicated: bool) -> None:
    """bench failover counted acks failed at the client ("request link lost") when the leader
    of their group died: a replicated group's ack now waits for the next leader, which accepts
    the old one's handles; a broker of no replicated group fails the ack at once."""
    old, new = AckPort("ga", alive=False), AckPort("ga", alive=True)
    cluster = BrokerCluster([old])  # type: ignore[list-item]
    if replicated:
        cluster.group_views = {"ga": GroupView("ga")}
    handles = Handles(ProxyConfig(), cluster, NoRenewals())  # type: ignore[arg-type]
    handle = _handle_of("ga")
    results: list[AckEntryResult] = []

    async def ack() -> None:
        results.extend(await handles.ack("g", "T", [AckEntry(handle, "m1")]))

    async def elect() -> None:
        await old.tried.wait()
        cluster.put_port(new)  # type: ignore[arg-type]

    with anyio.fail_after(10):  # a failure bound only: the retry follows the change at once
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(ack)
            tasks.start_soon(elect)
    (result,) = results
    if replicated:
        assert (result.code, new.acked) == (Code.OK, [handle])
    else:
        assert result.code != Code.OK and new.acked == []
