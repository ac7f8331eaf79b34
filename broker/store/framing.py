"""Checksummed frames for every append-only file of the broker.

A frame is ``[u32 length][u32 crc32(payload)][payload]`` (little endian). A reader walks frames
from a known boundary and stops at the first one that is torn (runs past the data) or corrupt
(checksum mismatch, zero length): after a crash that is where the valid log ends.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import overload

from popmq.broker.store import changes

FRAME_HEADER = struct.Struct("<II")
HEADER_SIZE = FRAME_HEADER.size
# A length above this is garbage, not a frame: refuse it rather than trust it.
MAX_FRAME_PAYLOAD = 1 << 30

_pack_header = FRAME_HEADER.pack
_unpack_header = FRAME_HEADER.unpack_from
_crc32 = zlib.crc32


def encode_frame(payload: bytes) -> bytes:
    """Frame one payload. Empty payloads are refused: a zero-filled tail must never parse."""
    size = len(payload)
    if size == 0 or size > MAX_FRAME_PAYLOAD:
        raise ValueError(f"frame payload must be 1..{MAX_FRAME_PAYLOAD} bytes, got {size}")
    return _pack_header(size, _crc32(payload)) + payload


# A frame as written: its header, then its payload in one or more parts.
Frame = tuple[bytes | memoryview, ...]


def frame_length(frame: Frame) -> int:
    return sum(len(part) for part in frame)


def frame_header(*parts: bytes | memoryview) -> bytes:
    """The header of a frame whose payload is ``parts`` in order (written after it as they
    are, so a large part is never joined into a new buffer)."""
    size = crc = 0
    for part in parts:
        size += len(part)
        crc = _crc32(part, crc)
    if size == 0 or size > MAX_FRAME_PAYLOAD:
        raise ValueError(f"frame payload must be 1..{MAX_FRAME_PAYLOAD} bytes, got {size}")
    return _pack_header(size, crc)


def check_frame(data: bytes | memoryview, offset: int) -> int:
    """Length of the valid frame's payload at ``offset``, or -1 when torn or corrupt."""
    end = len(data)
    if offset + HEADER_SIZE > end:
        return -1
    size, crc = _unpack_header(data, offset)
    start = offset + HEADER_SIZE
    if size == 0 or size > MAX_FRAME_PAYLOAD or start + size > end:
        return -1
    if _crc32(data[start : start + size]) != crc:
        return -1
    return size


@overload
def iter_frames(data: bytes, start: int = 0) -> Iterator[tuple[int, bytes]]: ...
@overload
def iter_frames(data: memoryview, start: int = 0) -> Iterator[tuple[int, memoryview]]: ...
@overload
def iter_frames(
    data: bytes | memoryview, start: int = 0
) -> Iterator[tuple[int, bytes | memoryview]]: ...
def iter_frames(
    data: bytes | memoryview, start: int = 0
) -> Iterator[tuple[int, bytes | memoryview]]:
    """Yield ``(offset_of_frame, payload)`` from ``start`` until the first torn or corrupt frame.

    The payload is a slice of ``data`` (bytes for bytes, a zero-copy memoryview for a
    memoryview). The valid end is the last frame's offset + HEADER_SIZE + len(payload), or
    ``start`` when nothing was yielded.
    """
    offset = start
    end = len(data)
    while offset + HEADER_SIZE <= end:
        size, crc = _unpack_header(data, offset)
        body_start = offset + HEADER_SIZE
        body_end = body_start + size
        if size == 0 or size > MAX_FRAME_PAYLOAD or body_end > end:
            return
        payload = data[body_start:body_end]
        if _crc32(payload) != crc:
            return
        yield offset, payload
        offset = body_end


@dataclass(slots=True, frozen=True)
class Resync:
    """How to recognise a real frame when searching past damage: the first byte(s) every
    payload of the file starts with, and a check of the payload beyond its CRC."""

    prefix: bytes = b""
    accept: Callable[[memoryview], bool] | None = None


def next_valid_frame(
    data: bytes | memoryview,
    start: int,
    payload_prefix: bytes = b"",
    accept: Callable[[memoryview], bool] | None = None,
) -> int:
    """Offset of the first valid frame at or after ``start`` (resync past damage), or -1.

    A candidate must have a sane length and a matching CRC-32 (a false match in damaged bytes
    is a 1 in 2**32 chance); ``payload_prefix`` (the first byte(s) every payload of this file
    starts with) lets the search jump between candidates in C instead of trying every byte,
    and ``accept`` may check the payload further (e.g. that a record header decodes)."""
    view = data if isinstance(data, memoryview) else memoryview(data)
    raw = view.obj if isinstance(view.obj, bytes) and len(view.obj) == len(view) else bytes(view)
    end = len(raw)
    offset = start
    while offset + HEADER_SIZE < end:
        if payload_prefix:
            found = raw.find(payload_prefix, offset + HEADER_SIZE)
            if found < 0:
                return -1
            offset = found - HEADER_SIZE
        size = check_frame(raw, offset)
        if size > 0 and (accept is None or accept(view[offset + HEADER_SIZE :][:size])):
            return offset
        offset += 1
    return -1


