"""Shared parts of `popmq bench scale`: the server, the backlog, the tally and consumer loops.

Everything goes through a real ``popmq serve`` process (proxy + embedded brokers) over gRPC
with popmq.client.AsyncClient, as a RocketMQ SimpleConsumer would talk to the proxy.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from popmq.broker.contract.types import Message
from popmq.client.aio import AsyncClient
from popmq.client.local_server import LocalServer
from popmq.client.model import QueueRef, ReceivedMessage

RAM_DISK = "/dev/shm"
SEND_BATCH = 32
SENDERS = 4


@dataclass(frozen=True, slots=True)
class LoopSettings:
    """What every consumer loop of one run shares."""

    topic: str
    group: str
    batch: int
    process_ms: float  # simulated work per message, before the ack
    invisible_ms: int
    long_polling_ms: int


# -- the server ----------------------------------------------------------------------------------
@dataclass
class Server:
    endpoint: str
    local: LocalServer
    settings: dict[str, Any]

    async def create_topic(self, name: str, queues_per_broker: int) -> None:
        await asyncio.to_thread(self.local.create_topic, name, queues_per_broker)


def _ram_disk() -> str | None:
    return RAM_DISK if os.path.isdir(RAM_DISK) else None


@contextlib.asynccontextmanager
async def serve(brokers: int, settings: dict[str, Any]) -> AsyncIterator[Server]:
    """A `popmq serve` child process with ``settings`` as --set flags; data on a RAM disk
    when there is one (the disk stalls of a shared machine are not what this measures)."""
    base = _ram_disk()
    with tempfile.TemporaryDirectory(prefix="popmq-bench-scale-", dir=base) as root:
        local = LocalServer(Path(root), brokers=brokers, settings=settings)
        endpoint = await asyncio.to_thread(local.start)
        try:
            yield Server(endpoint, local, dict(settings))
        finally:
            await asyncio.to_thread(local.stop)


@contextlib.asynccontextmanager
async def clients(endpoint: str, count: int) -> AsyncIterator[list[AsyncClient]]:
    """A few client connections shared by the consumer loops (as a few processes would)."""
    opened = [AsyncClient(endpoint, timeout_s=30.0) for _ in range(count)]
    try:
        yield opened
    finally:
        for client in opened:
            await client.close()


async def fill(client: AsyncClient, topic: str, count: int, body_bytes: int) -> list[str]:
    """Send ``count`` messages in batches from a few concurrent senders; their message ids."""
    body = bytes(body_bytes)
    sizes = [SEND_BATCH] * (count // SEND_BATCH) + (
        [count % SEND_BATCH] if count % SEND_BATCH else []
    )
    ids: list[str] = []

    async def sender(mine: list[int]) -> None:
        for size in mine:
            receipts = await client.send([Message(topic=topic, body=body) for _ in range(size)])
            ids.extend(receipt.message_id for receipt in receipts)

    async with anyio.create_task_group() as group:
        for index in range(SENDERS):
            group.start_soon(sender, sizes[index::SENDERS])
    return ids


# -- what happened -------------------------------------------------------------------------------
@dataclass
class Tally:
    """Every receipt and ack of a run, by message id and consumer (times: perf_counter s)."""

    consumers: int
    expected: set[str]
    started: float = field(default_factory=time.perf_counter)
    receipts: dict[str, list[tuple[int, float, int]]] = field(default_factory=dict)
    acks: Counter[str] = field(default_factory=Counter)
    ack_log: list[tuple[float, int, int]] = field(default_factory=list)  # (time, consumer, n)
    acked_by: list[int] = field(default_factory=list)
    receives: int = 0
    empty_receives: int = 0
    ack_failures: int = 0
    all_acked: asyncio.Event = field(default_factory=asyncio.Event)
    # Acks counted toward "all acked": the run's backlog only, each once.
    _pending: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.acked_by = [0] * self.consumers
        self._pending = set(self.expected)
        if not self._pending:
            self.all_acked.set()

    def received(self, consumer: int, messages: Sequence[ReceivedMessage]) -> float:
        now = time.perf_counter()
        self.receives += 1
        if not messages:
            self.empty_receives += 1
        for message in messages:
            entry = (consumer, now, message.delivery_attempt)
            self.receipts.setdefault(message.message_id, []).append(entry)
        return now

    def acked(self, consumer: int, message_ids: Sequence[str]) -> None:
        self.ack_log.append((time.perf_counter(), consumer, len(message_ids)))
        self.acked_by[consumer] += len(message_ids)
        self.acks.update(message_ids)
        self._pending.difference_update(message_ids)
        if not self._pending:
            self.all_acked.set()

    @property
    def acked_count(self) -> int:
        return len(self.expected) - len(self._pending)

    @property
    def duplicates(self) -> int:
        """Receipts beyond the first of each message."""
        return sum(len(seen) - 1 for seen in self.receipts.values())

    @property
    def lost(self) -> int:
        return len(self._pending)

    def last_ack_s(self) -> float:
        return (self.ack_log[-1][0] - self.started) if self.ack_log else 0.0


# -- consumer loops ------------------------------------------------------------------------------
async def pop_consumer(
    index: int, client: AsyncClient, route: Sequence[QueueRef], loop: LoopSettings, tally: Tally
) -> None:
    """A SimpleConsumer: receive a batch (rotating over the route's queues), do the work of
    each message, ack the batch in one AckMessage."""
    for turn in itertools.count(index):
        messages = await client.receive(
            loop.group, route[turn % len(route)], loop.batch, loop.invisible_ms,
            loop.long_polling_ms,
        )  # fmt: skip
        tally.received(index, messages)
        if not messages:
            continue
        await asyncio.sleep(len(messages) * loop.process_ms / 1000)
        outcomes = await client.ack(
            loop.group, loop.topic, [(m.message_id, m.receipt_handle) for m in messages]
        )
        tally.ack_failures += sum(1 for outcome in outcomes if not outcome.ok)
        tally.acked(index, [outcome.message_id for outcome in outcomes if outcome.ok])


def allocate_averagely(route: Sequence[QueueRef], consumers: int, index: int) -> list[QueueRef]:
    """RocketMQ's AllocateMessageQueueAveragely: contiguous blocks of the sorted queues;
    consumers past the queue count get none."""
    queues = sorted(route, key=lambda q: q.key)
    count = len(queues)
    if index >= count:
        return []
    share = count // consumers + (1 if index < count % consumers else 0)
    start = index * share if index < count % consumers else index * share + count % consumers
    return queues[start : start + share]


async def queue_bound_consumer(
    index: int,
    client: AsyncClient,
    owned: Sequence[QueueRef],
    loop: LoopSettings,
    tally: Tally,
) -> None:
    """A Push-style consumer: it owns whole queues (rebalance), pulls each by offset, does the
    work one message at a time (one worker, like the POP loops), commits the offset."""
    if not owned:
        await asyncio.Event().wait()  # no queue left for it: idle until the run ends
    worker = asyncio.Lock()

    async def queue_task(queue: QueueRef) -> None:
        offset = 0
        while True:
            result = await client.pull(
                queue, offset, loop.batch, long_polling_ms=loop.long_polling_ms, group=loop.group
            )
            tally.received(index, result.messages)
            if not result.messages:
                continue
            async with worker:
                await asyncio.sleep(len(result.messages) * loop.process_ms / 1000)
            offset = result.next_offset
            await client.update_offset(loop.group, queue, offset)
            tally.acked(index, [m.message_id for m in result.messages])

    async with anyio.create_task_group() as group:
        for queue in owned:
            group.start_soon(queue_task, queue)


async def _awaited(awaitable: Awaitable[Any]) -> None:
    await awaitable


async def run_until(
    loops: Sequence[Any], done: asyncio.Event, limit_s: float
) -> tuple[float, bool]:
    """Run the consumer coroutines until ``done`` or ``limit_s``; cancel them (clients going
    away mid-poll). Returns (seconds run, whether done was reached)."""
    started = time.perf_counter()
    reached = False
    async with anyio.create_task_group() as group:
        for loop in loops:
            group.start_soon(_awaited, loop)
        with anyio.move_on_after(limit_s):
            await done.wait()
            reached = True
        group.cancel_scope.cancel()
    return time.perf_counter() - started, reached
