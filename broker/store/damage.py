"""What recovery found wrong on disk, and the quarantine where damaged bytes are kept.

Nothing damaged is thrown away: before recovery cuts or skips bytes it copies them to
``DATA/quarantine/<file>.<start>-<end>.bin`` next to a small JSON record (file, byte range,
reason, frames lost), so an operator can inspect or salvage them. Every event is also kept in
``StoreFaults`` for the broker's metrics (and logged by whoever found it).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

QUARANTINE_DIR = "quarantine"

# Reasons (also the ``reason`` label of the metrics).
TORN_TAIL = "torn_tail"  # past the last durable point: an interrupted write, expected after a crash
DAMAGED = "damaged"  # inside data that was durable: bit rot, a bad disk, a stray write
MISSING = "missing"  # bytes that should exist are gone (a file cut short or deleted)
UNREADABLE = "unreadable"  # a valid frame whose content cannot be decoded


class QuarantineError(OSError):
    """Damaged bytes could not be set aside (disk full, read-only, not a directory): the
    caller must not cut or skip them."""


@dataclass(slots=True)
class DamageEvent:
    file: str  # path relative to the data directory
    start: int  # byte range in the file (for the commitlog: global positions)
    end: int
    reason: str
    frames_lost: int = 0  # messages/records known lost because of it
    quarantined_to: str = ""  # relative path of the copy ("" when there was nothing to copy)

    @property
    def size(self) -> int:
        return self.end - self.start


@dataclass(slots=True)
class MetadataFallback:
    file: str
    action: str  # previous_copy | rebuilt | full_scan | reset | recreated
    problem: str


@dataclass
class StoreFaults:
    """Everything recovery had to work around in one open of the store."""

    damage: list[DamageEvent] = field(default_factory=list)
    metadata: list[MetadataFallback] = field(default_factory=list)

    @property
    def frames_lost(self) -> int:
        return sum(event.frames_lost for event in self.damage)

    def to_json(self) -> dict:
        return {
            "damage": [asdict(e) for e in self.damage],
            "metadata": [asdict(m) for m in self.metadata],
        }


class Quarantine:
    def __init__(self, data_dir: Path) -> None:
        self._data_dir = data_dir
        self._dir = data_dir / QUARANTINE_DIR

    @property
    def directory(self) -> Path:
        return self._dir

    def relative(self, path: Path) -> str:
        """``path`` as named in events: relative to the data directory when inside it."""
        try:
            return str(Path(path).relative_to(self._data_dir))
        except ValueError:
            return str(path)

    def name_for(self, file: str, start: int, end: int) -> str:
        return f"{file.replace('/', '_')}.{start}-{end}"

    def known(self, file: str, start: int, end: int) -> bool:
        """Was this exact range quarantined by an earlier start? (Then it is not new damage.)"""
        return (self._dir / (self.name_for(file, start, end) + ".json")).exists()

    def keep(self, event: DamageEvent, data: bytes) -> None:
        """Copy ``data`` (the event's bytes) aside with a JSON record; fsynced."""
        self.keep_bytes(event, data)
        self.record(event)

    def keep_bytes(self, event: DamageEvent, data: bytes) -> None:
        """Copy the event's bytes aside (``record`` writes its JSON record later, once the
        frames it lost are counted)."""
        if data:
            name = self.name_for(event.file, event.start, event.end)
            self._write(self._dir / (name + ".bin"), data)
            event.quarantined_to = f"{QUARANTINE_DIR}/{name}.bin"

    def record(self, event: DamageEvent) -> None:
        name = self.name_for(event.file, event.start, event.end)
        record = json.dumps(asdict(event), indent=1, sort_keys=True).encode()
        self._write(self._dir / (name + ".json"), record)

    def _write(self, path: Path, data: bytes) -> None:
        try:
            self._dir.mkdir(exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                view = memoryview(data)
                while view:  # a short write (disk nearly full) must not truncate the copy
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
        except QuarantineError:
            raise
        except OSError as exc:
            raise QuarantineError(
                f"cannot set damaged bytes aside in {self._dir} ({exc.strerror or exc}); "
                f"refusing to cut or skip them: free space or make {self._dir} a writable "
                "directory, then start again"
            ) from exc
