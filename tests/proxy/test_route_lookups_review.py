"""Review of the shared route lookups (test_route_lookups.py): a lookup under way when the
brokers behind the proxy change answers its callers, but leaves nothing in the cache that
names a broker that is gone. In-process ports driven by events: no time passes."""

from __future__ import annotations

import anyio
from popmq.proxy.cluster import BrokerCluster

from tests.proxy.test_route_lookups import Port


async def test_a_lookup_under_way_when_a_broker_is_removed_caches_no_route_naming_it() -> None:
    """`popmq admin brokers remove gb` while a route lookup waits on gb: had the lookup's
    route gone into the cache the removal had just emptied, sends would pick gb's queues for
    CACHE_TTL_S and fail "no broker named 'gb'" (the route is built from the ports as they
    are when the answers are in)."""
    ga, gb = Port("ga"), Port("gb")
    gb.gate = anyio.Event()
    cluster = BrokerCluster([ga, gb])  # type: ignore[list-item]
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(cluster.route, "T")
        await gb.asked.wait()
        assert cluster.remove_port("gb") is gb
        gb.gate.set()  # the lookup under way ends with gb's answer
    assert gb.calls == 1
    cached = cluster.cached_route("T")
    assert cached is None or "gb" not in cached.brokers, cached
    route = await cluster.route("T")
    assert route.brokers == {"ga": 2}
    assert gb.calls == 1
