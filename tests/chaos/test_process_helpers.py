"""The process helpers clean up after themselves: a start cut short (a test's timeout, a cancel)
kills the child it spawned instead of leaving it running after the test."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from support.broker_process import BrokerProcess, kill_now

from chaos.processes import PopmqProcess, broker_args, free_port

pytestmark = pytest.mark.subprocess  # starts popmq


async def _cancel_once_spawned(
    start: Callable[[], Awaitable[Any]], spawned: Callable[[], asyncio.subprocess.Process | None]
) -> asyncio.subprocess.Process:
    """Start, cancel the start as soon as the child exists, and return the child."""
    task = asyncio.create_task(start())
    async with asyncio.timeout(60):  # bounds a failure only
        while (proc := spawned()) is None:  # noqa: ASYNC110
            await asyncio.sleep(0.001)
    task.cancel()
    try:
        with pytest.raises(asyncio.CancelledError):
            await task
        return proc
    except BaseException:
        kill_now(proc)
        raise


async def _killed(proc: asyncio.subprocess.Process) -> int:
    """Its exit status, once it exits (it is killed here when it does not: a failed check
    leaves nothing running)."""
    try:
        return await asyncio.wait_for(proc.wait(), 30)
    finally:
        kill_now(proc)


async def test_a_cancelled_start_kills_the_broker_process(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data", "b0", tmp_path / "b0.log")
    proc = await _cancel_once_spawned(broker.start, lambda: broker.proc)
    # Killed (-9), not left to start and run on: its wait ends although nobody stopped it.
    assert await _killed(proc) == -signal.SIGKILL


async def test_a_cancelled_start_kills_the_popmq_process(tmp_path: Path) -> None:
    child = PopmqProcess(broker_args("b0", tmp_path / "data", free_port()), tmp_path / "b0.log")
    proc = await _cancel_once_spawned(child.start, lambda: child.proc)
    assert await _killed(proc) == -signal.SIGKILL
