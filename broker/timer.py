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

from popmq.broker.api.errors import BrokerError
from popmq.broker.api.types import Message, StoredMessage
from popmq.broker.pop.queue_state import QueueState

if TYPE_CHECKING:
    from popmq.broker.store.message_store import MessageStore

log = logging.getLogger(__name__)

TIMER_TOPIC = "%SYS%TIMER"
TIMER_QUEUE = 0
TIMER_PROGRESS_GROUP = "%SYS%TIMER_PROGRESS"
PROP_TIMER_TOPIC = "__popmq.timer_topic"
PROP_TIMER_QUEUE = "__popmq.timer_queue"
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
        self._progress = QueueState(0)

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
        end = self._store.max_offset(TIMER_TOPIC, TIMER_QUEUE)
        offset = start
        while offset < end:
            result = self._store.read(TIMER_TOPIC, TIMER_QUEUE, offset, _SCAN_BATCH)
            for stored in result.messages:
                self._track(stored.delivery_timestamp_ms, stored.queue_offset)
            if result.next_offset <= offset:
                break
            offset = result.next_offset
        self._progress.advance_cursor(end)
        return self.pending

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
        """Move every entry that is due to its destination. Returns how many moved."""
        now = self._clock()
        due: list[int] = []
        while self._heap and self._heap[0][0] <= now and len(due) < limit:
            due.append(heapq.heappop(self._heap)[1])
        if not due:
            return 0
        try:
            moved = await self._move(due)
        except BaseException:
            for offset in due:  # not delivered: try again later
                if offset in self._progress.inflight:
                    heapq.heappush(self._heap, (now + 1000, offset))
            raise
        for offset in due:
            if self._progress.mark_done(offset):
                self._store.set_consumer_offset(
                    TIMER_PROGRESS_GROUP, TIMER_TOPIC, TIMER_QUEUE, self._progress.committed
                )
        return moved

    async def _move(self, offsets: list[int]) -> int:
        batches: dict[tuple[str, int], list[Message]] = defaultdict(list)
        for offset in offsets:
            message = self._load(offset)
            if message is None:
                continue
            topic = message.properties.pop(PROP_TIMER_TOPIC, "")
            queue_id = int(message.properties.pop(PROP_TIMER_QUEUE, "0"))
            if not topic or not self._ensure_topic(topic):
                log.warning("timer: dropping %s, destination topic %r is gone", offset, topic)
                continue
            message.topic = topic
            batches[(topic, queue_id)].append(message)
        moved = 0
        for (topic, queue_id), messages in batches.items():
            queue_id = self._valid_queue(topic, queue_id)
            await self._store.append(topic, queue_id, messages)
            moved += len(messages)
        return moved

    def _valid_queue(self, topic: str, queue_id: int) -> int:
        meta = self._store.get_topic(topic)
        if meta is None or 0 <= queue_id < meta.queue_count:
            return queue_id
        return queue_id % meta.queue_count

    def _load(self, offset: int) -> Message | None:
        try:
            result = self._store.read(TIMER_TOPIC, TIMER_QUEUE, offset, 1)
        except BrokerError:
            return None  # removed by retention: nothing left to deliver
        if not result.messages or result.messages[0].queue_offset != offset:
            return None
        return stored_to_message(result.messages[0])
