"""The hold table: long-polling pop, pull and notify requests waiting for a message.

A waiter is registered under one or more keys ``(topic, group, queue_id)``; ``group`` is "" for
pull and ``queue_id`` is -1 for "any queue of the topic". A message arriving on ``(topic, q)``
wakes waiters under ``(topic, *, q)`` and ``(topic, *, -1)`` whose tag filter accepts one of its
tags (and, for pull, whose offset it passes):
- broadcast waiters (pull: each puller reads its own offsets; notify: it only looks, and the
  proxies it answers race to pop): every matching one;
- pop waiters: the oldest matching one only, as RocketMQ's pop long polling does, so one
  message does not stampede every idle consumer of the group. The woken pop passes the wake
  on when it leaves more behind (``wake``), and a woken pop that is cancelled before it could
  use the wake hands it to the next waiter.
A woken request retries its read; if another consumer took the message first it simply holds
again for the rest of its time.

The table is bounded per key and in total; a full table refuses at once (POLLING_FULL).
Registration and removal are synchronous and paired in ``wait``'s ``finally``, so a cancelled
caller leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Iterable
from dataclasses import dataclass, field

HoldKey = tuple[str, str, int]  # (topic, group or "", queue id or -1)


class HoldOutcome(enum.Enum):
    WOKEN = "WOKEN"
    TIMEOUT = "TIMEOUT"
    FULL = "FULL"


@dataclass(eq=False, slots=True)
class _Waiter:
    keys: tuple[HoldKey, ...]
    tags: frozenset[str] | None  # None: any tag
    min_offset: int  # pull: wake only when the queue's max offset passes it; -1 otherwise
    broadcast: bool  # woken with every other matching waiter, not one at a time
    future: asyncio.Future[None] = field(repr=False)

    def accepts(self, max_offset: int, tags: Iterable[str] | None) -> bool:
        if self.min_offset >= 0 and max_offset <= self.min_offset:
            return False
        if self.tags is None or tags is None:
            return True
        return not self.tags.isdisjoint(tags)


class HoldTable:
    def __init__(self, max_per_key: int, max_total: int) -> None:
        self._max_per_key = max_per_key
        self._max_total = max_total
        # topic -> (group, queue id) -> waiters, oldest first (dict as an ordered set)
        self._by_topic: dict[str, dict[tuple[str, int], dict[_Waiter, None]]] = {}
        self._total = 0
        self.closed = False

    def close(self) -> None:
        """The broker stops: answer every held request now, hold nothing more."""
        self.closed = True
        for groups in self._by_topic.values():
            for waiters in groups.values():
                for waiter in waiters:
                    if not waiter.future.done():
                        waiter.future.set_result(None)

    def reopen(self) -> None:
        self.closed = False

    @property
    def total(self) -> int:
        """How many requests are held now."""
        return self._total

    def count(self, key: HoldKey) -> int:
        topic, group, queue_id = key
        return len(self._by_topic.get(topic, {}).get((group, queue_id), ()))

    async def wait(
        self,
        keys: Iterable[HoldKey],
        timeout_ms: int,
        tags: frozenset[str] | None = None,
        min_offset: int = -1,
        broadcast: bool = False,
    ) -> HoldOutcome:
        """Hold until a matching arrival (WOKEN), the timeout (TIMEOUT), or refuse (FULL).
        A closed table answers TIMEOUT at once."""
        if self.closed:
            return HoldOutcome.TIMEOUT
        waiter = self._register(tuple(dict.fromkeys(keys)), tags, min_offset, broadcast)
        if waiter is None:
            return HoldOutcome.FULL
        try:
            async with asyncio.timeout(max(timeout_ms, 0) / 1000):
                await waiter.future
            return HoldOutcome.WOKEN
        except TimeoutError:
            return HoldOutcome.TIMEOUT
        except asyncio.CancelledError:
            future = waiter.future
            if future.done() and not future.cancelled() and not waiter.broadcast:
                self._remove(waiter)  # woken, but will not use it: hand the wake on
                for key in waiter.keys:
                    self._wake_key(key, -1, None)
            raise
        finally:
            self._remove(waiter)

    def _register(
        self,
        keys: tuple[HoldKey, ...],
        tags: frozenset[str] | None,
        min_offset: int,
        broadcast: bool,
    ) -> _Waiter | None:
        if self._total >= self._max_total:
            return None
        if any(self.count(key) >= self._max_per_key for key in keys):
            return None
        future = asyncio.get_running_loop().create_future()
        waiter = _Waiter(keys, tags, min_offset, broadcast or min_offset >= 0, future)
        for topic, group, queue_id in keys:
            self._by_topic.setdefault(topic, {}).setdefault((group, queue_id), {})[waiter] = None
        self._total += 1
        return waiter

    def _remove(self, waiter: _Waiter) -> None:
        removed = False
        for topic, group, queue_id in waiter.keys:
            groups = self._by_topic.get(topic)
            if groups is None:
                continue
            waiters = groups.get((group, queue_id))
            if waiters is None or waiters.pop(waiter, False) is False:
                continue
            removed = True
            if not waiters:
                del groups[(group, queue_id)]
                if not groups:
                    del self._by_topic[topic]
        if removed:
            self._total -= 1

    def _wake_key(self, key: HoldKey, max_offset: int, tags: Iterable[str] | None) -> int:
        """Wake the matching broadcast waiters of ``key`` and its oldest matching pop."""
        topic, group, queue_id = key
        waiters = self._by_topic.get(topic, {}).get((group, queue_id))
        if not waiters:
            return 0
        woken = 0
        single_woken = False
        for waiter in list(waiters):
            if waiter.future.done() or not waiter.accepts(max_offset, tags):
                continue
            if waiter.broadcast:
                waiter.future.set_result(None)
                woken += 1
            elif not single_woken:
                waiter.future.set_result(None)
                woken += 1
                single_woken = True
        return woken

    def on_arrival(
        self, topic: str, queue_id: int, max_offset: int, tags: Iterable[str] | None
    ) -> int:
        """A message arrived on (topic, queue_id): wake matching waiters. Returns how many."""
        groups = self._by_topic.get(topic)
        if not groups:
            return 0
        woken = 0
        for group, held_queue in list(groups):
            if held_queue == queue_id or held_queue == -1:
                woken += self._wake_key((topic, group, held_queue), max_offset, tags)
        return woken

    def wake(self, topic: str, group: str, queue_id: int) -> int:
        """Something is visible for ``group`` on (topic, queue_id) without a new arrival (more
        left behind by a pop, a FIFO queue unblocked, a message released in place): wake the
        oldest pop and the notifications of each matching key (``queue_id`` -1: any queue)."""
        if queue_id == -1:
            keys = [(topic, group, q) for (g, q) in self._by_topic.get(topic, {}) if g == group]
        else:
            keys = [(topic, group, queue_id), (topic, group, -1)]
        return sum(self._wake_key(key, -1, None) for key in keys)
