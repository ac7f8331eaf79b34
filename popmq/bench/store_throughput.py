"""Store micro-benchmark: append and read throughput of one MessageStore, in process.

Not a test and not a command: ``popmq bench`` (or a REPL) calls ``bench_store``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Literal

import anyio

from popmq.broker.contract.types import Message
from popmq.broker.store.message_store import MessageStore
from popmq.config import StoreConfig


async def bench_store(
    data_dir: Path,
    n: int,
    body_size: int,
    flush: Literal["sync", "async"],
    *,
    producers: int = 64,
    queues: int = 8,
    batch: int = 1,
    read_batch: int = 32,
) -> dict[str, float | int | str]:
    """Append ``n`` messages of ``body_size`` bytes from ``producers`` concurrent tasks
    (``batch`` messages per append, queues round robin), then read them all back by offset
    ``read_batch`` at a time. ``data_dir`` should be empty; it is left behind."""
    store = MessageStore(Path(data_dir), "bench", StoreConfig(flush=flush))
    store.open()
    await store.start()
    try:
        store.create_topic("bench", queues)
        body = bytes(body_size)
        appends = -(-n // batch)
        per_producer = [appends // producers + (i < appends % producers) for i in range(producers)]

        async def produce(index: int, count: int) -> None:
            for i in range(count):
                messages = [Message("bench", body, tag="t") for _ in range(batch)]
                await store.append("bench", (index + i) % queues, messages)

        fsyncs_before = store.commitlog_fsyncs
        started = time.perf_counter()
        async with anyio.create_task_group() as group:
            for index, count in enumerate(per_producer):
                group.start_soon(produce, index, count)
        append_s = time.perf_counter() - started
        fsyncs = store.commitlog_fsyncs - fsyncs_before
        written = appends * batch

        started = time.perf_counter()
        read = 0
        for queue_id in range(queues):
            offset = store.min_offset("bench", queue_id)
            while True:
                result = store.read("bench", queue_id, offset, read_batch)
                if not result.messages:
                    break
                read += len(result.messages)
                offset = result.next_offset
        read_s = time.perf_counter() - started
    finally:
        await store.aclose()
    return {
        "flush": flush,
        "messages": written,
        "body_size": body_size,
        "producers": producers,
        "batch": batch,
        "append_seconds": round(append_s, 3),
        "append_msgs_per_s": round(written / append_s),
        "append_mib_per_s": round(written * body_size / append_s / (1 << 20), 1),
        "commitlog_fsyncs": fsyncs,
        "read_messages": read,
        "read_seconds": round(read_s, 3),
        "read_msgs_per_s": round(read / read_s) if read_s else 0,
    }
