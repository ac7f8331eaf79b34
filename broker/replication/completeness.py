"""Whether a node's data directory holds a whole copy of its group's state, as the node itself
knows it: what an election asks before this node may campaign.

The in-sync set in etcd is what a leader last recorded; it can still name a node whose
directory was wiped, or is being reset or cut back, since (a leader that died before
recording the shrink, or an etcd that refused the write). Elected then, that node would open
a broker without the topics, groups, offsets or POP state that decide delivery, and every
follower would be reset to its empty copy. So the node keeps its own account:

- a copy is **whole** when the directory has an epoch history (it led, or it applied a batch
  of a leader, which always carries the leader's history) and no ``replication/incomplete``
  marker;
- the follower writes the marker, durably, before it applies a reset (bootstrap) or a cut,
  and removes it once it has made a *complete* batch durable (one that carried every changed
  document, taken when the leader's commitlog ended where the batch did).

An emptied directory has no history: it is not whole until it has bootstrapped.
"""

from __future__ import annotations

import os
from pathlib import Path

from popmq.broker.replication.epochs import EpochHistory
from popmq.broker.replication.files import list_segments, log_end
from popmq.broker.store.framing import fsync_dir

MARKER = Path("replication") / "incomplete"


RESET = "reset"


def mark_incomplete(data_dir: Path, why: str) -> None:
    """Record, durably, that the copy is being reset or cut (before anything is changed). A
    reset overrides a cut's marker: what is left is a bootstrap from nothing (holds_data)."""
    path = Path(data_dir) / MARKER
    if path.exists() and (why != RESET or _marker_reason(path) == RESET):
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")  # replaced whole: never an empty marker
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, why.encode() + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def mark_complete(data_dir: Path) -> None:
    """The copy is whole again (call once a complete batch is durable)."""
    path = Path(data_dir) / MARKER
    if path.exists():
        path.unlink()
        fsync_dir(path.parent)


def is_marked_incomplete(data_dir: Path) -> bool:
    return (Path(data_dir) / MARKER).exists()


def _marker_reason(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace").strip()
    except FileNotFoundError:
        return None


def holds_whole_copy(data_dir: Path) -> bool:
    """Whether this directory may serve as the group's leader without losing state (see the
    module's doc). Reads two small files: called when an election is due, not per request."""
    if is_marked_incomplete(data_dir):
        return False
    return bool(EpochHistory(Path(data_dir)).entries)


def holds_data(data_dir: Path) -> bool:
    """Whether the directory holds any of its group's data (an epoch history or commitlog
    bytes): false for an emptied one. Even an unclean election never elects such a node in a
    group that had a leader (popmq.coord.group). A copy being bootstrapped after a reset
    holds none either until it is whole: its history and first commitlog bytes come before
    any topic, offset or POP state (a clipped batch carries no document), and elected it
    would open the group without them and cut back every node that returns with its data."""
    if _marker_reason(Path(data_dir) / MARKER) == RESET:
        return False
    if EpochHistory(Path(data_dir)).entries:
        return True
    return log_end(list_segments(Path(data_dir))) > 0
