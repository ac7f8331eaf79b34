"""Applying the leader's batches on a follower: its data directory becomes a copy of the
leader's, durable (fsynced) before each batch is acknowledged.

While a node follows, nothing else opens its data directory (the store's LOCK is held). What
the broker derives from the commitlog (queue indexes, ``checkpoint.json``) is not copied: the
follower builds it from what it applied (indexer.py), so a promoted follower's store walks
only the commitlog written since the follower's last checkpoint.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import os
import time
from pathlib import Path, PurePosixPath

from popmq.broker.replication import completeness, epochs
from popmq.broker.replication.files import (
    APPEND_LOGS,
    DOCUMENT_DIRS,
    DOCUMENTS,
    SEGMENT_DIGITS,
    list_segments,
    log_end,
    segment_path,
)
from popmq.broker.replication.indexer import ReplicaIndexer
from popmq.broker.store.files import DirLock
from popmq.broker.store.framing import fsync_dir

from popmq.clock import SYSTEM, Clock
from popmq.pb.replication.v1 import replication_pb2 as pb

log = logging.getLogger(__name__)

# Removed by a reset (bootstrap): everything the leader sends again.
_REPLICATED = ("commitlog", "topics.log", "pop", "state", "consumer_offsets.json",
               "consumer_offsets.json.prev", "FORMAT", "handle-keys.json")  # fmt: skip


# File names a writer remembers as checked (a few logs and documents are sent again and again).
_CHECKED_NAMES = 1024


class ReplicationError(Exception):
    """A batch this follower must refuse (older epoch, bad path): the stream ends."""


def check_path(name: str) -> str:
    """A file name the leader may write: one of the replicated files, in its one spelling
    (the follower caches names by their text), nothing else. A NUL byte is refused here: the
    OS would raise ValueError, which ends the follower's role instead of its stream."""
    if name in APPEND_LOGS or name in DOCUMENTS:
        return name
    parts = PurePosixPath(name).parts
    if (
        "\0" not in name
        and "/".join(parts) == name  # not "state//a.json", "state/./a.json", "state/a.json/"
        and len(parts) == 2
        and parts[0] in DOCUMENT_DIRS
        and parts[1].endswith(".json")
        and not parts[1].startswith(".")
    ):
        return name
    raise ReplicationError(f"the leader sent a file outside the replicated set: {name!r}")


