"""The leader's in-sync bookkeeping (RocketMQ's SyncStateSet), as pure logic on an injected clock.

A follower is *caught up* when it acknowledged a complete batch: it then held everything the
leader had when that batch was taken. It is in the in-sync set while it stays connected and
its last catch-up is at most ``max_lag_s`` old (RocketMQ's haMaxTimeSlaveNotCatchup, 15 s);
a connected follower that catches up again rejoins. The leader always counts itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Change:
    joined: frozenset[str]
    left: frozenset[str]

    def __bool__(self) -> bool:
        return bool(self.joined or self.left)


@dataclass(slots=True)
class FollowerProgress:
    connected: bool = False
    caught_up_at: float | None = None  # when the last complete batch it acknowledged was taken
    acked_id: int = 0  # the ticket of the last complete batch it acknowledged
    commitlog_end: int = 0
    acked_at: float | None = None


@dataclass
class InSyncSet:
    leader: str
    max_lag_s: float
    clock: Callable[[], float]
    members: set[str] = field(default_factory=set)  # followers only
    followers: dict[str, FollowerProgress] = field(default_factory=dict)

    def connected(self, node: str) -> None:
        """A new stream from ``node``: it may start over (a reset) or be cut back, so what
        its earlier streams caught up says nothing now; it is in sync again once it catches up
        on this one."""
        progress = self.followers.setdefault(node, FollowerProgress())
        progress.connected = True
        progress.caught_up_at = None

    def disconnected(self, node: str) -> None:
        progress = self.followers.get(node)
        if progress is not None:
            progress.connected = False

    def acked(self, node: str, ticket: int, taken_at: float, complete: bool, end: int) -> None:
        progress = self.followers.setdefault(node, FollowerProgress(connected=True))
        progress.commitlog_end = end
        progress.acked_at = self.clock()
        if complete:
            progress.acked_id = max(progress.acked_id, ticket)
            progress.caught_up_at = max(progress.caught_up_at or taken_at, taken_at)

    def should_be_in(self, node: str) -> bool:
        progress = self.followers.get(node)
        if progress is None or not progress.connected or progress.caught_up_at is None:
            return False
        return self.clock() - progress.caught_up_at <= self.max_lag_s

    def evaluate(self) -> Change:
        """Who should join and who should leave now (nothing is changed: see apply)."""
        wanted = {node for node in self.followers if self.should_be_in(node)}
        return Change(frozenset(wanted - self.members), frozenset(self.members - wanted))

    def apply(self, change: Change) -> None:
        self.members |= change.joined
        self.members -= change.left

    def with_change(self, change: Change) -> frozenset[str]:
        """The whole set (leader included) as it is after ``change``."""
        return frozenset({self.leader, *((self.members | change.joined) - change.left)})

    @property
    def size(self) -> int:
        return 1 + len(self.members)

    def lag_s(self, node: str) -> float | None:
        progress = self.followers.get(node)
        if progress is None or progress.caught_up_at is None:
            return None
        return max(0.0, self.clock() - progress.caught_up_at)
