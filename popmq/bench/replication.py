"""`popmq bench replication`: send msg/s of one broker unreplicated vs a replicated group.

Every setup runs in the same invocation, one after the other, on `popmq broker` processes on
127.0.0.1: ``none`` (a broker alone, replication off), ``sync-N`` (a leader and N-1 followers,
``--replication sync --min-in-sync N``: each answer waits for every node), ``async-N``. The
producers send through the leader's gRPC port (the request link, as a proxy does). Read the
ratios: the machine is shared.
"""

from __future__ import annotations

import contextlib
import itertools
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio

from popmq.bench.brokers import process_cpu_s
from popmq.bench.groups import create_topic_in_sync, replicated_group
from popmq.bench.table_text import grid
from popmq.broker.contract.port import BrokerPort
from popmq.broker.contract.types import Message
from popmq.config import BrokerConfig, StoreConfig

NAME = "bench-r"
TOPIC = "BenchReplication"


@contextlib.asynccontextmanager
async def _group(root: Path, setup: str, pids: list[int]) -> AsyncIterator[BrokerPort]:
    config = BrokerConfig(name=NAME, data_dir=root / "node-0", store=StoreConfig(flush="async"))
    mode, _, count = setup.partition("-")
    replicas = int(count) if count else 1
    async with replicated_group(config, replicas, mode if mode != "none" else "off", pids) as port:
        yield port


async def _run(setup: str, messages: int, body_bytes: int, batch: int, producers: int,
               queues: int) -> dict[str, Any]:  # fmt: skip
    pids: list[int] = []
    with tempfile.TemporaryDirectory(prefix="popmq-bench-repl-") as tmp:
        async with _group(Path(tmp), setup, pids) as port:
            await create_topic_in_sync(port, TOPIC, queues)
            body = b"x" * body_bytes
            counter = itertools.count()
            per_producer = messages // producers

            async def produce() -> None:
                sent = 0
                while sent < per_producer:
                    count = min(batch, per_producer - sent)
                    queue = next(counter) % queues
                    await port.send([Message(topic=TOPIC, body=body)] * count, queue)
                    sent += count

            cpu_before = sum(process_cpu_s(pid) for pid in pids)
            start = time.perf_counter()
            async with anyio.create_task_group() as group:
                for _ in range(producers):
                    group.start_soon(produce)
            elapsed = time.perf_counter() - start
            cpu = sum(process_cpu_s(pid) for pid in pids) - cpu_before
    total = per_producer * producers
    return {
        "send_msgs_per_s": round(total / elapsed),
        "seconds": round(elapsed, 2),
        "broker_cpu_s": round(cpu, 2),
    }


async def bench_replication(messages: int = 20_000, body_bytes: int = 1024, batch: int = 16,
                            producers: int = 8, queues: int = 8,
                            setups: tuple[str, ...] = ("none", "sync-2", "sync-3"),
                            ) -> dict[str, Any]:  # fmt: skip
    results = {}
    for setup in setups:
        results[setup] = await _run(setup, messages, body_bytes, batch, producers, queues)
    base = results.get("none", {}).get("send_msgs_per_s")
    if base:
        for figures in results.values():
            figures["vs_none"] = round(figures["send_msgs_per_s"] / base, 2)
    return {
        "params": {
            "messages": messages,
            "body_bytes": body_bytes,
            "batch": batch,
            "producers": producers,
            "queues": queues,
        },
        "results": results,
    }


def format_table(result: dict[str, Any]) -> str:
    p = result["params"]
    head = (f"{p['messages']} messages x {p['body_bytes']} B, batch {p['batch']}, "
            f"{p['producers']} producers, {p['queues']} queues")  # fmt: skip
    rows = [["setup", "send msg/s", "vs none", "seconds", "broker CPU s"]]
    for setup, f in result["results"].items():
        rows.append([setup, str(f["send_msgs_per_s"]), str(f.get("vs_none", "")),
                     str(f["seconds"]), str(f["broker_cpu_s"])])  # fmt: skip
    return head + "\n\n" + "\n".join(grid(rows))
