"""A real Broker's Prometheus metrics move with what it does; scrapes from another thread (as
the HTTP server does) read the same numbers; `popmq broker --metrics-port` serves them."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from popmq.broker.contract.types import (
    AckEntry,
    GroupConfig,
    Message,
    NotifyRequest,
    PopRequest,
    PopStatus,
    PullRequest,
)
from popmq.broker.core import Broker
from popmq.broker.metrics import MergedCollector
from popmq.broker.testing import fast_broker_config, running_broker
from popmq.broker.wire.remote import RemoteBrokerPort
from prometheus_client import CollectorRegistry, generate_latest

REPO_ROOT = Path(__file__).resolve().parents[2]


def value(broker: Broker, name: str, **labels: str) -> float:
    found = broker.metrics.registry.get_sample_value(name, {"broker": broker.name, **labels})
    return 0.0 if found is None else found


async def eventually(check, within_s: float = 3.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + within_s
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def test_counters_follow_send_pop_ack_and_change(tmp_path: Path) -> None:
    async with running_broker(fast_broker_config(tmp_path, checkpoint_buffer_ms=30)) as broker:
        await broker.create_topic("t", 4, "MIXED")  # normal and delay messages
        await broker.send([Message("t", f"m{i}".encode()) for i in range(5)], 1)
        later = int(time.time() * 1000) + 50
        await broker.send([Message("t", b"d", delivery_timestamp_ms=later)] * 2)
        await broker.send([Message("other", b"x")])
        assert value(broker, "popmq_broker_messages_stored_total", topic="t") == 7
        assert value(broker, "popmq_broker_messages_stored_total", topic="other") == 1

        popped = await broker.pop(PopRequest("g", "t", max_messages=3, invisible_time_ms=60_000))
        assert len(popped.messages) == 3
        assert value(broker, "popmq_broker_pop_requests_total", result="found") == 1
        assert value(broker, "popmq_broker_popped_messages_total") == 3
        first, second, third = popped.messages
        entries = [AckEntry(first.receipt_handle), AckEntry(second.receipt_handle)]
        await broker.ack("g", "t", [*entries, AckEntry("not-a-handle")])
        assert value(broker, "popmq_broker_acks_total", result="ok") == 2
        assert value(broker, "popmq_broker_acks_total", result="failed") == 1
        await broker.change_invisible_time("g", "t", third.receipt_handle, 60_000)
        assert value(broker, "popmq_broker_invisible_time_changes_total") == 1
        await broker.create_topic("empty", 1)
        empty = await broker.pop(PopRequest("g", "empty"))
        assert empty.status is PopStatus.NO_MESSAGE
        assert value(broker, "popmq_broker_pop_requests_total", result="empty") == 1

        # Scrape-time state: 7 on "t" (2 delivered by the timer once due), 2 acked.
        await eventually(lambda: value(broker, "popmq_broker_timer_deliveries_total") == 2)
        labels = {"group": "g", "topic": "t"}
        await eventually(
            lambda: value(broker, "popmq_broker_group_backlog_messages", **labels) == 5
        )
        assert value(broker, "popmq_broker_group_inflight_messages", **labels) == 1
        assert value(broker, "popmq_broker_group_retry_backlog_messages", **labels) == 0
        # The un-acked one outlives the checkpoint buffer (30 ms) and is journaled.
        await eventually(lambda: value(broker, "popmq_broker_checkpoints_spilled_total") == 1)
        assert value(broker, "popmq_broker_commitlog_bytes") > 0
        assert value(broker, "popmq_broker_commitlog_segments") == 1
        assert value(broker, "popmq_broker_timer_pending_messages") == 0

        # The HTTP server scrapes from its own thread: the state is read on the loop.
        text = (await asyncio.to_thread(generate_latest, broker.metrics.registry)).decode()
        assert (
            'popmq_broker_group_backlog_messages{broker="broker-a",group="g",topic="t"} 5.0' in text
        )
        assert 'popmq_broker_messages_stored_total{broker="broker-a",topic="t"} 7.0' in text


async def test_revive_and_dead_letters(tmp_path: Path) -> None:
    async with running_broker(fast_broker_config(tmp_path)) as broker:
        await broker.update_group(GroupConfig("g", max_attempts=2))
        await broker.send([Message("t", b"poison")])
        for attempt in (1, 2):
            (popped,) = (
                await broker.pop(PopRequest("g", "t", invisible_time_ms=10, poll_time_ms=2_000))
            ).messages
            assert popped.delivery_attempt == attempt
        await eventually(lambda: value(broker, "popmq_broker_dead_lettered_messages_total") == 1)
        assert value(broker, "popmq_broker_revived_messages_total") == 1
        assert value(broker, "popmq_broker_dlq_stored_messages", group="g") == 1
        # The retry went through the timer (its backoff) before the retry topic (counted once
        # the timer's progress is written, which may be after the retry was popped).
        await eventually(lambda: value(broker, "popmq_broker_timer_deliveries_total") == 1)


async def test_held_requests_by_kind_and_polling_full(tmp_path: Path) -> None:
    config = fast_broker_config(tmp_path)
    config.polling.max_held_per_key = 1
    async with running_broker(config) as broker:
        await broker.create_topic("idle", 1)
        assert value(broker, "popmq_broker_held_requests_limit") == 100_000
        pop = asyncio.create_task(broker.pop(PopRequest("g", "idle", poll_time_ms=5_000)))
        notify = asyncio.create_task(broker.notify(NotifyRequest("n", "idle", poll_time_ms=5_000)))
        pull = asyncio.create_task(broker.pull(PullRequest("idle", 0, 0, poll_time_ms=5_000)))
        for kind in ("pop", "notify", "pull"):
            await eventually(
                lambda k=kind: value(broker, "popmq_broker_held_requests", kind=k) == 1
            )
        # A second pop of the same (topic, group) is over max_held_per_key: refused at once.
        full = await broker.pop(PopRequest("g", "idle", poll_time_ms=5_000))
        assert full.status is PopStatus.POLLING_FULL
        assert value(broker, "popmq_broker_polling_full_total", kind="pop") == 1
        assert value(broker, "popmq_broker_pop_requests_total", result="polling_full") == 1
        await broker.send([Message("idle", b"wake")])
        await asyncio.wait_for(asyncio.gather(pop, notify, pull), 3)
        for kind in ("pop", "notify", "pull"):
            assert value(broker, "popmq_broker_held_requests", kind=kind) == 0
        assert broker.hold_table.total == 0


async def test_backlog_of_an_idle_group_survives_a_restart(tmp_path: Path) -> None:
    config = fast_broker_config(tmp_path)
    async with running_broker(config) as broker:
        await broker.send([Message("t", b"a"), Message("t", b"b"), Message("t", b"c")], 0)
        (one,) = (
            await broker.pop(PopRequest("g", "t", max_messages=1, invisible_time_ms=60_000))
        ).messages
        await broker.ack("g", "t", [AckEntry(one.receipt_handle)])
    async with running_broker(config) as broker:
        # No consumer of "g" has popped since the restart; its committed offset still counts.
        assert value(broker, "popmq_broker_group_backlog_messages", group="g", topic="t") == 2
        assert value(broker, "popmq_broker_messages_stored_total", topic="t") == 0


async def test_embedded_brokers_merge_into_one_family_per_name(tmp_path: Path) -> None:
    async with (
        running_broker(fast_broker_config(tmp_path / "a", name="b-0")) as b0,
        running_broker(fast_broker_config(tmp_path / "b", name="b-1")) as b1,
    ):
        await b0.send([Message("t", b"x")])
        await b1.send([Message("t", b"y"), Message("t", b"z")])
        merged = CollectorRegistry()
        merged.register(MergedCollector([b0.metrics.registry, b1.metrics.registry]))
        text = (await asyncio.to_thread(generate_latest, merged)).decode()
        assert text.count("# TYPE popmq_broker_messages_stored_total counter") == 1
        assert 'popmq_broker_messages_stored_total{broker="b-0",topic="t"} 1.0' in text
        assert 'popmq_broker_messages_stored_total{broker="b-1",topic="t"} 2.0' in text


@pytest.mark.subprocess
async def test_broker_process_serves_metrics(tmp_path: Path) -> None:
    log_path = tmp_path / "broker.log"
    with log_path.open("wb") as log:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "popmq", "broker", "--name", "broker-m",
            "--host", "127.0.0.1", "--port", "0", "--metrics-port", "0",
            "--data-dir", str(tmp_path / "data"),
            cwd=REPO_ROOT, stdout=asyncio.subprocess.PIPE, stderr=log,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 20)).decode()
        match = re.match(r"^popmq broker broker-m listening on 127\.0\.0\.1:(\d+)$", line.strip())
        assert match, (line, log_path.read_text())
        logged = re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", log_path.read_text())
        assert logged, log_path.read_text()
        remote = RemoteBrokerPort("broker-m", f"127.0.0.1:{match.group(1)}")
        try:
            await remote.send([Message("orders", b"1"), Message("orders", b"2")])
            await remote.pop(
                PopRequest("billing", "orders", max_messages=1, invisible_time_ms=60_000)
            )
        finally:
            await remote.aclose()
        url = f"http://127.0.0.1:{logged.group(1)}/metrics"

        def fetch() -> str:
            with urllib.request.urlopen(url, timeout=5) as response:
                return response.read().decode()

        text = await asyncio.to_thread(fetch)
        assert 'popmq_broker_messages_stored_total{broker="broker-m",topic="orders"} 2.0' in text
        assert 'popmq_broker_popped_messages_total{broker="broker-m"} 1.0' in text
        labels = 'broker="broker-m",group="billing",topic="orders"'
        assert f"popmq_broker_group_inflight_messages{{{labels}}} 1.0" in text
        assert f"popmq_broker_group_backlog_messages{{{labels}}} 2.0" in text
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 10) == 0
        assert await proc.stdout.read() == b""  # nothing on stdout after the first line
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_a_handle_key_file_that_fails_to_reload_is_counted(
    tmp_path: Path, monkeypatch
) -> None:
    """Issue 10: a rotated keys file that cannot be read was only logged."""
    from popmq.broker.pop import handle_keys

    monkeypatch.setattr(handle_keys, "_RELOAD_EVERY_S", 0.0)
    async with running_broker(fast_broker_config(tmp_path)) as broker:
        assert value(broker, "popmq_broker_handle_key_reload_failures_total") == 0
        path = handle_keys.keyring_path(broker.config)
        path.write_text('{"active": "x", "keys": []}')  # broken rotation
        os.utime(path, ns=(5, 5))
        await broker.send([Message("t", b"x")])
        popped = await broker.pop(PopRequest("g", "t"))  # seals a handle: reloads the keys
        assert len(popped.messages) == 1  # the old key goes on working
        assert value(broker, "popmq_broker_handle_key_reload_failures_total") == 1
