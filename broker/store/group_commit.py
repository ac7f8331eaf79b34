"""Group commit: concurrent writers that need durability share one fsync.

The first writer that finds its data not yet durable becomes the leader: it fsyncs everything
written so far (in a worker thread) and wakes the others. Writers that arrive meanwhile wait
for that fsync and, if their data came after it started, elect a new leader for the next one.
So under load there is one fsync per batch of arrivals, not one per append.
"""

from __future__ import annotations

import asyncio

from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.store.commitlog import CommitLog


class GroupCommit:
    def __init__(self, commitlog: CommitLog) -> None:
        self._log = commitlog
        self._leading = False
        # One future per waiting writer: resolving it wakes that writer in the very next loop
        # iteration, and a cancelled writer cancels only its own future.
        self._waiters: list[asyncio.Future[None]] = []

    async def wait_durable(self, position: int) -> None:
        """Return once every commitlog byte below ``position`` is fsynced."""
        while self._log.durable_position < position:
            if self._leading:
                waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                self._waiters.append(waiter)
                await waiter
                continue
            self._leading = True
            try:
                # Let writers that are already runnable append first, so they ride on this
                # fsync instead of each waiting for the next one.
                await asyncio.sleep(0)
                await self._fsync()
            finally:
                self._leading = False
                waiters, self._waiters = self._waiters, []
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_result(None)

    async def _fsync(self) -> None:
        target, fds, dir_dirty = self._log.flush_targets()
        if not fds and not dir_dirty:
            self._log.mark_durable(target, 0)
            return
        try:
            await asyncio.to_thread(self._log.sync_fds, fds, dir_dirty)
        except OSError as exc:
            self._log.flush_failed(dir_dirty)
            raise RefusedError(Code.INTERNAL_ERROR, f"commitlog fsync failed: {exc}") from exc
        except BaseException:
            self._log.flush_failed(dir_dirty)
            raise
        self._log.mark_durable(target, len(fds))
