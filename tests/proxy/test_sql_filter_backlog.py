"""A SQL92 receive over a long backlog the filter leaves out still finds the match behind it,
in every long-poll strategy (a broker pop scans it in passes; the receive must go on)."""

from __future__ import annotations

import pytest
from popmq.broker.contract.errors import Code
from popmq.broker.contract.types import Message
from proxy_support import unique
from test_sql_filter_strategies import _receive_sql


@pytest.mark.parametrize("strategy", ["pop", "slices", "notify", "adaptive"])
async def test_match_behind_a_long_unmatched_backlog(make_cluster, strategy: str) -> None:
    cluster = await make_cluster(1, **{"proxy.strategy": strategy})
    topic, group = unique("sqlb"), unique("g")
    (broker,) = cluster.brokers
    await broker.create_topic(topic, 1, "NORMAL")
    for _ in range(4):
        await broker.send([Message(topic, b"no", properties={"a": "1"})] * 1000)
    await broker.send([Message(topic, b"yes", properties={"a": "2"})])
    status, bodies = await _receive_sql(cluster, group, topic, "a = 2", 10_000)
    assert status.code == Code.OK and bodies == [b"yes"], (status, bodies)
