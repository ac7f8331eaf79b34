"""The role of a node from its group's election in etcd (popmq.coord.group).

``ElectedRoleSource`` adapts a ``GroupMember`` to ``RoleSource``: the role is the member's view
of the leader key (its create_revision is the epoch, the fencing token), a change of it is
awaited on the member, and the in-sync set is written with the member's epoch-compared
transaction, so a deposed leader's report fails and it learns at once that it lost.

Fencing: ``current()`` says "leader" only while the member may write, i.e. until the lease
deadline measured from the last keepalive sent. Replication checks the role before a write
and again after its barrier, so a leader that was paused or cut off from etcd past that
deadline answers nothing, even before it has heard of its successor. ``wait_changed`` reports
only what the election published, not the fence: a fenced leader keeps its broker open and
serves again when a late keepalive finds its lease alive (same epoch), instead of closing and
reopening it; a lost key is published, and ends its leading.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio
from popmq.broker.replication.leader import ReplicationLeader
from popmq.broker.replication.role import GroupRole

from popmq.coord import CoordUnavailableError, LeaseLostError
from popmq.coord.group import GroupMember


class DeposedError(Exception):
    """An in-sync report from a node that no longer leads that epoch."""


class ElectedRoleSource:
    def __init__(self, member: GroupMember) -> None:
        self._member = member

    def current(self) -> GroupRole:
        """The role now, fenced: "leader" only while the member may write."""
        role = self._published()
        if role.is_leader and not self._member.may_write():
            return GroupRole(role.epoch, role.leader_name, role.leader_address, False)
        return role

    def _published(self) -> GroupRole:
        role = self._member.role
        return GroupRole(
            epoch=role.epoch,
            leader_name=role.leader_name,
            leader_address=role.leader_address,
            is_leader=role.is_leader,
        )

    async def wait_changed(self, seen: GroupRole) -> GroupRole:
        """The next role the election publishes (a fence is not a change: see the module)."""
        while True:
            role = self._published()
            if role != seen:
                return role
            await self._member.role_changed()

    async def report_in_sync(self, epoch: int, members: frozenset[str]) -> None:
        role = self._member.role
        if not role.is_leader or role.epoch != epoch:
            raise DeposedError(f"this node no longer leads epoch {epoch} (now {role.epoch})")
        if not await self._member.set_in_sync(sorted(members)):
            raise DeposedError(f"the leader key is no longer epoch {epoch}'s: not recorded")

    async def give_up(self, role: GroupRole, why: str, *, served: bool) -> None:
        """Delete the leader key (an in-sync node is elected; this one waits before it
        campaigns again): see GroupMember.give_up."""
        await self._member.give_up(role.epoch, why, served=served)


async def publish_lag(
    member: GroupMember, leader: Callable[[], ReplicationLeader | None], every_s: float = 1.0
) -> None:
    """While this node leads, publish each follower's lag in etcd (what `popmq admin cluster
    status` shows). A follower that never caught up is left out: its lag shows as unknown."""
    while True:
        await anyio.sleep(every_s)
        replication = leader()
        if replication is None or not member.may_write():
            continue
        for follower in replication.status():
            if follower.lag_s is None:
                continue
            try:
                await member.report_lag(follower.name, follower.lag_bytes, follower.lag_s)
            except (CoordUnavailableError, LeaseLostError):
                break  # etcd is away: the election side notices and fences
