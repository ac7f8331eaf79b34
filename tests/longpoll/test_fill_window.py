"""The fill window of a woken receive (notify: ``proxy.fill_window_turns`` / ``_ms``).

A receive woken from its held poll by a broker's signal lets the loop run a few more turns
before it pops that broker, so sends landing meanwhile ride the same pop. It is bounded (in
turns and in time, never for a poll about to end), it loses no wake, and a receive cancelled
in it hands its signal on. In-process brokers on virtual time: a turn of the loop takes no
virtual time, so the turn bound is exact and the time bound is driven by a fake clock."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from popmq.broker.contract.types import Message
from popmq.proxy.longpoll import make_strategy
from popmq.proxy.longpoll.calls import BrokerCalls
from popmq.proxy.longpoll.notify import NotifyStrategy, _LongPoll
from popmq.proxy.metrics import ProxyMetrics

from popmq.config import ProxyConfig

from .helpers import local_brokers, make_request, wait_until

pytestmark = pytest.mark.looptime

TOPIC = "t"


def _strategy(turns: int, max_ms: float = 2.0) -> NotifyStrategy:
    metrics = ProxyMetrics()
    return NotifyStrategy(
        BrokerCalls(metrics), metrics, probe_false_empty=False, fill_turns=turns,
        fill_max_ms=max_ms,
    )  # fmt: skip


async def _turns(count: int) -> None:
    for _ in range(count):
        await asyncio.sleep(0)


def _messages(prefix: str, count: int) -> list[Message]:
    return [Message(topic=TOPIC, body=b"%s%d" % (prefix.encode(), i)) for i in range(count)]


async def _waiting(strategy: NotifyStrategy, count: int = 1) -> None:
    """Until ``count`` receives wait for a signal (their first pop found nothing)."""
    await wait_until(lambda: len(strategy._held) == count)


@pytest.mark.parametrize(("turns", "expected"), [(0, 3), (64, 7)])
async def test_a_woken_receive_takes_what_lands_in_its_window(
    tmp_path: Path, turns: int, expected: int
) -> None:
    strategy = _strategy(turns)
    async with local_brokers(tmp_path) as ports:
        assert await strategy.receive(ports, make_request(1_000)) == []  # watches armed
        receive = asyncio.create_task(strategy.receive(ports, make_request(5_000, "b0")))
        await _waiting(strategy)
        started = asyncio.get_running_loop().time()
        await ports[0].send(_messages("a", 3))  # wakes the receive
        await _turns(12)  # the window-less pop ran a few turns after the wake
        await ports[0].send(_messages("b", 4))
        got = await receive
        # With the window, one pop brings both sends; without it, the first send alone.
        assert len(got) == expected
        assert asyncio.get_running_loop().time() - started < 0.1  # no wait in virtual time
        rest = await strategy.receive(ports, make_request(1_000))
        assert len(got) + len(rest) == 7  # nothing lost either way
        await strategy.aclose()


async def test_a_wake_during_the_window_is_not_lost(tmp_path: Path) -> None:
    """Another broker's signal that comes while the receive is in its window is popped
    after the woken broker's pop, in the same receive."""
    strategy = _strategy(64)
    async with local_brokers(tmp_path) as ports:
        assert await strategy.receive(ports, make_request(1_000)) == []
        receive = asyncio.create_task(strategy.receive(ports, make_request(5_000, "b0")))
        await _waiting(strategy)
        await ports[0].send(_messages("a", 2))
        await _turns(6)  # in the window now
        await ports[1].send(_messages("b", 3))
        got = await receive
        assert sorted(m.message.body for m in got) == sorted(
            m.body for m in _messages("a", 2) + _messages("b", 3)
        )
        await strategy.aclose()


async def test_a_receive_cancelled_in_its_window_hands_its_signal_on(tmp_path: Path) -> None:
    strategy = _strategy(64)
    entered = asyncio.Event()
    window = strategy._fill_window

    async def marked(poll: _LongPoll) -> None:
        entered.set()
        await window(poll)

    strategy._fill_window = marked  # type: ignore[method-assign]
    async with local_brokers(tmp_path) as ports:
        assert await strategy.receive(ports, make_request(1_000)) == []
        first = asyncio.create_task(strategy.receive(ports, make_request(5_000, "b0")))
        await _waiting(strategy)
        second = asyncio.create_task(strategy.receive(ports, make_request(5_000, "b0")))
        await _waiting(strategy, 2)
        loop = asyncio.get_running_loop()
        started = loop.time()
        await ports[0].send(_messages("a", 2))
        await entered.wait()  # the oldest receive holds the signal, in its window
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        got = await second
        assert len(got) == 2
        assert loop.time() - started < 0.1  # at once, not at the second one's deadline
        await strategy.aclose()


def _ticking() -> tuple[list[int], Callable[[], Any]]:
    """A task counting the loop's turns until stopped."""
    count = [0]

    async def tick() -> None:
        while True:
            await asyncio.sleep(0)
            count[0] += 1

    task = asyncio.ensure_future(tick())
    return count, task.cancel


async def _window_turns(
    strategy: NotifyStrategy, poll: _LongPoll, monkeypatch: pytest.MonkeyPatch, step_s: float
) -> int:
    """The turns of the loop a window takes, on a clock that moves ``step_s`` a reading."""
    loop = asyncio.get_running_loop()
    now = [loop.time()]

    def clock() -> float:
        now[0] += step_s
        return now[0]

    count, stop = _ticking()
    await asyncio.sleep(0)  # the ticker is running
    start = count[0]
    with monkeypatch.context() as patch:
        patch.setattr(loop, "time", clock)
        await strategy._fill_window(poll)
    turns = count[0] - start
    stop()
    return turns


async def test_the_window_is_bounded_in_turns_and_in_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop = asyncio.get_running_loop()
    now = loop.time()
    # Bounded in turns: the clock barely moves.
    poll = _LongPoll(now + 5, 32, now)
    assert await _window_turns(_strategy(10, 2.0), poll, monkeypatch, 1e-6) <= 11
    # Bounded in time: 1 ms a reading against a 3 ms bound ends it within a few turns.
    poll = _LongPoll(now + 5, 32, now)
    assert await _window_turns(_strategy(64, 3.0), poll, monkeypatch, 0.001) <= 4
    # A poll about to end (its last second of a long wait) pops at once: no turn at all.
    poll = _LongPoll(now + 0.5, 32, now - 10)
    assert await _window_turns(_strategy(64, 3.0), poll, monkeypatch, 1e-6) == 0
    # An ended poll (its deadline, drain) leaves the window at the next turn.
    poll = _LongPoll(now + 5, 32, now)
    poll.cancel()
    assert await _window_turns(_strategy(64, 3.0), poll, monkeypatch, 1e-6) <= 2


async def test_the_config_sets_the_window_of_notify_and_adaptive() -> None:
    for name in ("notify", "adaptive"):
        config = ProxyConfig(strategy=name, fill_window_turns=3, fill_window_ms=1.5)
        strategy = make_strategy(config, ProxyMetrics())
        notify = (
            strategy if isinstance(strategy, NotifyStrategy) else strategy._strategies["notify"]
        )  # type: ignore[attr-defined]
        assert isinstance(notify, NotifyStrategy)
        assert (notify.fill_turns, notify.fill_max_s) == (3, 0.0015)
        await strategy.aclose()
