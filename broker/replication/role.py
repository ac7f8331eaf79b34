"""The role of this node in its broker group, as an injected source.

The election (popmq.coord, on etcd) decides who leads; replication only follows. It needs the
current ``GroupRole``, a way to wait for the next one, and a way to report the in-sync set it
keeps (the election writes it where elections read it). ``StaticRoleSource`` is the role from
flags (``popmq broker --role leader|follower --epoch N --leader ADDRESS``) and the tests' source.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class GroupRole:
    epoch: int
    leader_name: str
    leader_address: str
    is_leader: bool


class RoleSource(Protocol):
    def current(self) -> GroupRole:
        """The role now."""
        ...

    async def wait_changed(self, seen: GroupRole) -> GroupRole:
        """Return the role as soon as it differs from ``seen`` (at once if it already does)."""
        ...

    async def report_in_sync(self, epoch: int, members: frozenset[str]) -> None:
        """The leader of ``epoch`` changed its in-sync set (node names, itself included).
        Raises when the change could not be recorded (a deposed leader's change fails)."""
        ...

    async def give_up(self, role: GroupRole, why: str, *, served: bool) -> None:
        """This node was made leader of ``role.epoch`` but cannot lead (its promotion
        failed): let another node lead. ``served``: whether it acknowledged anything in
        that epoch."""
        ...


class StaticRoleSource:
    """A role set by hand: from flags, or by a test (``set``). In-sync reports are kept."""

    def __init__(self, role: GroupRole) -> None:
        self._role = role
        self._changed = asyncio.Condition()
        self.reports: list[tuple[int, frozenset[str]]] = []
        self.given_up: list[tuple[GroupRole, str]] = []

    def current(self) -> GroupRole:
        return self._role

    async def set(self, role: GroupRole) -> None:
        async with self._changed:
            self._role = role
            self._changed.notify_all()

    async def wait_changed(self, seen: GroupRole) -> GroupRole:
        async with self._changed:
            await self._changed.wait_for(lambda: self._role != seen)
            return self._role

    async def report_in_sync(self, epoch: int, members: frozenset[str]) -> None:
        self.reports.append((epoch, members))

    async def give_up(self, role: GroupRole, why: str, *, served: bool) -> None:
        """Kept (a role from flags has nobody to hand the lead to: it stays refused)."""
        self.given_up.append((role, why))
