"""Coalescer: acks/sends for one key within a window go as one request (RocketMQ's batch ack).

The window's clock is injected (ManualWindow): a test decides when the window closes, so no
assertion depends on the wall clock.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from popmq.broker.contract.errors import BrokerAuthError, BrokerUnavailableError, Code, RefusedError
from popmq.broker.wire.coalesce import Coalescer


class ManualWindow:
    """An injected ``sleep``: the window stays open until the test closes it."""

    def __init__(self) -> None:
        self.opened = asyncio.Event()  # the flusher waits in a window
        self._close = asyncio.Event()
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.opened.set()
        await self._close.wait()
        self._close.clear()
        self.opened.clear()

    async def close_window(self) -> None:
        await self.opened.wait()
        self._close.set()
        await asyncio.sleep(0)


class Broker:
    """Records each submitted batch; answers each item with (key, item)."""

    def __init__(self) -> None:
        self.batches: list[tuple[str, list[int]]] = []
        self.refuse: set[int] = set()  # an item that makes the whole request refused
        self.down = False

    async def submit(self, key: str, items: list[int]) -> list[tuple[str, int]]:
        self.batches.append((key, list(items)))
        await asyncio.sleep(0)
        if self.down:
            raise BrokerUnavailableError("b0", "connection refused")
        if self.refuse & set(items):
            raise RefusedError(Code.BAD_REQUEST, f"refused {sorted(self.refuse & set(items))}")
        return [(key, item) for item in items]


@pytest.fixture
async def setup() -> AsyncIterator[
    tuple[Coalescer[str, int, tuple[str, int]], Broker, ManualWindow]
]:
    broker, window = Broker(), ManualWindow()
    coalescer: Coalescer[str, int, tuple[str, int]] = Coalescer(
        broker.submit, window_s=0.002, max_items=4, sleep=window
    )
    async with asyncio.TaskGroup() as owner:
        runner = owner.create_task(coalescer.run())
        yield coalescer, broker, window
        runner.cancel()


async def _callers(
    coalescer: Coalescer[str, int, tuple[str, int]], *calls: tuple[str, list[int]]
) -> list[asyncio.Task[list[tuple[str, int]]]]:
    tasks = [asyncio.create_task(coalescer.submit(key, items)) for key, items in calls]
    await asyncio.sleep(0)  # every caller has queued its items
    return tasks


async def test_one_key_in_one_window_is_one_request(setup) -> None:  # type: ignore[no-untyped-def]
    coalescer, broker, window = setup
    tasks = await _callers(coalescer, ("g/t", [1, 2]), ("g/t", [3]))
    assert broker.batches == []  # nothing leaves before the window closes
    await window.close_window()
    assert [await t for t in tasks] == [[("g/t", 1), ("g/t", 2)], [("g/t", 3)]]
    assert broker.batches == [("g/t", [1, 2, 3])]
    assert window.waits == [0.002]
    assert (coalescer.batches, coalescer.items) == (1, 3)


async def test_keys_never_mix(setup) -> None:  # type: ignore[no-untyped-def]
    coalescer, broker, window = setup
    tasks = await _callers(coalescer, ("g/a", [1]), ("g/b", [2]), ("g/a", [3]))
    await window.close_window()
    assert [await t for t in tasks] == [[("g/a", 1)], [("g/b", 2)], [("g/a", 3)]]
    assert sorted(broker.batches) == [("g/a", [1, 3]), ("g/b", [2])]


async def test_a_full_batch_closes_and_the_next_opens(setup) -> None:  # type: ignore[no-untyped-def]
    coalescer, broker, window = setup
    tasks = await _callers(coalescer, ("k", [1, 2, 3]), ("k", [4, 5]), ("k", [6]))
    await window.close_window()
    assert [await t for t in tasks] == [
        [("k", 1), ("k", 2), ("k", 3)],
        [("k", 4), ("k", 5)],
        [("k", 6)],
    ]
    assert broker.batches == [("k", [1, 2, 3]), ("k", [4, 5, 6])]  # max_items 4 per request


async def test_items_after_the_window_wait_for_the_next(setup) -> None:  # type: ignore[no-untyped-def]
    coalescer, broker, window = setup
    first = await _callers(coalescer, ("k", [1]))
    await window.close_window()
    assert await first[0] == [("k", 1)]
    second = await _callers(coalescer, ("k", [2]))
    assert broker.batches == [("k", [1])]  # waits for its own window
    await window.close_window()
    assert await second[0] == [("k", 2)]
    assert broker.batches == [("k", [1]), ("k", [2])]


async def test_a_refused_batch_answers_each_caller_on_its_own(setup) -> None:  # type: ignore[no-untyped-def]
    """One caller's bad item must not fail the others' acks."""
    coalescer, broker, window = setup
    broker.refuse = {2}
    tasks = await _callers(coalescer, ("k", [1]), ("k", [2]), ("k", [3]))
    await window.close_window()
    done = await asyncio.wait_for(asyncio.shield(asyncio.wait(tasks)), 5)
    assert done
    assert tasks[0].result() == [("k", 1)]
    with pytest.raises(RefusedError) as refused:
        tasks[1].result()
    assert refused.value.code == Code.BAD_REQUEST
    assert tasks[2].result() == [("k", 3)]
    assert broker.batches == [("k", [1, 2, 3]), ("k", [1]), ("k", [2]), ("k", [3])]


async def test_a_transport_failure_is_reported_to_every_caller(setup) -> None:  # type: ignore[no-untyped-def]
    """A lost link is never swallowed: each caller gets BrokerUnavailableError (failover
    needs it), and nothing is repeated per caller against a broker that is down."""
    coalescer, broker, window = setup
    broker.down = True
    tasks = await _callers(coalescer, ("k", [1]), ("k", [2]))
    await window.close_window()
    for task in tasks:
        with pytest.raises(BrokerUnavailableError):
            await task
    assert broker.batches == [("k", [1, 2])]


async def test_a_caller_that_gives_up_does_not_lose_the_others(setup) -> None:  # type: ignore[no-untyped-def]
    coalescer, broker, window = setup
    tasks = await _callers(coalescer, ("k", [1]), ("k", [2]))
    tasks[0].cancel()
    await window.close_window()
    assert await tasks[1] == [("k", 2)]
    assert broker.batches == [("k", [1, 2])]  # the gone caller's ack still went


async def test_closing_fails_waiting_callers_instead_of_hanging() -> None:
    broker, window = Broker(), ManualWindow()
    coalescer: Coalescer[str, int, tuple[str, int]] = Coalescer(
        broker.submit, window_s=1.0, max_items=4, sleep=window
    )
    runner = asyncio.create_task(coalescer.run())
    tasks = await _callers(coalescer, ("k", [1]))
    await window.opened.wait()
    runner.cancel()
    with pytest.raises(BrokerUnavailableError):
        await tasks[0]
    assert broker.batches == []


async def test_a_wrong_result_count_is_reported_not_repeated(setup) -> None:  # type: ignore[no-untyped-def]
    """Regression: a batch answered with the wrong number of results was treated as a
    refusal and sent again per caller, so a coalesced send's messages were stored twice."""
    coalescer, broker, window = setup

    async def short_answer(key: str, items: list[int]) -> list[tuple[str, int]]:
        broker.batches.append((key, list(items)))
        return [(key, items[0])]  # one result for several items

    coalescer._submit = short_answer  # a broker that miscounts
    tasks = await _callers(coalescer, ("k", [1]), ("k", [2]))
    await window.close_window()
    for task in tasks:
        with pytest.raises(RefusedError) as failed:
            await task
        assert failed.value.code == Code.INTERNAL_ERROR
    assert broker.batches == [("k", [1, 2])]  # sent once


