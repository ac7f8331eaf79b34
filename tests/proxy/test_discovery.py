"""The proxy's view of broker groups followed in etcd (proxy/discovery.py) and what a group
without a leader means for routes and FIFO sends (proxy/cluster.py). Fake ports; the real
processes are in tests/coord/test_ha_processes.py."""

from __future__ import annotations

import pytest
from popmq.broker.contract.errors import BrokerUnavailableError, Code
from popmq.broker.contract.types import TopicInfo
from popmq.proxy.cluster import BrokerCluster
from popmq.proxy.discovery import GroupFollower, LeaderlessPort, NoLeaderError

from popmq.coord.directory import GroupView, Leader, read_groups, status_json
from popmq.coord.keys import encode
from popmq.coord.store import KeyValue


class FakePort:
    def __init__(self, name: str, address: str = "", queues: int = 4) -> None:
        self.name, self.address, self.queues = name, address, queues
        self.closed = False

    async def get_topic(self, topic: str, auto_create: bool = False) -> TopicInfo:
        return TopicInfo(topic, self.queues)

    async def aclose(self) -> None:
        self.closed = True


def view(name: str, address: str | None, epoch: int = 5, draining: bool = False) -> GroupView:
    leader = Leader(f"{name}-0", address, epoch) if address else None
    return GroupView(name, leader=leader, draining=draining)


def follower() -> tuple[BrokerCluster, GroupFollower, list[FakePort]]:
    cluster = BrokerCluster([], dynamic=True)
    made: list[FakePort] = []

    def make(group: str, address: str) -> FakePort:
        made.append(FakePort(group, address))
        return made[-1]

    return cluster, GroupFollower(cluster, make), made  # type: ignore[arg-type]


async def test_groups_come_move_and_go() -> None:
    cluster, groups, made = follower()
    groups.apply({"a": view("a", None)})
    assert cluster.names == []  # never led: not routable yet
    groups.apply({"a": view("a", "h:1"), "b": view("b", "h:2")})
    assert cluster.names == ["a", "b"]
    assert cluster.port("a").address == "h:1"  # type: ignore[attr-defined]
    groups.apply({"a": view("a", "h:3", epoch=9), "b": view("b", "h:2")})
    assert cluster.port("a").address == "h:3"  # type: ignore[attr-defined]
    await groups.close_retired(all_now=True)
    assert made[0].closed and not made[1].closed and not made[2].closed
    groups.apply({"b": view("b", "h:2")})  # a's keys are gone: removed
    assert cluster.names == ["b"]
    assert list(cluster.group_views) == ["b"]  # what cluster status shows


async def test_a_group_without_leader_refuses_with_ha_not_available() -> None:
    cluster, groups, _ = follower()
    seen: list[tuple[str, bool | None]] = []
    groups._on_leader = lambda group, up: seen.append((group, up))
    groups.apply({"a": view("a", "h:1")})
    groups.apply({"a": view("a", None)})
    assert seen == [("a", True), ("a", False)]
    port = cluster.port("a")
    assert isinstance(port, LeaderlessPort)
    with pytest.raises(NoLeaderError) as refused:
        await port.send([])
    assert refused.value.code == Code.HA_NOT_AVAILABLE
    assert isinstance(refused.value, BrokerUnavailableError)  # the proxy's fallbacks apply


async def test_fifo_group_keeps_its_queue_while_its_broker_has_no_leader() -> None:
    """Issue 19: a message group is hashed over every queue the topic had, so while one
    group has no leader its message groups wait (retryable) instead of moving."""
    cluster, groups, _ = follower()
    groups.apply({"a": view("a", "h:1"), "b": view("b", "h:2")})
    route = await cluster.route("t")
    chosen = {g: cluster.pick_queue(route, g) for g in (f"mg{i}" for i in range(40))}
    on_a = [g for g, q in chosen.items() if q.broker == "a"]
    assert on_a
    groups.apply({"a": view("a", None), "b": view("b", "h:2")})
    with pytest.raises(NoLeaderError):
        await cluster.port("a").get_topic("t")
    cluster.note_unavailable("a")  # as a failed call does
    route = await cluster.route("t")
    assert set(route.brokers) == {"a", "b"}  # a's queues stay in the route
    assert {g: cluster.pick_queue(route, g) for g in chosen} == chosen
    # Unordered sends skip the group without a leader.
    assert {cluster.pick_queue(route).broker for _ in range(20)} == {"b"}


async def test_draining_group_takes_no_new_sends() -> None:
    cluster, groups, _ = follower()
    groups.apply({"a": view("a", "h:1"), "b": view("b", "h:2", draining=True)})
    route = await cluster.route("t")
    assert set(route.brokers) == {"a", "b"}  # still routed: its messages are consumed
    assert {cluster.pick_queue(route).broker for _ in range(20)} == {"a"}
    assert {cluster.pick_queue(route, f"g{i}").broker for i in range(20)} == {"a"}
    groups.apply({"a": view("a", "h:1"), "b": view("b", "h:2")})
    assert cluster.draining == frozenset()


def test_status_json_shape() -> None:
    p = "/popmq/"
    kvs = [
        KeyValue(b"/popmq/groups/a/leader", encode({"name": "a-0", "address": "h:1"}), 7, 7),
        KeyValue(b"/popmq/groups/a/in_sync", encode({"members": ["a-0", "a-1"]}), 7, 9),
        KeyValue(b"/popmq/groups/a/members/a-0", encode({"name": "a-0", "address": "h:1"}), 3, 3),
        KeyValue(b"/popmq/groups/a/members/a-1", encode({"name": "a-1", "address": "h:2"}), 4, 4),
        KeyValue(b"/popmq/groups/a/lag/a-1", encode({"lag_bytes": 10, "lag_s": 0.5}), 9, 9),
        KeyValue(b"/popmq/groups/b/in_sync", encode({"members": ["b-0"]}), 2, 2),
    ]
    assert status_json(read_groups(p, kvs)) == {
        "groups": [
            {"name": "a", "leader": "a-0", "epoch": 7, "in_sync": ["a-0", "a-1"],
             "draining": False, "nodes": [
                 {"name": "a-0", "role": "leader", "lag_bytes": 0, "lag_s": 0.0},
                 {"name": "a-1", "role": "follower", "lag_bytes": 10, "lag_s": 0.5}]},
            {"name": "b", "leader": None, "epoch": 0, "in_sync": ["b-0"], "draining": False,
             "nodes": [{"name": "b-0", "role": "down", "lag_bytes": None, "lag_s": None}]},
        ]
    }  # fmt: skip
