"""writes_within: every write of a stream gets the stall timeout, not the stream as a whole."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from popmq.proxy.grpc.stall import WriterStalled, writes_within


class _SlowReader:
    """A servicer context whose client takes each frame after delay_s."""

    def __init__(self, delays_s: list[float]) -> None:
        self._delays = delays_s
        self.written: list[Any] = []

    async def write(self, frame: Any) -> None:
        await asyncio.sleep(self._delays[len(self.written)])
        self.written.append(frame)


@pytest.mark.looptime
async def test_a_slow_reader_that_keeps_reading_is_never_stalled() -> None:
    # Five frames at 0.8 of the timeout each: 4x the timeout in all, none stalled.
    context = _SlowReader([0.8] * 5)
    with writes_within(context, 1.0) as write:  # type: ignore[arg-type]
        for frame in range(5):
            await write(frame)
    assert context.written == [0, 1, 2, 3, 4]


@pytest.mark.looptime
async def test_a_write_that_waits_past_the_timeout_stalls() -> None:
    context = _SlowReader([0.5, 0.5, 5.0])
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(WriterStalled):
        with writes_within(context, 1.0) as write:  # type: ignore[arg-type]
            for frame in range(3):
                await write(frame)
    assert context.written == [0, 1]
    assert loop.time() - started == pytest.approx(2.0)


@pytest.mark.looptime
async def test_time_between_writes_does_not_count() -> None:
    # The stream's one timer fires while no write waits: it looks again later, nothing stalls.
    context = _SlowReader([0.1, 0.1])
    with writes_within(context, 1.0) as write:  # type: ignore[arg-type]
        await write(0)
        await asyncio.sleep(3.0)
        await write(1)
    assert context.written == [0, 1]


@pytest.mark.looptime
async def test_a_stall_after_a_pause_is_still_caught() -> None:
    context = _SlowReader([0.1, 5.0])
    loop = asyncio.get_running_loop()
    with pytest.raises(WriterStalled):
        with writes_within(context, 1.0) as write:  # type: ignore[arg-type]
            await write(0)
            await asyncio.sleep(2.5)
            paused = loop.time()
            await write(1)
    assert context.written == [0]
    assert loop.time() - paused == pytest.approx(1.0, abs=0.01)
