"""A bounded budget of open store files: index and old segment descriptors, LRU-closed.

Every queue index used to keep its last file open forever, so each auto-created topic cost
queue_count descriptors until the process hit EMFILE. Now every index file and every
non-active commitlog segment is opened through one ``FileBudget``: at most ``capacity``
descriptors stay open, and the least recently used one is closed when another is needed.
Closing a written file loses nothing: its data is in the page cache, and the checkpoint
fsyncs it through a fresh descriptor (fsync covers the file, not the descriptor).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path

DEFAULT_CAPACITY = 256


class FileBudget:
    """Read/write descriptors of store files, opened on demand, at most ``capacity`` open."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError("the open-file budget needs room for at least one file")
        self._capacity = capacity
        self._fds: OrderedDict[Path, int] = OrderedDict()
        self.opens = 0  # descriptors opened so far (cache misses)
        self.evictions = 0  # descriptors closed to stay within the budget

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def open_count(self) -> int:
        return len(self._fds)

    def get(self, path: Path, *, create: bool = False) -> int:
        """A descriptor of ``path`` (most recently used now); valid until the next call that
        may open another file, so use it at once and never keep it."""
        fd = self._fds.get(path)
        if fd is not None:
            self._fds.move_to_end(path)
            return fd
        # Make room first: the open below must not be the one that crosses the limit.
        self._shrink(self._capacity - 1)
        flags = os.O_RDWR | (os.O_CREAT if create else 0)
        fd = os.open(path, flags, 0o600)
        self.opens += 1
        self._fds[path] = fd
        return fd

    def adopt(self, path: Path, fd: int) -> None:
        """Take over an already open descriptor (a segment that stopped being appended to)."""
        self.discard(path)
        self._fds[path] = fd
        self._shrink(self._capacity)

    def discard(self, path: Path) -> None:
        """Close ``path``'s descriptor if open (the file is deleted or truncated away)."""
        fd = self._fds.pop(path, None)
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def _shrink(self, size: int) -> None:
        while len(self._fds) > size:
            _, old = self._fds.popitem(last=False)
            os.close(old)
            self.evictions += 1


def fsync_paths(paths: list[Path]) -> None:
    """fsync files (and directories) one at a time, each through its own short-lived
    descriptor, so making thousands of index files durable needs one spare descriptor, not
    thousands. A file deleted meanwhile (topic deleted, retention) needs no fsync."""
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
