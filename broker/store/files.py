"""Small file helpers: atomic JSON documents and the data directory lock (open descriptors
live in file_budget.py)."""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import Any

from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.store.framing import fsync_dir


def write_json_atomic(path: Path, value: Any) -> None:
    """Replace ``path`` with ``value`` as JSON so a crash leaves the old or the new document,
    never a mix: write a temp file, fsync it, rename it over, fsync the directory."""
    data = json.dumps(value, separators=(",", ":"), sort_keys=True).encode()
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
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


class DirLock:
    """An exclusive lock on a data directory: two stores on one directory would corrupt it.
    The kernel drops it when the process dies, so a kill -9 never leaves it stale."""

    def __init__(self, directory: Path) -> None:
        self._path = directory / "LOCK"
        self._fd = -1

    def acquire(self) -> None:
        fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RefusedError(
                Code.INTERNAL_ERROR, f"data directory {self._path.parent} is used by another store"
            ) from None
        self._fd = fd

    def release(self) -> None:
        if self._fd >= 0:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = -1