class ReplicaWriter:
    def __init__(self, data_dir: Path, *, clock: Clock = SYSTEM) -> None:
        self.data_dir = Path(data_dir)
        self._lock = DirLock(self.data_dir)
        self.history: epochs.EpochHistory | None = None
        # Written since the last sync(): files to fsync, folders whose entries changed.
        self._unsynced: set[Path] = set()
        self._unsynced_dirs: set[Path] = set()
        # completeness.py: marked before a reset or cut; cleared by a durable complete batch.
        self._incomplete = False
        self._completed = False  # a complete batch was applied after the last reset or cut
        # the follower's clock (its loop's): the indexer's waits are the follower's waits
        self.indexer = ReplicaIndexer(self.data_dir, monotonic=clock.monotonic)
        # The commitlog's segments as this writer last saw them (None: list them again); kept
        # up to date by its own writes, as nothing else writes the directory while it follows.
        # Listing (a stat per segment) twice per batch was a visible share of a follower's CPU.
        self._segments: list[tuple[int, int]] | None = None
        self._checked: dict[str, Path] = {}  # file names the leader sent, checked (check_path)
        # Files kept open between batches: the commitlog segment written last and the append
        # logs (an open, a close and an exists() per file and batch, and again per fsync, were
        # most of what applying a batch asked of the kernel). Closed before anything moves,
        # cuts or deletes files (reset, truncate, retention, a rewritten log), and by close().
        self._fds: dict[Path, int] = {}
        self._segment_fd: Path | None = None  # the segment among _fds

    def open(self) -> None:
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._lock.acquire()
        try:
            self._segments = None
            # Go on indexing from the checkpoint an earlier follower or this node's store left
            # (indexer.py); a cut or reset of the log adjusts the indexes before it happens.
            self.indexer.resume()
            self.history = epochs.EpochHistory(self.data_dir)
            self._incomplete = completeness.is_marked_incomplete(self.data_dir)
        except BaseException:
            # A failed open holds nothing and writes nothing: a lock it kept refused every
            # retry of the follower (node.py, FOLLOW_RETRY_S) "used by another store".
            with contextlib.suppress(Exception):
                self.indexer.abandon()
            self._lock.release()
            raise

    def close(self) -> None:
        try:
            self._close_files()
            self.indexer.close()
        finally:
            self._lock.release()

    def _open_file(self, path: Path) -> tuple[int, bool]:
        """(a descriptor open for writing, whether the file was created now)."""
        fd = self._fds.get(path)
        if fd is not None:
            return fd, False
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            created = True
        except FileExistsError:
            fd = os.open(path, os.O_RDWR)
            created = False
        self._fds[path] = fd
        return fd, created

    def _close_file(self, path: Path) -> None:
        fd = self._fds.pop(path, None)
        if fd is not None:
            os.close(fd)  # unsynced bytes stay in _unsynced: sync() opens the path again

    def _close_files(self) -> None:
        for path in list(self._fds):
            self._close_file(path)
        self._segment_fd = None

    def indexing_due(self) -> bool:
        return self.indexer.due

    def indexing_due_in(self) -> float:
        """Seconds until indexing is due (infinite: not until more is applied)."""
        wait = self.indexer.due_in()
        return math.inf if wait is None else wait

    def index_some(self, now: float | None = None) -> None:
        """Index a chunk of what was applied (blocking: a worker thread; never while a batch
        is applied: the follower calls both in turn). ``now``: the clock, read on the loop."""
        self.indexer.index_some(now=now)

    def _listed(self) -> list[tuple[int, int]]:
        if self._segments is None:
            self._segments = list_segments(self.data_dir)
        return self._segments

    @property
    def commitlog_end(self) -> int:
        return log_end(self._listed())

    def hello(self, node: str, known_epoch: int) -> pb.Hello:
        assert self.history is not None
        self._segments = None  # a new stream: look at the directory afresh
        return pb.Hello(
            node=node,
            epochs=[pb.EpochEntry(epoch=e, start_offset=s) for e, s in self.history.entries],
            commitlog_end=self.commitlog_end,
            known_epoch=max(known_epoch, self.history.last_epoch),
        )

    # -- applying (blocking: run in a worker thread) -----------------------------------------
    def apply(self, batch: pb.ReplicaBatch, known_epoch: int) -> int:
        """Make ``batch`` durable; return the commitlog end after it."""
        return self.apply_all([batch], known_epoch)[0]

    def apply_all(self, batches: list[pb.ReplicaBatch], known_epoch: int) -> list[int]:
        """Make ``batches`` durable, in order, with one fsync per file they touched (a group
        commit: a follower that fell behind by several batches pays one round of fsyncs);
        return the commitlog end after each. Nothing is acknowledged before this returns."""
        assert self.history is not None
        ends = []
        self._completed = False
        try:
            for batch in batches:
                ends.append(self._write(batch, known_epoch))
        finally:
            self.sync()  # what was written before a refusal is a valid prefix: keep it
        for batch, end in zip(batches, ends, strict=False):
            self.indexer.applied(end, batch.complete)
        if ends:
            # The epochs of what this copy holds (an epoch not reached yet is left out), once
            # the bytes they describe are durable.
            end = ends[-1]
            last = batches[len(ends) - 1]
            self.history.replace(
                [(e.epoch, e.start_offset) for e in last.epochs if e.start_offset <= end]
            )
            if self._incomplete and self._completed:  # every document is durable now
                completeness.mark_complete(self.data_dir)
                self._incomplete = False
        return ends

    def sync(self) -> None:
        for path in sorted(self._unsynced):
            fd = self._fds.get(path)
            if fd is not None:
                os.fsync(fd)
                continue
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                continue  # deleted since (a later batch's reset or retention)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        for folder in sorted(self._unsynced_dirs):
            if folder.is_dir():
                fsync_dir(folder)
        self._unsynced.clear()
        self._unsynced_dirs.clear()

    def _write(self, batch: pb.ReplicaBatch, known_epoch: int) -> int:
        assert self.history is not None
        if batch.epoch < max(known_epoch, self.history.last_epoch):
            raise ReplicationError(
                f"refused a batch of epoch {batch.epoch}: this node knows epoch "
                f"{max(known_epoch, self.history.last_epoch)}"
            )
        if batch.reset or batch.truncate_to >= 0:
            self.sync()  # what came before is durable before anything is moved or cut
            # Not electable until a complete batch is durable again (completeness.py).
            completeness.mark_incomplete(
                self.data_dir, completeness.RESET if batch.reset else "cut back"
            )
            self._incomplete, self._completed = True, False
        if batch.reset:
            self.indexer.before_reset()
            self._reset()
        if batch.truncate_to >= 0:
            self.indexer.before_cut(batch.truncate_to)
            self._truncate(batch.truncate_to)
        self._drop_below(batch.commitlog_min)
        if batch.commitlog_data:
            self._write_commitlog(batch.commitlog_segment, batch.commitlog_offset,
                                  batch.commitlog_data)  # fmt: skip
        for change in batch.files:
            self._apply_file(change)
        self._completed = self._completed or batch.complete
        return self.commitlog_end

    def _reset(self) -> None:
        """Start over: what this node held is moved aside (never deleted: a leader started by
        mistake on an empty directory must not cost the data), then copied afresh."""
        self._close_files()
        moved = [name for name in _REPLICATED if (self.data_dir / name).exists()]
        if moved:  # (a fresh follower holds nothing: no empty folder in quarantine/)
            aside = self._aside("replaced")
            for name in moved:
                target = aside / name
                target.parent.mkdir(parents=True, exist_ok=True)
                (self.data_dir / name).replace(target)
            log.warning("replication: this node shares no history with its leader; its data (%s) "
                        "was moved to %s and is copied afresh from the leader",
                        ", ".join(moved), aside)  # fmt: skip
        assert self.history is not None
        self.history.clear()
        self._segments = None
        fsync_dir(self.data_dir)

    def _aside(self, kind: str) -> Path:
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        path = self.data_dir / "quarantine" / f"replication-{kind}-{stamp}-{os.getpid()}"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _truncate(self, position: int) -> None:
        """Cut the commitlog back to ``position`` (where this node's history leaves the
        leader's). What is cut was never acknowledged by a sync group; it is kept aside."""
        segments = [(start, size) for start, size in list_segments(self.data_dir)
                    if start + size > position or (start == position and start > 0)]  # fmt: skip
        if not segments:
            return
        self._segments = None
        self._close_files()
        aside = self._aside("truncated")
        cut = 0
        for start, size in segments:
            path = segment_path(self.data_dir, start)
            keep = max(0, position - start)
            with open(path, "r+b") as file:
                file.seek(keep)
                (aside / path.name).write_bytes(file.read())
                cut += size - keep
                if keep or start == 0:
                    file.truncate(keep)
                    os.fsync(file.fileno())
            if not keep and start > 0:
                path.unlink()
        fsync_dir(self.data_dir / "commitlog")
        log.warning("replication: cut %d commitlog bytes written after position %d (after the "
                    "epoch this node shares with its leader); kept in %s", cut, position,
                    aside)  # fmt: skip

    def _drop_below(self, minimum: int) -> None:
        segments = self._listed()
        first = None
        for (start, _), (next_start, _) in itertools.pairwise(segments):
            if next_start <= minimum:
                self._close_files()
                segment_path(self.data_dir, start).unlink(missing_ok=True)
                first = next_start
        if first is not None:
            self._segments = None
            self.indexer.after_drop(first)

    def _write_commitlog(self, segment: int, position: int, data: bytes) -> None:
        path = self._segment_fd
        if path is None or path.name != f"{segment:0{SEGMENT_DIGITS}d}":
            if path is not None:
                self._close_file(path)
                self._segment_fd = None
            path = segment_path(self.data_dir, segment)
            path.parent.mkdir(exist_ok=True)
        fd, created = self._open_file(path)
        self._segment_fd = path
        written = os.pwrite(fd, data, position - segment)
        if written != len(data):
            raise OSError(f"short write to {path} ({written} of {len(data)} bytes)")
        self._unsynced.add(path)
        if created:
            self._unsynced_dirs.add(path.parent)
        self._grew(segment, position - segment + len(data))

    def _grew(self, segment: int, size: int) -> None:
        """Segment ``segment`` now holds at least ``size`` bytes (a pwrite never shrinks)."""
        segments = self._listed()
        for index in range(len(segments) - 1, -1, -1):
            start, known = segments[index]
            if start == segment:
                segments[index] = (start, max(known, size))
                return
        segments.append((segment, size))
        segments.sort()

    def _apply_file(self, change: pb.FileChange) -> None:
        path = self._checked.get(change.path)
        if path is None:  # checked once per name: a journal append comes with most batches
            if len(self._checked) >= _CHECKED_NAMES:  # documents come and go: stay bounded
                self._checked.clear()
            path = self.data_dir / check_path(change.path)  # only a checked name is kept
            self._checked[change.path] = path
        if change.kind == pb.FileChange.APPEND and path in self._fds:
            fd = self._fds[path]  # an append log written before: open, its folder made
            os.ftruncate(fd, change.offset)
            os.pwrite(fd, change.data, change.offset)
            self._unsynced.add(path)
            return
        self._close_file(path)  # replaced or deleted: a descriptor would keep the old file
        path.parent.mkdir(parents=True, exist_ok=True)
        if change.kind == pb.FileChange.DELETE:
            path.unlink(missing_ok=True)
            fsync_dir(path.parent)
            return
        if change.kind == pb.FileChange.REPLACE:
            # A document may refer to commitlog or log bytes written before it: those are
            # durable first, as on the leader.
            self.sync()
            tmp = path.with_name(path.name + ".replica")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, change.data)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
            fsync_dir(path.parent)
            return
        fd, created = self._open_file(path)
        if created:
            self._unsynced_dirs.add(path.parent)
        try:
            os.ftruncate(fd, change.offset)
            os.pwrite(fd, change.data, change.offset)
        finally:
            if change.path not in APPEND_LOGS:  # only the few known logs stay open
                self._close_file(path)
        self._unsynced.add(path)
