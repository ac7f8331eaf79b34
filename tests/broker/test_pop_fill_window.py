"""The fill window of a woken held pop (``broker.polling.fill_window_turns`` / ``_ms``).

A held pop woken by an arrival lets the loop run a few more turns before it pops, so sends
landing meanwhile ride the same pop. It is bounded in turns and in time, and a pop cancelled
in its window hands its wake on, as a woken pop cancelled in the hold table does. Virtual
time: a turn of the loop takes none, so the turn bound is exact; the time bound is driven
by a fake clock."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from popmq.broker.contract.types import Message, PopRequest
from popmq.broker.core import Broker
from popmq.broker.local import LocalBrokerPort
from popmq.broker.testing import fast_broker_config, running_broker

from popmq.clock import LoopClock

pytestmark = pytest.mark.looptime

TOPIC = "t"


@contextlib.asynccontextmanager
async def _broker(root: Path, turns: int, max_ms: float = 2.0) -> AsyncIterator[LocalBrokerPort]:
    config = fast_broker_config(root, name="b0")
    polling = config.polling.model_copy(
        update={"fill_window_turns": turns, "fill_window_ms": max_ms}
    )
    config = config.model_copy(update={"polling": polling})
    async with running_broker(config, LoopClock()) as broker:
        port = LocalBrokerPort(broker)
        await port.create_topic(TOPIC, 2)
        yield port


def _held(poll_ms: int = 5_000) -> PopRequest:
    return PopRequest(
        group="g", topic=TOPIC, max_messages=32, invisible_time_ms=60_000, poll_time_ms=poll_ms
    )


def _messages(prefix: str, count: int) -> list[Message]:
    return [Message(topic=TOPIC, body=b"%s%d" % (prefix.encode(), i)) for i in range(count)]


async def _turns(count: int) -> None:
    for _ in range(count):
        await asyncio.sleep(0)


async def _held_count(broker: Broker, count: int) -> None:
    async with asyncio.timeout(10):
        while broker.engine._hold.total != count:  # noqa: ASYNC110
            await asyncio.sleep(0.001)


@pytest.mark.parametrize(("turns", "expected"), [(0, 3), (64, 7)])
async def test_a_woken_pop_takes_what_lands_in_its_window(
    tmp_path: Path, turns: int, expected: int
) -> None:
    async with _broker(tmp_path, turns) as port:
        pop = asyncio.create_task(port.pop(_held()))
        await _held_count(port.broker, 1)
        await port.send(_messages("a", 3))  # wakes the held pop
        await _turns(6)  # the window-less pop ran the turn after the wake
        await port.send(_messages("b", 4))
        result = await pop
        assert len(result.messages) == expected
        rest = await port.pop(_held(0))
        assert len(result.messages) + len(rest.messages) == 7  # nothing lost either way


async def test_a_pop_cancelled_in_its_window_hands_its_wake_on(tmp_path: Path) -> None:
    async with _broker(tmp_path, 64) as port:
        engine = port.broker.engine
        entered = asyncio.Event()
        window = engine._fill_window

        async def marked(request: PopRequest, fifo: bool, deadline: float) -> None:
            entered.set()
            await window(request, fifo, deadline)

        engine._fill_window = marked  # type: ignore[method-assign]
        first = asyncio.create_task(port.pop(_held()))
        await _held_count(port.broker, 1)
        second = asyncio.create_task(port.pop(_held()))
        await _held_count(port.broker, 2)
        loop = asyncio.get_running_loop()
        started = loop.time()
        await port.send(_messages("a", 2))  # wakes the oldest: the first
        await entered.wait()
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        result = await second
        assert len(result.messages) == 2
        assert loop.time() - started < 0.1  # at once, not at the second one's poll time


async def _window_turns(port: LocalBrokerPort, step_ms: float, deadline_in_ms: float) -> int:
    """The turns of the loop a window takes, on a clock that moves ``step_ms`` a reading."""
    engine = port.broker.engine
    now = [float(engine._clock())]

    def clock() -> float:
        now[0] += step_ms
        return now[0]

    count = [0]

    async def tick() -> None:
        while True:
            await asyncio.sleep(0)
            count[0] += 1

    ticker = asyncio.ensure_future(tick())
    await asyncio.sleep(0)
    start = count[0]
    real, engine._clock = engine._clock, clock  # type: ignore[method-assign]
    try:
        await engine._fill_window(_held(), False, now[0] + deadline_in_ms)
    finally:
        engine._clock = real  # type: ignore[method-assign]
        ticker.cancel()
    return count[0] - start


async def test_the_window_is_bounded_in_turns_in_time_and_by_the_poll_time(
    tmp_path: Path,
) -> None:
    async with _broker(tmp_path, 10, 3.0) as port:
        assert await _window_turns(port, 0.0001, 5_000) <= 11  # the turns
        assert await _window_turns(port, 1.0, 5_000) <= 4  # 3 ms
    async with _broker(tmp_path / "2", 64, 50.0) as port:
        assert await _window_turns(port, 1.0, 1.5) <= 3  # the pop's own poll time


async def test_a_pop_in_its_window_when_the_broker_stops_pops_before_it_closes(
    tmp_path: Path,
) -> None:
    """The broker stopping while a woken pop is in its window ends the window: the pop is
    made at once, with those the close woke, so its checkpoint is journaled before the broker
    closes. (It popped after the journal closed: after a restart the message it had handed
    out was handed out again at once, though its invisible time had not passed.)"""
    config = fast_broker_config(tmp_path, name="b0")
    polling = config.polling.model_copy(update={"fill_window_turns": 64, "fill_window_ms": 50})
    config = config.model_copy(update={"polling": polling})
    broker = Broker(config, LoopClock())
    await broker.start()
    port = LocalBrokerPort(broker)
    await port.create_topic(TOPIC, 2)
    engine = broker.engine
    entered = asyncio.Event()
    window = engine._fill_window

    async def marked(request: PopRequest, fifo: bool, deadline: float) -> None:
        entered.set()
        await window(request, fifo, deadline)

    engine._fill_window = marked  # type: ignore[method-assign]
    try:
        pop = asyncio.create_task(port.pop(_held()))
        await _held_count(broker, 1)
        await port.send(_messages("a", 1))  # wakes the held pop: into its window
        await entered.wait()
    finally:
        await broker.aclose()
    result = await pop
    assert len(result.messages) == 1  # the pop still brings what woke it
    async with running_broker(config, LoopClock()) as again:
        # In flight for its invisible time (60 s), not handed out again after the restart.
        assert (await LocalBrokerPort(again).pop(_held(0))).messages == []


async def test_a_pop_woken_at_the_end_of_its_poll_pops_at_once(tmp_path: Path) -> None:
    """A held pop woken in the last second of its poll time (or fifth of a shorter one) has
    no window, as a notify receive about to end has none: its caller's deadline (the proxy's
    cancel scope, the client's) is as near, and a pop cancelled in its window hands its wake
    on: the receive answered empty though a message came while it was held."""
    async with _broker(tmp_path, 64) as port:
        pop = asyncio.create_task(port.pop(_held(5_000)))
        await _held_count(port.broker, 1)
        await asyncio.sleep(4.5)  # virtual time: 0.5 s of its poll left
        count, stop = [0], asyncio.Event()

        async def tick() -> None:
            while not stop.is_set():
                await asyncio.sleep(0)
                count[0] += 1

        ticker = asyncio.ensure_future(tick())
        await asyncio.sleep(0)
        await port.send(_messages("a", 1))  # wakes the held pop
        start = count[0]
        result = await pop
        turns = count[0] - start
        stop.set()
        await ticker
        assert len(result.messages) == 1
        assert turns < 32  # at once: no window of 64 turns
        # Not about to end: the same pop has its window (64 turns).
        pop = asyncio.create_task(port.pop(_held(5_000)))
        await _held_count(port.broker, 1)
        stop.clear()
        ticker = asyncio.ensure_future(tick())
        await asyncio.sleep(0)
        await port.send(_messages("b", 1))
        start = count[0]
        result = await pop
        turns = count[0] - start
        stop.set()
        await ticker
        assert len(result.messages) == 1
        assert turns >= 64
