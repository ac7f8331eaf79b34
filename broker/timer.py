"""Delayed delivery: messages due later wait in a system topic, then move to their real topic.

Both delay messages (``delivery_timestamp_ms`` in the future) and POP retries (backoff before
the retry topic) go through here. A delayed message is appended to ``%SYS%TIMER`` (queue 0)
with its destination in properties, so it is as durable as any message. An in-memory heap of
``(due, timer offset)`` drives delivery; on restart the heap is rebuilt by scanning the timer
topic from the timer's committed progress. Progress is a consumer offset committed past the
prefix of delivered entries, so after a crash an entry may be delivered twice (at least once),
never lost.
"""

from __future__ import annotations

import heapq
import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.types import Message, StoredMessage
from popmq.broker.isolation import FailureTracker, describe
from popmq.broker.pop.queue_state import QueueState

if TYPE_CHECKING:
    from popmq.broker.store.message_store import MessageStore

log = logging.getLogger(__name__)

TIMER_TOPIC = "%SYS%TIMER"
TIMER_QUEUE = 0
TIMER_PROGRESS_GROUP = "%SYS%TIMER_PROGRESS"
# Where entries that cannot be delivered go (with their destination and the reason), so an
# operator can inspect and re-drive them; nothing is dropped.
PARKED_TOPIC = "%SYS%TIMER_PARKED"
PROP_PARKED_REASON = "__popmq.parked_reason"
PROP_TIMER_TOPIC = "__popmq.timer_topic"
PROP_TIMER_QUEUE = "__popmq.timer_queue"
# A recall marker: a timer-topic record naming the entry (by timer offset) it cancels. It makes
# the recall durable: a restart that rescans the entry also finds the marker after it.
PROP_RECALL_OF = "__popmq.recall_of"
_SCAN_BATCH = 512


def stored_to_message(stored: StoredMessage, topic: str | None = None) -> Message:
    """A stored message as something to append again (elsewhere, or later)."""
    return Message(
        topic=topic or stored.topic,
        body=stored.body,
        tag=stored.tag,
        keys=list(stored.keys),
        properties=dict(stored.properties),
        message_id=stored.message_id,
        message_group=stored.message_group,
        delivery_timestamp_ms=stored.delivery_timestamp_ms,
        born_timestamp_ms=stored.born_timestamp_ms,
        born_host=stored.born_host,
        reconsume_times=stored.reconsume_times,
    )


