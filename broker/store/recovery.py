"""Bringing the commitlog and the queue indexes back in line when the store opens.

The checkpoint (written by the flush task after fsyncing the commitlog and every index) says:
"everything below commitlog position P, and every index entry for it, is on disk; queue q's
index files held offsets F_q .. M_q - 1 then". Opening therefore:

1. walks the commitlog from the segment holding P to the end, checking every frame. Damaged
   bytes are copied to the quarantine (damage.py) and skipped: the walk resyncs at the next
   valid frame, so every intact record after damage stays indexed and readable. Only the end
   of the last segment is cut (a torn tail when it lies past P; reported as damage if not);
2. drops index entries that point at or after that segment start, and re-adds an entry for
   every record the walk found (so an index that lagged or ran ahead of the commitlog is fixed);
3. checks each index against the commitlog (its last entry must be the record it claims, and it
   must span at least the offsets it spanned at the checkpoint); an index that fails, or whose
   files are missing or short, is rebuilt from a walk over the whole commitlog.

Lost messages keep their queue offsets: the index gets a *hole* entry (frame size HOLE_SIZE)
for each offset whose record was inside damaged or missing bytes, so offsets never move or get
reused, and readers skip holes (reader.py). Every damaged range is logged at ERROR (WARNING
for a torn tail), recorded in ``StoreFaults`` (metrics) with the number of frames lost.
"""

from __future__ import annotations

import array
import bisect
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from popmq.broker.store.codec import RECORD_VERSION, decode_header, tag_hash
from popmq.broker.store.commitlog import CommitLog, PositionPurged, segment_name
from popmq.broker.store.damage import (
    TORN_TAIL,
    UNREADABLE,
    DamageEvent,
    Quarantine,
    StoreFaults,
)
from popmq.broker.store.framing import HEADER_SIZE, MAX_FRAME_PAYLOAD, Resync
from popmq.broker.store.queue_index import ENTRY, HOLE_SIZE, QueueIndex
from popmq.broker.store.topics import TopicRecord

log = logging.getLogger(__name__)

QueueKey = tuple[str, int]


def queue_key_text(topic: str, queue_id: int) -> str:
    return f"{topic}/{queue_id}"


COMMITLOG_FILE = "commitlog"


def _decodable(payload: memoryview) -> bool:
    try:
        decode_header(payload)
    except (ValueError, UnicodeDecodeError):
        return False
    return True


_KNOWN = "(quarantined by an earlier start)"
RECORD_RESYNC = Resync(bytes([RECORD_VERSION]), _decodable)


@dataclass
class RecoveryReport:
    scanned_from: int = 0
    records_scanned: int = 0
    bytes_scanned: int = 0  # commitlog bytes walked (the tail, and any rebuild's walk)
    bytes_cut: int = 0
    entries_readded: int = 0
    rebuilt_queues: list[str] = field(default_factory=list)
    last_store_timestamp_ms: int = 0
    holes: int = 0  # queue offsets whose records were lost (index holes written)
    repaired_queues: list[str] = field(default_factory=list)  # short indexes, re-added


@dataclass
class _Pending:
    """Index entries found by a walk, written to the index in one go."""

    next_offset: int
    entries: bytearray = field(default_factory=bytearray)
    last_position: int = -1  # of the queue's previous record in this walk
    last_timestamp_ms: int = 0


