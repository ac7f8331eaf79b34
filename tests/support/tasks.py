"""Leak checks: no task outlives its owner."""

from __future__ import annotations

import asyncio

# An idle TaskOwner's host task ends a few loop turns after its last task: allow that many.
_SETTLE_TURNS = 20


async def assert_no_tasks_beyond(before: set[asyncio.Task[object]]) -> None:
    """Every task started since ``before`` is gone within a few event-loop turns (an ordering
    check, not a timing one: no real time passes)."""
    for _ in range(_SETTLE_TURNS):
        if asyncio.all_tasks() <= before:
            return
        await asyncio.sleep(0)
    left = {t.get_name() for t in asyncio.all_tasks() - before}
    raise AssertionError(f"tasks outlived their owner: {sorted(left)}")
