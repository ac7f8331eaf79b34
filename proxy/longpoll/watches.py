"""The proxy's visibility watches: one per (broker, group, topic, filter, fifo), shared by
every long poll of this proxy and kept a while after the last one leaves.

A long poll asks ``may_have(port, pop)`` before it pops a broker: False means the broker
holds an armed watch for the group and has sent no event, so a pop would come back empty.
Whoever pops a broker and leaves it empty (or drained) calls ``popped_empty`` to re-arm.
Watches linger for ``LINGER_S`` after their last use, so the next long poll of an idle group
finds them armed and costs the broker nothing. Ports without a ``watch_backend`` (test fakes)
get no watch: ``may_have`` is always True for them and the hub falls back to notify calls.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from popmq.broker.contract.port import ConsumePort
from popmq.broker.contract.types import FilterExpression, PopRequest
from popmq.broker.contract.watch import VisibilityWatch, WatchKey, WatchState

from popmq.clock import SYSTEM, Clock

# A watch nobody used for this long is cancelled (it costs one held waiter on the broker).
LINGER_S = 120.0
# Bound on watches held (a flood of distinct groups must not grow memory without end).
MAX_WATCHES = 100_000
_SWEEP_EVERY_S = 5.0

# (port, group, topic, filter text, filter kind, fifo): plain tuples of strings hash in C, and
# every long poll looks up one per broker, twice (the filter's own dataclass hash is a Python
# call). The filter's kind is part of it (a tag and a SQL92 expression may have the same text).
WatchId = tuple[ConsumePort, str, str, str, str, bool]
_Rest = tuple[str, str, str, str, bool]
_ARMED = WatchState.ARMED


def watch_key(pop: PopRequest) -> WatchKey:
    return WatchKey(pop.group, pop.topic, pop.filter, pop.fifo)


def _rest(group: str, topic: str, filter: FilterExpression, fifo: bool) -> _Rest:
    return (group, topic, filter.expression, filter.kind, fifo)


class WatchRegistry:
    def __init__(
        self,
        linger_s: float = LINGER_S,
        on_arm: Callable[[], None] | None = None,
        *,
        clock: Clock = SYSTEM,
    ) -> None:
        self.linger_s = linger_s
        self._clock = clock  # lingering and sweeps (virtual in tests)
        self._on_arm = on_arm  # counts arms sent (they cost the broker a level check)
        self._watches: dict[WatchId, VisibilityWatch] = {}
        self._used: dict[WatchId, float] = {}
        self._users: dict[WatchId, int] = {}
        self._next_sweep = self._clock.monotonic() + _SWEEP_EVERY_S

    def __len__(self) -> int:
        return len(self._watches)

    def get(self, port: ConsumePort, pop: PopRequest) -> VisibilityWatch | None:
        """The watch of this broker and group (made and armed on first use)."""
        now = self._now()
        return self._get(port, pop, _rest(pop.group, pop.topic, pop.filter, pop.fifo), now)

    def _now(self) -> float:
        now = self._clock.monotonic()
        if now >= self._next_sweep:
            self.sweep(now)
        return now

    def _get(
        self, port: ConsumePort, pop: PopRequest, rest: _Rest, now: float
    ) -> VisibilityWatch | None:
        ident = (port, *rest)
        watch = self._watches.get(ident)
        if watch is None:
            backend = getattr(port, "watch_backend", None)
            if backend is None:
                return None
            if len(self._watches) >= MAX_WATCHES:
                self.sweep(now, force=True)
            watch = self._watches[ident] = VisibilityWatch(watch_key(pop), backend)
            self.arm(watch)
        self._used[ident] = now
        return watch

    def candidates(self, ports: Sequence[ConsumePort], pop: PopRequest) -> list[ConsumePort]:
        """The brokers a long poll may pop: all but those whose watch is armed and silent."""
        # One clock read and one key for all the ports (asked twice by each long poll).
        now = self._now()
        rest = _rest(pop.group, pop.topic, pop.filter, pop.fifo)
        found: list[ConsumePort] = []
        # The usual case inline (a watch that exists): no call of _get per port.
        watches = self._watches
        used = self._used
        for port in ports:
            ident = (port, *rest)
            watch = watches.get(ident)
            if watch is None:
                watch = self._get(port, pop, rest, now)
            else:
                used[ident] = now
            if watch is None or watch.state is not _ARMED:  # (VisibilityWatch.may_have)
                found.append(port)
        return found

    def may_have(self, port: ConsumePort, pop: PopRequest) -> bool:
        watch = self.get(port, pop)
        return watch is None or watch.may_have

    def popped_empty(self, port: ConsumePort, pop: PopRequest) -> None:
        """A pop left this broker empty for the group: re-arm its watch."""
        watch = self.get(port, pop)
        if watch is not None:
            self.arm(watch)

    def arm(self, watch: VisibilityWatch) -> None:
        if not watch.pending and not watch.closed:
            if self._on_arm is not None:
                self._on_arm()
            watch.arm()

    def acquire(self, port: ConsumePort, pop: PopRequest) -> VisibilityWatch | None:
        """The watch, kept from the sweep until ``release``."""
        watch = self.get(port, pop)
        if watch is not None:
            ident = _ident(port, watch)
            self._users[ident] = self._users.get(ident, 0) + 1
        return watch

    def release(self, port: ConsumePort, watch: VisibilityWatch) -> None:
        ident = _ident(port, watch)
        left = self._users.get(ident, 0) - 1
        if left > 0:
            self._users[ident] = left
        else:
            self._users.pop(ident, None)
        self._used[ident] = self._clock.monotonic()

    def sweep(self, now: float, *, force: bool = False) -> None:
        """Cancel watches unused for linger_s (or the oldest half when ``force``)."""
        self._next_sweep = now + _SWEEP_EVERY_S
        idle = [ident for ident, used in self._used.items()
                if ident not in self._users and (force or now - used >= self.linger_s)]  # fmt: skip
        if force:
            idle.sort(key=self._used.__getitem__)
            idle = idle[: max(1, len(idle) // 2)]
        for ident in idle:
            self._watches.pop(ident).close()
            del self._used[ident]

    def close(self) -> None:
        for watch in self._watches.values():
            watch.close()
        self._watches.clear()
        self._used.clear()
        self._users.clear()


def _ident(port: ConsumePort, watch: VisibilityWatch) -> WatchId:
    key = watch.key
    return (port, *_rest(key.group, key.topic, key.filter, key.fifo))
