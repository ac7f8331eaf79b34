"""Role switches inside running nodes (the way an election drives them): two ReplicatedNodes
in this process, on 127.0.0.1, switch leader and follower and lose nothing."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest
from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.types import Message, PopRequest
from popmq.broker.replication.node import ReplicatedNode
from popmq.broker.replication.role import GroupRole, StaticRoleSource
from prometheus_client import generate_latest

from popmq.config import BrokerConfig, ReplicationConfig, StoreConfig

pytestmark = pytest.mark.wallclock


def config(root: Path, node: str) -> BrokerConfig:
    return BrokerConfig(
        name="broker-s", port=0, data_dir=root / node, store=StoreConfig(flush="async"),
        replication=ReplicationConfig(mode="sync", min_in_sync=2, node=node),
    )  # fmt: skip


async def eventually(check: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, what
        await anyio.sleep(0.05)


async def test_a_switchover_both_ways_keeps_every_message(tmp_path: Path) -> None:
    roles_a = StaticRoleSource(GroupRole(1, "broker-s", "", is_leader=True))
    a = ReplicatedNode(config(tmp_path, "s0"), roles_a)
    await a.start()
    address_a = f"127.0.0.1:{a.bound_port}"
    roles_b = StaticRoleSource(GroupRole(1, "broker-s", address_a, is_leader=False))
    b = ReplicatedNode(config(tmp_path, "s1"), roles_b)
    await b.start()
    address_b = f"127.0.0.1:{b.bound_port}"
    try:
        async with anyio.create_task_group() as group:
            group.start_soon(a.run)
            group.start_soon(b.run)
            await eventually(lambda: a.leader is not None and a.leader.in_sync.size == 2,
                             "s1 never came in sync")  # fmt: skip
            assert roles_a.reports[-1] == (1, frozenset({"s0", "s1"}))
            assert a.leader is not None
            [s1] = a.leader.status()
            assert s1.name == "s1" and s1.in_sync and s1.lag_bytes == 0
            scraped = generate_latest(a.metrics_registry()).decode()
            assert 'popmq_ha_in_sync_size{group="broker-s",node="s0"} 2.0' in scraped
            assert 'popmq_ha_is_leader{group="broker-s",node="s0"} 1.0' in scraped
            assert 'popmq_ha_epoch{group="broker-s",node="s0"} 1.0' in scraped
            assert 'popmq_ha_replication_lag_bytes{follower="s1",group="broker-s"} 0.0' in scraped
            follower_page = generate_latest(b.metrics_registry()).decode()
            assert 'popmq_ha_is_leader{group="broker-s",node="s1"} 0.0' in follower_page
            assert 'popmq_ha_has_leader{group="broker-s",node="s1"} 1.0' in follower_page
            assert "popmq_broker_replication" not in scraped + follower_page  # one set only
            assert "rocketmq_messages_in_total" in scraped or "popmq_broker_" in scraped
            await a.port.create_topic("T", 1)
            await a.port.send([Message(topic="T", body=f"e1-{i}".encode()) for i in range(5)])
            with pytest.raises(RefusedError) as refused:
                await b.port.send([Message(topic="T", body=b"no")])
            assert refused.value.code == Code.HA_NOT_AVAILABLE

            # switchover: s1 leads epoch 2, s0 follows it
            await roles_a.set(GroupRole(2, "broker-s", address_b, is_leader=False))
            await roles_b.set(GroupRole(2, "broker-s", address_b, is_leader=True))
            await eventually(lambda: b.leader is not None and b.leader.in_sync.size == 2,
                             "s0 never followed s1")  # fmt: skip
            await b.port.send([Message(topic="T", body=b"e2-0")])
            with pytest.raises(RefusedError):
                await a.port.pop(PopRequest("G", "T"))  # s0 follows now: no pops
            popped = await b.port.pop(PopRequest("G", "T", max_messages=32))
            bodies = [m.message.body for m in popped.messages]
            assert bodies == [*(f"e1-{i}".encode() for i in range(5)), b"e2-0"]
            assert roles_b.reports[-1] == (2, frozenset({"s0", "s1"}))
            group.cancel_scope.cancel()
    finally:
        await a.aclose()
        await b.aclose()


class FenceableRoles(StaticRoleSource):
    """A role source whose leader can be fenced (its lease deadline passed) without a role
    change, as the election does until it knows the key is lost."""

    def __init__(self, role: GroupRole) -> None:
        super().__init__(role)
        self.fenced = False

    def current(self) -> GroupRole:
        role = super().current()
        if self.fenced and role.is_leader:
            return GroupRole(role.epoch, role.leader_name, role.leader_address, False)
        return role


async def test_a_fenced_leader_answers_nothing_and_serves_again_on_the_same_broker(
    tmp_path: Path,
) -> None:
    roles = FenceableRoles(GroupRole(1, "broker-s", "", is_leader=True))
    settings = config(tmp_path, "s0").model_copy(
        update={"replication": ReplicationConfig(mode="sync", min_in_sync=1, node="s0")}
    )
    node = ReplicatedNode(settings, roles)
    await node.start()
    try:
        async with anyio.create_task_group() as group:
            group.start_soon(node.run)
            await eventually(lambda: node.port.leading is not None, "s0 never led")
            await node.port.create_topic("T", 1)
            await node.port.send([Message(topic="T", body=b"before")])
            leading = node.port.leading
            roles.fenced = True  # the lease deadline passed: no reads, no writes
            for call in (node.port.get_topic("T"), node.port.pop(PopRequest("G", "T")),
                         node.port.send([Message(topic="T", body=b"no")])):  # fmt: skip
                with pytest.raises(RefusedError) as refused:
                    await call
                assert refused.value.code == Code.HA_NOT_AVAILABLE
            roles.fenced = False  # a late keepalive found the lease alive
            assert node.port.leading is leading  # the same broker, never closed
            popped = await node.port.pop(PopRequest("G", "T", max_messages=32))
            assert [m.message.body for m in popped.messages] == [b"before"]
            group.cancel_scope.cancel()
    finally:
        await node.aclose()


async def test_a_first_leader_that_fails_to_start_may_campaign_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new group's first leader records its epoch before its broker starts: a crash during
    that start must not leave the group's only in-sync node without a history (it would never
    campaign again: completeness.py)."""
    from popmq.broker.core import Broker
    from popmq.broker.replication.completeness import holds_whole_copy

    async def crash(self: Broker) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(Broker, "start", crash)
    settings = config(tmp_path, "s0")
    node = ReplicatedNode(settings, StaticRoleSource(GroupRole(5, "broker-s", "", True)))
    await node.start()
    try:
        async with anyio.create_task_group() as group:
            group.start_soon(node.run)
            await eventually(lambda: "cannot play its role" in node.port.refusal, "no failure")
            group.cancel_scope.cancel()
    finally:
        await node.aclose()
    assert holds_whole_copy(settings.data_dir)
