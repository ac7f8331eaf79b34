"""popmq.budget: bytes in flight, bounded; over the limit a caller waits briefly, then gets
TOO_MANY_REQUESTS (virtual time)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from popmq.allocator import Trimmer
from popmq.budget import WAIT_MS, MemoryBudget
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
    loop.call_later(WAIT_MS / 2000, budget.release, 80)
    started = loop.time()
    async with budget.hold(50):
        assert loop.time() - started == pytest.approx(WAIT_MS / 2000)


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


async def test_the_wait_is_a_setting() -> None:
    """proxy/broker.inflight_wait_ms: a caller over the budget waits that long, then is refused."""
    budget = MemoryBudget(100, "test", wait_ms=1500)
    await budget.acquire(80)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(RefusedError):
        await budget.acquire(50)
    assert loop.time() - started == pytest.approx(1.5)


async def test_a_pop_waits_for_room_then_takes_what_it_got() -> None:
    """Pop answers draw from the broker's budget: a pop waits while the budget is full (and is
    refused before taking any message if it stays full); its answer then counts, whatever its
    size."""
    budget = MemoryBudget(100, "test")
    await budget.acquire(100)
    with pytest.raises(RefusedError) as refused:
        await budget.room()
    assert refused.value.code == Code.TOO_MANY_REQUESTS
    budget.release(60)
    await budget.room()
    budget.take(300)  # an answer larger than the room left
    assert budget.held == 340
    with pytest.raises(RefusedError):
        await budget.acquire(1)


async def test_a_drained_budget_trims_after_enough_bytes() -> None:
    """Memory freed after large requests goes back to the system (malloc_trim) shortly after
    the budget drains (once grpc has freed the request too), not after each small request, and
    not more than once per interval."""
    trims: list[float] = []
    loop = asyncio.get_running_loop()
    trimmer = Trimmer(after_bytes=1000, interval_s=1.0, clock=loop.time, delay_s=0.2,
                      do_trim=lambda: trims.append(loop.time()) or True)  # fmt: skip
    budget = MemoryBudget(10_000, "test", trimmer=trimmer)
    for _ in range(3):
        async with budget.hold(400):  # 1,200 bytes through, drained each time
            pass
    assert trims == []  # not at the release itself
    await asyncio.sleep(0.5)
    assert trims == [pytest.approx(0.2)]
    async with budget.hold(600), budget.hold(600):
        pass  # drained again, within the interval: trimmed once the interval has passed
    await asyncio.sleep(0.4)
    assert len(trims) == 1
    await asyncio.sleep(0.4)
    assert trims == [pytest.approx(0.2), pytest.approx(1.2)]  # not dropped
    await asyncio.sleep(1)
    async with budget.hold(1000):
        pass
    await asyncio.sleep(0.5)
    assert len(trims) == 3


async def test_a_spike_is_trimmed_once_more_after_it_settles() -> None:
    """grpc frees some of a large request's buffers only when its call ends, which on a loaded
    machine can come after the spike's trim: a CI run kept +72 MB that way. One settling trim
    follows every spike's trim, and schedules no other."""
    trims: list[float] = []
    loop = asyncio.get_running_loop()
    trimmer = Trimmer(after_bytes=1000, interval_s=1.0, clock=loop.time, delay_s=0.2,
                      settle_s=2.0, do_trim=lambda: trims.append(loop.time()) or True)  # fmt: skip
    trimmer.released(1000, drained=True)
    await asyncio.sleep(10)
    assert trims == [pytest.approx(0.2), pytest.approx(2.2)]
    trimmer.released(999, drained=True)  # not enough for a spike
    await asyncio.sleep(10)
    assert len(trims) == 2


async def test_a_caller_without_a_loop_leaves_a_coming_settling_trim() -> None:
    """A synchronous caller (no running loop) within the interval cannot schedule a trim: it
    must leave the one already coming alone (it cancelled the settling trim, from its own
    thread, and scheduled none: what was freed since stayed until the next spike)."""
    trims: list[float] = []
    loop = asyncio.get_running_loop()
    trimmer = Trimmer(after_bytes=1000, interval_s=1.0, clock=loop.time, delay_s=0.2,
                      settle_s=2.0, do_trim=lambda: trims.append(loop.time()) or True)  # fmt: skip
    trimmer.released(1000, drained=True)
    await asyncio.sleep(0.5)  # the spike's trim ran; its settling trim is coming
    caller = threading.Thread(target=trimmer.released, args=(1000, True))
    caller.start()
    caller.join()  # the loop waits: no virtual time passes meanwhile
    await asyncio.sleep(10)
    assert trims == [pytest.approx(0.2), pytest.approx(2.2)]


async def test_a_trim_coming_on_a_stopped_loop_does_not_hold_back_the_running_one() -> None:
    """A process-wide trimmer (refused large requests) serves every loop of a test process: a
    spike's trim scheduled on a loop that then stopped without closing (never to run) made
    every later spike wait for it, so nothing was trimmed any more."""
    trims: list[float] = []
    loop = asyncio.get_running_loop()
    trimmer = Trimmer(after_bytes=1000, interval_s=1.0, clock=loop.time, delay_s=0.2,
                      settle_s=2.0, do_trim=lambda: trims.append(loop.time()) or True)  # fmt: skip
    stopped = asyncio.new_event_loop()

    async def spike() -> None:
        trimmer.released(1000, drained=True)

    try:
        other = threading.Thread(target=stopped.run_until_complete, args=(spike(),))
        other.start()
        other.join()  # its trim is scheduled there; that loop no longer runs
        trimmer.released(1000, drained=True)
        await asyncio.sleep(10)
        assert trims == [pytest.approx(0.2), pytest.approx(2.2)]
    finally:
        stopped.close()
