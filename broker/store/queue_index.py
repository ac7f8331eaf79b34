"""The index of one queue: fixed-size entries, so reading offset N is one seek.

Entry N (the message at queue offset N) is ``[u64 commitlog position][u32 frame size]
[u32 tag hash][i64 store timestamp]``. Entries live in files of ``entries_per_file`` entries,
each named after its first offset (20 digits): the file starting at S holds offsets
S .. S + entries_per_file - 1. There is always at least one file, so an emptied queue still
knows its max offset. Positions and timestamps grow with the offset, which makes both
searchable by bisection.

No descriptor is held between calls: every file, the one being appended to included, is
opened through the store's FileBudget, so thousands of queues share a bounded number of
descriptors.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from pathlib import Path

from popmq.broker.store.file_budget import FileBudget
from popmq.broker.store.framing import fsync_dir

ENTRY = struct.Struct("<QIIq")
ENTRY_SIZE = ENTRY.size
# The frame size of a *hole*: an offset whose record recovery found lost (see recovery.py).
# Not 0, so a zero-filled entry (a file extended by a crash) is never taken for one.
HOLE_SIZE = 0xFFFFFFFF
_NAME_DIGITS = 20


class IndexDamaged(Exception):
    """The files do not form one contiguous run of entries: rebuild from the commitlog."""


class QueueIndex:
    def __init__(self, directory: Path, entries_per_file: int, handles: FileBudget) -> None:
        self._dir = directory
        self._per_file = entries_per_file
        self._handles = handles
        self._paths: dict[int, Path] = {}  # file start -> its path
        self._starts: list[int] = []
        self._active_count = 0  # entries in the last file
        self._dirty: set[int] = set()  # starts of files written since the last flush
        # A file was created since the last flush: the directory needs an fsync too (left to
        # the checkpoint, with the files' data, so creating thousands of queues stays cheap).
        self._dir_dirty = False
        self.min_offset = 0

    @property
    def directory(self) -> Path:
        return self._dir

    # -- opening -----------------------------------------------------------------------------
    def open(self) -> None:
        """Load the files; raise IndexDamaged when some are missing or short."""
        self._dir.mkdir(parents=True, exist_ok=True)
        sizes: dict[int, int] = {}
        for entry in self._dir.iterdir():
            if len(entry.name) == _NAME_DIGITS and entry.name.isdigit():
                sizes[int(entry.name)] = entry.stat().st_size
        if not sizes:
            self._create_file(0)
            return
        self._starts = sorted(sizes)
        for start, nxt in zip(self._starts, self._starts[1:], strict=False):
            if nxt != start + self._per_file or sizes[start] != self._per_file * ENTRY_SIZE:
                raise IndexDamaged(f"{self._dir}: file {start} is short or followed by a gap")
        last = self._starts[-1]
        size = sizes[last]
        if size > self._per_file * ENTRY_SIZE:
            raise IndexDamaged(f"{self._dir}: file {last} is longer than a file can be")
        if size % ENTRY_SIZE:  # a torn entry at the tail
            size -= size % ENTRY_SIZE
            os.ftruncate(self._handles.get(self._path(last)), size)
        self._active_count = size // ENTRY_SIZE
        self.min_offset = self._starts[0]

    def reset(self, base_offset: int) -> None:
        """Drop every entry; the next appended entry gets ``base_offset``."""
        for start in self._starts:
            self._handles.discard(self._path(start))
            self._path(start).unlink(missing_ok=True)
        self._starts = []
        self._dirty.clear()
        self._create_file(base_offset)
        self.min_offset = base_offset

    def _create_file(self, start: int) -> None:
        self._dir.mkdir(parents=True, exist_ok=True)
        path = self._path(start)
        self._handles.discard(path)
        os.ftruncate(self._handles.get(path, create=True), 0)
        self._starts.append(start)
        self._active_count = 0
        self._dirty.add(start)
        self._dir_dirty = True

    def _path(self, start: int) -> Path:
        path = self._paths.get(start)  # every append looks its file up: build its path once
        if path is None:
            if len(self._paths) > 64:
                self._paths.clear()
            path = self._paths[start] = self._dir / f"{start:0{_NAME_DIGITS}d}"
        return path

    # -- offsets -----------------------------------------------------------------------------
    @property
    def max_offset(self) -> int:
        """The offset the next entry gets."""
        return self._starts[-1] + self._active_count

    @property
    def first_offset(self) -> int:
        """The first offset still held in a file (entries below min_offset may remain)."""
        return self._starts[0]

    # -- append ------------------------------------------------------------------------------
    def append(self, entries: bytes) -> None:
        """Append packed entries (ENTRY.pack(...) joined) at max_offset."""
        view = memoryview(entries)
        while view:
            if self._active_count == self._per_file:
                self._dirty.add(self._starts[-1])
                self._create_file(self._starts[-1] + self._per_file)
            room = (self._per_file - self._active_count) * ENTRY_SIZE
            chunk = view[:room]
            os.pwrite(self._fd(self._starts[-1]), chunk, self._active_count * ENTRY_SIZE)
            self._active_count += len(chunk) // ENTRY_SIZE
            view = view[len(chunk) :]
        self._dirty.add(self._starts[-1])

    # -- read --------------------------------------------------------------------------------
    def _fd(self, start: int) -> int:
        return self._handles.get(self._path(start))

    def _file_index(self, offset: int) -> int:
        # Files are contiguous and all but the last are full: plain arithmetic finds the file.
        return (offset - self._starts[0]) // self._per_file

    def read_raw(self, offset: int, count: int) -> bytes:
        """Packed entries for ``offset`` .. ``offset + count - 1`` (clamped to max_offset)."""
        end = min(offset + count, self.max_offset)
        if offset < self._starts[0]:
            raise ValueError(f"offset {offset} is below the first index file")
        parts: list[bytes] = []
        while offset < end:
            start = self._starts[self._file_index(offset)]
            stop = min(end, start + self._per_file)
            parts.append(
                os.pread(
                    self._fd(start), (stop - offset) * ENTRY_SIZE, (offset - start) * ENTRY_SIZE
                )
            )
            offset = stop
        if len(parts) == 1:
            return parts[0]
        return b"".join(parts)

    def first_broken_entry(self, max_size: int, max_entries: int = 1 << 20) -> int | None:
        """The first offset whose entry cannot be right (positions and store times must grow,
        a record must fit before the next one), or None. Catches damage anywhere in the files
        (bit rot, a stray write) without reading the commitlog, in the newest files holding
        about ``max_entries`` entries (so a start stays fast on huge queues; `popmq broker
        verify` checks everything). Entries past the end of the log are not index damage:
        recovery counts their records as lost."""
        previous_start = previous_end = previous_ts = -1
        newest = [s for s in self._starts if s + self._per_file > self.max_offset - max_entries]
        for start in newest:
            count = min(self._per_file, self.max_offset - start)
            if count <= 0:
                break
            entries = ENTRY.iter_unpack(self.read_raw(start, count))
            for i, (position, size, _, ts) in enumerate(entries):
                if size == HOLE_SIZE:  # a lost record: placed at or after the one before
                    if position < previous_start:
                        return start + i
                    continue
                if size < 9 or size > max_size or position < previous_end or ts < previous_ts:
                    return start + i
                previous_start, previous_end, previous_ts = position, position + size, ts
        return None

    def entry(self, offset: int) -> tuple[int, int, int, int]:
        """(position, size, tag hash, store timestamp) of one offset."""
        return ENTRY.unpack(self.read_raw(offset, 1))

    def bisect(self, lo: int, hi: int, key: Callable[[tuple[int, int, int, int]], int],
               value: int) -> int:  # fmt: skip
        """First offset in [lo, hi) whose key(entry) >= value, or hi."""
        while lo < hi:
            mid = (lo + hi) // 2
            if key(self.entry(mid)) < value:
                lo = mid + 1
            else:
                hi = mid
        return lo

    # -- shrinking ---------------------------------------------------------------------------
    def truncate(self, offset: int) -> None:
        """Drop the entries at ``offset`` and above (recovery)."""
        if offset >= self.max_offset:
            return
        if offset <= self._starts[0]:
            self.reset(offset)
            return
        while self._starts[-1] > offset or (self._starts[-1] == offset and len(self._starts) > 1):
            start = self._starts.pop()
            self._handles.discard(self._path(start))
            self._path(start).unlink()
            self._dirty.discard(start)
        last = self._starts[-1]
        self._active_count = offset - last
        os.ftruncate(self._fd(last), self._active_count * ENTRY_SIZE)
        self._dirty.add(last)
        fsync_dir(self._dir)

    def first_kept(self, offset: int) -> int:
        """Start of the file holding ``offset`` (the last file if beyond it)."""
        index = min(max(self._file_index(offset), 0), len(self._starts) - 1)
        return self._starts[index]

    def delete_files_below(self, offset: int) -> None:
        """Delete whole files whose entries are all below ``offset`` (never the last one)."""
        while len(self._starts) > 1 and self._starts[1] <= offset:
            start = self._starts.pop(0)
            self._dirty.discard(start)
            self._handles.discard(self._path(start))
            self._path(start).unlink(missing_ok=True)

    def destroy(self) -> None:
        """Delete the whole index (the topic is deleted)."""
        for start in self._starts:
            self._handles.discard(self._path(start))
            self._path(start).unlink(missing_ok=True)
        self._starts = []
        self._dirty.clear()
        try:
            self._dir.rmdir()
        except OSError:
            pass

    # -- durability --------------------------------------------------------------------------
    def take_dirty_paths(self) -> list[Path]:
        """The files written since the last call, for file_budget.fsync_paths."""
        paths = [self._path(start) for start in sorted(self._dirty) if start in self._starts]
        if self._dir_dirty:
            paths.append(self._dir)
        self._dirty.clear()
        self._dir_dirty = False
        return paths

    def mark_all_dirty(self) -> None:
        self._dirty.update(self._starts)
        self._dir_dirty = True

    def close(self) -> None:
        for start in self._starts:
            self._handles.discard(self._path(start))
