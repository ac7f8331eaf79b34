"""What of a broker's data directory travels to followers, read on the leader.

The data directory *is* the broker's state: a follower holding a copy of it can start as a
broker (recovery rebuilds what is derived). So replication copies files, not operations:

- ``commitlog/`` by position: bytes at the same global positions in the same segment files
  (whole frames; a batch never crosses a segment or an epoch start);
- append-only logs (``topics.log``, ``pop/journal.log``, ``state/groups.log``) by appended
  bytes, and in full when the file was rewritten (compaction): a changed inode or first bytes
  tell;
- small documents (``FORMAT``, ``consumer_offsets.json``, ``state/*.json``, the receipt-handle
  keyring) in full when they changed.

Not copied: the queue indexes and ``checkpoint.json`` (derived from the commitlog: a promoted
follower rebuilds them), the quarantine, the lock.

A snapshot is taken synchronously, in one event-loop turn: every file the broker writes on the
loop is seen at one instant (a consistent cut). Documents written by the store's flush thread
(consumer offsets) are atomic renames and can only be older than the cut, which delivers again
at worst, never loses.
"""

from __future__ import annotations

import math
import os
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from popmq.broker.replication import epochs
from popmq.broker.store import changes

from popmq.pb.replication.v1 import replication_pb2 as pb

APPEND_LOGS = ("topics.log", "pop/journal.log", "state/groups.log")
DOCUMENTS = ("FORMAT", "consumer_offsets.json", "handle-keys.json")
DOCUMENT_DIRS = ("state",)
SEGMENT_DIGITS = 20
MAX_BATCH_BYTES = 4 << 20
_PREFIX_BYTES = 4096
_LENGTH = struct.Struct("<I")
_FRAME_HEADER = 8
# At least this often a snapshot looks at every file whatever the change marks say (a writer
# the marks do not see: another process, or a writer added without a mark).
FULL_LOOK_S = 1.0


def list_segments(data_dir: Path) -> list[tuple[int, int]]:
    """(start, size) of every commitlog segment, oldest first."""
    root = os.path.join(data_dir, "commitlog")  # strings, not Paths: called per batch
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        if len(name) == SEGMENT_DIGITS and name.isdigit():
            try:
                found.append((int(name), os.stat(os.path.join(root, name)).st_size))
            except FileNotFoundError:
                continue  # deleted by retention while listing
    return sorted(found)


def segment_path(data_dir: Path, start: int) -> Path:
    return data_dir / "commitlog" / f"{start:0{SEGMENT_DIGITS}d}"


def log_end(segments: list[tuple[int, int]]) -> int:
    return segments[-1][0] + segments[-1][1] if segments else 0


def whole_frames(data: bytes) -> int:
    """Length of the longest prefix of ``data`` made of whole frames."""
    offset, end = 0, len(data)
    while offset + _FRAME_HEADER <= end:
        size = _LENGTH.unpack_from(data, offset)[0]
        if size == 0 or offset + _FRAME_HEADER + size > end:
            break
        offset += _FRAME_HEADER + size
    return offset


class FollowerBehindRetention(Exception):
    """The next bytes a follower needs are gone from the leader's commitlog."""


@dataclass(slots=True)
class _LogState:
    ino: int = -1
    sent: int = 0
    prefix_crc: int = 0
    mtime_ns: int = -1  # as last sent: unchanged (inode, size, mtime) means nothing to read


def _prefix_crc(path: str, size: int) -> int:
    with open(path, "rb") as file:
        return zlib.crc32(file.read(min(size, _PREFIX_BYTES)))


@dataclass(slots=True)
class Snapshot:
    commitlog_segment: int
    commitlog_offset: int
    commitlog_data: bytes
    files: list[pb.FileChange]
    complete: bool
    taken_at: float  # the leader's monotonic clock when it was taken
    commitlog_min: int = 0  # the leader's first commitlog position (retention)
    # The newest change mark (store/changes.py) read before it was taken: a complete snapshot
    # holds every change noted at or before it (0 for a clipped one: it holds not all).
    ticket: int = 0

    @property
    def empty(self) -> bool:
        """Nothing changed since the last snapshot (the follower holds all of it)."""
        return self.complete and not self.commitlog_data and not self.files