def walk_frames(
    data: bytes | memoryview,
    start: int = 0,
    payload_prefix: bytes = b"",
    accept: Callable[[memoryview], bool] | None = None,
) -> Iterator[tuple[int, int, memoryview | None]]:
    """Every frame from ``start``, resyncing past damage: yields ``(offset, end, payload)``
    for a valid frame and ``(offset, end, None)`` for a damaged run of bytes (up to the next
    valid frame, or the end of the data when none follows)."""
    view = data if isinstance(data, memoryview) else memoryview(data)
    offset = start
    end = len(view)
    while offset < end:
        last = offset
        for frame_offset, payload in iter_frames(view, offset):
            if accept is not None and not accept(payload):
                break
            last = frame_offset + HEADER_SIZE + len(payload)
            yield frame_offset, last, payload
        if last >= end:
            return
        resync = next_valid_frame(view, last + 1, payload_prefix, accept)
        stop = end if resync < 0 else resync
        yield last, stop, None
        offset = stop


def valid_end(data: bytes | memoryview, start: int = 0) -> int:
    """Offset just past the last valid frame that follows ``start``."""
    end = start
    for offset, payload in iter_frames(data, start):
        end = offset + HEADER_SIZE + len(payload)
    return end


def fsync_dir(path: Path) -> None:
    """Make a create/rename/unlink inside ``path`` durable (every writer of a directory entry
    calls it after the change: it moves the ``ENTRIES`` mark, changes.py)."""
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    finally:
        changes.note(changes.ENTRIES)  # the entry changed before this was called, fsync or not


@dataclass(slots=True)
class DamagedRun:
    """Bytes of a FramedLog that are not valid frames: ``tail`` when nothing valid follows
    (cut at open, after the owner was told), else skipped in place by every read."""

    start: int
    end: int
    tail: bool
    data: bytes


class FramedLog:
    """One append-only file of frames (e.g. a journal).

    Opening walks the file: a damaged run of bytes followed by valid frames is left in place
    and skipped by every read (resyncing at the next valid frame, see ``Resync``); a damaged
    tail is cut. Both are listed in ``damage`` (with their bytes) so the owner can report and
    quarantine them; nothing is dropped silently. ``append`` buffers in memory and returns the
    frame's position; ``flush`` hands the buffer to the OS and, with ``fsync=True``, waits for
    the disk. Not thread-safe, except ``sync()``, which only fsyncs what was already flushed and
    may run in a worker thread (``asyncio.to_thread(log.sync)``) while the loop keeps appending.
    """

    def __init__(self, path: Path, resync: Resync | None = None) -> None:
        self._path = Path(path)
        self._path.parent.mkdir(parents=True, exist_ok=True)
        self._resync = resync or Resync()
        self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o600)
        self._buffer = bytearray()
        size = os.fstat(self._fd).st_size
        data = os.pread(self._fd, size, 0) if size else b""
        self.damage: list[DamagedRun] = []
        self._written = size
        for offset, end, payload in walk_frames(data, 0, self._resync.prefix, self._resync.accept):
            if payload is None:
                tail = end == size
                self.damage.append(DamagedRun(offset, end, tail, data[offset:end]))
                if tail:
                    self._written = offset
        self.truncated_bytes = size - self._written
        if self.truncated_bytes:
            os.ftruncate(self._fd, self._written)
            os.fsync(self._fd)
        changes.note(changes.ENTRIES)  # opened after a rewrite, or cut back: look at it whole

    @property
    def path(self) -> Path:
        return self._path

    @property
    def end_position(self) -> int:
        """Where the next frame will start (buffered frames included)."""
        return self._written + len(self._buffer)

    def append(self, payload: bytes) -> int:
        position = self.end_position
        self._buffer += encode_frame(payload)
        return position

    def flush(self, fsync: bool = False) -> None:
        if self._buffer:
            os.pwrite(self._fd, self._buffer, self._written)
            self._written += len(self._buffer)
            self._buffer.clear()
            changes.note(changes.LOGS)
        if fsync:
            os.fsync(self._fd)

    def sync(self) -> None:
        """fsync what earlier flush() calls wrote; safe from a worker thread."""
        os.fsync(self._fd)

    def iter_from(self, position: int = 0) -> Iterator[tuple[int, bytes]]:
        """Frames from ``position`` (a frame boundary) to the end, buffered ones included;
        damaged runs are skipped."""
        self.flush()
        size = self._written - position
        if size <= 0:
            return iter(())
        data = os.pread(self._fd, size, position)
        frames = walk_frames(data, 0, self._resync.prefix, self._resync.accept)
        return ((position + offset, bytes(payload)) for offset, _, payload in frames
                if payload is not None)  # fmt: skip

    def close(self) -> None:
        if self._fd < 0:
            return
        self.flush(fsync=True)
        os.close(self._fd)
        self._fd = -1
