"""popmq.client.AsyncClient against the in-memory fake server."""

from __future__ import annotations

import asyncio

import pytest
from popmq.broker.contract.errors import Code
from popmq.broker.contract.types import Message
from support.fake_proxy import FakeProxy

from popmq.client import AsyncClient, OffsetPolicy, ProxyError, ProxyUnavailable


async def test_send_pull_and_offsets(fake_proxy: FakeProxy) -> None:
    async with AsyncClient(fake_proxy.endpoint) as client:
        queues = await client.query_route("orders")
        await asyncio.gather(
            *(client.send([Message(topic="orders", body=f"{i}".encode())]) for i in range(8))
        )
        ends = await asyncio.gather(*(client.query_offset(q, OffsetPolicy.END) for q in queues))
        pulled = await asyncio.gather(*(client.pull(q, 0) for q in queues))
    assert sum(ends) == 8
    bodies = sorted(m.body for result in pulled for m in result.messages)
    assert bodies == sorted(f"{i}".encode() for i in range(8))
    assert [r.next_offset for r in pulled] == ends


async def test_receive_and_ack(fake_proxy: FakeProxy) -> None:
    async with AsyncClient(fake_proxy.endpoint) as client:
        queue = (await client.query_route("events"))[0]
        await client.send([Message(topic="events", body=b"a"), Message(topic="events", body=b"b")])
        got = await client.receive("g", queue, invisible_ms=30_000, long_polling_ms=0)
        outcomes = await client.ack("g", "events", [(m.message_id, m.receipt_handle) for m in got])
        assert await client.receive("g", queue, long_polling_ms=0) == []
    assert sorted(m.body for m in got) == [b"a", b"b"]
    assert all(o.ok for o in outcomes)


async def test_group_offsets(fake_proxy: FakeProxy) -> None:
    async with AsyncClient(fake_proxy.endpoint) as client:
        queue = (await client.query_route("orders"))[0]
        await client.update_offset("g", queue, 7)
        assert await client.get_offset("g", queue) == 7
        with pytest.raises(ProxyError) as info:
            await client.change_invisible_duration("g", "orders", "id", "bad|0|0|1", 1000)
    assert info.value.code == Code.INVALID_RECEIPT_HANDLE


async def test_errors_carry_codes(fake_proxy: FakeProxy) -> None:
    async with AsyncClient(fake_proxy.endpoint) as client:
        with pytest.raises(ProxyError) as info:
            await client.query_route("missing")
    assert info.value.code == Code.TOPIC_NOT_FOUND
    async with AsyncClient("127.0.0.1:1", timeout_s=1.0) as client:
        with pytest.raises(ProxyUnavailable):
            await client.query_route("orders")
