"""Durability: the checkpoint (commitlog, indexes, consumer offsets and checkpoint.json made
durable together) and the flush loop. Every ``flush_interval_ms`` the loop fsyncs the commitlog
and writes the consumer offsets that changed (what an answer's durability rests on); every
``checkpoint_interval_ms`` (0: every time) it writes a whole checkpoint instead (the indexes'
fsyncs and checkpoint.json); retention every few seconds.
See message_store.py for what each flush mode promises."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from popmq.broker.store import metafile
from popmq.broker.store.commitlog import CommitLog
from popmq.broker.store.consumer_offsets import ConsumerOffsets
from popmq.broker.store.file_budget import fsync_paths
from popmq.broker.store.group_commit import GroupCommit
from popmq.broker.store.queue_index import QueueIndex
from popmq.broker.store.recovery import QueueKey, queue_key_text

from popmq.clock import Clock

log = logging.getLogger(__name__)

Extents = list[tuple[QueueKey, QueueIndex, int, int]]


class Checkpointer:
    """Writes checkpoints; ``flush_failing`` tells appends to wait for their own fsync while
    the periodic flush fails, so none is acknowledged undurable."""

    def __init__(
        self,
        data_dir: Path,
        commitlog: CommitLog,
        group: GroupCommit,
        indexes: dict[QueueKey, QueueIndex],
        offsets: ConsumerOffsets,
    ) -> None:
        self._dir = data_dir
        self._commitlog = commitlog
        self._group = group
        self._indexes = indexes
        self._offsets = offsets
        self._lock = asyncio.Lock()
        self.flush_failures = 0  # failed periodic flushes (fsync or checkpoint)
        self.flush_failing = False  # whether the last one failed
        # (position, extents) of the last checkpoint written: an idle store's flush has
        # nothing new to make durable, so it writes no file (two metafiles with fsyncs,
        # every flush interval, in every broker).
        self._written: tuple[int, dict[str, list[int]]] | None = None
        self.checkpoints_written = 0

    async def checkpoint(self, only_if_changed: bool = False) -> None:
        """Make the commitlog, the indexes, the consumer offsets and the checkpoint durable;
        then delete the index files that retention emptied. ``only_if_changed`` (the periodic
        flush): write no file when nothing changed since the last checkpoint written."""
        async with self._lock:
            position = self._commitlog.write_position
            extents = self._index_extents()
            await self._group.wait_durable(position)
            paths = [p for idx in self._indexes.values() for p in idx.take_dirty_paths()]
            doc = _extents_doc(extents)
            unchanged = not paths and not self._offsets.dirty and self._written == (position, doc)
            if only_if_changed and unchanged:
                return  # nothing written since the last checkpoint: it still says it all
            offsets = self._offsets.snapshot() if self._offsets.dirty else None
            self._offsets.dirty = False
            # A future (not a task): the thread's work, which cancelling cannot stop.
            work = asyncio.get_running_loop().run_in_executor(
                None,
                functools.partial(self._write, paths, position, doc, offsets),
            )
            try:
                try:
                    await asyncio.shield(work)
                except asyncio.CancelledError:
                    # The thread goes on regardless: keep the lock until it is done, so the
                    # next checkpoint (close's) never writes the same files at the same time.
                    while not work.done():
                        with contextlib.suppress(BaseException):
                            await asyncio.shield(work)
                    raise
            except BaseException:
                self._written = None
                for idx in self._indexes.values():
                    idx.mark_all_dirty()
                self._offsets.dirty = self._offsets.dirty or offsets is not None
                raise
            self._delete_purged_index_files(extents)

    async def flush(self) -> None:
        """The periodic flush between checkpoints: fsync the commitlog and write the consumer
        offsets if they changed, as a checkpoint would, without the indexes' fsyncs and
        checkpoint.json (a metafile with two fsyncs and a directory fsync)."""
        async with self._lock:
            await self._group.wait_durable(self._commitlog.write_position)
            if not self._offsets.dirty:
                return
            offsets = self._offsets.snapshot()
            self._offsets.dirty = False
            work = asyncio.get_running_loop().run_in_executor(
                None, functools.partial(self._write_offsets, offsets)
            )
            try:
                try:
                    await asyncio.shield(work)
                except asyncio.CancelledError:
                    while not work.done():  # as in checkpoint(): keep the lock until it is done
                        with contextlib.suppress(BaseException):
                            await asyncio.shield(work)
                    raise
            except BaseException:
                self._offsets.dirty = True
                raise

    def checkpoint_now(self) -> None:
        """checkpoint() for synchronous callers (open): everything fsynced inline."""
        target, fds, dir_dirty = self._commitlog.flush_targets()
        self._commitlog.sync_fds(fds, dir_dirty)
        self._commitlog.mark_durable(target, len(fds))
        extents = self._index_extents()
        paths = [p for idx in self._indexes.values() for p in idx.take_dirty_paths()]
        self._written = None
        self._write(paths, target, _extents_doc(extents), self._offsets.snapshot())
        self._offsets.dirty = False
        self._delete_purged_index_files(extents)

    async def flush_loop(
        self,
        interval_s: float,
        timer: Clock,
        retention_interval_s: float,
        apply_retention: Callable[[], object],
        checkpoint_interval_s: float = 0.0,
    ) -> None:
        """Flush every interval_s, writing a whole checkpoint instead once checkpoint_interval_s
        passed since the last one, and apply retention every retention_interval_s, until
        cancelled; a failing flush is counted and logged once until it works again."""
        next_retention = timer.monotonic() + retention_interval_s
        next_checkpoint = timer.monotonic() + checkpoint_interval_s
        while True:
            await timer.sleep(interval_s)
            try:
                if timer.monotonic() >= next_checkpoint:
                    await self.checkpoint(only_if_changed=True)
                    next_checkpoint = timer.monotonic() + checkpoint_interval_s
                else:
                    await self.flush()
            except Exception as exc:
                self.flush_failures += 1
                if not self.flush_failing:
                    log.error("store: periodic flush failed (%s); sends now wait for their own "
                              "fsync until a flush succeeds", exc)  # fmt: skip
                self.flush_failing = True
            else:
                if self.flush_failing:
                    log.warning("store: periodic flush works again")
                self.flush_failing = False
            if timer.monotonic() >= next_retention:
                next_retention = timer.monotonic() + retention_interval_s
                try:
                    apply_retention()
                except Exception:
                    log.exception("store: retention failed")

    def _index_extents(self) -> Extents:
        """(queue, its index, first offset to keep in a file, max offset) of every queue.

        Index files below the first offset to keep hold only purged entries. They are deleted
        only after a checkpoint recorded the new first offset: recovery treats an index that
        starts later than the checkpoint says as damaged, and must not mistake retention for
        a lost file."""
        return [
            (key, idx, idx.first_kept(idx.min_offset), idx.max_offset)
            for key, idx in self._indexes.items()
        ]

    def _delete_purged_index_files(self, extents: Extents) -> None:
        for key, idx, first, _ in extents:
            if self._indexes.get(key) is idx:  # not deleted (or recreated) meanwhile
                idx.delete_files_below(first)

    def _write(
        self,
        paths: list[Path],
        position: int,
        extents: dict[str, list[int]],
        offsets: list[list[Any]] | None,
    ) -> None:
        fsync_paths(paths)
        metafile.write(self._dir / "checkpoint.json", {"position": position, "queues": extents})
        if offsets is not None:
            self._write_offsets(offsets)
        self._written = (position, extents)
        self.checkpoints_written += 1

    def _write_offsets(self, offsets: list[list[Any]]) -> None:
        metafile.write(self._dir / "consumer_offsets.json", offsets)
        self._offsets.written(offsets)


def _extents_doc(extents: Extents) -> dict[str, list[int]]:
    return {queue_key_text(*key): [first, top] for key, _, first, top in extents}
