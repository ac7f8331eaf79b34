"""The long-poll benchmark runs end to end on a tiny scale and reports what it measured."""

from __future__ import annotations

import json

import pytest

from popmq.bench.longpoll import bench_longpoll, format_table

pytestmark = pytest.mark.slow  # scheduled first in make check (tests/conftest.py)


async def test_bench_longpoll_small_run() -> None:
    result = await bench_longpoll(
        brokers=3, consumers=1, rate=20.0, duration_s=1.0, await_ms=1_000,
        strategies=("notify", "pop"),
    )  # fmt: skip
    json.dumps(result)  # the CLI writes it with --json
    runs = {run["strategy"]: run for run in result["low_rate"]}
    notify = runs["notify"]
    assert notify["sent"] > 5
    assert notify["delivered"] == notify["sent"]
    assert notify["false_empty"] == 0
    # Far below the 1 s poll: woken by the watches. The median holds that on a loaded machine;
    # the tail only counts beyond the event loop's own measured stalls (a busy CI machine
    # stalls a process for 100s of ms, and a 1 s run has ~20 messages: p99 is the max).
    assert notify["latency_ms"]["p50"] < 500
    assert notify["latency_ms"]["p99"] < 500 + notify["loop_stall_ms"]["max"]
    # notify waits on the brokers' watch events (arms), not on held notify calls.
    assert notify["broker_rpcs"].get("watch_arm", 0) > 0
    assert runs["pop"]["broker_rpcs"].get("notify", 0) == 0
    table = format_table(result)
    assert "notify" in table and "p99 ms" in table
