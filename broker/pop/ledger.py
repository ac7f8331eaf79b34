"""Checkpoint bookkeeping: live checkpoints, per-queue progress, revive order, spilling.

Pure in-memory logic. Durability is delegated to a ``CheckpointJournal`` (the pop journal):
a checkpoint is written there only once it has stayed un-acked for ``checkpoint_buffer_ms``
(``spill``); from then on every change of one of its entries is journaled too. Checkpoints
acked sooner never touch the disk (RocketMQ's PopBufferMergeService idea).

Consumer offsets move through ``commit(group, topic, queue, offset)`` when the done prefix of a
queue has grown and ``flush_commits()`` is called (callers do at the end of each operation).
"""

from __future__ import annotations

import heapq
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from typing import Protocol

from popmq.broker.pop.checkpoint import DONE_STATES, Checkpoint, EntryState
from popmq.broker.pop.queue_state import QueueState

QueueKey = tuple[str, str, int]  # (group, topic, queue id)


class CheckpointJournal(Protocol):
    def write_checkpoint(self, ck: Checkpoint) -> None: ...

    def write_state(self, ck_id: int, index: int, state: EntryState) -> None: ...


class CheckpointLedger:
    def __init__(
        self,
        journal: CheckpointJournal | None,
        start_offset: Callable[[str, str, int], int],
        commit: Callable[[str, str, int, int], None],
        first_id: int,
        recent_capacity: int = 16_384,
    ) -> None:
        self._journal = journal
        self._start_offset = start_offset
        self._commit = commit
        self._next_id = first_id
        self._recent_capacity = recent_capacity
        self.queues: dict[QueueKey, QueueState] = {}
        self._dirty: dict[QueueKey, QueueState] = {}  # commit offsets moved, not yet handed on
        self.live: dict[int, Checkpoint] = {}
        # Finished checkpoints, kept a while so a repeated ack is answered OK, not "unknown".
        self._recent: OrderedDict[int, Checkpoint] = OrderedDict()
        self._revive_heap: list[tuple[int, int]] = []  # (invisible_until_ms, ck_id)
        self._spill_queue: deque[Checkpoint] = deque()  # memory checkpoints, oldest first
        # In-flight or released entries whose message was no longer in the store when they
        # came due (retention removed it): finished without a delivery, counted, never silent.
        self.gone = 0
        # Pending entries a client's forward_to_dlq has claimed while it writes the DLQ copy,
        # as (checkpoint id, index): nothing else may settle them meanwhile (a hand-back or a
        # revive would deliver the message again besides the DLQ copy).
        self.forwarding: set[tuple[int, int]] = set()

    # -- queues ---------------------------------------------------------------------------
    def queue(self, group: str, topic: str, queue_id: int) -> QueueState:
        key = (group, topic, queue_id)
        state = self.queues.get(key)
        if state is None:
            state = QueueState(self._start_offset(group, topic, queue_id))
            self.queues[key] = state
        return state

    def existing_queue(self, group: str, topic: str, queue_id: int) -> QueueState | None:
        return self.queues.get((group, topic, queue_id))

    def reset_queue(self, group: str, topic: str, queue_id: int, offset: int | None = None) -> None:
        """Restart a group's cursor at ``offset`` (default: its start offset, e.g. newly set);
        what is in flight beyond it stays in flight."""
        key = (group, topic, queue_id)
        old = self.queues.pop(key, None)
        if offset is None:
            fresh = self.queue(group, topic, queue_id)
        else:
            fresh = self.queues[key] = QueueState(offset)
            self._dirty[key] = fresh
        if old is not None:
            for offset, owner in old.inflight.items():
                if offset >= fresh.pop_offset:
                    fresh.add_inflight(offset, owner)

    def group_inflight(self, group: str) -> int:
        """Messages of ``group`` popped and not yet acked, over every queue."""
        return sum(len(s.inflight) for (g, _, _), s in self.queues.items() if g == group)

    def forget_group(self, group: str) -> None:
        """Drop a deleted group's cursors; queues with messages in flight keep theirs until
        those finish (their checkpoints still need them)."""
        for key in [k for k, s in self.queues.items() if k[0] == group and not s.inflight]:
            del self.queues[key]
            self._dirty.pop(key, None)

    def forget_topic(self, topic: str) -> None:
        for key in [key for key in self.queues if key[1] == topic]:
            del self.queues[key]

    def _changed(self, key: QueueKey, state: QueueState, moved: bool) -> None:
        if moved:
            self._dirty[key] = state

    def flush_commits(self) -> int:
        """Hand the moved commit offsets to ``commit`` (batched: once per queue per call)."""
        if not self._dirty:
            return 0
        dirty, self._dirty = self._dirty, {}
        for (group, topic, queue_id), state in dirty.items():
            self._commit(group, topic, queue_id, state.committed)
        return len(dirty)

    def advance_cursor(self, group: str, topic: str, queue_id: int, next_offset: int) -> None:
        state = self.queue(group, topic, queue_id)
        self._changed((group, topic, queue_id), state, state.advance_cursor(next_offset))

    # -- checkpoints ----------------------------------------------------------------------
    def _new_id(self) -> int:
        ck_id = self._next_id
        self._next_id += 1
        return ck_id

    def open(
        self,
        group: str,
        topic: str,
        queue_id: int,
        offsets: list[int],
        attempts: list[int],
        pop_time_ms: int,
        invisible_until_ms: int,
        fifo: bool,
    ) -> Checkpoint:
        """Record a pop: the offsets become in flight under a new checkpoint."""
        ck = Checkpoint(
            ck_id=self._new_id(),
            group=group,
            topic=topic,
            queue_id=queue_id,
            pop_time_ms=pop_time_ms,
            invisible_until_ms=invisible_until_ms,
            fifo=fifo,
            offsets=offsets,
            attempts=attempts,
            created_ms=pop_time_ms,
        )
        state = self.queue(group, topic, queue_id)
        for offset in offsets:
            state.add_inflight(offset, ck)
        self._track(ck)
        self._spill_queue.append(ck)
        return ck

    def _track(self, ck: Checkpoint) -> None:
        self.live[ck.ck_id] = ck
        heapq.heappush(self._revive_heap, (ck.invisible_until_ms, ck.ck_id))

    def find(self, ck_id: int) -> Checkpoint | None:
        """A live checkpoint, or a recently finished one."""
        return self.live.get(ck_id) or self._recent.get(ck_id)

    def _set(self, ck: Checkpoint, index: int, state: EntryState) -> None:
        ck.set_state(index, state)
        if ck.spilled and self._journal is not None:
            self._journal.write_state(ck.ck_id, index, state)
        if ck.pending == 0 and self.live.pop(ck.ck_id, None) is not None:
            self._recent[ck.ck_id] = ck
            if len(self._recent) > self._recent_capacity:
                self._recent.popitem(last=False)

    def _finish_offset(self, ck: Checkpoint, index: int, state: EntryState) -> None:
        """Mark an entry done and let the queue's commit offset move past it."""
        self._set(ck, index, state)
        queue = self.queue(*ck.queue_key)
        self._changed(ck.queue_key, queue, queue.mark_done(ck.offsets[index], ck))

    def finish_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """An offset no checkpoint holds is done (e.g. a released message the filter skips)."""
        queue = self.queue(group, topic, queue_id)
        self._changed((group, topic, queue_id), queue, queue.mark_done(offset))

    def finish_gone_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """A released offset whose message is no longer in the store is done (counted)."""
        self.gone += 1
        self.finish_offset(group, topic, queue_id, offset)

    def ack(self, ck: Checkpoint, index: int) -> None:
        self._finish_offset(ck, index, EntryState.ACKED)

    def revived(self, ck: Checkpoint, index: int) -> None:
        """The message went to the retry topic or the DLQ: it is done here."""
        self._finish_offset(ck, index, EntryState.REVIVED)

    def dropped(self, ck: Checkpoint, index: int) -> None:
        """The message no longer exists in the store (counted; the caller logs it)."""
        self.gone += 1
        self._finish_offset(ck, index, EntryState.DROPPED)

    def release(self, ck: Checkpoint, index: int, *, attempted: bool = True) -> None:
        """The message goes back to its queue, to be redelivered in place (FIFO: in order);
        ``attempted`` False: it never reached a consumer, so it counts no delivery attempt."""
        self._set(ck, index, EntryState.RELEASED if attempted else EntryState.HANDED_BACK)
        queue = self.queue(*ck.queue_key)
        attempts = ck.attempts[index] + 1 if attempted else ck.attempts[index]
        moved = queue.release(ck.offsets[index], ck, attempts)
        self._changed(ck.queue_key, queue, moved)

    def change(
        self, ck: Checkpoint, index: int, pop_time_ms: int, invisible_until_ms: int
    ) -> Checkpoint:
        """change_invisible_time: a one-message checkpoint replaces the entry's old one."""
        offset = ck.offsets[index]
        new = Checkpoint(
            ck_id=self._new_id(),
            group=ck.group,
            topic=ck.topic,
            queue_id=ck.queue_id,
            pop_time_ms=pop_time_ms,
            invisible_until_ms=invisible_until_ms,
            fifo=ck.fifo,
            offsets=[offset],
            attempts=[ck.attempts[index]],
            created_ms=pop_time_ms,
        )
        self.queue(*ck.queue_key).transfer(offset, ck, new)
        self._track(new)
        self._spill_queue.append(new)
        self._set(ck, index, EntryState.SUPERSEDED)
        return new

    # -- revive ---------------------------------------------------------------------------
    def next_due_ms(self) -> int | None:
        heap = self._revive_heap
        while heap and heap[0][1] not in self.live:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def take_due(self, now_ms: int, limit: int = 1024) -> list[Checkpoint]:
        """Live checkpoints whose invisible time has passed, earliest first."""
        due: list[Checkpoint] = []
        heap = self._revive_heap
        while heap and heap[0][0] <= now_ms and len(due) < limit:
            _, ck_id = heapq.heappop(heap)
            ck = self.live.get(ck_id)
            if ck is not None and ck.pending:
                due.append(ck)
        return due

    def reschedule(self, ck: Checkpoint, at_ms: int) -> None:
        """Revive ``ck`` again at ``at_ms`` (its revive failed and must be retried)."""
        if ck.ck_id in self.live:
            heapq.heappush(self._revive_heap, (at_ms, ck.ck_id))

    # -- durability -----------------------------------------------------------------------
    def spill(self, now_ms: int, buffer_ms: int) -> int:
        """Journal checkpoints still un-acked after ``buffer_ms``. Returns how many."""
        written = 0
        queue = self._spill_queue
        while queue and queue[0].created_ms + buffer_ms <= now_ms:
            ck = queue.popleft()
            if ck.pending and not ck.spilled and ck.ck_id in self.live:
                if self._journal is not None:
                    self._journal.write_checkpoint(ck)
                ck.spilled = True
                written += 1
        return written

    def journaled(
        self, durable: Callable[[tuple[str, str, int]], int] | None = None
    ) -> list[Checkpoint]:
        """Checkpoints a compacted journal must keep: live spilled ones, and finished ones
        still ahead of their queue's commit offset (their acks are not in any offset yet).
        ``durable`` gives the commit offset on disk: until an offset is written, the journal
        is what remembers the acks below it."""
        keep = [ck for ck in self.live.values() if ck.spilled]
        for ck in self._recent.values():
            if not ck.spilled:
                continue
            queue = self.queues.get(ck.queue_key)
            committed = queue.committed if queue is not None else 0
            if durable is not None:
                committed = min(committed, durable(ck.queue_key))
            if any(offset >= committed for offset in ck.offsets):
                keep.append(ck)
        return keep

    def recover(self, checkpoints: Iterable[Checkpoint]) -> int:
        """Rebuild state from journaled checkpoints (their final states applied). Returns the
        number of live checkpoints. Done entries ahead of the commit offset are skipped by the
        cursor; pending ones are in flight again and revive when due."""
        cks = list(checkpoints)
        for ck in cks:
            self._next_id = max(self._next_id, ck.ck_id + 1)
            ck.spilled = True
            queue = self.queue(*ck.queue_key)
            for index, offset in enumerate(ck.offsets):
                state = ck.states[index]
                if offset < queue.pop_offset:
                    continue
                if state in DONE_STATES:
                    queue.done_ahead.add(offset)
                elif state == EntryState.RELEASED:
                    queue.attempts[offset] = ck.attempts[index] + 1
                elif state == EntryState.HANDED_BACK:
                    queue.attempts[offset] = ck.attempts[index]  # never delivered
        live = 0
        for ck in cks:
            if not ck.pending:
                self._recent[ck.ck_id] = ck
                continue
            queue = self.queue(*ck.queue_key)
            for index in ck.pending_indexes():
                offset = ck.offsets[index]
                if offset < queue.pop_offset:
                    ck.states[index] = EntryState.ACKED  # the commit offset says it is done
                    ck.pending -= 1
                else:
                    queue.add_inflight(offset, ck)
            if ck.pending:
                self._track(ck)
                live += 1
        while len(self._recent) > self._recent_capacity:
            self._recent.popitem(last=False)
        for key, queue in self.queues.items():
            queue.skip_known()
            self._changed(key, queue, queue.recommit())
        return live

    # -- stats ----------------------------------------------------------------------------
    def inflight_count(self, group: str, topic: str, queue_id: int) -> int:
        state = self.queues.get((group, topic, queue_id))
        return len(state.inflight) if state is not None else 0
