"""The commitlog: every message of every queue, appended in arrival order to segment files.

Positions are global byte addresses. A segment file is named after the position of its first
byte (20 digits) and holds whole frames only (see framing.py); a new segment starts when the
next frame would push the active one past ``segment_bytes`` (a frame bigger than that gets a
segment of its own). Only the last segment is written to; retention deletes from the front.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from popmq.broker.store import changes
from popmq.broker.store.damage import DAMAGED, MISSING, TORN_TAIL
from popmq.broker.store.file_budget import FileBudget
from popmq.broker.store.framing import (
    HEADER_SIZE,
    Frame,
    Resync,
    check_frame,
    frame_length,
    fsync_dir,
    walk_frames,
)

log = logging.getLogger(__name__)

# Buffers per pwritev call: the kernel refuses more than IOV_MAX at once (1024 on Linux and
# macOS).
_MOST_BUFFERS = 1024

_NAME_DIGITS = 20


def segment_name(start: int) -> str:
    return f"{start:0{_NAME_DIGITS}d}"


@dataclass(slots=True)
class Segment:
    start: int
    size: int
    path: Path

    @property
    def end(self) -> int:
        return self.start + self.size


class PositionPurged(Exception):
    """The position lies below the first segment: retention deleted it."""


class CommitLog:
    def __init__(self, directory: Path, segment_bytes: int, handles: FileBudget) -> None:
        self._dir = directory
        self._segment_bytes = segment_bytes
        self._handles = handles
        self._segments: list[Segment] = []
        self._starts: list[int] = []
        self._active_fd = -1
        # Everything below this position is known to be on disk (fsynced).
        self.durable_position = 0
        self.fsync_count = 0

    # -- opening and recovery ----------------------------------------------------------------
    def open(self) -> None:
        """List the segments (no validation: recover_tail() does that)."""
        self._dir.mkdir(parents=True, exist_ok=True)
        for entry in sorted(self._dir.iterdir()):
            if len(entry.name) == _NAME_DIGITS and entry.name.isdigit():
                size = entry.stat().st_size
                self._segments.append(Segment(int(entry.name), size, entry))
        if not self._segments:
            path = self._dir / segment_name(0)
            path.touch(mode=0o600)
            fsync_dir(self._dir)
            self._segments.append(Segment(0, 0, path))
        self._starts = [seg.start for seg in self._segments]
        self._active_fd = os.open(self._segments[-1].path, os.O_RDWR)

    def first_inconsistent_start(self) -> int | None:
        """Start of the first segment whose size does not reach the next segment's start."""
        for seg, nxt in zip(self._segments, self._segments[1:], strict=False):
            if seg.end != nxt.start:
                return seg.start
        return None

    def segment_start_for(self, position: int) -> int:
        """Start of the segment holding ``position`` (clamped to the existing segments)."""
        index = bisect.bisect_right(self._starts, position) - 1
        return self._segments[max(index, 0)].start

    def recover_tail(
        self,
        scan_from: int,
        on_record: Callable[[int, memoryview], None],
        on_damage: Callable[[int, int, str, bytes], None],
        durable: int,
        resync: Resync,
    ) -> int:
        """Walk every frame from ``scan_from`` (a segment start, or a frame's) to the end, calling
        ``on_record(position, payload)`` for each valid frame and ``on_damage(start, end,
        reason, data)`` for each damaged run of bytes, then resyncing at the next valid frame
        (found by ``resync``), so damage inside the log never hides what follows it.

        Only the end of the last segment is cut: the bytes after its last valid frame (a torn
        tail when they lie at or past ``durable``, the last position known to be fsynced;
        damage otherwise); they are handed to ``on_damage`` first, so they can be kept.
        Damage elsewhere stays in place (every walk skips it). A segment that ends before the
        next one starts, or a log that ends before ``durable``, is reported as missing bytes.
        Returns the number of bytes cut."""
        cut = 0
        original_end = self.write_position
        index = max(bisect.bisect_right(self._starts, scan_from) - 1, 0)
        while index < len(self._segments):
            seg = self._segments[index]
            last = index + 1 == len(self._segments)
            # The first segment may be walked from a frame inside it: only that part is read.
            skip = min(max(0, scan_from - seg.start), seg.size)
            data = os.pread(self._fd_for(seg), seg.size - skip, skip) if seg.size > skip else b""
            for offset, end, payload in walk_frames(data, 0, resync.prefix, resync.accept):
                if payload is not None:
                    on_record(seg.start + skip + offset, payload)
                    continue
                start = seg.start + skip + offset
                if last and skip + end == seg.size:
                    reason = TORN_TAIL if start >= durable else DAMAGED
                    on_damage(start, seg.start + skip + end, reason, bytes(data[offset:end]))
                    self._truncate_segment(seg, skip + offset)
                    cut += end - offset
                else:
                    on_damage(start, seg.start + skip + end, DAMAGED, bytes(data[offset:end]))
            if not last and seg.end < self._segments[index + 1].start:
                on_damage(seg.end, self._segments[index + 1].start, MISSING, b"")
            index += 1
        if original_end < durable:
            on_damage(original_end, durable, MISSING, b"")
        self.durable_position = self.write_position
        return cut

    def scan(
        self,
        start: int,
        on_record: Callable[[int, memoryview], None],
        on_damage: Callable[[int, int, str, bytes], None],
        resync: Resync,
    ) -> None:
        """Call ``on_record`` for every frame at or after ``start`` and ``on_damage`` for every
        damaged run (resyncing past it), changing nothing."""
        for seg in self._segments:
            if seg.end <= start:
                continue
            data = self._read_segment(seg)
            for offset, end, payload in walk_frames(data, 0, resync.prefix, resync.accept):
                if seg.start + offset < start:
                    continue
                if payload is not None:
                    on_record(seg.start + offset, payload)
                else:
                    on_damage(seg.start + offset, seg.start + end, DAMAGED,
                              bytes(data[offset:end]))  # fmt: skip

    def _read_segment(self, seg: Segment) -> bytes:
        return os.pread(self._fd_for(seg), seg.size, 0) if seg.size else b""

    def _truncate_segment(self, seg: Segment, size: int) -> None:
        fd = self._fd_for(seg)
        os.ftruncate(fd, size)
        os.fsync(fd)
        seg.size = size
        changes.note(changes.ENTRIES)  # cut back: look at the whole directory again

    # -- positions ---------------------------------------------------------------------------
    @property
    def write_position(self) -> int:
        return self._segments[-1].end

    @property
    def min_position(self) -> int:
        return self._segments[0].start

    @property
    def segments(self) -> list[Segment]:
        return list(self._segments)

    @property
    def total_bytes(self) -> int:
        return self.write_position - self.min_position

    def _segment_at(self, position: int) -> Segment:
        index = bisect.bisect_right(self._starts, position) - 1
        if index < 0:
            raise PositionPurged(position)
        return self._segments[index]

    def _fd_for(self, seg: Segment) -> int:
        if seg is self._segments[-1]:
            return self._active_fd
        return self._handles.get(seg.path)

    # -- append and read ---------------------------------------------------------------------
    def append(self, frames: Sequence[Frame]) -> list[int]:
        """Write frames (already encoded, each one or more buffers) to the page cache; return
        each one's position."""
        positions: list[int] = []
        pending: list[bytes | memoryview] = []
        seg = self._segments[-1]
        size = seg.size
        for frame in frames:
            length = frame_length(frame)
            if size and size + length > self._segment_bytes:
                self._write(seg, pending, size)
                pending = []
                seg = self._roll()
                size = 0
            positions.append(seg.start + size)
            pending.extend(frame)
            size += length
        self._write(seg, pending, size)
        return positions

    def _write(self, seg: Segment, buffers: list[bytes | memoryview], new_size: int) -> None:
        """Write ``buffers`` at the end of the active segment as they are (pwritev: a large
        body is written from where it is, grpc's bytes of the request, never joined)."""
        if not buffers:
            return
        at = seg.size
        try:
            for start in range(0, len(buffers), _MOST_BUFFERS):
                batch = buffers[start : start + _MOST_BUFFERS]
                expected = sum(len(b) for b in batch)
                written = os.pwritev(self._active_fd, batch, at)
                if written != expected:
                    raise OSError(f"short write to the commitlog ({written} of {expected} bytes)")
                at += written
        except OSError:  # a full disk: keep the log consistent, then fail loudly
            with contextlib.suppress(OSError):  # recovery cuts a torn tail if this fails too
                os.ftruncate(self._active_fd, seg.size)
            changes.note(changes.ENTRIES)  # cut back
            raise
        finally:
            changes.note(changes.COMMITLOG)  # bytes may be visible, even of a failed write
        seg.size = new_size

    def _roll(self) -> Segment:
        old = self._segments[-1]
        self._handles.adopt(old.path, self._active_fd)
        seg = Segment(old.end, 0, self._dir / segment_name(old.end))
        self._active_fd = os.open(seg.path, os.O_RDWR | os.O_CREAT, 0o600)
        self._segments.append(seg)
        self._starts.append(seg.start)
        # The new file's directory entry is made durable by the next flush (sync_fds).
        self._dir_dirty = True
        changes.note(changes.ENTRIES)  # a new segment: the directory is listed again
        return seg

    def read(self, position: int, size: int) -> bytes:
        """``size`` bytes at ``position`` (a run of records, possibly over segments)."""
        parts: list[bytes] = []
        while size > 0:
            seg = self._segment_at(position)
            take = min(size, seg.end - position)
            if take <= 0:
                index = bisect.bisect_right(self._starts, position)
                if index >= len(self._segments):
                    raise ValueError(f"read past the end of the commitlog at {position}")
                # Bytes a segment lost (recovery reported them): zeros, never a record.
                gap = min(size, self._segments[index].start - position)
                parts.append(bytes(gap))
                position += gap
                size -= gap
                continue
            parts.append(os.pread(self._fd_for(seg), take, position - seg.start))
            position += take
            size -= take
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def read_frame(self, position: int) -> bytes | None:
        """The payload of the frame at ``position``, or None when it is not a valid frame."""
        seg = self._segment_at(position)
        head = os.pread(self._fd_for(seg), HEADER_SIZE, position - seg.start)
        if len(head) < HEADER_SIZE:
            return None
        size = int.from_bytes(head[:4], "little")
        if position + HEADER_SIZE + size > seg.end:
            return None
        data = head + os.pread(self._fd_for(seg), size, position - seg.start + HEADER_SIZE)
        return data[HEADER_SIZE:] if check_frame(data, 0) == size else None

    # -- durability --------------------------------------------------------------------------
    _dir_dirty = False

    def flush_targets(self) -> tuple[int, list[int], bool]:
        """(position, duplicated descriptors to fsync, whether the directory needs it) for
        making everything written so far durable. The duplicates belong to the caller (sync_fds
        closes them), so a worker thread can fsync while the loop rolls or deletes segments."""
        target = self.write_position
        fds: list[int] = []
        for seg in reversed(self._segments):
            if seg.end <= self.durable_position:
                break
            fds.append(os.dup(self._fd_for(seg)))
        dir_dirty, self._dir_dirty = self._dir_dirty, False
        return target, fds, dir_dirty

    def sync_fds(self, fds: list[int], dir_dirty: bool) -> None:
        """fsync (in a worker thread) what flush_targets() returned; closes the duplicates."""
        try:
            for fd in reversed(fds):  # oldest segment first
                os.fsync(fd)
            if dir_dirty:
                fsync_dir(self._dir)
        finally:
            for fd in fds:
                os.close(fd)

    def flush_failed(self, dir_dirty: bool) -> None:
        """A sync_fds() call did not finish: keep what it owed for the next one."""
        self._dir_dirty = self._dir_dirty or dir_dirty

    def mark_durable(self, position: int, fsyncs: int) -> None:
        """Record (on the loop) that a sync_fds() call covering ``position`` finished."""
        self.durable_position = max(self.durable_position, position)
        self.fsync_count += fsyncs

    # -- retention ---------------------------------------------------------------------------
    def delete_oldest(self) -> Segment:
        """Delete the first segment (never the active one); the caller checked it may go."""
        if len(self._segments) < 2:
            raise ValueError("the active segment is never deleted")
        seg = self._segments.pop(0)
        self._starts.pop(0)
        self._handles.discard(seg.path)
        seg.path.unlink(missing_ok=True)
        changes.note(changes.ENTRIES)
        return seg

    def segment_mtime_ms(self, seg: Segment) -> int:
        return int(seg.path.stat().st_mtime * 1000)

    def close(self) -> None:
        if self._active_fd >= 0:
            os.close(self._active_fd)
            self._active_fd = -1
