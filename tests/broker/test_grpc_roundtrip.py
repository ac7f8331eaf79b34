"""A real Broker behind BrokerGrpcServer, used through RemoteBrokerPort: every port operation
crosses the wire and behaves as it does in process."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.types import (
    AckEntry,
    ConsumeMode,
    FilterExpression,
    GroupConfig,
    Message,
    NotifyRequest,
    PopRequest,
    PopStatus,
    PullRequest,
    PullStatus,
)
from popmq.broker.core import Broker
from popmq.broker.local import LocalBrokerPort
from popmq.broker.testing import fast_broker_config, running_broker
from popmq.broker.wire.remote import RemoteBrokerPort
from popmq.broker.wire.server import BrokerGrpcServer


@dataclass
class Served:
    broker: Broker
    remote: RemoteBrokerPort


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    async with running_broker(fast_broker_config(tmp_path / "b", name="broker-a")) as broker:
        server = BrokerGrpcServer(LocalBrokerPort(broker), "127.0.0.1", 0)
        await server.start()
        remote = RemoteBrokerPort("broker-a", server.address, rpc_timeout_s=5.0)
        try:
            yield Served(broker, remote)
        finally:
            await remote.aclose()
            await server.aclose(0)


async def eventually(condition: Callable[[], bool], timeout_s: float = 3.0) -> None:
    for _ in range(int(timeout_s / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached in time")


def msgs(topic: str, *bodies: str, tag: str = "") -> list[Message]:
    return [Message(topic, body.encode(), tag=tag) for body in bodies]


async def test_send_pop_ack(served: Served) -> None:
    remote = served.remote
    await remote.create_topic("orders", 1)
    sent = await remote.send(msgs("orders", "a", "b", "c"))
    assert [r.queue_offset for r in sent] == [0, 1, 2]
    assert {r.broker_name for r in sent} == {"broker-a"}

    popped = await remote.pop(PopRequest("g", "orders", max_messages=32, invisible_time_ms=60_000))
    assert popped.status is PopStatus.FOUND
    assert [p.message.body for p in popped.messages] == [b"a", b"b", b"c"]
    assert [p.message.message_id for p in popped.messages] == [r.message_id for r in sent]
    assert all(p.delivery_attempt == 1 and p.receipt_handle for p in popped.messages)

    results = await remote.ack(
        "g", "orders", [AckEntry(p.receipt_handle, p.message.message_id) for p in popped.messages]
    )
    assert [r.code for r in results] == [Code.OK] * 3
    again = await remote.pop(PopRequest("g", "orders", invisible_time_ms=60_000))
    assert again.status is PopStatus.NO_MESSAGE and not again.messages


async def test_change_invisible_time_and_redelivery(served: Served) -> None:
    remote = served.remote
    await remote.create_topic("jobs", 1)
    await remote.send(msgs("jobs", "x"))
    first = (await remote.pop(PopRequest("g", "jobs", invisible_time_ms=60_000))).messages[0]
    changed = await remote.change_invisible_time("g", "jobs", first.receipt_handle, 200)
    assert changed.receipt_handle and changed.receipt_handle != first.receipt_handle
    assert changed.invisible_until_ms <= int(time.time() * 1000) + 1_000

    stale = await remote.ack("g", "jobs", [AckEntry(first.receipt_handle, "")])
    assert stale[0].code == Code.INVALID_RECEIPT_HANDLE
    with pytest.raises(RefusedError) as caught:
        await remote.change_invisible_time("g", "jobs", "not-a-handle", 1_000)
    assert caught.value.code is Code.INVALID_RECEIPT_HANDLE

    # Un-acked: it comes back (via the retry topic) with the attempt raised.
    back = await remote.pop(PopRequest("g", "jobs", invisible_time_ms=60_000, poll_time_ms=5_000))
    assert [p.message.body for p in back.messages] == [b"x"]
    assert back.messages[0].delivery_attempt == 2
    assert back.messages[0].message.topic == "jobs"


@pytest.mark.wallclock  # real timing, generous bounds (see pyproject markers)
async def test_pop_long_poll_wakes_on_send(served: Served) -> None:
    remote = served.remote
    await remote.create_topic("live", 2)
    loop = asyncio.get_running_loop()
    started = loop.time()
    waiting = asyncio.create_task(
        remote.pop(PopRequest("g", "live", invisible_time_ms=60_000, poll_time_ms=10_000))
    )
    await asyncio.sleep(0.2)
    assert not waiting.done()
    await remote.send(msgs("live", "now"))
    result = await asyncio.wait_for(waiting, 5)
    assert [p.message.body for p in result.messages] == [b"now"]
    assert loop.time() - started < 3


@pytest.mark.wallclock  # real timing, generous bounds (see pyproject markers)
async def test_pop_long_poll_times_out_empty(served: Served) -> None:
    remote = served.remote
    await remote.create_topic("quiet", 1)
    loop = asyncio.get_running_loop()
    started = loop.time()
    result = await remote.pop(PopRequest("g", "quiet", invisible_time_ms=60_000, poll_time_ms=300))
    assert result.status is PopStatus.NO_MESSAGE
    assert 0.25 <= loop.time() - started < 3


async def test_notify_long_poll(served: Served) -> None:
    remote = served.remote
    await remote.create_topic("signals", 1)
    empty = await remote.notify(NotifyRequest("g", "signals", poll_time_ms=0))
    assert not empty.has_message
    waiting = asyncio.create_task(remote.notify(NotifyRequest("g", "signals", poll_time_ms=10_000)))
    await asyncio.sleep(0.2)
    assert not waiting.done()
    await remote.send(msgs("signals", "ping"))
    assert (await asyncio.wait_for(waiting, 5)).has_message
    # notify does not pop: the message is still there
    popped = await remote.pop(PopRequest("g", "signals", invisible_time_ms=60_000))
    assert [p.message.body for p in popped.messages] == [b"ping"]


async def test_cancelled_pop_releases_its_hold(served: Served) -> None:
    remote, broker = served.remote, served.broker
    await remote.create_topic("held", 1)
    waiting = asyncio.create_task(
        remote.pop(PopRequest("g", "held", invisible_time_ms=60_000, poll_time_ms=30_000))
    )
    await eventually(lambda: broker.hold_table.total == 1)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await eventually(lambda: broker.hold_table.total == 0)
    # Nothing was popped on behalf of the cancelled call.
    await remote.send(msgs("held", "kept"))
    popped = await remote.pop(PopRequest("g", "held", invisible_time_ms=60_000))
    assert [p.message.body for p in popped.messages] == [b"kept"]


async def test_pull_and_offsets(served: Served) -> None:
    remote = served.remote
    await remote.create_topic("log", 1)
    before = int(time.time() * 1000) - 1
    await remote.send(msgs("log", "a", tag="A") + msgs("log", "b", tag="B") + msgs("log", "c"), 0)

    pulled = await remote.pull(PullRequest("log", 0, 0, max_messages=10))
    assert pulled.status is PullStatus.FOUND
    assert [m.body for m in pulled.messages] == [b"a", b"b", b"c"]
    assert (pulled.next_offset, pulled.min_offset, pulled.max_offset) == (3, 0, 3)
    tagged = await remote.pull(PullRequest("log", 0, 0, 10, filter=FilterExpression("B")))
    assert [m.body for m in tagged.messages] == [b"b"]
    assert (await remote.pull(PullRequest("log", 0, 3))).status is PullStatus.NO_NEW_MESSAGE
    assert (await remote.pull(PullRequest("log", 0, 9))).status is PullStatus.OFFSET_ILLEGAL

    waiting = asyncio.create_task(remote.pull(PullRequest("log", 0, 3, poll_time_ms=10_000)))
    await asyncio.sleep(0.2)
    await remote.send(msgs("log", "d"), 0)
    assert [m.body for m in (await asyncio.wait_for(waiting, 5)).messages] == [b"d"]

    assert await remote.get_consumer_offset("pg", "log", 0) == -1
    await remote.update_consumer_offset("pg", "log", 0, 2)
    assert await remote.get_consumer_offset("pg", "log", 0) == 2
    with pytest.raises(RefusedError) as caught:
        await remote.update_consumer_offset("pg", "log", 0, 99)
    assert caught.value.code is Code.ILLEGAL_OFFSET
    assert await remote.offset_for_timestamp("log", 0, before) == 0
    assert await remote.offset_for_timestamp("log", 0, int(time.time() * 1000) + 60_000) == 4


async def test_admin_operations(served: Served) -> None:
    remote = served.remote
    created = await remote.create_topic("admin-t", 3)
    assert (created.name, created.queue_count, len(created.queues)) == ("admin-t", 3, 3)
    await remote.send(msgs("admin-t", "1", "2"), 1)
    info = await remote.get_topic("admin-t")
    assert [(q.queue_id, q.min_offset, q.max_offset) for q in info.queues] == [
        (0, 0, 0),
        (1, 0, 2),
        (2, 0, 0),
    ]
    assert "admin-t" in {t.name for t in await remote.list_topics()}
    auto = await remote.get_topic("auto-t", auto_create=True)
    assert auto.queue_count == 4

    group = await remote.update_group(GroupConfig("gx", ConsumeMode.POP, 3, ["1s", "2s"], True))
    assert (group.max_attempts, group.retry_levels, group.fifo) == (3, ["1s", "2s"], True)
    assert await remote.get_group("gx") == group

    popped = await remote.pop(PopRequest("gs", "admin-t", invisible_time_ms=60_000))
    assert len(popped.messages) == 2
    stats = {(s.topic, s.queue_id): s for s in await remote.group_stats("gs", "admin-t")}
    assert stats[("admin-t", 1)].inflight == 2 and stats[("admin-t", 1)].max_offset == 2

    groups = {g.config.name: g for g in await remote.list_groups()}
    assert groups["gx"].config == group and groups["gs"].inflight == 2
    with pytest.raises(RefusedError) as refused:
        await remote.delete_group("gs")
    assert refused.value.code is Code.PRECONDITION_FAILED
    deleted = await remote.delete_group("gs", clean_offsets=True, force=True)
    assert deleted.inflight == 2
    await remote.delete_group("gx")
    assert {g.config.name for g in await remote.list_groups()} == set()

    await remote.delete_topic("admin-t")
    with pytest.raises(RefusedError) as caught:
        await remote.get_topic("admin-t")
    assert caught.value.code is Code.TOPIC_NOT_FOUND


async def test_refusals_keep_their_codes(served: Served) -> None:
    remote = served.remote
    with pytest.raises(RefusedError) as caught:
        await remote.pop(PopRequest("g", "missing-topic"))
    assert caught.value.code is Code.TOPIC_NOT_FOUND
    with pytest.raises(RefusedError) as caught:
        await remote.send([Message("t", b"")])
    assert caught.value.code is Code.MESSAGE_BODY_EMPTY
    with pytest.raises(RefusedError) as caught:
        await remote.pop(PopRequest("g", "missing-topic", poll_time_ms=-1))
    assert caught.value.code in (Code.ILLEGAL_POLLING_TIME, Code.TOPIC_NOT_FOUND)
    bad = await remote.ack("g", "t", [AckEntry("garbage", "m")])
    assert bad[0].code == Code.INVALID_RECEIPT_HANDLE and bad[0].message


async def test_forward_to_dlq(served: Served) -> None:
    remote = served.remote
    await remote.create_topic("doomed", 1)
    await remote.send(msgs("doomed", "bad"))
    popped = (await remote.pop(PopRequest("gd", "doomed", invisible_time_ms=60_000))).messages[0]
    await remote.forward_to_dlq("gd", "doomed", popped.receipt_handle)
    dlq = await remote.pull(PullRequest("%DLQ%gd", 0, 0, poll_time_ms=3_000))
    assert [m.body for m in dlq.messages] == [b"bad"]
    after = await remote.pop(PopRequest("gd", "doomed", invisible_time_ms=60_000))
    assert not after.messages
