"""`popmq bench e2e` on a tiny scale: every mode delivers every message and reports it."""

from __future__ import annotations

import json

import pytest

from popmq.bench.e2e import bench_e2e, format_table

pytestmark = pytest.mark.subprocess  # starts popmq or another process


async def test_bench_e2e_direct_proxy_and_floor() -> None:
    result = await bench_e2e(
        messages=480, producers=2, consumers=4, brokers=2, queues=2, send_batch=16,
        modes=("direct", "proxy", "floor"),
    )  # fmt: skip
    json.dumps(result)  # the CLI writes it with --json
    for mode in ("direct", "proxy", "floor"):
        figures = result["results"][mode]
        assert figures["acked"] >= 480, mode
        assert figures["msgs_per_s"] > 0, mode
    assert result["results"]["proxy"]["cpu_s_server"] > 0
    assert result["proxy_overhead"] > 0 and result["floor_over_proxy"] > 0
    table = format_table(result)
    assert "floor" in table and "gRPC floor / proxy" in table
