"""The follower's side: dial the leader, say where this copy stands, apply and acknowledge.

One stream at a time; a lost or refused stream is retried with back-off (the leader may be
restarting, or not be the leader yet). A batch from an older epoch than this node knows is
refused: the stream ends and nothing of it is written.
"""

from __future__ import annotations

import asyncio
import logging
import math
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
                ends = await anyio.to_thread.run_sync(
                    self._writer.apply_all, batches, self._role.epoch
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
