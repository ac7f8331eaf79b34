"""`popmq bench e2e` on a tiny scale: every mode delivers every message and reports it, and
with --transactions each mode (but the floor) also runs transactionally beside it."""

from __future__ import annotations

import json

import pytest

from popmq.bench.e2e import bench_e2e, format_table

pytestmark = pytest.mark.subprocess  # starts popmq or another process


async def test_bench_e2e_direct_proxy_floor_and_transactions() -> None:
    result = await bench_e2e(
        messages=160, producers=4, consumers=4, brokers=2, queues=2,
        modes=("direct", "proxy", "floor"), transactions=True,
    )  # fmt: skip
    json.dumps(result)  # the CLI writes it with --json
    for mode in ("direct", "proxy", "floor", "direct-tx", "proxy-tx"):
        figures = result["results"][mode]
        assert figures["acked"] >= 160, mode
        assert figures["msgs_per_s"] > 0, mode
    assert "floor-tx" not in result["results"]  # the floor server has no transactions
    assert result["params"]["send_batch"] == 1  # like with like: one message per send
    assert result["results"]["proxy"]["cpu_s_server"] > 0
    assert result["proxy_overhead"] > 0 and result["floor_over_proxy"] > 0
    assert set(result["tx_over_plain"]) == {"direct", "proxy"}
    assert result["tx_over_plain"]["proxy"]["msgs_per_s"] > 0
    table = format_table(result)
    assert "floor" in table and "gRPC floor / proxy" in table
    assert "proxy: transactional / plain: msg/s" in table
    # Measured with the ACL on (every call signed; the acks above got through it), and the
    # ratios issue 18's done-when reads are printed.
    assert result["params"]["acl"] is True and "ACL on (signed calls)" in table
    assert result["proxy_cpu_over_floor"] > 0 and "proxy / floor server CPU µs/msg" in table
