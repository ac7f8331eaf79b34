import asyncio

from popmq.broker.pop.hold import HoldOutcome, HoldTable


async def test_arrival_wakes_matching_waiter_only() -> None:
    table = HoldTable(max_per_key=10, max_total=100)
    tag_a = asyncio.create_task(table.wait([("t", "g", -1)], 5_000, frozenset({"A"})))
    queue_1 = asyncio.create_task(table.wait([("t", "g", 1)], 50))
    await asyncio.sleep(0)
    assert table.total == 2
    assert table.on_arrival("t", 0, 5, {"B"}) == 0  # wrong tag, wrong queue
    assert table.on_arrival("t", 0, 6, {"A"}) == 1
    assert await tag_a == HoldOutcome.WOKEN
    assert await queue_1 == HoldOutcome.TIMEOUT
    assert table.total == 0


async def test_pull_waiter_needs_offset_past_its_own() -> None:
    table = HoldTable(10, 100)
    task = asyncio.create_task(table.wait([("t", "", 0)], 5_000, min_offset=7))
    await asyncio.sleep(0)
    assert table.on_arrival("t", 0, 7, None) == 0
    assert table.on_arrival("t", 0, 8, None) == 1
    assert await task == HoldOutcome.WOKEN


async def test_full_per_key_and_total() -> None:
    table = HoldTable(max_per_key=2, max_total=3)
    held = [asyncio.create_task(table.wait([("t", "g", -1)], 5_000)) for _ in range(2)]
    await asyncio.sleep(0)
    assert await table.wait([("t", "g", -1)], 5_000) == HoldOutcome.FULL
    held.append(asyncio.create_task(table.wait([("u", "g", -1)], 5_000)))
    await asyncio.sleep(0)
    assert await table.wait([("v", "g", -1)], 5_000) == HoldOutcome.FULL
    for task in held:
        task.cancel()
    await asyncio.gather(*held, return_exceptions=True)
    assert table.total == 0


async def test_cancel_removes_entry_under_every_key() -> None:
    table = HoldTable(10, 100)
    keys = [("t", "g", -1), ("%RETRY%g+t", "g", -1)]
    task = asyncio.create_task(table.wait(keys, 5_000))
    await asyncio.sleep(0)
    assert table.total == 1 and all(table.count(k) == 1 for k in keys)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert task.cancelled()
    assert table.total == 0 and all(table.count(k) == 0 for k in keys)
    assert table.on_arrival("t", 0, 1, None) == 0


async def test_wake_for_group_queue() -> None:
    table = HoldTable(10, 100)
    mine = asyncio.create_task(table.wait([("t", "g", 2)], 5_000))
    other = asyncio.create_task(table.wait([("t", "h", 2)], 100))
    await asyncio.sleep(0)
    assert table.wake("t", "g", 2) == 1
    assert await mine == HoldOutcome.WOKEN
    assert await other == HoldOutcome.TIMEOUT


async def test_group_waiters_woken_one_at_a_time_pull_all() -> None:
    table = HoldTable(10, 100)
    pops = [asyncio.create_task(table.wait([("t", "g", -1)], 5_000)) for _ in range(3)]
    pulls = [asyncio.create_task(table.wait([("t", "", 0)], 5_000, min_offset=0)) for _ in range(2)]
    await asyncio.sleep(0)
    notify = asyncio.create_task(table.wait([("t", "g", -1)], 5_000, broadcast=True))
    await asyncio.sleep(0)
    assert table.on_arrival("t", 0, 1, {""}) == 1 + 2 + 1
    assert await notify == HoldOutcome.WOKEN
    await asyncio.sleep(0)
    assert [t.done() for t in pops] == [True, False, False]  # the oldest pop only
    assert all(t.done() for t in pulls)
    assert table.wake("t", "g", -1) == 1
    await asyncio.sleep(0)
    assert [t.done() for t in pops] == [True, True, False]
    pops[2].cancel()
    await asyncio.gather(*pops, *pulls, return_exceptions=True)
    assert table.total == 0


async def test_cancelled_after_wake_passes_it_on() -> None:
    table = HoldTable(10, 100)
    first = asyncio.create_task(table.wait([("t", "g", -1)], 5_000))
    second = asyncio.create_task(table.wait([("t", "g", -1)], 5_000))
    await asyncio.sleep(0)
    assert table.on_arrival("t", 1, 5, None) == 1
    first.cancel()  # woken, but its caller goes away before using the wake
    assert await second == HoldOutcome.WOKEN
    assert first.cancelled()
    assert table.total == 0
