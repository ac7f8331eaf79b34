"""BackgroundTasks: owner of the proxy's few fire-and-forget tasks.

Used for work that must outlive the request that caused it (e.g. making messages visible
again after a client vanished mid-receive). Every task is tracked, and close() cancels and
awaits whatever is left, so nothing leaks past the proxy's lifetime.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger(__name__)


class BackgroundTasks:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any] | None:
        if self._closed:
            coro.close()
            return None
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("background task %s failed: %r", task.get_name(), task.exception())

    def __len__(self) -> int:
        return len(self._tasks)

    async def close(self, grace_s: float = 2.0) -> None:
        """Let running tasks finish for up to grace_s, then cancel the rest."""
        self._closed = True
        if not self._tasks:
            return
        _, pending = await asyncio.wait(set(self._tasks), timeout=grace_s)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
