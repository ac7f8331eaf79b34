"""`popmq bench e2e` leaves `popmq serve`'s console start out of its measured window: the
console imports its web stack after the proxy listens."""

from __future__ import annotations

import asyncio
from pathlib import Path

from popmq.bench.e2e import _console_started, _serve_command


def test_serve_runs_its_console_on_a_port_of_its_own(tmp_path: Path) -> None:
    params = {"mode": "proxy", "brokers": 2, "queues": 2, "strategy": "adaptive"}
    args = _serve_command(params, tmp_path)
    port = int(args[args.index("--console-port") + 1])
    assert port > 0  # on, and never the default 8080 another bench may hold


async def test_the_measurement_waits_for_the_console() -> None:
    stdout = asyncio.StreamReader()
    waiting = asyncio.ensure_future(_console_started(stdout))
    stdout.feed_data(b"popmq admin listening on 127.0.0.1:1\n")
    await asyncio.sleep(0.01)
    assert not waiting.done()
    stdout.feed_data(b"popmq console on http://127.0.0.1:2/\n")
    await asyncio.wait_for(waiting, 5)


async def test_a_console_that_does_not_start_does_not_hold_the_bench() -> None:
    stdout = asyncio.StreamReader()
    stdout.feed_data(b"popmq console: not started (the console extra is not installed)\n")
    await asyncio.wait_for(_console_started(stdout), 5)
    ended = asyncio.StreamReader()
    ended.feed_eof()  # the server died: the bench finds out when it calls it
    await asyncio.wait_for(_console_started(ended), 5)
