"""The read path: pick index entries, then fetch and decode their records.

Records of one queue that lie close together in the commitlog are fetched with one read;
every record's checksum is verified before it is decoded.
"""

from __future__ import annotations

import array
import logging
import sys
import zlib
from collections.abc import Callable
from typing import TypeGuard

from popmq.broker.contract.types import StoredMessage
from popmq.broker.store.codec import decode_record, tag_hash
from popmq.broker.store.commitlog import CommitLog, PositionPurged
from popmq.broker.store.framing import FRAME_HEADER, HEADER_SIZE
from popmq.broker.store.queue_index import ENTRY, HOLE_SIZE, QueueIndex

log = logging.getLogger(__name__)

# A filtered read looks at no more than this many index entries per call (RocketMQ bounds
# its filtered pulls the same way), so a rare tag cannot make one read scan a whole queue.
_MAX_FILTER_SCAN = 16_384
_FILTER_CHUNK = 1_024
# Index entries read when counting a tag's backlog; beyond them, extrapolate.
_MAX_COUNT_SCAN = 65_536
# Records closer than this in the commitlog are fetched with one read.
_COALESCE_GAP = 16 * 1024
_COALESCE_SPAN = 4 << 20

_iter_entries = ENTRY.iter_unpack
_crc32 = zlib.crc32
_unpack_frame_header = FRAME_HEADER.unpack_from


def select_entries(
    index: QueueIndex,
    offset: int,
    max_messages: int,
    tags: frozenset[str] | None,
    max_bytes: int,
) -> tuple[list[tuple[int, int, int]], int]:
    """(position, size, offset) of the messages a read returns, and its next offset.

    Unfiltered: the next ``max_messages`` entries. Filtered: entries whose tag hash is one of
    ``tags``, scanning at most _MAX_FILTER_SCAN entries. The first entry is always taken; later
    ones only while the total stays within ``max_bytes``. Holes (entries of records lost to
    damage, see recovery.py) are skipped like filtered-out entries."""
    end = index.max_offset
    codes = None if tags is None else {tag_hash(tag) for tag in tags}
    selected: list[tuple[int, int, int]] = []
    total = 0
    cursor = offset
    scan_end = end if codes is None else min(end, offset + _MAX_FILTER_SCAN)
    while cursor < scan_end:
        want = max_messages - len(selected)
        count = min(scan_end - cursor, want if codes is None else _FILTER_CHUNK)
        for position, size, code, _ in _iter_entries(index.read_raw(cursor, count)):
            if size == HOLE_SIZE or (codes is not None and code not in codes):
                # a hole, whose record recovery found lost (and reported then)
                cursor += 1
                continue
            if selected and total + size > max_bytes:
                return selected, cursor
            selected.append((position, size, cursor))
            total += size
            cursor += 1
            if len(selected) == max_messages:
                return selected, cursor
    return selected, cursor


def fetch_messages(
    commitlog: CommitLog,
    topic: str,
    queue_id: int,
    selected: list[tuple[int, int, int]],
    tags: frozenset[str] | None,
    on_corrupt: Callable[[int, int], None] | None = None,
    on_bad_entry: Callable[[str, int, int, int], None] | None = None,
) -> list[StoredMessage]:
    """Read and decode the selected records. A corrupt record (bad checksum, or not the
    message its index entry claims) is logged, reported (``on_corrupt(position, size)``) and
    skipped rather than blocking the queue. When the record is intact but its index entry is
    not (a wrong size), the record is served and ``on_bad_entry(topic, queue, offset, size)``
    reports the entry."""
    messages: list[StoredMessage] = []
    run_start = 0
    while run_start < len(selected):
        # Grow a run of records close together in the commitlog: one read for all.
        first_position, first_size, _ = selected[run_start]
        limit = first_position + first_size
        run_end = run_start + 1
        while run_end < len(selected):
            position, size, _ = selected[run_end]
            if position < limit or position - limit > _COALESCE_GAP:
                break
            if position + size - first_position > _COALESCE_SPAN:
                break
            limit = position + size
            run_end += 1
        data = memoryview(commitlog.read(first_position, limit - first_position))
        for position, size, offset in selected[run_start:run_end]:
            message = decode_at(data, position - first_position, size)
            if not _is_record(message, topic, queue_id, offset):
                # Perhaps the index entry is what is damaged (a wrong size), not the log:
                # read the frame by the length it carries itself.
                message = _frame_at(commitlog, position)
                if _is_record(message, topic, queue_id, offset) and on_bad_entry is not None:
                    on_bad_entry(topic, queue_id, offset, size)
            if not _is_record(message, topic, queue_id, offset):
                if on_corrupt is not None:
                    on_corrupt(position, size)
                else:
                    log.error("store: record of %s/%d offset %d at position %d is corrupt; "
                              "skipped", topic, queue_id, offset, position)  # fmt: skip
                continue
            if tags is not None and message.tag not in tags:
                continue  # a tag hash collision
            messages.append(message)
        run_start = run_end
    return messages


def _is_record(
    message: StoredMessage | None, topic: str, queue_id: int, offset: int
) -> TypeGuard[StoredMessage]:
    """Is this the record the index entry names (a damaged one decodes as None or another)?"""
    if message is None:
        return False
    return (message.topic, message.queue_id, message.queue_offset) == (topic, queue_id, offset)


def _frame_at(commitlog: CommitLog, position: int) -> StoredMessage | None:
    """The message of the intact frame at ``position`` (by its own length), or None."""
    try:
        payload = commitlog.read_frame(position)
        return None if payload is None else decode_record(memoryview(payload))
    except (OSError, ValueError, PositionPurged):
        return None


def decode_at(data: memoryview, start: int, size: int) -> StoredMessage | None:
    """The message in the frame at ``data[start:start + size]``, or None if it is corrupt."""
    if start + size > len(data) or size <= HEADER_SIZE:
        return None
    length, crc = _unpack_frame_header(data, start)
    payload = data[start + HEADER_SIZE : start + size]
    if length != size - HEADER_SIZE or _crc32(payload) != crc:
        return None
    try:
        return decode_record(payload)
    except ValueError:
        return None


def count_tagged(index: QueueIndex, start: int, end: int, tags: frozenset[str]) -> int:
    """Entries in [start, end) (within the index) whose tag hash is one of ``tags``: exact
    up to _MAX_COUNT_SCAN entries, extrapolated from their share beyond."""
    scanned_end = min(end, start + _MAX_COUNT_SCAN)
    words = array.array("I", index.read_raw(start, scanned_end - start))
    if sys.byteorder == "big":
        words.byteswap()
    # An entry is 6 u32 words; the tag hash is the fourth. Counting runs in C.
    tag_codes = words[3 :: ENTRY.size // 4]
    matches = sum(tag_codes.count(code) for code in {tag_hash(tag) for tag in tags})
    if scanned_end == end:
        return matches
    return round(matches * (end - start) / (scanned_end - start))
