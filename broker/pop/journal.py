"""The pop journal: the durable record of checkpoints that stayed un-acked.

One ``FramedLog`` of JSON records:
  {"k": "ck", ...checkpoint...}              a spilled checkpoint with its entry states then
  {"k": "st", "id": ck_id, "i": i, "s": s}   entry ``i`` of checkpoint ``id`` changed to ``s``

Replaying the file in order rebuilds each checkpoint's last known states. The file only grows,
so it is rewritten (compacted) with the checkpoints still needed, at open and when it has grown
well past what is live: a temp file is written and fsynced, then renamed over.

Damage is never dropped silently: damaged bytes are copied to the store's quarantine, logged
(ERROR; WARNING for a torn tail after a crash) and listed in ``faults`` for the metrics, and
the intact records after them are still replayed (the log resyncs at the next valid frame).
A lost record can make a message in flight visible again before its invisible time ends.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path

from popmq.broker.pop.checkpoint import Checkpoint, EntryState
from popmq.broker.store.damage import DAMAGED, TORN_TAIL, UNREADABLE, DamageEvent, Quarantine
from popmq.broker.store.framing import FramedLog, Resync, fsync_dir

log = logging.getLogger(__name__)

_dumps = json.JSONEncoder(separators=(",", ":")).encode


def _is_record(payload: memoryview) -> bool:
    try:
        return isinstance(json.loads(bytes(payload)), dict)
    except ValueError:
        return False


# Every record is a JSON object: a resync candidate's payload starts with "{" and parses.
JOURNAL_RESYNC = Resync(b"{", _is_record)


class PopJournal:
    def __init__(self, path: Path, quarantine: Quarantine | None = None) -> None:
        self._path = Path(path)
        self._quarantine = quarantine or Quarantine(self._path.parent)
        self._file = self._quarantine.relative(self._path)
        self.faults: list[DamageEvent] = []
        self._log = FramedLog(self._path, JOURNAL_RESYNC)
        self._report_damage()
        self._size_after_compaction = self._log.end_position

    def _report_damage(self) -> None:
        for run in self._log.damage:
            # A damaged run holds at least one record; how many is unknown.
            event = DamageEvent(self._file, run.start, run.end,
                                TORN_TAIL if run.tail else DAMAGED, frames_lost=1)  # fmt: skip
            self._quarantine.keep(event, run.data)
            self.faults.append(event)
            log.log(logging.WARNING if run.tail else logging.ERROR,
                    "pop journal: %s bytes %d..%d of %s (at least one record lost: messages in "
                    "flight may be delivered again early); copied to %s",
                    event.reason.replace("_", " "), run.start, run.end, self._file,
                    event.quarantined_to)  # fmt: skip

    @property
    def path(self) -> Path:
        return self._path

    @property
    def size(self) -> int:
        return self._log.end_position

    def load(self) -> list[Checkpoint]:
        """Replay the journal: every checkpoint with its final entry states."""
        checkpoints: dict[int, Checkpoint] = {}
        for position, payload in self._log.iter_from(0):
            try:
                record = json.loads(bytes(payload))
                if record["k"] == "ck":
                    ck = Checkpoint.from_record(record)
                    checkpoints[ck.ck_id] = ck
                elif record["k"] == "st":
                    known = checkpoints.get(int(record["id"]))
                    if known is not None:
                        known.set_state(int(record["i"]), EntryState(int(record["s"])))
            except (ValueError, KeyError, TypeError, IndexError) as exc:
                # Intact frame, unusable content: skipped (not fatal), kept and reported.
                end = position + len(payload) + 8
                event = DamageEvent(self._file, position, end, UNREADABLE, frames_lost=1)
                self._quarantine.keep(event, bytes(payload))
                self.faults.append(event)
                log.error("pop journal: unreadable record at %d of %s (%s); skipped, copied "
                          "to %s", position, self._file, exc, event.quarantined_to)  # fmt: skip
        return list(checkpoints.values())

    def write_checkpoint(self, ck: Checkpoint) -> None:
        self._log.append(_dumps(ck.to_record()).encode())

    def write_state(self, ck_id: int, index: int, state: EntryState) -> None:
        self._log.append(_dumps({"k": "st", "id": ck_id, "i": index, "s": int(state)}).encode())

    def flush(self) -> None:
        """Hand buffered records to the OS (they survive a process crash from here on)."""
        self._log.flush()

    async def sync(self) -> None:
        """Flush and fsync (in a worker thread) what was written so far.

        A cancelled caller still waits for the fsync thread, which cannot be stopped, so the
        file is never closed under it."""
        self._log.flush()
        fsync = asyncio.get_running_loop().run_in_executor(None, self._log.sync)
        try:
            await asyncio.shield(fsync)
        except asyncio.CancelledError:
            await asyncio.wait([fsync])
            raise

    def should_compact(self, min_bytes: int = 16 << 20) -> bool:
        return self.size > max(min_bytes, 4 * self._size_after_compaction)

    def rewrite(self, checkpoints: list[Checkpoint]) -> None:
        """Replace the journal by one holding just ``checkpoints`` (current states)."""
        tmp = self._path.with_name(self._path.name + ".compact")
        tmp.unlink(missing_ok=True)
        fresh = FramedLog(tmp, JOURNAL_RESYNC)
        for ck in checkpoints:
            fresh.append(_dumps(ck.to_record()).encode())
        fresh.flush(fsync=True)
        self._log.close()
        fresh.close()
        os.replace(tmp, self._path)
        fsync_dir(self._path.parent)
        self._log = FramedLog(self._path, JOURNAL_RESYNC)
        self._size_after_compaction = self._log.end_position

    def close(self) -> None:
        self._log.close()
