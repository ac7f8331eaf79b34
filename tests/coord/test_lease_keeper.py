"""LeaseKeeper's healthy-loop check (popmq.coord.group), on a stand-in store: no etcd needed.

The keepalives go from a thread of their own; they stop once the event loop has not run for
``loop_stall_limit_s``, so a wedged node loses its lease and the group fails over. The default
bound decides how long a wedged leader holds its group: after it, the lease still runs up to a
TTL, then an election. At 4 TTLs (the first default) a wedged leader held a group for up to
5 TTLs (15 s at the default 3 s lease), five times as long as before the keepalives left the
loop; 2 TTLs keep it to 3 TTLs and still ride out loop stalls of 8/3 of a TTL.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable

import anyio
import pytest

from popmq.coord.group import GroupMember, LeaseKeeper, MemberSettings

TTL_S = 30  # the keeper's periodic wake is 10 s away: only what a test pokes happens
LEASE = 7


class KeepaliveCounter:
    """The one CoordStore call a LeaseKeeper makes, counted."""

    def __init__(self) -> None:
        self.calls = 0
        self.called = threading.Event()

    def keepalive_blocking(self, lease: int) -> float:
        assert lease == LEASE
        self.calls += 1
        self.called.set()
        return float(TTL_S)


async def wait_until(check: Callable[[], bool], within_s: float = 5.0) -> None:
    with anyio.fail_after(within_s):
        while not check():  # noqa: ASYNC110 (set by a worker thread: no event to await)
            await anyio.sleep(0.01)


@pytest.fixture
async def member() -> AsyncIterator[tuple[GroupMember, LeaseKeeper, KeepaliveCounter]]:
    store = KeepaliveCounter()
    settings = MemberSettings("g", "n0", "127.0.0.1:100", lease_ttl_s=TTL_S)
    joined = GroupMember(store, settings)  # type: ignore[arg-type]  # only keepalive_blocking
    joined._lease = LEASE
    keeper = joined._keeper = LeaseKeeper(joined, asyncio.get_running_loop())
    keeper.start()
    try:
        yield joined, keeper, store
    finally:
        keeper.stop()
        keeper.join(5)
        assert not keeper._thread.is_alive()


async def test_a_loop_silent_for_more_than_two_ttls_gets_no_keepalive(
    member: tuple[GroupMember, LeaseKeeper, KeepaliveCounter],
) -> None:
    joined, keeper, store = member
    joined._loop_seen = time.monotonic() - 2.5 * TTL_S  # the loop last ran 2.5 TTLs ago
    keeper.renew_now()
    await wait_until(lambda: keeper.stalled or store.calls > 0)
    assert keeper.stalled and store.calls == 0, "a wedged loop's lease was renewed"


async def test_a_loop_that_runs_again_is_renewed_at_once(
    member: tuple[GroupMember, LeaseKeeper, KeepaliveCounter],
) -> None:
    """Once a stalled loop runs again, its next tick asks for a keepalive at once, not up
    to a third of a TTL later: what is left of the lease after a stall may be less."""
    joined, keeper, store = member
    joined._loop_seen = time.monotonic() - 2.5 * TTL_S
    keeper.renew_now()
    await wait_until(lambda: keeper.stalled)
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(joined._tick)
        await wait_until(lambda: store.calls > 0, within_s=TTL_S / 6)  # long before TTL/3
        tasks.cancel_scope.cancel()
    assert not keeper.stalled


class SilentStore:
    """A store that never answers on the event loop (the member's tasks just wait), whose
    keepalives block until the test lets them return: a keepalive in flight at exit."""

    def __init__(self) -> None:
        self.in_keepalive = threading.Event()
        self.release = threading.Event()

    def keepalive_blocking(self, lease: int) -> float:
        self.in_keepalive.set()
        self.release.wait(60)  # bounded: a broken test must not hang the run
        return float(TTL_S)

    async def revoke(self, lease: int) -> None:
        pass

    def __getattr__(self, name: str) -> Callable[..., object]:
        async def silent(*args: object, **kwargs: object) -> None:
            await anyio.sleep_forever()

        return silent


async def test_a_cancel_during_the_exit_of_join_group_still_joins_the_keeper() -> None:
    """join_group waits for its keepalive thread on every way out. Its shielded wait did not
    hold against an asyncio cancel that landed during the exit (a second task.cancel(), an
    asyncio.timeout firing): the context ended with the thread still running a keepalive,
    the lease left unrevoked."""
    from popmq.coord.group import join_group

    store = SilentStore()
    settings = MemberSettings("g", "n0", "127.0.0.1:100", lease_ttl_s=TTL_S)
    seen: dict[str, object] = {}
    inside = anyio.Event()

    async def member_of_group() -> None:
        try:
            async with join_group(store, settings) as joined:  # type: ignore[arg-type]
                seen["keeper"] = joined._keeper
                joined._lease = LEASE
                assert joined._keeper is not None
                joined._keeper.renew_now()
                inside.set()
                await anyio.sleep_forever()
        finally:
            keeper = seen["keeper"]
            assert isinstance(keeper, LeaseKeeper)
            seen["alive_at_exit"] = keeper._thread.is_alive()

    task = asyncio.get_running_loop().create_task(member_of_group())
    await inside.wait()
    await wait_until(store.in_keepalive.is_set)
    task.cancel()  # leave: the exit stops the keeper and waits for its thread
    keeper = seen["keeper"]
    assert isinstance(keeper, LeaseKeeper)
    await wait_until(lambda: keeper._stopping)
    for _ in range(3):
        await asyncio.sleep(0)
    task.cancel()  # a second cancel, while the exit waits
    for _ in range(20):
        await asyncio.sleep(0)
    store.release.set()  # the keepalive in flight returns; the thread can end
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen["alive_at_exit"] is False, "join_group ended before its keepalive thread"
