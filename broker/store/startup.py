"""What ``MessageStore.open`` reads before serving: the metadata documents (with their
fallbacks) and the topic table, completed from the data when topics.log is missing or damaged;
and where an emptied queue's offsets go on from (``keep_committed_offsets``).

Nothing here deletes data for lack of metadata: a damaged document falls back to its previous
copy or to a safe action, and every fallback is logged and recorded in the store's faults.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Container, Mapping
from pathlib import Path
from typing import Any

from popmq.broker.contract.errors import RefusedError
from popmq.broker.store import metafile
from popmq.broker.store.codec import decode_header
from popmq.broker.store.commitlog import CommitLog
from popmq.broker.store.consumer_offsets import ConsumerOffsets
from popmq.broker.store.damage import (
    DAMAGED,
    TORN_TAIL,
    UNREADABLE,
    DamageEvent,
    MetadataFallback,
    Quarantine,
    StoreFaults,
)
from popmq.broker.store.framing import HEADER_SIZE, fsync_dir
from popmq.broker.store.queue_index import QueueIndex
from popmq.broker.store.recovery import RECORD_RESYNC, QueueKey
from popmq.broker.store.topics import (
    LEGACY_NAME,
    LOG_NAME,
    TopicLogLoad,
    TopicRecord,
    TopicTable,
    check_queue_count,
    check_topic_name,
)

log = logging.getLogger(__name__)

_CONSEQUENCE = {
    "full_scan": "recovery scans the whole commitlog instead",
    "reset": "consumer groups restart from their last known position (messages after it "
    "are delivered again: at-least-once)",
    "rebuilt": "topics and queue counts are rebuilt from the commitlog and index dirs",
}


def read_meta(
    data_dir: Path, name: str, action: str, fresh: bool, faults: StoreFaults
) -> Any | None:
    """A metadata document; a missing or damaged one is logged and recorded in faults
    (it falls back to the previous copy if that is intact, else to ``action``)."""
    result = metafile.read(data_dir / name)
    if not result.fell_back or (fresh and result.source is metafile.Source.MISSING):
        return result.body
    if result.source is metafile.Source.PREVIOUS:
        log.warning("store: %s is %s; using its previous copy %s%s", name, result.problem,
                    name, metafile.PREVIOUS_SUFFIX)  # fmt: skip
        faults.metadata.append(MetadataFallback(name, "previous_copy", result.problem))
        return result.body
    log.error("store: %s is %s and has no intact previous copy; %s", name,
              result.problem or result.source.value, _CONSEQUENCE[action])  # fmt: skip
    faults.metadata.append(MetadataFallback(name, action, result.problem or result.source.value))
    return None


def load_topics(data_dir: Path, table: TopicTable, fresh: bool, faults: StoreFaults) -> bool:
    """Load topics.log (migrating an old topics.json once); False when it is missing or
    damaged: then nothing may be deleted for lack of a topic, and recover_topics completes
    the table from the data."""
    legacy = data_dir / LEGACY_NAME
    if not table.exists() and (legacy.exists() or metafile.previous_path(legacy).exists()):
        return _migrate_topics(data_dir, table, fresh, faults)
    was_missing = not table.exists()
    result = table.load()
    if was_missing and fresh:
        return True
    if result.trusted:
        return True
    _report_topic_log(data_dir, result, faults)
    return False


def _migrate_topics(data_dir: Path, table: TopicTable, fresh: bool, faults: StoreFaults) -> bool:
    """An old topics.json (and .prev) becomes topics.log; the old files are kept renamed
    ``.migrated``. A damaged one is reported as before (previous copy, or rebuilt)."""
    body = read_meta(data_dir, LEGACY_NAME, "rebuilt", fresh, faults)
    table.load_doc(body if isinstance(body, dict) else {})
    trusted = not any(m.file == LEGACY_NAME for m in faults.metadata)
    table.rewrite()
    legacy = data_dir / LEGACY_NAME
    for path in (legacy, metafile.previous_path(legacy)):
        if path.exists():
            path.replace(path.with_name(path.name + ".migrated"))
    fsync_dir(data_dir)
    log.info("store: migrated %d topics from %s to %s", len(table.topics), LEGACY_NAME,
             LOG_NAME)  # fmt: skip
    return trusted


def _report_topic_log(data_dir: Path, result: TopicLogLoad, faults: StoreFaults) -> None:
    """Missing or damaged topics.log: logged, damaged bytes copied to quarantine/,
    counted (metrics), and the table rebuilt from the data by the caller."""
    quarantine = Quarantine(data_dir)
    for run in result.damage:
        event = DamageEvent(LOG_NAME, run.start, run.end,
                            TORN_TAIL if run.tail else DAMAGED, frames_lost=1)  # fmt: skip
        if not quarantine.known(LOG_NAME, run.start, run.end):
            quarantine.keep(event, run.data)
        faults.damage.append(event)
    for position, payload in result.unreadable:
        end = position + HEADER_SIZE + len(payload)
        event = DamageEvent(LOG_NAME, position, end, UNREADABLE, frames_lost=1)
        quarantine.keep(event, payload)
        faults.damage.append(event)
    problem = "missing" if result.missing else (
        f"{len(result.damage) + len(result.unreadable)} damaged records"
    )  # fmt: skip
    log.error("store: %s is %s; topics and queue counts are rebuilt from the commitlog "
              "and index dirs (damaged bytes are kept in quarantine/)", LOG_NAME,
              problem)  # fmt: skip
    faults.metadata.append(MetadataFallback(LOG_NAME, "rebuilt", problem))


def recover_topics(data_dir: Path, table: TopicTable, commitlog: CommitLog) -> None:
    """Complete the topic table from the index directories and the commitlog's records
    (topic names and queue ids), so no topic's data is dropped for lack of metadata."""
    found: dict[str, int] = {}
    root = data_dir / "index"
    if root.is_dir():
        for entry in root.iterdir():
            if not entry.is_dir():
                continue
            queues = [int(q.name) for q in entry.iterdir() if q.name.isdigit()]
            if queues:
                found[entry.name] = max(queues) + 1

    def on_record(position: int, payload: memoryview) -> None:
        try:
            header = decode_header(payload)
        except (ValueError, UnicodeDecodeError):
            return  # reported by recovery
        found[header.topic] = max(found.get(header.topic, 0), header.queue_id + 1)

    commitlog.scan(commitlog.min_position, on_record, lambda *_: None, RECORD_RESYNC)
    topics = table.topics
    added = 0
    for name, queue_count in sorted(found.items()):
        try:
            check_topic_name(name)
            check_queue_count(queue_count)
        except RefusedError:
            log.error("store: found data of an invalid topic %r (%d queues); left as is",
                      name, queue_count)  # fmt: skip
            continue
        record = topics.get(name)
        if record is None:
            topics[name] = TopicRecord(name, queue_count, 0)
            added += 1
        elif record.queue_count < queue_count:
            record.queue_count = queue_count
            added += 1
    table.rewrite()
    log.error("store: %s rebuilt: %d topics (%d added or grown from the commitlog and "
              "index dirs)", LOG_NAME, len(topics), added)  # fmt: skip


