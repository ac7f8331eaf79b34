"""The held polls' shared deadline timer (proxy.longpoll.deadlines), in virtual time."""

from __future__ import annotations

import asyncio

import pytest
from popmq.proxy.longpoll.deadlines import Deadlines

pytestmark = pytest.mark.looptime


class _Poll:
    def __init__(self, name: str, log: list[tuple[str, float]]) -> None:
        self.name = name
        self.log = log
        self.closed = False

    def expire(self) -> None:
        self.log.append((self.name, asyncio.get_running_loop().time()))


def _timers(loop: asyncio.AbstractEventLoop) -> int:
    return sum(1 for handle in loop._scheduled if not handle.cancelled())  # type: ignore[attr-defined]


async def test_each_poll_ends_at_its_own_deadline_with_one_timer_for_all() -> None:
    loop = asyncio.get_running_loop()
    start = loop.time()
    log: list[tuple[str, float]] = []
    deadlines = Deadlines()
    before = _timers(loop)
    deadlines.add(start + 3, _Poll("c", log))
    deadlines.add(start + 1, _Poll("a", log))  # earlier than the armed one: re-armed
    deadlines.add(start + 2, _Poll("b", log))
    deadlines.add(start + 2, _Poll("b2", log))  # a tie: first come, first ended
    assert _timers(loop) - before == 1
    await asyncio.sleep(1.5)
    assert log == [("a", start + 1)]
    await asyncio.sleep(2)
    assert log == [("a", start + 1), ("b", start + 2), ("b2", start + 2), ("c", start + 3)]
    assert len(deadlines) == 0 and _timers(loop) == before


async def test_a_poll_added_after_the_timer_fired_is_ended_too() -> None:
    loop = asyncio.get_running_loop()
    log: list[tuple[str, float]] = []
    deadlines = Deadlines()
    deadlines.add(loop.time() + 1, _Poll("first", log))
    await asyncio.sleep(2)
    deadlines.add(loop.time() + 1, _Poll("later", log))
    await asyncio.sleep(2)
    assert [name for name, _ in log] == ["first", "later"]


async def test_entries_of_polls_ended_early_do_not_pile_up() -> None:
    # A busy proxy: most polls are answered long before their deadline.
    loop = asyncio.get_running_loop()
    log: list[tuple[str, float]] = []
    deadlines = Deadlines()
    waiting = _Poll("waiting", log)
    deadlines.add(loop.time() + 30, waiting)
    for i in range(5_000):
        poll = _Poll(f"p{i}", log)
        deadlines.add(loop.time() + 30, poll)
        poll.closed = True
        deadlines.done()
    assert len(deadlines) <= 2 * 1 + 1_025
    await asyncio.sleep(31)
    assert "waiting" in [name for name, _ in log]  # the one still waiting is still ended
