"""The broker's durable message store: topics split in queues over one commitlog.

Layout under ``data_dir``::

    LOCK                       held while open (one store per directory)
    FORMAT                     on-disk format version (data_format.py)
    topics.log                 topic table: append-only checksummed records (topics.py)
    checkpoint.json            recovery start point (see recovery.py; metafile.py)
    consumer_offsets.json      committed offsets per (group, topic, queue) (metafile.py)
    quarantine/                damaged bytes recovery copied aside (damage.py)
    commitlog/<20 digits>      segments of checksummed message records
    index/<topic>/<queue>/<20 digits>   fixed-size index entries per queue
    state/<name>.json          small documents of other services (save_state; metafile.py)

Damaged or missing files never make the store delete data: recovery keeps what is intact,
copies damage aside, falls back to the previous copy of a metadata file or rebuilds it from
the commitlog, and records every such event in ``faults`` (logged, and counted in metrics).

Durability (``StoreConfig.flush``):

* ``"sync"``: ``append`` returns only after the commitlog is fsynced; concurrent appends share
  one fsync (group commit). Nothing acknowledged is lost, even on a power cut.
* ``"async"``: ``append`` returns once the data is in the OS page cache; the flush task fsyncs
  every ``flush_interval_ms``. A crash of the process loses nothing, but a crash of the
  machine (power cut, kernel panic) can lose what was acknowledged in the last
  ``flush_interval_ms`` before it.

In both modes the flush task also fsyncs the queue indexes and writes the checkpoint and the
consumer offsets every ``flush_interval_ms`` (and at close), so committed consumer offsets can
lag by that interval after a machine crash; indexes are rebuilt from the commitlog anyway.
Messages are readable as soon as they are written, before their fsync.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import re
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.message_types import MessageType
from popmq.broker.contract.types import Message, StoredMessage
from popmq.broker.store import data_format, metafile
from popmq.broker.store.codec import decode_header, encode_record, tag_hash
from popmq.broker.store.commitlog import CommitLog, PositionPurged, segment_name
from popmq.broker.store.damage import (
    DAMAGED,
    TORN_TAIL,
    UNREADABLE,
    DamageEvent,
    MetadataFallback,
    Quarantine,
    StoreFaults,
)
from popmq.broker.store.errors import OffsetOutOfRangeError, OffsetPurgedError
from popmq.broker.store.file_budget import FileBudget, fsync_paths
from popmq.broker.store.files import DirLock
from popmq.broker.store.framing import HEADER_SIZE, encode_frame, fsync_dir
from popmq.broker.store.group_commit import GroupCommit
from popmq.broker.store.queue_index import ENTRY, IndexDamaged, QueueIndex
from popmq.broker.store.reader import count_tagged, fetch_messages, select_entries
from popmq.broker.store.recovery import (
    RECORD_RESYNC,
    QueueKey,
    Recovery,
    RecoveryReport,
    queue_key_text,
)
from popmq.broker.store.topics import (
    LEGACY_NAME,
    LOG_NAME,
    TopicLogLoad,
    TopicMeta,
    TopicRecord,
    TopicTable,
    check_queue_count,
    check_topic_name,
)

from popmq.clock import SYSTEM, Clock
from popmq.config import StoreConfig
from popmq.lifecycle import Job, TaskOwner

log = logging.getLogger(__name__)
_WRITE_FAILURE_LOG_EVERY_S = 10.0

ArrivalListener = Callable[[str, int, int, set[str]], None]

_STATE_NAME = re.compile(r"^[A-Za-z0-9_%-][A-Za-z0-9_.%-]{0,199}$")
_RETENTION_INTERVAL_S = 10.0

_pack_entry = ENTRY.pack


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class MessageIds:
    """Ids for messages that arrive without one: a random per-process prefix and a counter.
    (uuid4 per message costs more than the rest of an append.)"""

    def __init__(self) -> None:
        self._prefix = uuid.uuid4().hex[:16].upper()
        self._counter = itertools.count()

    def next(self) -> str:
        return f"{self._prefix}{next(self._counter):016X}"


@dataclass(slots=True)
class ReadResult:
    messages: list[StoredMessage]
    next_offset: int


class MessageStore:
    """See the module docstring. All methods run on the event loop; only fsyncs leave it."""

    def __init__(
        self,
        data_dir: Path,
        broker_name: str,
        config: StoreConfig,
        clock: Callable[[], int] = now_ms,
        *,
        timer: Clock = SYSTEM,
        index_entries_per_file: int = 300_000,
        retention_interval_s: float = _RETENTION_INTERVAL_S,
    ) -> None:
        self._dir = Path(data_dir)
        self._broker_name = broker_name
        self._host_bytes = broker_name.encode()
        self._config = config
        self._clock = clock
        self._timer = timer  # the flush loop's sleeps and intervals (virtual time in tests)
        self._per_file = index_entries_per_file
        self._retention_interval_s = retention_interval_s
        self._handles = FileBudget(config.max_open_files)
        self._lock = DirLock(self._dir)
        self._commitlog = CommitLog(self._dir / "commitlog", config.segment_bytes, self._handles)
        self._group = GroupCommit(self._commitlog)
        self._topic_table = TopicTable(self._dir)
        self._topics: dict[str, TopicRecord] = self._topic_table.topics
        self._topic_bytes: dict[str, bytes] = {}
        self._indexes: dict[QueueKey, QueueIndex] = {}
        self._offsets: dict[tuple[str, str, int], int] = {}
        self._offsets_dirty = False
        # The consumer offsets as last written to disk: what a crash would fall back to.
        self._durable_offsets: dict[tuple[str, str, int], int] = {}
        self._listeners: list[ArrivalListener] = []
        self._tag_hashes: dict[str, int] = {}
        self._ids = MessageIds()
        self._last_store_ts = 0
        self._sync = config.flush == "sync"
        self._checkpoint_lock = asyncio.Lock()
        self._task: Job[None] | None = None
        self._tasks = TaskOwner(f"store:{broker_name}", grace_s=0)  # the flush loop
        self._open = False
        self.recovery: RecoveryReport | None = None
        self.faults = StoreFaults()
        self.was_new = False  # open() found an empty data directory
        # Records found damaged by reads (damage older than recovery's walk; see reader.py).
        self.corrupt_records_read = 0
        self._corrupt_seen: set[int] = set()
        # Failed periodic flushes (fsync or checkpoint), and whether the last one failed: while
        # it does, async appends wait for their own fsync, so none is acknowledged undurable.
        self.flush_failures = 0
        self.flush_failing = False
        self._bad_entries_seen: set[tuple[str, int, int]] = set()
        self.write_failures = 0  # appends refused because the disk failed (full, read-only)
        self._write_failure_logged = -_WRITE_FAILURE_LOG_EVERY_S

    @property
    def data_dir(self) -> Path:
        return self._dir

    @property
    def broker_name(self) -> str:
        return self._broker_name

    @property
    def open_files(self) -> FileBudget:
        """The bounded budget of open index and segment descriptors (for metrics)."""
        return self._handles

    @property
    def commitlog_fsyncs(self) -> int:
        """fsync calls made on commitlog segments so far (group commit makes it small)."""
        return self._commitlog.fsync_count

    # -- lifecycle ---------------------------------------------------------------------------
    def open(self) -> None:
        """Create or recover the store (see recovery.py). Synchronous: call before serving."""
        # Owner-only whatever the process umask (an embedded broker keeps its host's).
        self._dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._lock.acquire()
        try:
            self._open_locked()
        except BaseException:
            self._close_files()
            self._lock.release()
            raise
        self._open = True

    def _open_locked(self) -> None:
        marked = data_format.check_and_mark(self._dir)
        self.faults = StoreFaults()
        self.was_new = marked == "created"
        if marked == "added":
            log.warning("store: %s had no FORMAT marker (deleted, or written before markers "
                        "existed); marked as format %d", self._dir,
                        data_format.CURRENT_VERSION)  # fmt: skip
            self.faults.metadata.append(MetadataFallback("FORMAT", "recreated", "missing"))
        (self._dir / "state").mkdir(exist_ok=True)
        topics_trusted = self._load_topics(fresh=marked == "created")
        self._commitlog.open()
        if not topics_trusted:
            self._recover_topics()
        damaged: set[QueueKey] = set()
        for topic in self._topics.values():
            self._topic_bytes[topic.name] = topic.name.encode()
            for queue_id in range(topic.queue_count):
                index = self._new_index(topic.name, queue_id)
                try:
                    index.open()
                except IndexDamaged as exc:
                    log.warning("store: %s", exc)
                    damaged.add((topic.name, queue_id))
        if topics_trusted:
            self._remove_stray_index_dirs()
        checkpoint = self._read_meta("checkpoint.json", "full_scan", fresh=marked == "created")
        recovery = Recovery(
            self._commitlog, self._topics, self._indexes, damaged,
            checkpoint if isinstance(checkpoint, dict) else None,
            Quarantine(self._dir), self.faults,
        )  # fmt: skip
        self.recovery = recovery.run()
        for queue in self.recovery.rebuilt_queues + self.recovery.repaired_queues:
            # repaired from the commitlog, nothing lost: still reported
            self.faults.metadata.append(
                MetadataFallback(f"index/{queue}", "rebuilt", "damaged, missing or behind")
            )
        self._last_store_ts = self.recovery.last_store_timestamp_ms
        self._advance_min_offsets()
        offsets = self._read_meta("consumer_offsets.json", "reset", fresh=marked == "created")
        for group, topic, queue_id, offset in offsets or []:
            self._offsets[(group, topic, queue_id)] = offset
        self._checkpoint_now()

    # -- metadata files ----------------------------------------------------------------------
    _CONSEQUENCE = {
        "full_scan": "recovery scans the whole commitlog instead",
        "reset": "consumer groups restart from their last known position (messages after it "
        "are delivered again: at-least-once)",
        "rebuilt": "topics and queue counts are rebuilt from the commitlog and index dirs",
    }

    def _read_meta(self, name: str, action: str, fresh: bool) -> Any | None:
        """A metadata document; a missing or damaged one is logged and recorded in faults
        (it falls back to the previous copy if that is intact, else to ``action``)."""
        result = metafile.read(self._dir / name)
        if not result.fell_back or (fresh and result.source is metafile.Source.MISSING):
            return result.body
        if result.source is metafile.Source.PREVIOUS:
            log.warning("store: %s is %s; using its previous copy %s%s", name, result.problem,
                        name, metafile.PREVIOUS_SUFFIX)  # fmt: skip
            self.faults.metadata.append(MetadataFallback(name, "previous_copy", result.problem))
            return result.body
        log.error("store: %s is %s and has no intact previous copy; %s", name,
                  result.problem or result.source.value, self._CONSEQUENCE[action])  # fmt: skip
        self.faults.metadata.append(
            MetadataFallback(name, action, result.problem or result.source.value)
        )
        return None

    def _load_topics(self, fresh: bool) -> bool:
        """Load topics.log (migrating an old topics.json once); False when it is missing or
        damaged: then nothing may be deleted for lack of a topic, and _recover_topics
        completes the table from the data."""
        table = self._topic_table
        legacy = self._dir / LEGACY_NAME
        if not table.exists() and (legacy.exists() or metafile.previous_path(legacy).exists()):
            return self._migrate_topics(fresh)
        was_missing = not table.exists()
        result = table.load()
        self._topics = table.topics
        if was_missing and fresh:
            return True
        if result.trusted:
            return True
        self._report_topic_log(result)
        return False

    def _migrate_topics(self, fresh: bool) -> bool:
        """An old topics.json (and .prev) becomes topics.log; the old files are kept renamed
        ``.migrated``. A damaged one is reported as before (previous copy, or rebuilt)."""
        body = self._read_meta(LEGACY_NAME, "rebuilt", fresh)
        table = self._topic_table
        table.load_doc(body if isinstance(body, dict) else {})
        self._topics = table.topics
        trusted = not any(m.file == LEGACY_NAME for m in self.faults.metadata)
        table.rewrite()
        legacy = self._dir / LEGACY_NAME
        for path in (legacy, metafile.previous_path(legacy)):
            if path.exists():
                path.replace(path.with_name(path.name + ".migrated"))
        fsync_dir(self._dir)
        log.info("store: migrated %d topics from %s to %s", len(self._topics), LEGACY_NAME,
                 LOG_NAME)  # fmt: skip
        return trusted

    def _report_topic_log(self, result: TopicLogLoad) -> None:
        """Missing or damaged topics.log: logged, damaged bytes copied to quarantine/,
        counted (metrics), and the table rebuilt from the data by the caller."""
        quarantine = Quarantine(self._dir)
        for run in result.damage:
            event = DamageEvent(LOG_NAME, run.start, run.end,
                                TORN_TAIL if run.tail else DAMAGED, frames_lost=1)  # fmt: skip
            if not quarantine.known(LOG_NAME, run.start, run.end):
                quarantine.keep(event, run.data)
            self.faults.damage.append(event)
        for position, payload in result.unreadable:
            end = position + HEADER_SIZE + len(payload)
            event = DamageEvent(LOG_NAME, position, end, UNREADABLE, frames_lost=1)
            quarantine.keep(event, payload)
            self.faults.damage.append(event)
        problem = "missing" if result.missing else (
            f"{len(result.damage) + len(result.unreadable)} damaged records"
        )  # fmt: skip
        log.error("store: %s is %s; topics and queue counts are rebuilt from the commitlog "
                  "and index dirs (damaged bytes are kept in quarantine/)", LOG_NAME,
                  problem)  # fmt: skip
        self.faults.metadata.append(MetadataFallback(LOG_NAME, "rebuilt", problem))

    def _recover_topics(self) -> None:
        """Complete the topic table from the index directories and the commitlog's records
        (topic names and queue ids), so no topic's data is dropped for lack of metadata."""
        found: dict[str, int] = {}
        root = self._dir / "index"
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

        self._commitlog.scan(
            self._commitlog.min_position, on_record, lambda *_: None, RECORD_RESYNC
        )
        added = 0
        for name, queue_count in sorted(found.items()):
            try:
                check_topic_name(name)
                check_queue_count(queue_count)
            except RefusedError:
                log.error("store: found data of an invalid topic %r (%d queues); left as is",
                          name, queue_count)  # fmt: skip
                continue
            record = self._topics.get(name)
            if record is None:
                self._topics[name] = TopicRecord(name, queue_count, 0)
                added += 1
            elif record.queue_count < queue_count:
                record.queue_count = queue_count
                added += 1
        self._topic_table.rewrite()
        log.error("store: %s rebuilt: %d topics (%d added or grown from the commitlog and "
                  "index dirs)", LOG_NAME, len(self._topics), added)  # fmt: skip

    def _new_index(self, topic: str, queue_id: int) -> QueueIndex:
        index = QueueIndex(self._dir / "index" / topic / str(queue_id), self._per_file,
                           self._handles)  # fmt: skip
        self._indexes[(topic, queue_id)] = index
        return index

    def _remove_stray_index_dirs(self) -> None:
        root = self._dir / "index"
        if not root.is_dir():
            return
        for entry in root.iterdir():
            if entry.name not in self._topics:  # a topic deleted just before a crash
                shutil.rmtree(entry, ignore_errors=True)

    async def start(self) -> None:
        """Start the flush task (fsyncs, checkpoints, retention); close() stops it."""
        if not self._open:
            raise RefusedError(Code.INTERNAL_ERROR, "open() the store before start()")
        if self._task is None:
            self._task = self._tasks.spawn(self._flush_loop(), "store-flush")

    async def close(self) -> None:
        if not self._open:
            return
        if self._task is not None:
            await self._tasks.aclose()  # cancels the flush loop and waits until it is gone
            self._tasks = TaskOwner(f"store:{self._broker_name}", grace_s=0)
            self._task = None
        try:
            await self.checkpoint()
        finally:
            self._open = False
            self._close_files()
            self._lock.release()

    def _close_files(self) -> None:
        self._topic_table.close()
        for index in self._indexes.values():
            index.close()
        self._commitlog.close()
        self._handles.close()

    async def _flush_loop(self) -> None:
        interval = self._config.flush_interval_ms / 1000
        timer = self._timer
        next_retention = timer.monotonic() + self._retention_interval_s
        while True:
            await timer.sleep(interval)
            try:
                await self.checkpoint()
            except Exception as exc:
                self.flush_failures += 1
                if not self.flush_failing:
                    log.error("store: periodic flush failed (%s); sends now wait for their own "
                              "fsync until a flush succeeds", exc)  # fmt: skip
                self.flush_failing = True
            else:
                if self.flush_failing:
                    log.warning("store: periodic flush works again")
                self.flush_failing = False
            if timer.monotonic() >= next_retention:
                next_retention = timer.monotonic() + self._retention_interval_s
                try:
                    self.apply_retention()
                except Exception:
                    log.exception("store: retention failed")

    # -- durability --------------------------------------------------------------------------
    async def flush(self) -> None:
        """fsync the commitlog up to everything written so far."""
        await self._group.wait_durable(self._commitlog.write_position)

    async def checkpoint(self) -> None:
        """Make the commitlog, the indexes, the consumer offsets and the checkpoint durable;
        then delete the index files that retention emptied."""
        async with self._checkpoint_lock:
            position = self._commitlog.write_position
            extents = self._index_extents()
            await self._group.wait_durable(position)
            paths = [p for idx in self._indexes.values() for p in idx.take_dirty_paths()]
            offsets = self._offsets_snapshot() if self._offsets_dirty else None
            self._offsets_dirty = False
            # A future (not a task): the thread's work, which cancelling cannot stop.
            work = asyncio.get_running_loop().run_in_executor(
                None,
                functools.partial(
                    self._write_checkpoint, paths, position, self._extents_doc(extents), offsets
                ),
            )
            try:
                try:
                    await asyncio.shield(work)
                except asyncio.CancelledError:
                    # The thread goes on regardless: keep the lock until it is done, so the
                    # next checkpoint (close's) never writes the same files at the same time.
                    while not work.done():
                        with contextlib.suppress(BaseException):
                            await asyncio.shield(work)
                    raise
            except BaseException:
                for idx in self._indexes.values():
                    idx.mark_all_dirty()
                self._offsets_dirty = self._offsets_dirty or offsets is not None
                raise
            self._delete_purged_index_files(extents)

    def _checkpoint_now(self) -> None:
        """checkpoint() for synchronous callers (open): everything fsynced inline."""
        target, fds, dir_dirty = self._commitlog.flush_targets()
        self._commitlog.sync_fds(fds, dir_dirty)
        self._commitlog.mark_durable(target, len(fds))
        extents = self._index_extents()
        paths = [p for idx in self._indexes.values() for p in idx.take_dirty_paths()]
        self._write_checkpoint(paths, target, self._extents_doc(extents), self._offsets_snapshot())
        self._offsets_dirty = False
        self._delete_purged_index_files(extents)

    def _index_extents(self) -> list[tuple[QueueKey, QueueIndex, int, int]]:
        """(queue, its index, first offset to keep in a file, max offset) of every queue.

        Index files below the first offset to keep hold only purged entries. They are deleted
        only after a checkpoint recorded the new first offset: recovery treats an index that
        starts later than the checkpoint says as damaged, and must not mistake retention for
        a lost file."""
        return [
            (key, idx, idx.first_kept(idx.min_offset), idx.max_offset)
            for key, idx in self._indexes.items()
        ]

    @staticmethod
    def _extents_doc(extents: list[tuple[QueueKey, QueueIndex, int, int]]) -> dict:
        return {queue_key_text(*key): [first, top] for key, _, first, top in extents}

    def _delete_purged_index_files(
        self, extents: list[tuple[QueueKey, QueueIndex, int, int]]
    ) -> None:
        for key, idx, first, _ in extents:
            if self._indexes.get(key) is idx:  # not deleted (or recreated) meanwhile
                idx.delete_files_below(first)

    def _write_checkpoint(
        self, paths: list[Path], position: int, extents: dict[str, list[int]], offsets: list | None
    ) -> None:
        fsync_paths(paths)
        metafile.write(self._dir / "checkpoint.json", {"position": position, "queues": extents})
        if offsets is not None:
            metafile.write(self._dir / "consumer_offsets.json", offsets)
            self._durable_offsets = {(g, t, q): o for g, t, q, o in offsets}

    def _offsets_snapshot(self) -> list[list[Any]]:
        return [[g, t, q, o] for (g, t, q), o in self._offsets.items()]

    # -- topics ------------------------------------------------------------------------------
    def create_topic(
        self, name: str, queue_count: int, message_type: MessageType | None = None
    ) -> TopicMeta:
        """Create a topic, or grow its queue count. Shrinking is refused (BAD_REQUEST).
        ``message_type`` (None: MIXED) is set at creation only; see set_topic_type."""
        self._check_open()
        check_topic_name(name)
        check_queue_count(queue_count)
        existing = self._topics.get(name)
        if existing is not None:
            if queue_count < existing.queue_count:
                raise RefusedError(
                    Code.BAD_REQUEST,
                    f"topic {name} has {existing.queue_count} queues; they cannot be reduced "
                    f"to {queue_count}",
                )
            if queue_count == existing.queue_count:
                return existing.meta
            first_new = existing.queue_count
            existing.queue_count = queue_count
            record = existing
        else:
            shutil.rmtree(self._dir / "index" / name, ignore_errors=True)
            record = TopicRecord(name, queue_count, self._commitlog.write_position,
                                 message_type or MessageType.MIXED)  # fmt: skip
            self._topics[name] = record
            self._topic_bytes[name] = name.encode()
            first_new = 0
        try:
            for queue_id in range(first_new, queue_count):
                self._new_index(name, queue_id).open()
            self._topic_table.put(record)
        except OSError as exc:
            # Keep memory as topics.log has it: a topic missing there would be dropped, with
            # every message sent to it meanwhile, at the next start.
            for queue_id in range(first_new, queue_count):
                index = self._indexes.pop((name, queue_id), None)
                if index is not None:
                    index.destroy()
            if existing is None:
                del self._topics[name]
                self._topic_bytes.pop(name, None)
                shutil.rmtree(self._dir / "index" / name, ignore_errors=True)
            else:
                existing.queue_count = first_new
            log.error("store: cannot create topic %s (%d queues): %s", name, queue_count, exc)
            raise RefusedError(
                Code.INTERNAL_ERROR, f"cannot create topic {name}: store write failed: {exc}"
            ) from exc
        return record.meta

    def set_topic_type(self, name: str, message_type: MessageType) -> TopicMeta:
        """Give a topic its message type (durable before it returns, like creation)."""
        self._check_open()
        record = self._topic(name)
        if record.message_type != message_type:
            previous, record.message_type = record.message_type, message_type
            try:
                self._topic_table.put(record)
            except OSError as exc:
                record.message_type = previous
                raise RefusedError(
                    Code.INTERNAL_ERROR, f"cannot type topic {name}: store write failed: {exc}"
                ) from exc
        return record.meta

    def get_topic(self, name: str) -> TopicMeta | None:
        record = self._topics.get(name)
        return record.meta if record is not None else None

    def list_topics(self) -> list[TopicMeta]:
        return [record.meta for record in sorted(self._topics.values(), key=lambda r: r.name)]

    def delete_topic(self, name: str) -> None:
        """Forget a topic and its indexes and offsets; its records age out with retention."""
        self._check_open()
        record = self._topic(name)
        del self._topics[name]
        self._topic_bytes.pop(name, None)
        self._topic_table.remove(name)
        for queue_id in range(record.queue_count):
            self._indexes.pop((name, queue_id)).destroy()
        shutil.rmtree(self._dir / "index" / name, ignore_errors=True)
        for key in [key for key in self._offsets if key[1] == name]:
            del self._offsets[key]
            self._offsets_dirty = True

    def _topic(self, name: str) -> TopicRecord:
        record = self._topics.get(name)
        if record is None:
            raise RefusedError(Code.TOPIC_NOT_FOUND, f"topic {name} does not exist")
        return record

    def _queue(self, topic: str, queue_id: int) -> QueueIndex:
        index = self._indexes.get((topic, queue_id))
        if index is None:
            record = self._topic(topic)
            raise RefusedError(
                Code.BAD_REQUEST,
                f"queue {queue_id!r} does not exist: topic {topic} has queues "
                f"0..{record.queue_count - 1}",
            )
        return index

    def _check_open(self) -> None:
        if not self._open:
            raise RefusedError(Code.INTERNAL_ERROR, "the store is not open")

    # -- write -------------------------------------------------------------------------------
    async def _wait_durable(self, position: int) -> None:
        """Group-commit fsync up to ``position``; a failure refuses the send (never an
        acknowledgement of data the disk did not take)."""
        try:
            await self._group.wait_durable(position)
        except RefusedError as exc:
            raise RefusedError(
                Code.MASTER_PERSISTENCE_TIMEOUT, f"the message could not be made durable: {exc}"
            ) from exc

    async def append(
        self, topic: str, queue_id: int, messages: list[Message]
    ) -> list[StoredMessage]:
        """Store messages at the end of one queue, in order. See the module docstring for
        when this returns relative to the fsync."""
        self._check_open()
        index = self._queue(topic, queue_id)
        if not messages:
            return []
        now = self._clock()
        if now < self._last_store_ts:  # keep store times ordered for offset_for_timestamp
            now = self._last_store_ts
        self._last_store_ts = now
        base = index.max_offset
        topic_bytes = self._topic_bytes[topic]
        host = self._host_bytes
        hashes = self._tag_hashes
        frames: list[bytes] = []
        ids: list[str] = []
        for i, message in enumerate(messages):
            message_id = message.message_id or self._ids.next()
            ids.append(message_id)
            payload = encode_record(message, topic_bytes, queue_id, base + i, now, host,
                                    message_id)  # fmt: skip
            frames.append(encode_frame(payload))
        try:
            positions = self._commitlog.append(frames)
            entries = []
            for message, position, frame in zip(messages, positions, frames, strict=True):
                code = hashes.get(message.tag)
                if code is None:
                    if len(hashes) > 4096:
                        hashes.clear()
                    code = hashes[message.tag] = tag_hash(message.tag)
                entries.append(_pack_entry(position, len(frame), code, now))
            index.append(b"".join(entries))
        except OSError as exc:
            self._count_write_failure(exc)
            raise RefusedError(
                Code.MASTER_PERSISTENCE_TIMEOUT,
                f"store write failed, the message was not stored: {exc}",
            ) from exc
        if self._sync or self.flush_failing:
            await self._wait_durable(positions[-1] + len(frames[-1]))
        stored = [
            StoredMessage(
                topic=topic,
                queue_id=queue_id,
                queue_offset=base + i,
                body=message.body,
                tag=message.tag,
                keys=list(message.keys),
                properties=dict(message.properties),
                message_id=ids[i],
                message_group=message.message_group,
                delivery_timestamp_ms=message.delivery_timestamp_ms,
                born_timestamp_ms=message.born_timestamp_ms,
                born_host=message.born_host,
                store_timestamp_ms=now,
                store_host=self._broker_name,
                reconsume_times=message.reconsume_times,
            )
            for i, message in enumerate(messages)
        ]
        self._notify(topic, queue_id, base + len(messages), {m.tag for m in messages})
        return stored

    def add_arrival_listener(self, callback: ArrivalListener) -> None:
        """``callback(topic, queue_id, new_max_offset, tags)`` after every successful append
        (after the fsync in sync mode). Exceptions are logged, never raised into append."""
        self._listeners.append(callback)

    def remove_arrival_listener(self, callback: ArrivalListener) -> None:
        with contextlib.suppress(ValueError):
            self._listeners.remove(callback)

    def _notify(self, topic: str, queue_id: int, max_offset: int, tags: set[str]) -> None:
        for listener in self._listeners:
            try:
                listener(topic, queue_id, max_offset, tags)
            except Exception:
                log.exception("store: arrival listener %r failed", listener)

    # -- read --------------------------------------------------------------------------------
    def min_offset(self, topic: str, queue_id: int) -> int:
        return self._queue(topic, queue_id).min_offset

    def max_offset(self, topic: str, queue_id: int) -> int:
        return self._queue(topic, queue_id).max_offset

    def _check_offset(self, topic: str, queue_id: int, index: QueueIndex, offset: int) -> None:
        if offset < 0 or offset > index.max_offset:
            raise OffsetOutOfRangeError(topic, queue_id, offset, index.max_offset)
        if offset < index.min_offset:
            raise OffsetPurgedError(topic, queue_id, offset, index.min_offset)

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
        self._check_offset(topic, queue_id, index, offset)
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

    def _count_write_failure(self, exc: OSError) -> None:
        """A refused append: counted, and logged at most every few seconds (a full disk
        refuses every send: one line per send would flood the log)."""
        self.write_failures += 1
        now = self._timer.monotonic()
        if now - self._write_failure_logged >= _WRITE_FAILURE_LOG_EVERY_S:
            self._write_failure_logged = now
            log.error("store: cannot write to %s (%s): sends are refused (%d so far); free "
                      "space on the volume or fix it",
                      self._dir, exc, self.write_failures)  # fmt: skip

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
        self._check_offset(topic, queue_id, index, offset)
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

    # -- consumer offsets --------------------------------------------------------------------
    def durable_consumer_offset(self, group: str, topic: str, queue_id: int) -> int:
        """The consumer offset as last written to disk (-1 if never): a crash falls back to
        it, so journal entries above it must be kept."""
        return self._durable_offsets.get((group, topic, queue_id), -1)

    def consumer_offset_keys(self) -> list[tuple[str, str, int]]:
        """Every (group, topic, queue id) with a committed consumer offset."""
        return list(self._offsets)

    def get_consumer_offset(self, group: str, topic: str, queue_id: int) -> int:
        self._queue(topic, queue_id)
        return self._offsets.get((group, topic, queue_id), -1)

    def set_consumer_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        self._queue(topic, queue_id)
        if not isinstance(offset, int) or offset < 0:
            raise RefusedError(Code.BAD_REQUEST, f"consumer offset must be >= 0, got {offset!r}")
        key = (group, topic, queue_id)
        if self._offsets.get(key) != offset:
            self._offsets[key] = offset
            self._offsets_dirty = True

    def delete_consumer_offsets(self, group: str) -> int:
        """Remove every committed offset of ``group`` (a deleted group); returns how many."""
        keys = [key for key in self._offsets if key[0] == group]
        for key in keys:
            del self._offsets[key]
        if keys:
            self._offsets_dirty = True
        return len(keys)

    # -- small documents ---------------------------------------------------------------------
    def _state_path(self, name: str) -> Path:
        if not isinstance(name, str) or not _STATE_NAME.match(name):
            raise RefusedError(Code.BAD_REQUEST, f"illegal state document name {name!r}")
        return self._dir / "state" / f"{name}.json"

    def load_state(self, name: str) -> Any | None:
        """A document saved by save_state, or None if there is none. A damaged one falls back
        to its previous copy (logged, in ``faults``); None (logged) if neither is intact."""
        path = self._state_path(name)
        result = metafile.read(path)
        if result.fell_back and result.source is not metafile.Source.MISSING:
            log.error("store: state document %s is %s; %s", path.name, result.problem,
                      "using its previous copy" if result.body is not None
                      else "no intact previous copy: starting without it")  # fmt: skip
            action = "previous_copy" if result.body is not None else "reset"
            self.faults.metadata.append(MetadataFallback(f"state/{path.name}", action,
                                                         result.problem))  # fmt: skip
        return result.body

    def save_state(self, name: str, value: Any) -> None:
        """Atomically replace a document (metafile.write: checksum, previous copy kept);
        blocks for the fsync."""
        metafile.write(self._state_path(name), value)

    # -- retention ---------------------------------------------------------------------------
    def apply_retention(self) -> int:
        """Delete whole commitlog segments older than ``retention_hours`` (by last write) or
        beyond ``retention_bytes`` (oldest first); never the active one, nor one not yet
        fsynced. Queue min offsets move up at once; index files left empty go at the next
        checkpoint. Returns the commitlog bytes freed."""
        self._check_open()
        max_age_ms = self._config.retention_hours * 3_600_000
        max_bytes = self._config.retention_bytes
        now = self._clock()
        freed = 0
        while len(segments := self._commitlog.segments) > 1:
            oldest = segments[0]
            if oldest.end > self._commitlog.durable_position:
                break
            too_old = now - self._commitlog.segment_mtime_ms(oldest) > max_age_ms
            too_big = max_bytes > 0 and self._commitlog.total_bytes > max_bytes
            if not (too_old or too_big):
                break
            self._commitlog.delete_oldest()
            freed += oldest.size
            log.info("store: retention deleted commitlog segment %d (%d bytes)",
                     oldest.start, oldest.size)  # fmt: skip
        if freed:
            self._advance_min_offsets()
        return freed

    def _advance_min_offsets(self) -> None:
        """Move each queue's min offset past the entries whose records retention deleted."""
        floor = self._commitlog.min_position
        for index in self._indexes.values():
            lo = max(index.min_offset, index.first_offset)
            index.min_offset = index.bisect(lo, index.max_offset, lambda e: e[0], floor)
