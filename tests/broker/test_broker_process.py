"""`popmq broker` as a real subprocess on 127.0.0.1, used over gRPC: startup line, health,
clean SIGTERM shutdown, restart on the same data, and a kill -9 in the middle of traffic."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.types import AckEntry, Message, PopRequest, PopStatus
from popmq.broker.wire.remote import RemoteBrokerPort
from support.broker_process import REPO_ROOT, STARTUP_TIMEOUT_S, BrokerProcess

from popmq.errors import PopmqError

pytestmark = pytest.mark.subprocess  # starts popmq or another process

# Fast POP timings: retry level 1s -> 1 ms, revive scans every 20 ms, checkpoints journaled
# after 50 ms, consumer offsets flushed every 50 ms.
FAST = [
    "--set", "broker.pop.time_scale=0.001",
    "--set", "broker.pop.min_invisible_ms=1",
    "--set", "broker.pop.revive_scan_interval_ms=20",
    "--set", "broker.pop.checkpoint_buffer_ms=50",
    "--set", "broker.store.flush_interval_ms=50",
    "--set", "broker.topics.queue_count=4",
]  # fmt: skip


@pytest.fixture
async def spawn(tmp_path: Path) -> AsyncIterator:
    """spawn(data_dir, name) -> a started BrokerProcess; all are killed at the end."""
    started: list[BrokerProcess] = []

    async def start(data_dir: Path, name: str = "broker-a") -> BrokerProcess:
        process = BrokerProcess(data_dir, name, tmp_path / f"{name}.log", *FAST)
        started.append(process)
        await process.start()
        return process

    yield start
    for process in started:
        await process.kill()


async def test_serves_grpc_and_stops_cleanly_on_sigterm(tmp_path: Path, spawn) -> None:
    data_dir = tmp_path / "data"
    broker = await spawn(data_dir, "broker-p")
    remote = RemoteBrokerPort("broker-p", broker.address)
    try:
        assert await remote.describe() == "broker-p"
        async with grpc.aio.insecure_channel(broker.address) as channel:
            reply = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=5
            )
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        await remote.create_topic("t", 2)
        sent = await remote.send([Message("t", b"one"), Message("t", b"two")], 1)
        popped = await remote.pop(PopRequest("g", "t", invisible_time_ms=1_500))
        assert sorted(p.message.body for p in popped.messages) == [b"one", b"two"]
        first = next(p for p in popped.messages if p.message.body == b"one")
        acked = await remote.ack("g", "t", [AckEntry(first.receipt_handle)])
        assert acked[0].code == Code.OK
        # A long poll held at shutdown is answered or cut, never left hanging.
        held = asyncio.create_task(remote.pop(PopRequest("g2", "t", poll_time_ms=30_000)))
        await asyncio.sleep(0.2)
        assert await broker.terminate() == 0
        with contextlib.suppress(RefusedError):
            await asyncio.wait_for(held, 5)
    finally:
        await remote.aclose()

    # Restarted on the same data: the store and the POP state are back.
    again = await spawn(data_dir, "broker-p")
    remote = RemoteBrokerPort("broker-p", again.address)
    try:
        info = await remote.get_topic("t")
        assert info.queues[1].max_offset == 2 and sent[1].queue_offset == 1
        # "two" was popped and never acked: it returns once its invisible time is over, as a
        # second attempt; "one" was acked and never does.
        returned = await remote.pop(
            PopRequest("g", "t", invisible_time_ms=60_000, poll_time_ms=5_000)
        )
        assert [p.message.body for p in returned.messages] == [b"two"]
        assert returned.messages[0].delivery_attempt == 2
        assert not (await remote.pop(PopRequest("g", "t", poll_time_ms=300))).messages
        assert await again.terminate() == 0
    finally:
        await remote.aclose()


async def test_port_in_use_fails_fast(tmp_path: Path, spawn) -> None:
    first = await spawn(tmp_path / "a", "broker-a")
    port = first.address.rsplit(":", 1)[1]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "popmq", "broker", "--port", port, "--data-dir", str(tmp_path / "b"),
        cwd=REPO_ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), STARTUP_TIMEOUT_S)
    assert proc.returncode != 0
    assert b"listening" not in out
    assert b"cannot listen" in err


async def test_data_dir_in_use_fails_fast(tmp_path: Path, spawn) -> None:
    await spawn(tmp_path / "shared", "broker-a")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "popmq", "broker", "--port", "0",
        "--data-dir", str(tmp_path / "shared"),
        cwd=REPO_ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), STARTUP_TIMEOUT_S)
    assert proc.returncode == 2  # a user's error: one line, exit 2
    assert b"listening" not in out
    assert b"used by another" in err and b"Traceback" not in err


@pytest.mark.slow
async def test_kill_9_under_traffic_loses_nothing(tmp_path: Path, spawn) -> None:
    """Producers (sync flush) and consumers run over gRPC; the broker is killed -9 mid-way and
    restarted on the same data. Every acknowledged send is delivered, every message not acked
    comes back, and an acked message comes back only inside the documented window (acked less
    than a consumer-offset flush before the crash)."""
    data_dir = tmp_path / "data"
    topic, group = "crash", "cg"
    first = await spawn(data_dir)
    remote = RemoteBrokerPort("broker-a", first.address, rpc_timeout_s=5.0)
    await remote.create_topic(topic, 4)

    sent: set[str] = set()
    acked_at: dict[str, float] = {}  # body -> monotonic time the ack was confirmed
    popped_pre: set[str] = set()
    redelivered_after_ack: list[str] = []
    counter = itertools.count()
    stop = asyncio.Event()

    async def produce() -> None:
        while not stop.is_set():
            body = f"m-{next(counter)}"
            await remote.send([Message(topic, body.encode())])
            sent.add(body)

    async def consume() -> None:
        while not stop.is_set():
            result = await remote.pop(
                PopRequest(group, topic, max_messages=8, invisible_time_ms=1_500, poll_time_ms=200)
            )
            entries = []
            for popped in result.messages:
                body = popped.message.body.decode()
                if body in acked_at:
                    redelivered_after_ack.append(body)
                popped_pre.add(body)
                if int(body.split("-")[1]) % 4 != 0:  # leave every 4th message un-acked
                    entries.append((body, AckEntry(popped.receipt_handle)))
            if entries:
                results = await remote.ack(group, topic, [entry for _, entry in entries])
                now = time.monotonic()
                for (body, _), outcome in zip(entries, results, strict=True):
                    if outcome.code == Code.OK:
                        acked_at[body] = now

    async def run_until_killed() -> None:
        # The workers end with the connection errors the kill causes (transport errors since the
        # error tree; a refusal mid-kill is possible too).
        with contextlib.suppress(PopmqError):
            await asyncio.gather(produce(), produce(), consume(), consume())

    traffic = asyncio.create_task(run_until_killed())
    await asyncio.sleep(3.0)
    # ... and enough traffic, however slowly a loaded machine sends, before the kill.
    deadline = time.monotonic() + 60
    while len(sent) <= 40 or len(acked_at) <= 10:
        assert time.monotonic() < deadline and not traffic.done(), (len(sent), len(acked_at))
        await asyncio.sleep(0.1)
    killed_at = time.monotonic()
    await first.kill()
    await asyncio.wait_for(traffic, 10)
    await remote.aclose()
    assert not redelivered_after_ack, "acked messages redelivered in normal operation"
    acked_pre = set(acked_at)
    assert len(sent) > 20 and acked_pre and popped_pre - acked_pre, (len(sent), len(acked_pre))

    second = await spawn(data_dir)
    remote = RemoteBrokerPort("broker-a", second.address, rpc_timeout_s=5.0)
    received: set[str] = set()
    back_after_ack: list[str] = []
    missing = sent - acked_pre
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 15
    try:
        # Popped-but-unacked messages return after their invisible time (1.5 s) at the latest.
        settle = loop.time() + 2.5
        while loop.time() < deadline and (missing - received or loop.time() < settle):
            result = await remote.pop(
                PopRequest(group, topic, max_messages=32, invisible_time_ms=5_000, poll_time_ms=300)
            )
            if result.status is PopStatus.FOUND:
                bodies = [p.message.body.decode() for p in result.messages]
                received.update(bodies)
                back_after_ack += [b for b in bodies if b in acked_pre]
                await remote.ack(
                    group, topic, [AckEntry(p.receipt_handle) for p in result.messages]
                )
        assert await second.terminate() == 0
    finally:
        await remote.aclose()

    lost = sorted(missing - received)
    assert not lost, f"{len(lost)} acknowledged sends never delivered/acked: {lost[:10]}"
    # Documented at-least-once window: acks newer than the last consumer-offset flush (50 ms
    # here, plus scheduling slack) may be redelivered after a crash; older ones never.
    window_s = 1.0
    too_old = sorted(b for b in set(back_after_ack) if killed_at - acked_at[b] > window_s)
    assert not too_old, f"acked long before the crash, yet redelivered: {too_old[:10]}"
    ages = [killed_at - acked_at[b] for b in set(back_after_ack)]
    print(
        f"\noldest_redelivered_ack_s={max(ages, default=0):.3f} sent={len(sent)} "
        f"acked_before_kill={len(acked_pre)} "
        f"unacked_before_kill={len(popped_pre - acked_pre)} delivered_after={len(received)} "
        f"acked_redelivered_in_window={len(set(back_after_ack))}"
    )
