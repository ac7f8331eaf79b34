"""The epoch history of a node's commitlog: which epoch wrote from which position on.

``replication/epochs.json`` (a metafile: checksummed, written atomically) holds
``[[epoch, start_offset], ...]``, oldest first, as RocketMQ's epoch checkpoint does. A leader
adds its epoch with the commitlog's write position when it starts leading; a follower copies
its leader's history. Comparing two histories gives the last position both logs share: a
former leader cuts what it wrote after that, then catches up.
"""

from __future__ import annotations

from pathlib import Path

from popmq.broker.store import metafile

FILE = Path("replication") / "epochs.json"

Entry = tuple[int, int]  # (epoch, start offset)


class StaleEpochError(ValueError):
    """The epoch is older than one this node already knows."""


class EpochHistory:
    def __init__(self, data_dir: Path) -> None:
        self._path = Path(data_dir) / FILE
        body = metafile.read(self._path).body
        self.entries: list[Entry] = [(int(e), int(s)) for e, s in body or []]

    @property
    def last_epoch(self) -> int:
        return self.entries[-1][0] if self.entries else 0

    def begin(self, epoch: int, start_offset: int) -> None:
        """This node leads ``epoch`` from ``start_offset`` on (idempotent on a restart)."""
        if epoch < self.last_epoch:
            raise StaleEpochError(
                f"epoch {epoch} is older than epoch {self.last_epoch} this node already knows"
            )
        if epoch > self.last_epoch:
            self.entries.append((epoch, start_offset))
            self.save()

    def replace(self, entries: list[Entry]) -> None:
        if entries != self.entries:
            self.entries = list(entries)
            self.save()

    def clear(self) -> None:
        self.replace([])

    def save(self) -> None:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        metafile.write(self._path, [[e, s] for e, s in self.entries])


def epoch_end(entries: list[Entry], index: int, log_end: int) -> int:
    return entries[index + 1][1] if index + 1 < len(entries) else log_end


def consistent_point(
    leader: list[Entry], leader_end: int, follower: list[Entry], follower_end: int
) -> int:
    """The commitlog position up to which both logs hold the same bytes: the end of the
    newest epoch both histories share (with the same start), capped by both logs' ends.
    -1 when they share nothing (the follower must start over, unless it is empty)."""
    starts = {epoch: (i, start) for i, (epoch, start) in enumerate(leader)}
    for f_index in range(len(follower) - 1, -1, -1):
        epoch, start = follower[f_index]
        found = starts.get(epoch)
        if found is None or found[1] != start:
            continue
        l_end = epoch_end(leader, found[0], leader_end)
        f_end = epoch_end(follower, f_index, follower_end)
        return min(l_end, f_end)
    return -1


def next_epoch_start(entries: list[Entry], position: int) -> int | None:
    """The first epoch start after ``position`` (a batch must not cross it), if any."""
    for _, start in entries:
        if start > position:
            return start
    return None


def epoch_at(entries: list[Entry], position: int) -> int:
    """The epoch that wrote ``position`` (0 before the first known epoch)."""
    epoch = 0
    for entry_epoch, start in entries:
        if start <= position:
            epoch = entry_epoch
    return epoch
