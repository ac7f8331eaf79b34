"""Queue choice: where a send goes, in which order a pop visits queues, and pop queue locks."""

from __future__ import annotations

import random
from collections.abc import Hashable


class RoundRobin:
    """Per-topic round robin for messages without a queue or a message group."""

    def __init__(self) -> None:
        self._next: dict[str, int] = {}

    def next(self, topic: str, queue_count: int) -> int:
        index = self._next.get(topic)
        if index is None:
            index = random.randrange(queue_count)  # brokers should not all start at queue 0
        self._next[topic] = index + 1
        return index % queue_count


def pop_queue_order(queue_count: int, start: int) -> list[int]:
    """Every queue once, starting at ``start`` and rotating (so no queue is always last)."""
    return [(start + i) % queue_count for i in range(queue_count)]


class QueueLocks:
    """Non-blocking per-(group, topic, queue) locks: one puller per queue at a time.

    A pop that finds a queue locked skips it (RocketMQ's queueLockManager.tryLock)."""

    def __init__(self) -> None:
        self._held: set[Hashable] = set()

    def try_lock(self, key: Hashable) -> bool:
        if key in self._held:
            return False
        self._held.add(key)
        return True

    def unlock(self, key: Hashable) -> None:
        self._held.discard(key)

    def is_locked(self, key: Hashable) -> bool:
        return key in self._held