async def test_per_caller_retries_do_not_wait_for_each_other(setup) -> None:  # type: ignore[no-untyped-def]
    """Regression: after a refused batch the callers' items were retried one after another,
    so a slow retry held up every caller behind it."""
    coalescer, broker, window = setup
    broker.refuse = {2}
    slow = asyncio.Event()
    plain = broker.submit

    async def submit(key: str, items: list[int]) -> list[tuple[str, int]]:
        if items == [1]:
            await slow.wait()  # the first caller's retry is slow
        return await plain(key, items)

    coalescer._submit = submit
    tasks = await _callers(coalescer, ("k", [1]), ("k", [2]), ("k", [3]))
    await window.close_window()
    assert await asyncio.wait_for(tasks[2], 5) == [("k", 3)]  # not behind caller 1
    assert not tasks[0].done()
    slow.set()
    assert await tasks[0] == [("k", 1)]
    with pytest.raises(RefusedError):
        await tasks[1]


async def test_a_broker_refusing_the_proxy_is_not_asked_again_per_caller(setup) -> None:  # type: ignore[no-untyped-def]
    """A wrong cluster token (BrokerAuthError) is the proxy's fault, not one caller's: the
    batch fails for everyone at once instead of being repeated once per caller."""
    coalescer, broker, window = setup

    async def refuse_proxy(key: str, items: list[int]) -> list[tuple[str, int]]:
        broker.batches.append((key, list(items)))
        raise BrokerAuthError("b0", "UNAUTHENTICATED")

    coalescer._submit = refuse_proxy
    tasks = await _callers(coalescer, ("k", [1]), ("k", [2]), ("k", [3]))
    await window.close_window()
    for task in tasks:
        with pytest.raises(BrokerAuthError):
            await task
    assert broker.batches == [("k", [1, 2, 3])]