def remove_stray_index_dirs(data_dir: Path, topics: Container[str]) -> None:
    """Index directories of topics the table does not know (deleted just before a crash)."""
    root = data_dir / "index"
    if not root.is_dir():
        return
    for entry in root.iterdir():
        if entry.name not in topics:
            shutil.rmtree(entry, ignore_errors=True)


def keep_committed_offsets(
    offsets: ConsumerOffsets, indexes: Mapping[QueueKey, QueueIndex]
) -> None:
    """A queue with no record left whose groups committed past its end (a replicated copy
    made after retention deleted every record of the queue: nothing told its index where
    the offsets had reached) goes on from the highest committed offset, so new messages
    never get offsets a group has already passed (it would never receive them)."""
    reached: dict[QueueKey, int] = {}
    for group, topic, queue_id in offsets.keys():
        key = (topic, queue_id)
        reached[key] = max(reached.get(key, 0), offsets.get((group, topic, queue_id)))
    for key, offset in reached.items():
        index = indexes.get(key)
        if index is None or index.min_offset < index.max_offset or offset <= index.max_offset:
            continue
        log.warning("store: %s/%d holds no message and starts at offset %d, where its "
                    "groups' committed offsets had reached (its records were deleted by "
                    "retention before this copy was made)", *key, offset)  # fmt: skip
        index.reset(offset)