class _EntryError(Exception):
    """An entry that was read but cannot be delivered (it can be parked)."""

    def __init__(self, message: Message, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.message = message
        self.cause = cause


class TimerService:
    def __init__(
        self,
        store: MessageStore,
        clock: Callable[[], int],
        ensure_topic: Callable[[str], bool],
    ) -> None:
        """``ensure_topic(name)`` makes sure a destination exists (creating system topics);
        False means it is gone (a deleted user topic) and the entry is dropped."""
        self._store = store
        self._clock = clock
        self._ensure_topic = ensure_topic
        self._heap: list[tuple[int, int]] = []  # (due ms, timer offset)
        self.failures: FailureTracker[int] = FailureTracker()  # by timer offset
        self._progress = QueueState(0)
        # Recalled entries still on the heap: skipped (not delivered) when they come due.
        self._recalled: set[int] = set()
        self._delivering: set[int] = set()  # taken off the heap by deliver_due, not settled
        self.recalls = 0

    @property
    def pending(self) -> int:
        return len(self._progress.inflight)

    def recover(self) -> int:
        """Rebuild the heap from the timer topic. Returns the number of pending entries."""
        self._ensure_topic(TIMER_TOPIC)
        start = max(
            self._store.get_consumer_offset(TIMER_PROGRESS_GROUP, TIMER_TOPIC, TIMER_QUEUE),
            self._store.min_offset(TIMER_TOPIC, TIMER_QUEUE),
        )
        self._progress = QueueState(start)
        self._recalled = set()
        end = self._store.max_offset(TIMER_TOPIC, TIMER_QUEUE)
        offset = start
        recalled: set[int] = set()
        while offset < end:
            result = self._store.read(TIMER_TOPIC, TIMER_QUEUE, offset, _SCAN_BATCH)
            for stored in result.messages:
                marker = stored.properties.get(PROP_RECALL_OF)
                if marker is not None:
                    recalled.add(int(marker))
                else:
                    self._track(stored.delivery_timestamp_ms, stored.queue_offset)
            if result.next_offset <= offset:
                break
            offset = result.next_offset
        self._progress.advance_cursor(end)
        for entry in recalled:
            if entry in self._progress.inflight:
                self._recalled.add(entry)
                self._settle(entry)
        return self.pending

    async def recall(self, timer_offset: int, message_id: str) -> None:
        """Cancel a waiting entry: a marker is stored (durable), then the entry counts as done
        and is skipped when it comes due. Recalling it again before then is a no-op;
        NOT_FOUND once it was delivered (or recalled and its time passed)."""
        if timer_offset in self._recalled:
            return
        if timer_offset not in self._progress.inflight or timer_offset in self._delivering:
            raise RefusedError(
                Code.NOT_FOUND,
                f"message {message_id} is no longer waiting: it was delivered already (or "
                "recalled); nothing to recall",
            )
        entry = self._load(timer_offset)
        if entry is None or entry.message_id != message_id:
            raise RefusedError(Code.BAD_REQUEST, "invalid recall handle: no such delay message")
        marker = Message(
            TIMER_TOPIC, b"recall", message_id=message_id,
            properties={PROP_RECALL_OF: str(timer_offset)},
        )  # fmt: skip
        (stored,) = await self._store.append(TIMER_TOPIC, TIMER_QUEUE, [marker])
        self._progress.advance_cursor(stored.queue_offset + 1)
        if timer_offset not in self._progress.inflight or timer_offset in self._delivering:
            # Delivered (or being delivered) while the marker was written: too late.
            raise RefusedError(
                Code.NOT_FOUND, f"message {message_id} was delivered already; nothing to recall"
            )
        self._recalled.add(timer_offset)
        self._settle(timer_offset)
        self.recalls += 1

    def _track(self, due_ms: int, offset: int) -> None:
        self._progress.add_inflight(offset, due_ms)
        heapq.heappush(self._heap, (due_ms, offset))

    async def schedule(self, entries: list[tuple[Message, str, int]]) -> list[StoredMessage]:
        """Store ``(message, destination topic, destination queue)`` entries until each
        message's ``delivery_timestamp_ms``. Returns the timer-topic records."""
        if not entries:
            return []
        held: list[Message] = []
        for message, topic, queue_id in entries:
            properties = dict(message.properties)
            properties[PROP_TIMER_TOPIC] = topic
            properties[PROP_TIMER_QUEUE] = str(queue_id)
            held.append(replace(message, topic=TIMER_TOPIC, properties=properties))
        stored = await self._store.append(TIMER_TOPIC, TIMER_QUEUE, held)
        for record in stored:
            self._track(record.delivery_timestamp_ms, record.queue_offset)
        self._progress.advance_cursor(stored[-1].queue_offset + 1)
        return stored

    def next_due_ms(self) -> int | None:
        return self._heap[0][0] if self._heap else None

    async def deliver_due(self, limit: int = 1024) -> int:
        """Move every entry that is due to its destination. Returns how many moved.

        Entries are isolated from each other: one that fails is retried alone with backoff
        and finally parked in ``%SYS%TIMER_PARKED`` (see ``popmq.broker.isolation``); the
        others are delivered on time."""
        now = self._clock()
        due: list[int] = []
        while self._heap and self._heap[0][0] <= now and len(due) < limit:
            due.append(heapq.heappop(self._heap)[1])
        if not due:
            return 0
        unsettled = set(due)  # taken off the heap, not yet delivered, parked or rescheduled
        moved = 0
        self._delivering.update(due)
        try:
            batches: dict[tuple[str, int], list[tuple[int, Message]]] = defaultdict(list)
            for offset in due:
                if offset in self._recalled:  # recalled: settled already, nothing to move
                    self._recalled.discard(offset)
                    unsettled.discard(offset)
                    continue
                try:
                    loaded = self._prepare(offset)
                except _EntryError as err:
                    await self._failed(offset, err.message, err.cause, now)
                    unsettled.discard(offset)
                    continue
                except Exception as exc:  # not even readable: retried, never parked blind
                    await self._failed(offset, None, exc, now)
                    unsettled.discard(offset)
                    continue
                if loaded is None:
                    self._settle(offset)
                    unsettled.discard(offset)
                    continue
                batches[loaded[1]].append((offset, loaded[0]))
            for (topic, queue_id), items in batches.items():
                moved += await self._deliver_batch(topic, queue_id, items, now, unsettled)
        finally:
            self._delivering.difference_update(due)
            for offset in unsettled:  # interrupted (cancelled): try again later
                if offset in self._progress.inflight:
                    heapq.heappush(self._heap, (now + 1000, offset))
        if moved:
            # The progress (a consumer offset) on disk now, not at the next periodic flush:
            # followers copy consumer_offsets.json as written, and one promoted while it still
            # said "not moved" moved these entries again (a second retry copy delivered).
            try:
                await self._store.flush_offsets()
            except Exception as exc:  # the periodic flush writes it (and counts its failures)
                log.warning("timer: progress not written at once (%s)", describe(exc))
        return moved

    async def _deliver_batch(
        self,
        topic: str,
        queue_id: int,
        items: list[tuple[int, Message]],
        now: int,
        unsettled: set[int],
    ) -> int:
        try:
            await self._store.append(topic, queue_id, [message for _, message in items])
        except Exception as exc:
            if len(items) == 1:
                offset, message = items[0]
                # Parked with its destination, so it can be re-driven.
                properties = dict(message.properties)
                properties[PROP_TIMER_TOPIC] = topic
                properties[PROP_TIMER_QUEUE] = str(queue_id)
                await self._failed(offset, replace(message, properties=properties), exc, now)
                unsettled.discard(offset)
                return 0
            # One bad entry must not hold up the batch: deliver them one by one.
            moved = 0
            for item in items:
                moved += await self._deliver_batch(topic, queue_id, [item], now, unsettled)
            return moved
        for offset, _ in items:
            self.failures.succeeded(offset, now)
            self._settle(offset)
            unsettled.discard(offset)
        return len(items)

    def _settle(self, offset: int) -> None:
        """The entry is finished (delivered, parked or gone): commit the timer's progress."""
        if self._progress.mark_done(offset):
            self._store.set_consumer_offset(
                TIMER_PROGRESS_GROUP, TIMER_TOPIC, TIMER_QUEUE, self._progress.committed
            )

    async def _failed(
        self, offset: int, message: Message | None, exc: BaseException, now: int
    ) -> None:
        park, backoff_ms = self.failures.failed(offset, exc, now)
        if not park or message is None:
            log.warning(
                "timer: entry %d failed (%s); retrying in %d ms",
                offset, describe(exc), backoff_ms,
            )  # fmt: skip
            heapq.heappush(self._heap, (now + backoff_ms, offset))
            return
        try:
            await self._park(message, exc)
        except Exception as park_exc:  # kept in the timer (never lost), retried slowly
            log.error(
                "timer: entry %d failed (%s) and could not be parked (%s); retrying in %d ms",
                offset, describe(exc), describe(park_exc), backoff_ms,
            )  # fmt: skip
            heapq.heappush(self._heap, (now + backoff_ms, offset))
            return
        self.failures.parked_one(offset)
        self._settle(offset)
        log.error(
            "timer: entry %d for %r parked in %s after %s; its neighbours go on",
            offset, message.properties.get(PROP_TIMER_TOPIC, message.topic), PARKED_TOPIC,
            describe(exc),
        )  # fmt: skip

    async def _park(self, message: Message, exc: BaseException) -> None:
        self._ensure_topic(PARKED_TOPIC)
        properties = dict(message.properties)
        properties[PROP_PARKED_REASON] = describe(exc)[:500]
        await self._store.append(
            PARKED_TOPIC, TIMER_QUEUE, [replace(message, topic=PARKED_TOPIC, properties=properties)]
        )

    def _prepare(self, offset: int) -> tuple[Message, tuple[str, int]] | None:
        """The entry as a message for its destination, or None if there is nothing to move.
        Raises if the destination cannot be made ready."""
        message = self._load(offset)
        if message is None:
            return None
        topic = message.properties.get(PROP_TIMER_TOPIC, "")
        try:
            queue_id = int(message.properties.get(PROP_TIMER_QUEUE, "0"))
            exists = bool(topic) and self._ensure_topic(topic)
        except Exception as exc:
            raise _EntryError(message, exc) from exc
        if not exists:
            log.warning("timer: dropping %s, destination topic %r is gone", offset, topic)
            return None
        delivered = replace(message, topic=topic, properties=dict(message.properties))
        delivered.properties.pop(PROP_TIMER_TOPIC, None)
        delivered.properties.pop(PROP_TIMER_QUEUE, None)
        return delivered, (topic, self._valid_queue(topic, queue_id))

    def _valid_queue(self, topic: str, queue_id: int) -> int:
        meta = self._store.get_topic(topic)
        if meta is None or 0 <= queue_id < meta.queue_count:
            return queue_id
        return queue_id % meta.queue_count

    def _load(self, offset: int) -> Message | None:
        try:
            result = self._store.read(TIMER_TOPIC, TIMER_QUEUE, offset, 1)
        except RefusedError:
            return None  # removed by retention: nothing left to deliver
        if not result.messages or result.messages[0].queue_offset != offset:
            return None
        return stored_to_message(result.messages[0])