class Recovery:
    def __init__(
        self,
        commitlog: CommitLog,
        topics: dict[str, TopicRecord],
        indexes: dict[QueueKey, QueueIndex],
        damaged: set[QueueKey],
        checkpoint: dict | None,
        quarantine: Quarantine,
        faults: StoreFaults,
    ) -> None:
        self._log = commitlog
        self._topics = topics
        self._indexes = indexes
        self._damaged = set(damaged)
        self._checkpoint_position = int((checkpoint or {}).get("position", 0))
        # A follower's checkpoint (replication/indexer.py): it walked and checked every frame
        # below its position, so the walk starts there, not at the segment's start.
        self._exact_start = bool((checkpoint or {}).get("from_replica", False))
        # "topic/queue" -> [first offset held in an index file, max offset] at the checkpoint
        self._expected: dict[str, list[int]] = dict((checkpoint or {}).get("queues", {}))
        self.report = RecoveryReport()
        self._quarantine = quarantine
        self._faults = faults
        # Damaged/missing commitlog ranges found by the walks, by start position.
        self._damage: dict[int, DamageEvent] = {}
        self._damage_starts: list[int] = []
        self._last_damage = -1  # start of the latest damage the current walk passed
        # Positions of index entries at or after the scan start, before they were dropped:
        # records the walk does not find again were lost (queue -> (first offset, positions)).
        self._old_tail: dict[QueueKey, tuple[int, array.array]] = {}
        self._min_offset_before = {
            key: index.first_offset for key, index in indexes.items() if key not in damaged
        }

    def run(self) -> RecoveryReport:
        scan_from = self._log.segment_start_for(self._checkpoint_position)
        if self._exact_start and scan_from <= self._checkpoint_position <= self._log.write_position:
            scan_from = self._checkpoint_position
        inconsistent = self._log.first_inconsistent_start()
        if inconsistent is not None:
            scan_from = min(scan_from, inconsistent)
        self.report.scanned_from = scan_from
        short: list[QueueKey] = []
        for key, index in self._indexes.items():
            if index.max_offset < self._expected.get(queue_key_text(*key), (0, 0))[1]:
                short.append(key)  # lost entries the checkpoint saw: re-added or rebuilt
            if key not in self._damaged:
                broken = index.first_broken_entry(MAX_FRAME_PAYLOAD + HEADER_SIZE)
                if broken is not None:
                    log.error("store recovery: the index of %s/%d is damaged at offset %d; "
                              "rebuilding it from the commitlog", *key, broken)  # fmt: skip
                    self._damaged.add(key)
                    continue
                self._remember_tail(key, index, scan_from)
                self._drop_entries_from(index, scan_from)
                if not self._last_entry_matches(key, index):
                    self._damaged.add(key)
        pending: dict[QueueKey, _Pending] = {}
        self._last_damage = -1
        self.report.bytes_cut = self._log.recover_tail(
            scan_from,
            self._collector(pending, self._damaged, strict=True),
            self._on_damage,
            self._checkpoint_position,
            RECORD_RESYNC,
        )
        self.report.bytes_scanned += max(0, self._log.write_position - scan_from)
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
        for key in short:
            if key not in self._damaged:
                self.report.repaired_queues.append(queue_key_text(*key))
                log.warning("store recovery: the index of %s/%d had lost entries; re-added "
                            "from the commitlog", *key)  # fmt: skip
        if self._damage:
            self._pad_lost_tails()
        self._report_damage()
        for index in self._indexes.values():
            if index.max_offset > index.first_offset:
                ts = index.entry(index.max_offset - 1)[3]
                self.report.last_store_timestamp_ms = max(self.report.last_store_timestamp_ms, ts)
        return self.report

    # -- damage ------------------------------------------------------------------------------
    def _on_damage(self, start: int, end: int, reason: str, data: bytes) -> None:
        """A damaged, missing or torn range of the commitlog (each range reported once)."""
        self._last_damage = start
        if start in self._damage:
            return
        file = f"{COMMITLOG_FILE}/{segment_name(self._log.segment_start_for(start))}"
        event = DamageEvent(file, start, end, reason)
        if self._quarantine.known(file, start, end):
            event.quarantined_to = _KNOWN
        else:
            self._quarantine.keep_bytes(event, data)
        self._damage[start] = event
        bisect.insort(self._damage_starts, start)

    def _damage_at(self, position: int) -> DamageEvent | None:
        index = bisect.bisect_right(self._damage_starts, position) - 1
        if index < 0:
            return None
        event = self._damage[self._damage_starts[index]]
        return event if position < event.end else None

    def _add_holes(self, slot: _Pending, count: int, position: int) -> None:
        hole = ENTRY.pack(position, HOLE_SIZE, 0, slot.last_timestamp_ms)
        slot.entries += hole * count
        slot.next_offset += count
        self.report.holes += count
        event = self._damage.get(position)
        if event is not None:
            event.frames_lost += count

    def _remember_tail(self, key: QueueKey, index: QueueIndex, scan_from: int) -> None:
        first = index.bisect(index.first_offset, index.max_offset, lambda e: e[0], scan_from)
        positions = array.array("Q")
        raw = index.read_raw(first, index.max_offset - first) if index.max_offset > first else b""
        for position, _, _, _ in ENTRY.iter_unpack(raw):
            positions.append(position)
        self._old_tail[key] = (first, positions)

    def _pad_lost_tails(self) -> None:
        """Give each queue back the offsets its index had reached before recovery whose records
        were lost (inside damage, or past the end of the recovered log), as holes, so offsets
        are never reused and the loss is counted."""
        log_end = self._log.write_position
        last_event = self._damage[self._damage_starts[-1]]
        for key, index in self._indexes.items():
            first, positions = self._old_tail.get(key, (0, array.array("Q")))
            target = index.max_offset
            lost_event: DamageEvent | None = None
            for i in range(len(positions) - 1, -1, -1):
                if first + i < index.max_offset:
                    break
                position = positions[i]
                event = self._damage_at(position)
                if event is None and position >= log_end:
                    event = last_event
                if event is not None:
                    target = max(target, first + i + 1)
                    lost_event = lost_event or event
            top = self._expected.get(queue_key_text(*key), (0, 0))[1]
            target = max(target, top)
            missing = target - index.max_offset
            if missing <= 0:
                continue
            event = lost_event or last_event
            position, last_ts = min(event.start, log_end), 0
            if index.max_offset > index.first_offset:
                previous, _, _, last_ts = index.entry(index.max_offset - 1)
                position = max(position, previous)
            index.append(ENTRY.pack(position, HOLE_SIZE, 0, last_ts) * missing)
            event.frames_lost += missing
            self.report.holes += missing
            log.error("store recovery: %s/%d offsets %d..%d were lost with damaged commitlog "
                      "bytes; they stay reserved (readers skip them)",
                      *key, target - missing, target - 1)  # fmt: skip

    def _report_damage(self) -> None:
        for start in self._damage_starts:
            event = self._damage[start]
            if event.quarantined_to == _KNOWN:
                log.warning("store recovery: commitlog bytes %d..%d in %s are still damaged "
                            "(quarantined and reported at an earlier start)",
                            event.start, event.end, event.file)  # fmt: skip
                continue
            self._faults.damage.append(event)
            self._quarantine.record(event)
            level = logging.WARNING if event.reason == TORN_TAIL else logging.ERROR
            log.log(
                level,
                "store recovery: %s commitlog bytes %d..%d in %s (%d bytes, %d frames lost); %s",
                event.reason.replace("_", " "), event.start, event.end, event.file, event.size,
                event.frames_lost,
                f"copied to {event.quarantined_to}" if event.quarantined_to
                else "nothing left to copy",
            )  # fmt: skip

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
        if size == HOLE_SIZE:
            return True  # a lost record, reported when it was found
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
            except (ValueError, UnicodeDecodeError):
                self._on_damage(position, position + HEADER_SIZE + len(payload), UNREADABLE,
                                bytes(payload))  # fmt: skip
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
                if not strict and self._last_damage >= 0:
                    # A rebuilt queue whose first records were lost: start where it started.
                    first = self._expected.get(queue_key_text(*key), (start, start))[0]
                    start = min(start, max(first, self._min_offset_before.get(key, first)))
                slot = pending[key] = _Pending(start)
            if header.queue_offset > slot.next_offset and self._last_damage > slot.last_position:
                # Records of this queue were inside the damage the walk just passed.
                self._add_holes(slot, header.queue_offset - slot.next_offset, self._last_damage)
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
            slot.last_position = position
            slot.last_timestamp_ms = header.store_timestamp_ms
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
        walked = self._log.write_position - max(since, self._log.min_position)
        self.report.bytes_scanned += max(0, walked)
        self._last_damage = -1
        self._log.scan(
            since, self._collector(pending, keys, strict=False), self._on_damage, RECORD_RESYNC
        )
        for key in keys:
            slot = pending.get(key)
            index = self._indexes[key]
            if slot is not None:
                base = slot.next_offset - len(slot.entries) // ENTRY.size
            else:  # nothing left in the commitlog: keep the offsets the queue had reached
                first, base = self._expected.get(queue_key_text(*key), (0, 0))
                first = max(first, self._min_offset_before.get(key, first))
                if self._damage and first < base:
                    # ... and they were lost with the damage: holes, counted.
                    slot = pending[key] = _Pending(first)
                    self._add_holes(slot, base - first, self._damage_starts[-1])
                    base = first
            index.reset(base)
            self.report.rebuilt_queues.append(queue_key_text(*key))
            log.warning("store recovery: rebuilt the index of %s/%d from the commitlog", *key)
        self._write_pending(pending)
