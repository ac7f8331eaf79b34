"""popmq.budget: bytes in flight, bounded; over the limit a caller waits briefly, then gets
TOO_MANY_REQUESTS (virtual time)."""

from __future__ import annotations

import asyncio

import pytest

from popmq.budget import WAIT_S, MemoryBudget
from popmq.errors import Code, RefusedError

pytestmark = pytest.mark.looptime


async def test_within_the_limit_everything_passes() -> None:
    budget = MemoryBudget(100, "test")
    async with budget.hold(60), budget.hold(40):
        assert budget.held == 100
    assert budget.held == 0


async def test_over_the_limit_a_caller_waits_for_room() -> None:
    budget = MemoryBudget(100, "test")
    await budget.acquire(80)
    loop = asyncio.get_running_loop()
    loop.call_later(WAIT_S / 2, budget.release, 80)
    started = loop.time()
    async with budget.hold(50):
        assert loop.time() - started == pytest.approx(WAIT_S / 2)


async def test_over_the_limit_for_too_long_is_too_many_requests() -> None:
    refusals: list[int] = []
    budget = MemoryBudget(100, "test", lambda: refusals.append(1))
    await budget.acquire(80)
    with pytest.raises(RefusedError) as refused:
        await budget.acquire(50)
    assert refused.value.code == Code.TOO_MANY_REQUESTS
    assert refusals == [1]
    assert budget.held == 80


async def test_one_request_larger_than_the_budget_passes_alone() -> None:
    budget = MemoryBudget(100, "test")
    async with budget.hold(500):
        with pytest.raises(RefusedError):
            await budget.acquire(1)
