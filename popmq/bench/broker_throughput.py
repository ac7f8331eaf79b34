"""Broker throughput: send, pop+ack and pull, in-process and over gRPC, async and sync flush.

``bench_broker`` starts a fresh broker for each (transport, flush) pair: ``inproc`` calls a
Broker in this process through LocalBrokerPort; ``grpc`` starts a `popmq broker` child process
and calls it through RemoteBrokerPort. It sends ``messages`` messages of ``body_bytes`` in
batches from ``producers`` concurrent tasks, drains them with ``consumers`` concurrent pop
(batch ``batch``) + ack loops, then reads them all again by offset with pull. Figures are
messages per second of wall time.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

from popmq.bench import progress as live
from popmq.bench.brokers import local_broker, remote_broker
from popmq.broker.contract.port import BrokerPort
from popmq.broker.contract.types import AckEntry, Message, PopRequest, PullRequest, PullStatus
from popmq.config import BrokerConfig

TOPIC = "bench"
GROUP = "bench-group"


def _config(data_dir: Path, flush: str, queues: int) -> BrokerConfig:
    return BrokerConfig.model_validate(
        {
            "name": f"bench-{flush}",
            "data_dir": str(data_dir),
            "store": {"flush": flush},
            "topics": {"queue_count": queues},
        }
    )


async def _send_all(
    broker: BrokerPort, total: int, batch: int, producers: int, body: bytes
) -> float:
    per_task = total // producers

    async def produce() -> None:
        left = per_task
        while left > 0:
            n = min(batch, left)
            await broker.send([Message(TOPIC, body) for _ in range(n)])
            left -= n
            live.count(n)

    live.measure()
    started = time.perf_counter()
    async with anyio.create_task_group() as group:
        for _ in range(producers):
            group.start_soon(produce)
    elapsed = time.perf_counter() - started
    live.measured()
    return per_task * producers / elapsed


async def _pop_ack_all(
    broker: BrokerPort, total: int, batch: int, consumers: int
) -> tuple[float, int]:
    done = 0
    request = PopRequest(GROUP, TOPIC, max_messages=batch, invisible_time_ms=60_000)

    async def consume() -> None:
        nonlocal done
        empty = 0
        while done < total and empty < 3:
            result = await broker.pop(request)
            if not result.messages:
                empty += 1
                await asyncio.sleep(0)
                continue
            entries = [AckEntry(p.receipt_handle) for p in result.messages]
            await broker.ack(GROUP, TOPIC, entries)
            done += len(entries)
            live.count(len(entries))

    live.measure()
    started = time.perf_counter()
    async with anyio.create_task_group() as group:
        for _ in range(consumers):
            group.start_soon(consume)
    elapsed = time.perf_counter() - started
    live.measured()
    return done / elapsed, done


async def _pull_all(broker: BrokerPort, queues: int, batch: int) -> tuple[float, int]:
    count = 0
    live.measure()
    started = time.perf_counter()
    for queue_id in range(queues):
        offset = 0
        while True:
            result = await broker.pull(PullRequest(TOPIC, queue_id, offset, max_messages=batch))
            if result.status != PullStatus.FOUND:
                break
            count += len(result.messages)
            live.count(len(result.messages))
            offset = result.next_offset
    elapsed = time.perf_counter() - started
    live.measured()
    return count / elapsed, count


async def bench_broker(
    messages: int = 50_000,
    body_bytes: int = 1024,
    batch: int = 32,
    producers: int = 4,
    consumers: int = 4,
    queues: int = 8,
    flush_modes: tuple[str, ...] = ("async", "sync"),
    transports: tuple[str, ...] = ("inproc",),
    data_dir: Path | None = None,
) -> dict[str, Any]:
    """Run the benchmark; returns ``{"params": ..., "results": {"inproc/async": {msg/s}}}``."""
    body = b"x" * body_bytes
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(dir=data_dir) as tmp:
        for transport in transports:
            for mode in flush_modes:
                label = f"{transport}/{mode}"
                config = _config(Path(tmp) / label.replace("/", "-"), mode, queues)
                start = remote_broker if transport == "grpc" else local_broker
                async with start(config) as broker:
                    await broker.create_topic(TOPIC, queues)
                    sent = messages // producers * producers  # each producer sends its share
                    live.phase(f"{label}: send", total=sent)
                    send = await _send_all(broker, messages, batch, producers, body)
                    live.phase(f"{label}: pop+ack", total=sent)
                    pop_ack, acked = await _pop_ack_all(broker, messages, batch, consumers)
                    live.phase(f"{label}: pull", total=sent)
                    pull, pulled = await _pull_all(broker, queues, batch)
                results[label] = {
                    "send_msgs_per_s": round(send),
                    "pop_ack_msgs_per_s": round(pop_ack),
                    "pull_msgs_per_s": round(pull),
                    "acked": acked,
                    "pulled": pulled,
                }
    return {
        "params": {
            "messages": messages,
            "body_bytes": body_bytes,
            "batch": batch,
            "producers": producers,
            "consumers": consumers,
            "queues": queues,
        },
        "results": results,
    }