@dataclass(slots=True)
class DataSnapshotter:
    """One follower's view of the leader's data directory: what was sent so far; ``take``
    returns what changed since (and counts it as sent)."""

    data_dir: Path
    position: int  # next commitlog byte to send
    copy_keyring: bool = True
    max_bytes: int = MAX_BATCH_BYTES
    _logs: dict[str, _LogState] = field(default_factory=dict)
    _docs: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    full_look_s: float = FULL_LOOK_S
    # A snapshot per batch per follower: the paths are joined once (pathlib's joins were a
    # visible share of a leader's CPU).
    _paths: dict[str, str] = field(default_factory=dict)
    # The change marks (store/changes.py) read before the last look at each part; None: look.
    # Most snapshots find nothing new or one file grown: a part no writer touched since is
    # not looked at (its stats and listings were most of a snapshot's cost).
    _seen: tuple[int, int, int] | None = None
    _looked_at: float = -math.inf  # when every file was last looked at
    _segments: list[tuple[int, int]] | None = None  # the commitlog as last listed

    def _path(self, name: str) -> str:
        path = self._paths.get(name)
        if path is None:
            path = self._paths[name] = os.path.join(self.data_dir, name)
        return path

    def _segment(self, start: int) -> str:
        return self._path(f"commitlog/{start:0{SEGMENT_DIGITS}d}")

    def take(self, history: list[epochs.Entry], now: float) -> Snapshot:
        # Documents and logs first, the commitlog's end last: everything they refer to was
        # written before they were (all in this one loop turn anyway).
        marks = changes.marks()  # before looking: a write after it moves a mark again
        seen = self._seen
        if seen is None or now - self._looked_at >= self.full_look_s:
            seen, self._looked_at = (-1, -1, -1), now  # every mark "moved": look at all
        entries = marks[changes.ENTRIES] != seen[changes.ENTRIES]
        docs = self._documents() if entries else []
        logs = (self._append_logs(rewrites=entries)
                if entries or marks[changes.LOGS] != seen[changes.LOGS] else [])  # fmt: skip
        segments = self._segments
        if segments is None or entries:
            segments = self._segments = list_segments(self.data_dir)
        elif marks[changes.COMMITLOG] != seen[changes.COMMITLOG] and segments:
            # only appended to: the last segment grew (one stat, no listing)
            start = segments[-1][0]
            try:
                segments[-1] = (start, os.stat(self._segment(start)).st_size)
            except FileNotFoundError:
                segments = self._segments = list_segments(self.data_dir)
        self._seen = marks
        segment, data, complete = self._commitlog(history, segments)
        first = segments[0][0] if segments else 0
        if not complete:
            # A clipped commitlog: the documents may refer to bytes not in this batch. Send
            # them once the commitlog has caught up (their state stays "unsent").
            self._forget(docs, logs)
            return Snapshot(segment, self.position - len(data), data, [], False, now, first)
        return Snapshot(segment, self.position - len(data), data, logs + docs, True, now, first,
                        max(marks))  # fmt: skip

    # -- commitlog ---------------------------------------------------------------------------
    def _commitlog(
        self, history: list[epochs.Entry], segments: list[tuple[int, int]]
    ) -> tuple[int, bytes, bool]:
        end = log_end(segments)
        if segments and self.position < segments[0][0]:
            raise FollowerBehindRetention(
                f"position {self.position} was deleted by retention (the log starts at "
                f"{segments[0][0]}): the follower must start over"
            )
        holder = next(((s, z) for s, z in reversed(segments) if s <= self.position), None)
        if holder is None or self.position >= end:
            return (holder[0] if holder else self.position), b"", True
        start, size = holder
        if self.position >= start + size:  # at a segment's end: the next one
            later = [(s, z) for s, z in segments if s >= self.position]
            if not later:
                return start, b"", True
            start, size = later[0]
            self.position = start
        stop = start + size
        boundary = epochs.next_epoch_start(history, self.position)
        if boundary is not None:
            stop = min(stop, boundary)
        want = min(stop - self.position, self.max_bytes)
        with open(self._segment(start), "rb") as file:
            data = os.pread(file.fileno(), want, self.position - start)
            take = whole_frames(data)
            if take == 0 and data:  # one frame larger than a batch: send it alone
                frame = _FRAME_HEADER + _LENGTH.unpack_from(data, 0)[0]
                data = os.pread(file.fileno(), frame, self.position - start)
                take = whole_frames(data)
        data = data[:take]
        self.position += take
        return start, data, self.position >= end

    # -- append-only logs --------------------------------------------------------------------
    def _append_logs(self, rewrites: bool = True) -> list[pb.FileChange]:
        """What was appended to each log, or the whole log where it was rewritten (looked for
        only when ``rewrites``: no directory entry changed and no log was reopened since the
        last look, so a log of the same inode that did not shrink was appended to)."""
        found = []
        for name in APPEND_LOGS:
            path = self._path(name)
            try:
                stat = os.stat(path)
            except FileNotFoundError:
                continue
            state = self._logs.setdefault(name, _LogState())
            size = stat.st_size
            if (stat.st_ino, size, stat.st_mtime_ns) == (state.ino, state.sent, state.mtime_ns):
                continue  # untouched since it was sent: no read (most logs, most batches)
            rewritten = (
                stat.st_ino != state.ino
                or size < state.sent
                or (rewrites and _prefix_crc(path, state.sent) != state.prefix_crc)
            )
            if not rewritten and size == state.sent:
                state.mtime_ns = stat.st_mtime_ns
                continue
            start = 0 if rewritten else state.sent
            with open(path, "rb") as file:
                data = os.pread(file.fileno(), size - start, start)
            kind = pb.FileChange.REPLACE if rewritten else pb.FileChange.APPEND
            found.append(pb.FileChange(path=name, kind=kind, offset=start, data=data))
            if rewritten or state.sent < _PREFIX_BYTES:  # else its first bytes were checked
                state.prefix_crc = _prefix_crc(path, start + len(data))
            state.ino, state.sent, state.mtime_ns = stat.st_ino, start + len(data), stat.st_mtime_ns
        return found

    # -- small documents ---------------------------------------------------------------------
    def _document_names(self) -> list[str]:
        names = [n for n in DOCUMENTS if self.copy_keyring or n != "handle-keys.json"]
        for folder in DOCUMENT_DIRS:
            try:
                entries = os.listdir(self._path(folder))
            except (FileNotFoundError, NotADirectoryError):
                continue
            names += sorted(f"{folder}/{e}" for e in entries if e.endswith(".json"))
        return names

    def _documents(self) -> list[pb.FileChange]:
        found = []
        present = set()
        for name in self._document_names():
            path = self._path(name)
            try:
                seen = os.stat(path)
            except FileNotFoundError:
                continue
            if self._docs.get(name) == (seen.st_ino, seen.st_mtime_ns, seen.st_size):
                present.add(name)  # unchanged: one stat, no open
                continue
            try:
                with open(path, "rb") as file:
                    stat = os.fstat(file.fileno())
                    identity = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
                    present.add(name)
                    if self._docs.get(name) == identity:
                        continue
                    data = file.read()
            except FileNotFoundError:
                continue
            self._docs[name] = identity
            found.append(pb.FileChange(path=name, kind=pb.FileChange.REPLACE, data=data))
        for name in [n for n in self._docs if n not in present]:
            del self._docs[name]
            found.append(pb.FileChange(path=name, kind=pb.FileChange.DELETE))
        return found

    def _forget(self, docs: list[pb.FileChange], logs: list[pb.FileChange]) -> None:
        for change in docs:
            if change.kind == pb.FileChange.DELETE:
                self._docs[change.path] = (-1, -1, -1)  # still to delete
            else:
                self._docs.pop(change.path, None)
        for change in logs:
            self._logs.pop(change.path, None)
        self._seen = None  # look at every document and log again next time
