"""Consumption progress of one group on one queue (a pure data structure).

Invariant: every offset below ``pop_offset`` (the read cursor) is either in flight, released
(FIFO: waiting to be redelivered in place) or done (acked, revived into the retry topic,
skipped by the tag filter). So the consumer offset to commit is the smallest offset that is in
flight or released, or ``pop_offset`` when there is none.

Offsets at or above the cursor can also be known (after a restart the cursor restarts at the
committed offset while recovered checkpoints still hold later offsets): in-flight ones sit in
``inflight``, done ones in ``done_ahead``; the cursor skips both.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from typing import Any


class QueueState:
    __slots__ = (
        "_heap",
        "attempts",
        "committed",
        "done_ahead",
        "inflight",
        "pop_offset",
        "released",
    )

    def __init__(self, start_offset: int) -> None:
        self.pop_offset = start_offset
        self.committed = start_offset
        self.inflight: dict[int, Any] = {}  # offset -> owner (the checkpoint holding it)
        self.released: list[int] = []  # sorted; all below pop_offset
        self.done_ahead: set[int] = set()
        self.attempts: dict[int, int] = {}  # FIFO: reconsume count of offsets redelivered in place
        self._heap: list[int] = []  # offsets in flight or released (lazily cleaned)

    # -- reads ----------------------------------------------------------------------------
    def is_known(self, offset: int) -> bool:
        """True when the cursor must skip ``offset`` (someone holds it, or it is done)."""
        return offset in self.inflight or offset in self.done_ahead

    def commit_offset(self) -> int:
        heap = self._heap
        while heap and heap[0] not in self.inflight and not self._is_released(heap[0]):
            heapq.heappop(heap)
        if heap and heap[0] < self.pop_offset:
            return heap[0]
        return self.pop_offset

    def _is_released(self, offset: int) -> bool:
        index = bisect_left(self.released, offset)
        return index < len(self.released) and self.released[index] == offset

    # -- changes (each returns True when the commit offset moved) ----------------------------
    def recommit(self) -> bool:
        offset = self.commit_offset()
        if offset != self.committed:
            self.committed = offset
            stale = [o for o in self.attempts if o < offset]
            for o in stale:
                del self.attempts[o]
            return True
        return False

    def add_inflight(self, offset: int, owner: Any) -> None:
        self.inflight[offset] = owner
        self.done_ahead.discard(offset)
        heapq.heappush(self._heap, offset)

    def advance_cursor(self, next_offset: int) -> bool:
        """The cursor read up to ``next_offset``: what it passed and did not hand out is done."""
        if next_offset <= self.pop_offset:
            return False
        if self.done_ahead:
            self.done_ahead = {o for o in self.done_ahead if o >= next_offset}
        self.pop_offset = next_offset
        return self.recommit()

    def reset_cursor(self, offset: int) -> bool:
        """Move the cursor forward to ``offset`` (e.g. retention removed what was below)."""
        return self.advance_cursor(offset)

    def mark_done(self, offset: int, owner: Any = None) -> bool:
        """``offset`` is finished (acked / revived). ``owner``, when given, must still hold it."""
        current = self.inflight.get(offset)
        if current is not None and (owner is None or current is owner):
            del self.inflight[offset]
        elif owner is not None and current is not None:
            return False  # someone else holds it now (e.g. after change_invisible_time)
        if offset >= self.pop_offset:
            self.done_ahead.add(offset)
            self.skip_known()
        self.attempts.pop(offset, None)
        return self.recommit()

    def skip_known(self) -> None:
        """Move the cursor over a run of known offsets right at it (nothing to read there)."""
        while self.pop_offset in self.done_ahead or self.pop_offset in self.inflight:
            self.done_ahead.discard(self.pop_offset)
            self.pop_offset += 1

    def release(self, offset: int, owner: Any, attempts: int) -> bool:
        """FIFO: ``offset`` comes back for redelivery in place with ``attempts`` recorded."""
        if self.inflight.get(offset) is not owner:
            return False
        del self.inflight[offset]
        self.attempts[offset] = attempts
        if offset < self.pop_offset:
            insort(self.released, offset)
            heapq.heappush(self._heap, offset)
        return self.recommit()

    def take_released(self, limit: int) -> list[int]:
        taken = self.released[:limit]
        del self.released[:limit]
        return taken

    def transfer(self, offset: int, old_owner: Any, new_owner: Any) -> bool:
        """A new checkpoint takes over an in-flight offset (change_invisible_time)."""
        if self.inflight.get(offset) is not old_owner:
            return False
        self.inflight[offset] = new_owner
        return True
