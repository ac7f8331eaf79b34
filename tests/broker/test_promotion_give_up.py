"""A node made leader that cannot take up the role (its promotion fails) gives the role back
through its role source, so the election picks another in-sync node, after closing what it
opened. It held the role before, refusing every call, and its group never failed over.

In process, no server, no etcd: the role source records the give-up and, as the election
does, publishes "no leader" for this node."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from popmq.broker.core import Broker
from popmq.broker.replication import node as node_module
from popmq.broker.replication.node import ReplicatedNode
from popmq.broker.replication.role import GroupRole, StaticRoleSource

from popmq.config import BrokerConfig, ReplicationConfig, StoreConfig

LEADER = GroupRole(7, "broker-s", "127.0.0.1:1", is_leader=True)


class ElectionLike(StaticRoleSource):
    """A give-up ends this node's leadership, as GroupMember.give_up does."""

    def __init__(self, role: GroupRole) -> None:
        super().__init__(role)
        self.gave_up = anyio.Event()
        self.served: list[bool] = []

    async def give_up(self, role: GroupRole, why: str, *, served: bool) -> None:
        await super().give_up(role, why, served=served)
        self.served.append(served)
        await self.set(GroupRole(role.epoch, "", "", is_leader=False))
        self.gave_up.set()


def config(root: Path) -> BrokerConfig:
    return BrokerConfig(
        name="broker-s", port=0, data_dir=root / "s0", store=StoreConfig(flush="async"),
        replication=ReplicationConfig(mode="sync", min_in_sync=2, node="s0"),
    )  # fmt: skip


async def _run_until_given_up(node: ReplicatedNode, roles: ElectionLike) -> None:
    async with anyio.create_task_group() as group:
        group.start_soon(node.run)
        with anyio.fail_after(30):  # a failure bound only: the give-up follows the failure
            await roles.gave_up.wait()
            while node.role is None or node.role.is_leader:  # noqa: ASYNC110 (no event)
                await anyio.sleep(0.01)
        group.cancel_scope.cancel()


async def test_a_leader_whose_store_cannot_open_gives_the_role_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def crash(self: Broker, **_: object) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(Broker, "start", crash)
    roles = ElectionLike(LEADER)
    node = ReplicatedNode(config(tmp_path), roles)
    await _run_until_given_up(node, roles)
    assert [(role.epoch, "disk gone" in why) for role, why in roles.given_up] == [(7, True)]
    assert roles.served == [False]  # nothing was acknowledged: its set may be put back
    assert node.port.leading is None


async def test_a_promotion_failing_after_the_store_opened_closes_it_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the promotion opened (the broker and its store) is closed before the role goes."""
    closed: list[Broker] = []
    real_aclose = Broker.aclose

    async def aclose(self: Broker) -> None:
        closed.append(self)
        await real_aclose(self)

    class BrokenLeader:
        def __init__(self, *args: object, **kwargs: object) -> None:
            raise RuntimeError("replication cannot start")

    monkeypatch.setattr(Broker, "aclose", aclose)
    monkeypatch.setattr(node_module, "ReplicationLeader", BrokenLeader)
    roles = ElectionLike(LEADER)
    node = ReplicatedNode(config(tmp_path), roles)
    await _run_until_given_up(node, roles)
    assert len(closed) == 1, "the store it opened was left open"
    assert roles.served == [False]
    assert "replication cannot start" in roles.given_up[0][1]
