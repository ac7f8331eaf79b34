"""Bringing the commitlog and the queue indexes back in line when the store opens.

The checkpoint (written by the flush task after fsyncing the commitlog and every index) says:
"everything below commitlog position P, and every index entry for it, is on disk; queue q's
index files held offsets F_q .. M_q - 1 then". Opening therefore:

1. walks the commitlog from the segment holding P to the end, checking every frame, and cuts
   it at the first torn or corrupt frame (a crash mid-write leaves such a tail);
2. drops index entries that point at or after that segment start, and re-adds an entry for
   every record the walk found (so an index that lagged or ran ahead of the commitlog is fixed);
3. checks each index against the commitlog (its last entry must be the record it claims, and it
   must span at least the offsets it spanned at the checkpoint); an index that fails, or whose
   files are missing or short, is rebuilt from a walk over the whole commitlog.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from popmq.broker.store.codec import decode_header, tag_hash
from popmq.broker.store.commitlog import CommitLog, PositionPurged
from popmq.broker.store.framing import HEADER_SIZE
from popmq.broker.store.queue_index import ENTRY, QueueIndex
from popmq.broker.store.topics import TopicRecord

log = logging.getLogger(__name__)

QueueKey = tuple[str, int]


def queue_key_text(topic: str, queue_id: int) -> str:
    return f"{topic}/{queue_id}"


@dataclass
class RecoveryReport:
    scanned_from: int = 0
    records_scanned: int = 0
    bytes_cut: int = 0
    entries_readded: int = 0
    rebuilt_queues: list[str] = field(default_factory=list)
    last_store_timestamp_ms: int = 0


@dataclass
class _Pending:
    """Index entries found by a walk, written to the index in one go."""

    next_offset: int
    entries: bytearray = field(default_factory=bytearray)


class Recovery:
    def __init__(
        self,
        commitlog: CommitLog,
        topics: dict[str, TopicRecord],
        indexes: dict[QueueKey, QueueIndex],
        damaged: set[QueueKey],
        checkpoint: dict | None,
    ) -> None:
        self._log = commitlog
        self._topics = topics
        self._indexes = indexes
        self._damaged = set(damaged)
        self._checkpoint_position = int((checkpoint or {}).get("position", 0))
        # "topic/queue" -> [first offset held in an index file, max offset] at the checkpoint
        self._expected: dict[str, list[int]] = dict((checkpoint or {}).get("queues", {}))
        self.report = RecoveryReport()

    def run(self) -> RecoveryReport:
        scan_from = self._log.segment_start_for(self._checkpoint_position)
        inconsistent = self._log.first_inconsistent_start()
        if inconsistent is not None:
            scan_from = min(scan_from, inconsistent)
        self.report.scanned_from = scan_from
        for key, index in self._indexes.items():
            if key not in self._damaged:
                self._drop_entries_from(index, scan_from)
                if not self._last_entry_matches(key, index):
                    self._damaged.add(key)
        pending: dict[QueueKey, _Pending] = {}
        self.report.bytes_cut = self._log.recover_tail(
            scan_from, self._collector(pending, self._damaged, strict=True)
        )
        self._write_pending(pending)
        for key, index in self._indexes.items():
            first, top = self._expected.get(queue_key_text(*key), (0, 0))
            # Fewer entries than the checkpoint saw: an index file was lost or cut short.
            # (A first offset above the checkpoint's can also follow retention that ran just
            # before a crash; the rebuild then merely confirms the index.)
            if index.max_offset < top or index.first_offset > first:
                self._damaged.add(key)
        if self._damaged:
            self._rebuild(self._damaged)
        for index in self._indexes.values():
            if index.max_offset > index.first_offset:
                ts = index.entry(index.max_offset - 1)[3]
                self.report.last_store_timestamp_ms = max(self.report.last_store_timestamp_ms, ts)
        return self.report

    # -- steps -------------------------------------------------------------------------------
    @staticmethod
    def _drop_entries_from(index: QueueIndex, position: int) -> None:
        first = index.bisect(index.first_offset, index.max_offset, lambda e: e[0], position)
        index.truncate(first)

    def _last_entry_matches(self, key: QueueKey, index: QueueIndex) -> bool:
        if index.max_offset == index.first_offset:
            return True
        offset = index.max_offset - 1
        position, size, _, _ = index.entry(offset)
        try:
            payload = self._log.read_frame(position)
        except PositionPurged:
            return True  # retention took it: nothing left to check against
        if payload is None or len(payload) + HEADER_SIZE != size:
            return False
        try:
            header = decode_header(payload)
        except ValueError:
            return False
        return (header.topic, header.queue_id, header.queue_offset) == (*key, offset)

    def _collector(
        self, pending: dict[QueueKey, _Pending], wanted: set[QueueKey], strict: bool
    ) -> Callable[[int, memoryview], None]:
        """on_record for a walk: queue an index entry for each record of a known topic.

        strict (the tail walk): records of queues in ``wanted`` are skipped (they get a full
        rebuild); other queues must continue exactly at their index's max offset, else they
        join ``wanted``. Not strict (the rebuild walk): only queues in ``wanted`` are
        collected, starting wherever their first surviving record is.
        """

        def on_record(position: int, payload: memoryview) -> None:
            self.report.records_scanned += 1
            try:
                header = decode_header(payload)
            except ValueError:
                log.error("store recovery: undecodable record at %d; not indexed", position)
                return
            topic = self._topics.get(header.topic)
            if topic is None or position < topic.since or header.queue_id >= topic.queue_count:
                return  # a deleted topic's leftovers
            key = (header.topic, header.queue_id)
            if strict == (key in wanted):
                return
            slot = pending.get(key)
            if slot is None:
                start = self._indexes[key].max_offset if strict else header.queue_offset
                slot = pending[key] = _Pending(start)
            if header.queue_offset != slot.next_offset:
                if strict:
                    wanted.add(key)
                    del pending[key]
                    return
                log.warning("store recovery: %s/%d jumps from offset %d to %d",
                            *key, slot.next_offset, header.queue_offset)  # fmt: skip
                slot.entries.clear()
                slot.next_offset = header.queue_offset
            slot.entries += ENTRY.pack(
                position, len(payload) + HEADER_SIZE, tag_hash(header.tag),
                header.store_timestamp_ms,
            )  # fmt: skip
            slot.next_offset += 1
            self.report.last_store_timestamp_ms = max(
                self.report.last_store_timestamp_ms, header.store_timestamp_ms
            )

        return on_record

    def _write_pending(self, pending: dict[QueueKey, _Pending]) -> None:
        for key, slot in pending.items():
            if slot.entries:
                self._indexes[key].append(bytes(slot.entries))
                self.report.entries_readded += len(slot.entries) // ENTRY.size

    def _rebuild(self, keys: set[QueueKey]) -> None:
        pending: dict[QueueKey, _Pending] = {}
        since = min(self._topics[topic].since for topic, _ in keys)
        self._log.scan(since, self._collector(pending, keys, strict=False))
        for key in keys:
            slot = pending.get(key)
            index = self._indexes[key]
            if slot is not None:
                base = slot.next_offset - len(slot.entries) // ENTRY.size
            else:  # nothing left in the commitlog: keep the offsets the queue had reached
                base = self._expected.get(queue_key_text(*key), (0, 0))[1]
            index.reset(base)
            self.report.rebuilt_queues.append(queue_key_text(*key))
            log.warning("store recovery: rebuilt the index of %s/%d from the commitlog", *key)
        self._write_pending(pending)
