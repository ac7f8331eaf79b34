"""A follower keeps the queue indexes of its copy, so a promotion walks only the tail.

The leader does not send its queue indexes (they are derived from the commitlog). Without
them, a promoted follower's store had to walk its whole commitlog at start to rebuild every
index: seconds per hundred megabytes, added to every failover. So the follower indexes what
it applied, as the store would, a bounded chunk at a time after its acknowledgements (never
before one; once enough waits, ``INDEX_AT_BYTES`` or ``INDEX_EVERY_S``), and now and then
makes the indexes durable and writes ``checkpoint.json`` saying how far they go, flagged
``from_replica`` (recovery.py then starts its walk at that very position: every frame below
it was checked here).

Only commitlog bytes covered by a *complete* batch are indexed: the topic table
(``topics.log``, replicated) describes them then. Records of topics the table does not hold,
or from before a topic's ``since``, are skipped, as recovery skips them. Before the writer
cuts its commitlog back, the indexes are cut to match and the checkpoint is lowered, durably;
a reset drops them. Anything unexpected (a queue offset that does not follow its index, a
damaged frame, a topic the table gains with records below the indexed position: the table
went back with a leader change) stops the indexer: the checkpoint goes back to position 0
and a promotion walks everything, as before: slower, never wrong.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from popmq.broker.replication.files import list_segments, log_end, segment_path
from popmq.broker.store import metafile
from popmq.broker.store.codec import decode_header, tag_hash
from popmq.broker.store.file_budget import FileBudget, fsync_paths
from popmq.broker.store.framing import HEADER_SIZE, fsync_dir, walk_frames
from popmq.broker.store.queue_index import ENTRY, HOLE_SIZE, IndexDamaged, QueueIndex
from popmq.broker.store.recovery import RECORD_RESYNC, QueueKey, queue_key_text
from popmq.broker.store.topics import LOG_NAME, TOPICS_RESYNC

log = logging.getLogger(__name__)

CHECKPOINT = "checkpoint.json"
# As MessageStore's default: the files a promoted store opens are the same files.
ENTRIES_PER_FILE = 300_000
CHUNK_BYTES = 1 << 20  # walked per call (~50 ms): bounds how long a batch waits behind it
CHECKPOINT_EVERY_S = 1.0
# Indexing waits until this much is applied, or its oldest bytes waited INDEX_EVERY_S: each
# call has a fixed cost (a thread hop, a segment listing, an open), which per batch of a few
# records was a large share of a follower's CPU. A promotion walks what is not indexed yet:
# a fraction of a megabyte, milliseconds.
INDEX_AT_BYTES = 256 << 10
INDEX_EVERY_S = 0.5
_OPEN_FILES = 64


@dataclass(frozen=True, slots=True)
class _Topic:
    queue_count: int
    since: int


def read_topic_table(path: Path) -> dict[str, _Topic]:
    """The topics ``topics.log`` holds, read without changing the file (it is the leader's
    copy: the store's loader may compact it)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return {}
    topics: dict[str, _Topic] = {}
    for _, _, payload in walk_frames(data, 0, TOPICS_RESYNC.prefix, TOPICS_RESYNC.accept):
        if payload is None:
            continue
        try:
            record = json.loads(bytes(payload))
            name = str(record["name"])
            if record.get("deleted") is True:
                topics.pop(name, None)
            else:
                topics[name] = _Topic(int(record["queue_count"]), int(record["since"]))
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
    return topics


class IndexerStopped(Exception):
    """The copy is not what the indexer expects: a promotion walks everything."""


class ReplicaIndexer:
    def __init__(
        self,
        data_dir: Path,
        *,
        entries_per_file: int = ENTRIES_PER_FILE,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._dir = Path(data_dir)
        # Read on the event loop's side only (due_in; index_some's callers pass its reading): a
        # follower's clock is its loop's (virtual under looptime), which a worker thread running
        # apply or index_some cannot read, and time.monotonic there disagreed with the loop's
        # waits (the follower woke and found nothing due, again and again).
        self._monotonic = monotonic
        self._per_file = entries_per_file
        self._handles = FileBudget(_OPEN_FILES)
        self._indexes: dict[QueueKey, QueueIndex] = {}
        self._topics: dict[str, _Topic] = {}
        self._topics_seen: tuple[int, int, int] | None = None
        self.position = 0  # every record below is indexed
        self.indexable_end = 0  # the commitlog end of the last complete batch
        self.stopped = False
        self.records_indexed = 0
        self._checkpointed = -1
        self._checkpointed_at = -math.inf  # the clock's reading at the last timed checkpoint
        # When indexable bytes started to wait: stamped by the first due_in() that sees them
        # (applied() runs in a worker thread, which does not read the clock).
        self._behind_since: float | None = None

    # -- the writer's hooks ------------------------------------------------------------------
    def start(self) -> None:
        """Start from nothing: no index, a checkpoint at position 0."""
        self._close_indexes()
        shutil.rmtree(self._dir / "index", ignore_errors=True)
        self.position = 0
        self._write_checkpoint(twice=True)

    def resume(self) -> None:
        """Go on from the checkpoint this directory holds (this indexer's, or the store's when
        the node led): every role change starts a new follower, and indexing the whole log
        again each time would make the next promotion walk it. What does not check out
        (an index file missing or short, a last entry that is not its record) starts over."""
        try:
            resumed = self._resume()
        except (IndexerStopped, IndexDamaged, OSError, ValueError) as error:
            log.info("replication: indexing this copy from the start (%s)", error)
            resumed = False
        if not resumed:
            self.start()

    def _resume(self) -> bool:
        doc = metafile.read(self._dir / CHECKPOINT).body
        if not isinstance(doc, dict) or int(doc.get("position", 0)) <= 0:
            return False
        position = int(doc["position"])
        segments = list_segments(self._dir)
        if not segments or not segments[0][0] <= position <= log_end(segments):
            return False
        expected: dict[str, list[int]] = dict(doc.get("queues", {}))
        self._refresh_topics()
        for name, topic in self._topics.items():
            if topic.since >= position:  # created after the checkpoint: only older leftovers
                shutil.rmtree(self._dir / "index" / name, ignore_errors=True)
                continue
            for queue_id in range(topic.queue_count):
                key = (name, queue_id)
                index = self._open_index(key)
                # entries written after the checkpoint may be torn or missing: dropped
                first = index.bisect(index.first_offset, index.max_offset, lambda e: e[0],
                                     position)  # fmt: skip
                index.truncate(first)
                top = expected.get(queue_key_text(*key), [0, 0])[1]
                if index.max_offset < top or not self._last_entry_matches(key, index):
                    raise IndexerStopped(f"the index of {name}/{queue_id} does not match")
        self.position = position
        self._write_checkpoint(twice=True)
        log.info("replication: indexing this copy from position %d (its checkpoint)", position)
        return True

    def _last_entry_matches(self, key: QueueKey, index: QueueIndex) -> bool:
        if index.max_offset == index.first_offset:
            return True
        offset = index.max_offset - 1
        position, size, _, _ = index.entry(offset)
        if size == HOLE_SIZE:
            return True
        start = max((s for s, _ in list_segments(self._dir) if s <= position), default=None)
        if start is None:
            return True  # purged by retention: nothing left to check against
        with open(segment_path(self._dir, start), "rb") as file:
            frame = os.pread(file.fileno(), size, position - start)
        found = [p for _, _, p in walk_frames(frame, 0, RECORD_RESYNC.prefix,
                                              RECORD_RESYNC.accept)]  # fmt: skip
        if len(found) != 1 or found[0] is None or len(found[0]) + HEADER_SIZE != size:
            return False
        header = decode_header(found[0])
        return (header.topic, header.queue_id, header.queue_offset) == (*key, offset)

    def applied(self, end: int, complete: bool) -> None:
        """A batch ending at ``end`` is durable; ``complete``: the documents describe it."""
        if complete:
            self.indexable_end = max(self.indexable_end, end)

    def before_reset(self) -> None:
        """Everything is copied afresh: drop the indexes."""
        self._close_indexes()
        self._topics_seen = None
        self.indexable_end = 0
        self._behind_since = None
        if not self.stopped:
            self.start()

    def before_cut(self, position: int) -> None:
        """The commitlog is cut back to ``position``: no index entry may point past it, and
        the checkpoint must not claim it, before the first byte is cut."""
        self.indexable_end = min(self.indexable_end, position)
        if self.stopped or self.position <= position:
            return
        for index in self._indexes.values():
            first = index.bisect(index.first_offset, index.max_offset, lambda e: e[0], position)
            index.truncate(first)
        self.position = position
        self._write_checkpoint(twice=True)

    def after_drop(self, minimum: int) -> None:
        """Segments below ``minimum`` were deleted (the leader's retention)."""
        self.position = max(self.position, minimum)

    # -- indexing ----------------------------------------------------------------------------
    @property
    def behind(self) -> bool:
        return not self.stopped and self.position < self.indexable_end

    @property
    def due(self) -> bool:
        """Work to do now: enough bytes to index, bytes that waited long enough, or a
        checkpoint owed for a while."""
        wait = self.due_in()
        return wait is not None and wait <= 0

    def due_in(self) -> float | None:
        """Seconds until there is work to do (0: now; None: nothing to do until more is
        applied). Read on the event loop: it reads the clock."""
        if self.stopped:
            return None
        now = self._monotonic()
        waits = []
        if self.behind:
            if self.indexable_end - self.position >= INDEX_AT_BYTES:
                return 0.0
            if self._behind_since is None:
                self._behind_since = now
            waits.append(self._behind_since + INDEX_EVERY_S - now)
        if self._checkpointed != self.position:
            waits.append(self._checkpointed_at + CHECKPOINT_EVERY_S - now)
        return max(0.0, min(waits)) if waits else None

    def index_some(self, max_bytes: int = CHUNK_BYTES, now: float | None = None) -> None:
        """Index up to ``max_bytes`` of the indexable commitlog (blocking: a worker thread),
        and write a checkpoint when one is due. ``now``: the clock's reading, taken by the
        caller on the event loop (None: read it here, for a clock any thread may read)."""
        if self.stopped:
            return
        now = self._monotonic() if now is None else now
        try:
            if self.position < self.indexable_end:
                self._refresh_topics()
                before = self.position
                self._index(max_bytes)
                if self.position == before:
                    raise IndexerStopped(f"no record found at {before}")
                # what is left (a chunk's worth more) is indexed by the next call at once
                self._behind_since = now - INDEX_EVERY_S if self.behind else None
            if (
                self._checkpointed != self.position
                and now - self._checkpointed_at >= CHECKPOINT_EVERY_S
            ):
                self._write_checkpoint(now=now)
        except (IndexerStopped, OSError, ValueError) as error:
            self._stop(str(error))

    def close(self) -> None:
        """Make what was indexed durable (a promotion follows, or a restart)."""
        if not self.stopped and self._checkpointed != self.position:
            try:
                self._write_checkpoint()
            except OSError as error:
                self._stop(str(error))
        self._close_indexes()

    def _index(self, max_bytes: int) -> None:
        segments = list_segments(self._dir)
        if not segments:
            return
        self.position = max(self.position, segments[0][0])
        holder = [(s, z) for s, z in segments if s <= self.position < s + z]
        if not holder:  # at a segment's end: the next segment's start
            later = [(s, z) for s, z in segments if s >= self.position]
            if not later:
                return
            holder = later[:1]
            self.position = holder[0][0]
        start, size = holder[0]
        limit = min(self.indexable_end, start + size)  # whole frames end there
        if self.position >= limit:
            return
        with open(segment_path(self._dir, start), "rb") as file:
            want = min(limit - self.position, max_bytes)
            data = os.pread(file.fileno(), want, self.position - start)
            if want < limit - self.position and len(data) >= HEADER_SIZE:
                # a record longer than the chunk: read it whole
                frame = HEADER_SIZE + int.from_bytes(data[:4], "little")
                if frame > len(data):
                    data = os.pread(file.fileno(), min(frame, limit - self.position),
                                    self.position - start)  # fmt: skip
        clipped = self.position + len(data) < limit
        pending: dict[QueueKey, bytearray] = {}
        walked = 0
        for offset, end, payload in walk_frames(data, 0, RECORD_RESYNC.prefix,
                                                RECORD_RESYNC.accept):  # fmt: skip
            if payload is None:
                if clipped and end == len(data) and offset > 0:
                    break  # the chunk cut the last record: the next call reads it whole
                raise IndexerStopped(f"damaged commitlog bytes at {self.position + offset}")
            self._add(self.position + offset, payload, pending)
            walked = end
        for key, entries in pending.items():
            self._indexes[key].append(bytes(entries))
        self.position += walked

    def _add(self, position: int, payload: memoryview, pending: dict[QueueKey, bytearray]) -> None:
        header = decode_header(payload)
        topic = self._topics.get(header.topic)
        if topic is None or position < topic.since or header.queue_id >= topic.queue_count:
            return  # a deleted topic's leftovers (recovery skips them too)
        key = (header.topic, header.queue_id)
        index = self._indexes.get(key)
        if index is None:
            index = self._open_index(key)
        entries = pending.setdefault(key, bytearray())
        expected = index.max_offset + len(entries) // ENTRY.size
        if header.queue_offset != expected:
            if index.max_offset == index.first_offset and not entries:
                index.reset(header.queue_offset)  # the log starts later (retention)
            else:
                raise IndexerStopped(
                    f"{header.topic}/{header.queue_id} offset {header.queue_offset} at "
                    f"{position} does not follow its index ({expected})"
                )
        entries += ENTRY.pack(position, len(payload) + HEADER_SIZE, tag_hash(header.tag),
                              header.store_timestamp_ms)  # fmt: skip
        self.records_indexed += 1

    def _open_index(self, key: QueueKey) -> QueueIndex:
        index = QueueIndex(self._dir / "index" / key[0] / str(key[1]), self._per_file,
                           self._handles)  # fmt: skip
        index.open()
        self._indexes[key] = index
        return index

    def _refresh_topics(self) -> None:
        path = self._dir / LOG_NAME
        try:
            stat = os.stat(path)
            seen = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
        except FileNotFoundError:
            seen = (-1, -1, -1)
        if seen == self._topics_seen:
            return
        topics = read_topic_table(path)
        segments = list_segments(self._dir)
        floor = segments[0][0] if segments else 0
        for name, topic in topics.items():
            known = self._topics.get(name)
            if (known is None or known.since != topic.since) and max(topic.since, floor) < (
                self.position
            ):
                # A topic the table did not hold when its records were passed (the table went
                # back with a leader change, after this copy applied a deletion): they are
                # not in its index, or were dropped from it.
                raise IndexerStopped(f"topic {name} (since {topic.since}) appeared in the "
                                     f"topic table after position {self.position}")  # fmt: skip
        for name, old in self._topics.items():
            new = topics.get(name)
            if new is None or new.since != old.since:  # deleted, or deleted and created again
                for queue_id in range(old.queue_count):
                    index = self._indexes.pop((name, queue_id), None)
                    if index is not None:
                        index.destroy()
                shutil.rmtree(self._dir / "index" / name, ignore_errors=True)
        self._topics, self._topics_seen = topics, seen

    # -- durability --------------------------------------------------------------------------
    def _write_checkpoint(self, twice: bool = False, now: float | None = None) -> None:
        """Indexes durable first, then the checkpoint that vouches for them. ``twice``: the
        previous copy (read when the current one is damaged) must not claim more either.
        ``now``: a timed checkpoint, the next one is due CHECKPOINT_EVERY_S later (the others,
        at a start, a cut or a close, do not move the schedule)."""
        paths = [p for index in self._indexes.values() for p in index.take_dirty_paths()]
        fsync_paths(paths)
        if (self._dir / "index").is_dir():
            fsync_dir(self._dir / "index")
        queues = {
            queue_key_text(*key): [index.first_offset, index.max_offset]
            for key, index in self._indexes.items()
        }
        doc = {"position": self.position, "queues": queues, "from_replica": True}
        for _ in range(2 if twice else 1):
            metafile.write(self._dir / CHECKPOINT, doc)
        self._checkpointed = self.position
        if now is not None:
            self._checkpointed_at = now

    def _stop(self, why: str) -> None:
        log.warning("replication: the follower stops indexing its copy (%s); a promotion "
                    "rebuilds every queue index from the whole commitlog", why)  # fmt: skip
        self.stopped = True
        self._close_indexes()
        shutil.rmtree(self._dir / "index", ignore_errors=True)
        for _ in range(2):
            metafile.write(self._dir / CHECKPOINT, {"position": 0, "queues": {}})

    def abandon(self) -> None:
        """Close the index files, writing nothing (the writer's open failed part way)."""
        self._close_indexes()

    def _close_indexes(self) -> None:
        for index in self._indexes.values():
            index.close()
        self._indexes = {}
        self._handles.close()
