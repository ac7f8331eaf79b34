"""Which files of the data directory changed: a mark per kind that every writer of a file a
follower copies moves after its write is visible (replication/files.py reads the marks).

A replication leader looks at its data directory once per batch and follower. Most looks find
nothing new (a write's batch went out before its barrier asked for another) or one file grown,
yet each stat()ed and listed every replicated file. With the marks it skips what no writer
touched since its last look. A mark is a fresh number from one counter: a writer that moves
its mark after writing is seen by every look that reads the mark after that, so a look that
read an unchanged mark before scanning missed nothing a writer had finished.

Kinds:
- ``COMMITLOG``: bytes appended to the last segment (only its size changed);
- ``LOGS``: bytes appended to a framed log (``FramedLog``: the pop journal, topics and groups);
- ``ENTRIES``: a directory entry made, replaced, renamed or deleted (every atomic document
  write and log rewrite ends with ``fsync_dir``, which moves it; a commitlog segment made or
  deleted), a file cut back (a log opened, a segment), the receipt-handle keyring written or
  seen changed.

The marks are process-wide (over-reporting costs a look, never a miss). Writers in other
processes (``popmq handle-keys rotate`` beside a running broker) are not seen here: the
broker's keyring reload moves ``ENTRIES`` when it notices the file changed, and a snapshotter
looks at everything at least once a second anyway.
"""

from __future__ import annotations

import itertools
import threading

COMMITLOG = 0
LOGS = 1
ENTRIES = 2

_ticket = itertools.count(1)
_marks = [0, 0, 0]
# Taking a number and storing it are two steps, and a worker thread (a checkpoint's
# fsync_dir) can be switched out between them: a look reading the marks then would be given a
# ticket above a change it did not see (the sync barrier would answer that write unreplicated).
_lock = threading.Lock()


def note(kind: int) -> None:
    """A file of ``kind`` changed (call after the change is visible to readers)."""
    with _lock:
        _marks[kind] = next(_ticket)


def marks() -> tuple[int, int, int]:
    """The current mark of each kind (read before looking at the files)."""
    with _lock:
        return (_marks[0], _marks[1], _marks[2])


def newest() -> int:
    """The newest mark of any kind: every change noted so far has a mark at most this. A look
    that read marks whose newest is at least this saw every one of those changes (the sync
    barrier's test of whether a batch holds a write)."""
    with _lock:
        return max(_marks)
