"""The read side of the store: messages, offsets and counts of one queue, from its index and
the commitlog. Damage older than recovery's walk, found by a read, is reported once, set
aside in quarantine/ and counted (``corrupt_records_read``); the read goes on without it."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from popmq.broker.contract.types import StoredMessage
from popmq.broker.store.commitlog import CommitLog, PositionPurged, segment_name
from popmq.broker.store.damage import DamageEvent, Quarantine
from popmq.broker.store.errors import OffsetOutOfRangeError, OffsetPurgedError
from popmq.broker.store.queue_index import QueueIndex
from popmq.broker.store.reader import count_tagged, fetch_messages, select_entries

log = logging.getLogger(__name__)


@dataclass(slots=True)
class ReadResult:
    messages: list[StoredMessage]
    next_offset: int


class QueueReader:
    def __init__(
        self, data_dir: Path, commitlog: CommitLog, queue: Callable[[str, int], QueueIndex]
    ) -> None:
        self._dir = data_dir
        self._commitlog = commitlog
        self._queue = queue  # the index of (topic, queue id); refuses an unknown queue
        self.corrupt_records_read = 0
        self._corrupt_seen: set[int] = set()
        self._bad_entries_seen: set[tuple[str, int, int]] = set()

    def read(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_messages: int,
        tags: frozenset[str] | None = None,
        max_bytes: int = 8 << 20,
    ) -> ReadResult:
        """Up to ``max_messages`` messages from ``offset`` on (at least one if any, then no more
        than ``max_bytes`` of records). With ``tags``, other messages are skipped but still
        advance ``next_offset``; a filtered read scans at most 16384 entries."""
        index = self._queue(topic, queue_id)
        _check_offset(topic, queue_id, index, offset)
        if max_messages <= 0:
            return ReadResult([], offset)
        selected, next_offset = select_entries(index, offset, max_messages, tags, max_bytes)
        if not selected:
            return ReadResult([], next_offset)
        try:
            messages = fetch_messages(
                self._commitlog, topic, queue_id, selected, tags, self._count_corrupt_read,
                self._count_bad_index_entry,
            )  # fmt: skip
        except PositionPurged:
            raise OffsetPurgedError(topic, queue_id, offset, index.min_offset) from None
        return ReadResult(messages, next_offset)

    def peek_offsets(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_messages: int,
        tags: frozenset[str] | None = None,
    ) -> tuple[list[int], int]:
        """The offsets ``read`` would return from ``offset`` (and its next offset), from the
        index alone: nothing is fetched or decoded. A tag hash collision may let a message
        with another tag through (``read`` drops it); a corrupt record is not noticed."""
        index = self._queue(topic, queue_id)
        _check_offset(topic, queue_id, index, offset)
        if max_messages <= 0:
            return [], offset
        selected, next_offset = select_entries(index, offset, max_messages, tags, 1 << 62)
        return [entry[2] for entry in selected], next_offset

    def offset_for_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The first offset stored at or after ``timestamp_ms``; the max offset if none."""
        index = self._queue(topic, queue_id)
        return index.bisect(index.min_offset, index.max_offset, lambda e: e[3], timestamp_ms)

    def count_matching(
        self, topic: str, queue_id: int, start: int, end: int, tags: frozenset[str] | None
    ) -> int:
        """Messages in [start, end) whose tag is in ``tags`` (None: all). Exact for short
        ranges; past 65536 entries the share of matches seen so far is extrapolated."""
        index = self._queue(topic, queue_id)
        start = max(start, index.min_offset)
        end = min(end, index.max_offset)
        if end <= start:
            return 0
        if tags is None:
            return end - start
        return count_tagged(index, start, end, tags)

    def _count_bad_index_entry(self, topic: str, queue_id: int, offset: int, size: int) -> None:
        """A read found an index entry with a wrong size whose record is intact: the record
        was served; report the entry once per start and count it (a corrupt read)."""
        if (topic, queue_id, offset) in self._bad_entries_seen:
            return
        self._bad_entries_seen.add((topic, queue_id, offset))
        self.corrupt_records_read += 1
        log.error("store: the index entry of %s/%d offset %d is damaged (size %d does not match "
                  "its intact record); served the record; to repair, stop the broker and delete "
                  "DATA/index/%s/%d (rebuilt at start)", topic, queue_id, offset, size, topic,
                  queue_id)  # fmt: skip

    def _count_corrupt_read(self, position: int, size: int) -> None:
        """A read found a damaged record (older than recovery's walk): report it once per
        start, set its bytes aside like recovery does, and count it."""
        if position in self._corrupt_seen:
            return
        self._corrupt_seen.add(position)
        segment = self._commitlog.segment_start_for(position)
        event = DamageEvent(f"commitlog/{segment_name(segment)}", position, position + size,
                            "damaged", frames_lost=1)  # fmt: skip
        quarantine = Quarantine(self._dir)
        if quarantine.known(event.file, event.start, event.end):
            return
        self.corrupt_records_read += 1
        try:
            quarantine.keep(event, self._commitlog.read(position, size))
        except (OSError, ValueError, PositionPurged) as exc:
            log.error("store: could not copy damaged record at %d aside: %s", position, exc)
        log.error("store: damaged commitlog record at %d..%d in %s found by a read (1 frame "
                  "lost); skipped, copied to %s", event.start, event.end, event.file,
                  event.quarantined_to or "(nothing)")  # fmt: skip


def _check_offset(topic: str, queue_id: int, index: QueueIndex, offset: int) -> None:
    if offset < 0 or offset > index.max_offset:
        raise OffsetOutOfRangeError(topic, queue_id, offset, index.max_offset)
    if offset < index.min_offset:
        raise OffsetPurgedError(topic, queue_id, offset, index.min_offset)
