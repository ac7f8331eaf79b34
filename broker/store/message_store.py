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

In both modes the flush task also writes the consumer offsets that changed every
``flush_interval_ms`` (and at close), so committed consumer offsets can lag by that interval
after a machine crash. It fsyncs the queue indexes and writes checkpoint.json at every flush
too, or every ``checkpoint_interval_ms`` when set (and at close): those make nothing
acknowledged durable, but recovery notices a lost commitlog tail only from a checkpoint's
extents, so a longer interval widens that window.
Messages are readable as soon as they are written, before their fsync.

The store is this facade over parts with one job each: startup.py (metadata and the topic
table at open), writer.py (append), reads.py (reads and their damage reports),
durability.py (checkpoint and flush loop), retention.py, consumer_offsets.py and
state_docs.py (small documents of other services).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.message_types import MessageType
from popmq.broker.contract.types import Message, StoredMessage
from popmq.broker.store import data_format, retention, startup, state_docs
from popmq.broker.store.commitlog import CommitLog
from popmq.broker.store.consumer_offsets import ConsumerOffsets
from popmq.broker.store.damage import MetadataFallback, Quarantine, StoreFaults
from popmq.broker.store.durability import Checkpointer
from popmq.broker.store.file_budget import FileBudget
from popmq.broker.store.files import DirLock
from popmq.broker.store.group_commit import GroupCommit
from popmq.broker.store.reads import QueueReader, ReadResult
from popmq.broker.store.recovery import Recovery, RecoveryReport
from popmq.broker.store.topic_queues import TopicQueues
from popmq.broker.store.topics import TopicMeta, TopicTable
from popmq.broker.store.writer import ArrivalListener, QueueWriter

from popmq.clock import SYSTEM, Clock
from popmq.config import StoreConfig
from popmq.lifecycle import Job, TaskOwner

log = logging.getLogger(__name__)

_RETENTION_INTERVAL_S = 10.0

__all__ = ["ArrivalListener", "MessageStore", "ReadResult"]


