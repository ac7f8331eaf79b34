"""Small file helpers: atomic JSON documents, a bounded cache of read handles, the dir lock."""

from __future__ import annotations

import fcntl
import json
import os
from collections import OrderedDict
from pathlib import Path
from typing import Any

from popmq.broker.api.errors import BrokerError, Code
from popmq.broker.store.framing import fsync_dir


def write_json_atomic(path: Path, value: Any) -> None:
    """Replace ``path`` with ``value`` as JSON so a crash leaves the old or the new document,
    never a mix: write a temp file, fsync it, rename it over, fsync the directory."""
    data = json.dumps(value, separators=(",", ":"), sort_keys=True).encode()
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def read_json(path: Path) -> Any | None:
    """The document at ``path``, or None when there is none."""
    try:
        return json.loads(path.read_bytes())
    except FileNotFoundError:
        return None


class HandleCache:
    """Read/write descriptors of files that are not being appended to, opened on demand.

    Bounded (least recently used closed first) so thousands of old segments and index files
    do not exhaust the process's descriptor limit.
    """

    def __init__(self, capacity: int = 128) -> None:
        self._capacity = capacity
        self._fds: OrderedDict[Path, int] = OrderedDict()

    def get(self, path: Path) -> int:
        fd = self._fds.get(path)
        if fd is not None:
            self._fds.move_to_end(path)
            return fd
        fd = os.open(path, os.O_RDWR)
        self._fds[path] = fd
        if len(self._fds) > self._capacity:
            _, old = self._fds.popitem(last=False)
            os.close(old)
        return fd

    def adopt(self, path: Path, fd: int) -> None:
        """Take over an already open descriptor (a segment that stopped being appended to)."""
        self.discard(path)
        self._fds[path] = fd
        if len(self._fds) > self._capacity:
            _, old = self._fds.popitem(last=False)
            os.close(old)

    def discard(self, path: Path) -> None:
        fd = self._fds.pop(path, None)
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


class DirLock:
    """An exclusive lock on a data directory: two stores on one directory would corrupt it.
    The kernel drops it when the process dies, so a kill -9 never leaves it stale."""

    def __init__(self, directory: Path) -> None:
        self._path = directory / "LOCK"
        self._fd = -1

    def acquire(self) -> None:
        fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise BrokerError(
                Code.INTERNAL_ERROR, f"data directory {self._path.parent} is used by another store"
            ) from None
        self._fd = fd

    def release(self) -> None:
        if self._fd >= 0:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = -1
