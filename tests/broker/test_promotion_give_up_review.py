"""Review of the give-up of a failed promotion (test_promotion_give_up.py): what the node tells
its role source must hold when etcd hiccups, and must be about the epoch, not the attempt.

In process, no server, no etcd (as test_promotion_give_up.py)."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from popmq.broker.core import Broker
from popmq.broker.replication.node import ReplicatedNode
from popmq.broker.replication.role import GroupRole

from popmq.clock import ManualClock
from popmq.coord import CoordUnavailableError
from tests.broker.test_promotion_give_up import LEADER, ElectionLike, _run_until_given_up, config


class FlakyElection(ElectionLike):
    """etcd does not answer the first give-up (a timeout, a leader election of etcd's own):
    the leader key is still this node's, its keepalives go on."""

    def __init__(self, role: GroupRole) -> None:
        super().__init__(role)
        self.attempts = 0

    async def give_up(self, role: GroupRole, why: str, *, served: bool) -> None:
        self.attempts += 1
        if self.attempts == 1:
            raise CoordUnavailableError("etcd: timed out")
        await super().give_up(role, why, served=served)


async def crash(self: Broker, **_: object) -> None:
    raise OSError("disk gone")


async def test_a_give_up_that_etcd_did_not_take_is_tried_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The failed give-up was logged and the node slept, refusing every call, while it held
    the key: the group never failed over (the next read of the key says "this node leads",
    which is no change). Virtual time: the retry's wait takes none."""
    monkeypatch.setattr(Broker, "start", crash)
    roles = FlakyElection(LEADER)
    node = ReplicatedNode(config(tmp_path), roles, clock=ManualClock())
    with anyio.fail_after(10):  # a failure bound only: the retry waits on the manual clock
        await _run_until_given_up(node, roles)
    assert roles.attempts == 2
    assert roles.served == [False]


async def test_a_node_that_served_an_epoch_says_so_when_leading_it_again_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``served`` is about the epoch: the in-sync set put back for a leader that "served
    nothing" may lack the nodes holding what it acknowledged. The same epoch is played again
    when a give-up's delete was cancelled (a read under way published "no leader", which
    cancels the role's task and so the delete) and the key read back as this node's."""
    roles = ElectionLike(LEADER)
    node = ReplicatedNode(config(tmp_path), roles)
    async with anyio.create_task_group() as group:
        group.start_soon(node.run)
        with anyio.fail_after(30):  # failure bounds only
            while node.port.leading is None:  # noqa: ASYNC110 (no event)
                await anyio.sleep(0.01)
            await roles.set(GroupRole(LEADER.epoch, "", "", is_leader=False))
            while node.port.leading is not None or node.role is None or node.role.is_leader:  # noqa: ASYNC110
                await anyio.sleep(0.01)
        monkeypatch.setattr(Broker, "start", crash)
        await roles.set(LEADER)  # the same epoch again: its promotion fails this time
        with anyio.fail_after(30):
            await roles.gave_up.wait()
        group.cancel_scope.cancel()
    assert roles.served == [True], "epoch 7 answered calls: its in-sync set must stay"
