"""`popmq bench idle` with small numbers: real broker and proxy processes, real gRPC clients."""

from __future__ import annotations

import pytest

from popmq.bench.idle import bench_idle, format_table

pytestmark = pytest.mark.subprocess  # starts popmq or another process


async def test_bench_idle_small_run() -> None:
    result = await bench_idle(
        long_polls=30, brokers=2, duration_s=1.5, strategies=("pop", "notify", "floor"),
        await_ms=1_000, ramp_s=0.2, settle_s=0.3,
        proxy_settings={"proxy.min_long_polling_ms": 500},
    )  # fmt: skip
    # The window (1.5 s) outlasts a long poll (1 s): every poller answers inside it, however
    # late the loaded machine started the window (0.6 s once saw no receive at all).
    runs = {run["strategy"]: run for run in result["runs"]}
    for run in runs.values():
        assert run["client_errors"] == 0
        assert run["unexpected_messages"] == 0
        assert run["receives_per_s"] > 0
        assert run["proxy_rss_mib"]["max"] >= run["proxy_rss_mib"]["base"] > 0
    assert runs["pop"]["broker_rpcs_per_s_by_kind"]["pop"] > 0
    # pop: each long poll is a pop held on a broker; notify: one shared notification per
    # broker for the whole group, whatever the number of long polls.
    # (The peak over the window's samples: on a loaded machine pollers re-poll late, so the
    # mean or any one sample may catch many of them between polls.)
    assert runs["pop"]["held_on_brokers_max"]["pop"] > 15
    assert runs["pop"]["held_on_brokers"].get("notify", 0) == 0
    assert runs["notify"]["held_on_brokers"]["notify"] <= 2
    assert runs["notify"]["held_on_brokers"].get("pop", 0) == 0
    # notify over the link: armed watches, no first pops, no notify calls once polls run.
    assert runs["notify"]["broker_rpcs_per_s"] <= 1
    assert runs["floor"]["broker_rpcs_per_s"] == 0  # the do-nothing server has no brokers
    table = format_table(result)
    assert "notify" in table and "broker RPC/s" in table
    # With the ACL on (every poll signed), each strategy against the floor as issue 18 reads.
    assert "ACL on (signed calls)" in table and "notify vs floor: RSS" in table