class MessageStore:
    """See the module docstring. All methods run on the event loop; only fsyncs leave it."""

    def __init__(
        self,
        data_dir: Path,
        broker_name: str,
        config: StoreConfig,
        clock: Callable[[], int] = SYSTEM.now_ms,
        *,
        timer: Clock = SYSTEM,
        index_entries_per_file: int = 300_000,
        retention_interval_s: float = _RETENTION_INTERVAL_S,
    ) -> None:
        self._dir = Path(data_dir)
        self._broker_name = broker_name
        self._config = config
        self._clock = clock
        self._timer = timer  # the flush loop's sleeps and intervals (virtual time in tests)
        self._retention_interval_s = retention_interval_s
        self._handles = FileBudget(config.max_open_files)
        self._lock = DirLock(self._dir)
        self._commitlog = CommitLog(self._dir / "commitlog", config.segment_bytes, self._handles)
        group = GroupCommit(self._commitlog)
        self._topic_table = TopicTable(self._dir)
        self._queues = TopicQueues(self._dir, self._topic_table, self._commitlog, self._handles,
                                   index_entries_per_file)  # fmt: skip
        self._indexes = self._queues.indexes
        self._queue = self._queues.queue
        self._offsets = ConsumerOffsets()
        self._group = group
        self._checkpointer = Checkpointer(
            self._dir, self._commitlog, group, self._indexes, self._offsets
        )
        self._writer = QueueWriter(
            self._dir, broker_name, self._commitlog, group, self._checkpointer,
            sync=config.flush == "sync", clock=clock, timer=timer,
        )  # fmt: skip
        self._reader = QueueReader(self._dir, self._commitlog, self._queue)
        self._task: Job[None] | None = None
        self._tasks = TaskOwner(f"store:{broker_name}", grace_s=0)  # the flush loop
        self._open = False
        self.recovery: RecoveryReport | None = None
        self.faults = StoreFaults()
        self.was_new = False  # open() found an empty data directory

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

    # -- health counters (metrics) -----------------------------------------------------------
    @property
    def corrupt_records_read(self) -> int:
        """Records found damaged by reads (damage older than recovery's walk; see reader.py)."""
        return self._reader.corrupt_records_read

    @property
    def write_failures(self) -> int:
        """Appends refused because the disk failed (full, read-only)."""
        return self._writer.write_failures

    @property
    def flush_failures(self) -> int:
        """Failed periodic flushes (fsync or checkpoint)."""
        return self._checkpointer.flush_failures

    @property
    def checkpoints_written(self) -> int:
        """Checkpoints written (the periodic flush skips those with nothing new)."""
        return self._checkpointer.checkpoints_written

    @property
    def flush_failing(self) -> bool:
        """Whether the last periodic flush failed: while it does, async appends wait for
        their own fsync, so none is acknowledged undurable."""
        return self._checkpointer.flush_failing

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
        self.was_new = fresh = marked == "created"
        if marked == "added":
            log.warning("store: %s had no FORMAT marker (deleted, or written before markers "
                        "existed); marked as format %d", self._dir,
                        data_format.CURRENT_VERSION)  # fmt: skip
            self.faults.metadata.append(MetadataFallback("FORMAT", "recreated", "missing"))
        (self._dir / "state").mkdir(exist_ok=True)
        topics_trusted = startup.load_topics(self._dir, self._topic_table, fresh, self.faults)
        self._commitlog.open()
        if not topics_trusted:
            startup.recover_topics(self._dir, self._topic_table, self._commitlog)
        damaged = self._queues.open_indexes()
        if topics_trusted:
            startup.remove_stray_index_dirs(self._dir, self._queues.topics)
        checkpoint = startup.read_meta(self._dir, "checkpoint.json", "full_scan", fresh,
                                       self.faults)  # fmt: skip
        recovery = Recovery(
            self._commitlog, self._queues.topics, self._indexes, damaged,
            checkpoint if isinstance(checkpoint, dict) else None,
            Quarantine(self._dir), self.faults,
        )  # fmt: skip
        self.recovery = recovery.run()
        for queue in self.recovery.rebuilt_queues + self.recovery.repaired_queues:
            # repaired from the commitlog, nothing lost: still reported
            self.faults.metadata.append(
                MetadataFallback(f"index/{queue}", "rebuilt", "damaged, missing or behind")
            )
        self._writer.last_store_ts = self.recovery.last_store_timestamp_ms
        retention.advance_min_offsets(self._commitlog, self._indexes.values())
        self._offsets.load(startup.read_meta(self._dir, "consumer_offsets.json", "reset", fresh,
                                             self.faults))  # fmt: skip
        startup.keep_committed_offsets(self._offsets, self._indexes)
        self._checkpointer.checkpoint_now()

    async def start(self) -> None:
        """Start the flush task (fsyncs, checkpoints, retention); aclose() stops it."""
        if not self._open:
            raise RefusedError(Code.INTERNAL_ERROR, "open() the store before start()")
        if self._task is None:
            loop = self._checkpointer.flush_loop(
                self._config.flush_interval_ms / 1000, self._timer, self._retention_interval_s,
                self.apply_retention, self._config.checkpoint_interval_ms / 1000,
            )  # fmt: skip
            self._task = self._tasks.spawn(loop, "store-flush")

    async def aclose(self) -> None:
        """Stop the flush task, checkpoint, close every file and release the lock."""
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

    # -- durability --------------------------------------------------------------------------
    async def flush(self) -> None:
        """fsync the commitlog up to everything written so far."""
        await self._group.wait_durable(self._commitlog.write_position)

    async def flush_offsets(self) -> None:
        """The periodic flush now: fsync the commitlog and write the consumer offsets if they
        changed (what a follower copies of them is what is on disk)."""
        await self._checkpointer.flush()

    async def checkpoint(self) -> None:
        """Make the commitlog, the indexes, the consumer offsets and the checkpoint durable;
        then delete the index files that retention emptied."""
        await self._checkpointer.checkpoint()

    def apply_retention(self) -> int:
        """Delete commitlog segments past retention (see retention.py); the bytes freed."""
        self._check_open()
        return retention.apply_retention(
            self._commitlog, self._indexes.values(), self._config, self._clock()
        )

    # -- topics (topic_queues.py) ----------------------------------------------------------
    def create_topic(
        self, name: str, queue_count: int, message_type: MessageType | None = None
    ) -> TopicMeta:
        """Create a topic, or grow its queue count. Shrinking is refused (BAD_REQUEST).
        ``message_type`` (None: MIXED) is set at creation only; see set_topic_type."""
        self._check_open()
        return self._queues.create(name, queue_count, message_type)

    def set_topic_type(self, name: str, message_type: MessageType) -> TopicMeta:
        """Give a topic its message type (durable before it returns, like creation)."""
        self._check_open()
        return self._queues.set_type(name, message_type)

    def get_topic(self, name: str) -> TopicMeta | None:
        return self._queues.get(name)

    def list_topics(self) -> list[TopicMeta]:
        return self._queues.list()

    def delete_topic(self, name: str) -> None:
        """Forget a topic and its indexes and offsets; its records age out with retention."""
        self._check_open()
        self._queues.delete(name)
        self._offsets.delete_topic(name)

    def _check_open(self) -> None:
        if not self._open:
            raise RefusedError(Code.INTERNAL_ERROR, "the store is not open")

    # -- write -------------------------------------------------------------------------------
    async def append(
        self, topic: str, queue_id: int, messages: list[Message]
    ) -> list[StoredMessage]:
        """Store messages at the end of one queue, in order. See the module docstring for
        when this returns relative to the fsync."""
        self._check_open()
        index = self._queue(topic, queue_id)
        return await self._writer.append(
            topic, self._queues.topic_bytes[topic], queue_id, index, messages
        )

    async def append_ids(
        self, topic: str, queue_id: int, messages: list[Message]
    ) -> tuple[list[str], int]:
        """``append`` answering only the messages' ids and the first one's queue offset (a
        send needs no stored copy of each message)."""
        self._check_open()
        index = self._queue(topic, queue_id)
        return await self._writer.append_ids(
            topic, self._queues.topic_bytes[topic], queue_id, index, messages
        )

    def add_arrival_listener(self, callback: ArrivalListener) -> None:
        """``callback(topic, queue_id, new_max_offset, tags)`` after every successful append
        (after the fsync in sync mode). Exceptions are logged, never raised into append."""
        self._writer.add_arrival_listener(callback)

    def remove_arrival_listener(self, callback: ArrivalListener) -> None:
        self._writer.remove_arrival_listener(callback)

    # -- read (reads.py) ---------------------------------------------------------------------
    def min_offset(self, topic: str, queue_id: int) -> int:
        return self._queue(topic, queue_id).min_offset

    def max_offset(self, topic: str, queue_id: int) -> int:
        return self._queue(topic, queue_id).max_offset

    def read(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_messages: int,
        tags: frozenset[str] | None = None,
        max_bytes: int = 8 << 20,
    ) -> ReadResult:
        return self._reader.read(topic, queue_id, offset, max_messages, tags, max_bytes)

    def peek_offsets(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_messages: int,
        tags: frozenset[str] | None = None,
    ) -> tuple[list[int], int]:
        return self._reader.peek_offsets(topic, queue_id, offset, max_messages, tags)

    def offset_for_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        return self._reader.offset_for_timestamp(topic, queue_id, timestamp_ms)

    def count_matching(
        self, topic: str, queue_id: int, start: int, end: int, tags: frozenset[str] | None
    ) -> int:
        return self._reader.count_matching(topic, queue_id, start, end, tags)

    # -- consumer offsets (consumer_offsets.py) ----------------------------------------------
    def durable_consumer_offset(self, group: str, topic: str, queue_id: int) -> int:
        """The consumer offset as last written to disk (-1 if never): a crash falls back to
        it, so journal entries above it must be kept."""
        return self._offsets.durable((group, topic, queue_id))

    def consumer_offset_keys(self) -> list[tuple[str, str, int]]:
        """Every (group, topic, queue id) with a committed consumer offset."""
        return self._offsets.keys()

    def get_consumer_offset(self, group: str, topic: str, queue_id: int) -> int:
        self._queue(topic, queue_id)
        return self._offsets.get((group, topic, queue_id))

    def set_consumer_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        self._queue(topic, queue_id)
        self._offsets.set((group, topic, queue_id), offset)

    def delete_consumer_offsets(self, group: str) -> int:
        """Remove every committed offset of ``group`` (a deleted group); returns how many."""
        return self._offsets.delete_group(group)

    # -- small documents (state_docs.py) -----------------------------------------------------
    def load_state(self, name: str) -> Any | None:
        return state_docs.load_state(self._dir, name, self.faults)

    def save_state(self, name: str, value: Any) -> None:
        state_docs.save_state(self._dir, name, value)
