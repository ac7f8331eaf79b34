"""The follower's side: dial the leader, say where this copy stands, apply and acknowledge.

One stream at a time; a lost or refused stream is retried with back-off (the leader may be
restarting, or not be the leader yet). A batch from an older epoch than this node knows is
refused: the stream ends and nothing of it is written.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import grpc
from popmq.broker.replication.replica import ReplicationError, ReplicaWriter
from popmq.broker.replication.role import GroupRole

from popmq.clock import SYSTEM, Clock
from popmq.pb.replication.v1 import replication_pb2 as pb
from popmq.pb.replication.v1 import replication_pb2_grpc

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 256 * 1024 * 1024
_BACKOFF_S = (0.2, 0.5, 1.0, 2.0)

# A small group of batches (what a caught-up follower gets: a few sends, pops and acks) is
# applied on the event loop itself, fsyncs included: the hop to a worker thread and back
# (anyio's limiter, queue, condition, the result's way back: two wake-ups) cost about as much
# CPU as the apply, and the loop has nothing else to do meanwhile (one batch travels at a
# time; lease keepalives have a thread of their own). What could block the loop for long
# stays in a thread: a big group (a follower catching up, a bootstrap), a reset or a cut back.
LOOP_APPLY_BYTES = 256 << 10
# A loop apply that took longer than this (a slow or busy disk: the fsyncs) sends the next
# groups to a worker thread for LOOP_APPLY_PAUSE_S, and a small group's apply there is timed
# too: a disk that stays slow keeps them in the thread, and the loop (the role's watches, the
# server's refusals) is blocked by the first slow apply only. Far
# below the lease keeper's loop-stall limit (2 TTLs, popmq/coord/group.py); above the tail
# of a small group's apply on a busy disk (the shared 2-core VM under load 15-18: p99 60 ms,
# p99.9 210 ms, max 265 ms of 3,000), which a lower bound turned into a thread hop again.
LOOP_APPLY_SLOW_S = 0.5
LOOP_APPLY_PAUSE_S = 10.0


class ReplicaFollower:
    def __init__(
        self,
        writer: ReplicaWriter,
        node: str,
        role: GroupRole,
        channel_factory: Callable[[str], grpc.aio.Channel],
        *,
        clock: Clock = SYSTEM,
    ) -> None:
        self._writer = writer
        self._node = node
        self._role = role
        self._channel_factory = channel_factory
        self._clock = clock
        self.batches = 0
        self.loop_applies = 0  # groups applied on the event loop (the rest: in a thread)
        self._threads_until = -math.inf  # time.monotonic(): groups go to a thread until then
        self.connected = False
        self.last_error: str | None = None

    @property
    def writer(self) -> ReplicaWriter:
        return self._writer

    async def run(self) -> None:
        """Follow until cancelled."""
        failures = 0
        while True:
            try:
                await self._follow_once()
                failures = 0
            except (grpc.aio.AioRpcError, ReplicationError, OSError, asyncio.InvalidStateError,
                    grpc.RpcError) as error:  # fmt: skip
                # InvalidStateError: the leader ended the stream while an ack was being written
                text = (error.details() or error.code().name
                        if isinstance(error, grpc.aio.AioRpcError)
                        else str(error) or type(error).__name__)  # fmt: skip
                if text != self.last_error:
                    log.warning("replication: following %s (epoch %d): %s",
                                self._role.leader_address, self._role.epoch, text)  # fmt: skip
                self.last_error = text
                failures += 1
            finally:
                self.connected = False
            await self._clock.sleep(_BACKOFF_S[min(failures, len(_BACKOFF_S) - 1)])

    async def _stream(self, call: Any) -> None:
        """Read batches while earlier ones are applied: whatever arrived meanwhile is applied
        next as one group (one fsync per file), then each is acknowledged, in order."""
        pending: list[pb.ReplicaBatch] = []
        arrived = asyncio.Event()
        ended = False
        failure: list[BaseException] = []

        async def read() -> None:
            nonlocal ended
            while True:
                batch = await call.read()
                if batch is grpc.aio.EOF:
                    ended = True
                    arrived.set()
                    return
                pending.append(batch)
                arrived.set()

        async def apply() -> None:
            while pending or not ended:
                if not pending:
                    if self._writer.indexing_due():  # idle: index what was applied
                        await anyio.to_thread.run_sync(
                            self._writer.index_some, self._clock.monotonic()
                        )
                        continue
                    arrived.clear()
                    # until a batch arrives, or indexing is due (it waits to do more at once);
                    # a timer handle, not a cancel scope: this wait comes once per batch
                    await _wait_at_most(arrived, self._writer.indexing_due_in())
                    continue
                batches = pending[:]
                pending.clear()
                small = self._small(batches)
                if small and time.monotonic() >= self._threads_until:
                    ends = self._apply_on_loop(batches)
                else:
                    # A small group sent here by a slow apply is timed too: a disk that stays
                    # slow keeps the groups in a thread (else each pause's end put one more
                    # whole stall back on the loop).
                    ends = await anyio.to_thread.run_sync(
                        self._apply_timed if small else self._apply_all, batches
                    )
                self.batches += len(batches)
                if not self.connected:
                    log.info("replication: following %s at epoch %d from %d",
                             self._role.leader_address, batches[0].epoch, ends[0])  # fmt: skip
                self.connected = True
                self.last_error = None
                for batch, end in zip(batches, ends, strict=True):
                    await call.write(
                        pb.ReplicaReport(ack=pb.Ack(sequence=batch.sequence, commitlog_end=end))
                    )
                if self._writer.indexing_due():  # a chunk after the acks, even under load
                    await anyio.to_thread.run_sync(self._writer.index_some, self._clock.monotonic())

        async with anyio.create_task_group() as group:

            async def until_one_fails(work: Callable[[], Awaitable[None]]) -> None:
                try:
                    await work()
                except Exception as error:  # the stream is over: run() retries
                    failure.append(error)
                    group.cancel_scope.cancel()

            group.start_soon(until_one_fails, read)
            group.start_soon(until_one_fails, apply)
        if failure:
            raise failure[0]

    def _small(self, batches: list[pb.ReplicaBatch]) -> bool:
        """Whether ``batches`` may be applied on the loop (see LOOP_APPLY_BYTES)."""
        size = 0
        for batch in batches:
            if batch.reset or batch.truncate_to >= 0:
                return False
            size += batch.ByteSize()
        return size <= LOOP_APPLY_BYTES

    def _apply_all(self, batches: list[pb.ReplicaBatch]) -> list[int]:
        return self._writer.apply_all(batches, self._role.epoch)

    def _apply_timed(self, batches: list[pb.ReplicaBatch]) -> list[int]:
        # Real time, not the follower's clock: how long the disk took (on the loop: how long
        # the loop was blocked).
        started = time.monotonic()
        try:
            return self._writer.apply_all(batches, self._role.epoch)
        finally:
            took = time.monotonic() - started
            if took > LOOP_APPLY_SLOW_S:
                self._threads_until = max(self._threads_until, started + took + LOOP_APPLY_PAUSE_S)
                log.debug("replication: applying a batch took %.3f s (its fsyncs); the next "
                         "%g s of batches are applied in a worker thread", took,
                         LOOP_APPLY_PAUSE_S)  # fmt: skip

    def _apply_on_loop(self, batches: list[pb.ReplicaBatch]) -> list[int]:
        self.loop_applies += 1
        return self._apply_timed(batches)

    async def _follow_once(self) -> None:
        channel = self._channel_factory(self._role.leader_address)
        try:
            stub = replication_pb2_grpc.ReplicationServiceStub(channel)
            call = stub.Replicate()
            try:
                hello = self._writer.hello(self._node, self._role.epoch)
                await call.write(pb.ReplicaReport(hello=hello))
                await self._stream(call)
            finally:
                call.cancel()
        finally:
            await channel.close()


async def _wait_at_most(event: asyncio.Event, timeout_s: float) -> None:
    """Until ``event`` is set, or ``timeout_s`` passed (which sets it: the caller looks again
    at what it waits for either way)."""
    if math.isinf(timeout_s):
        await event.wait()
        return
    timer = asyncio.get_running_loop().call_later(max(timeout_s, 0.0), event.set)
    try:
        await event.wait()
    finally:
        timer.cancel()
