"""The follower's indexer waits on the follower's clock (issue 19): under virtual time the
follower sleeps until indexing is due by the loop's clock, so the indexer must count its
INDEX_EVERY_S wait on that clock too. With time.monotonic it never became due in virtual
time: the follower woke, found nothing due, slept again, and virtual time ran away."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import anyio
import grpc
import pytest
from popmq.broker.contract.types import Message
from popmq.broker.core import Broker
from popmq.broker.replication import indexer as indexer_module
from popmq.broker.replication.files import DataSnapshotter
from popmq.broker.replication.follower import ReplicaFollower
from popmq.broker.replication.leader import make_batch
from popmq.broker.replication.replica import ReplicaWriter
from popmq.broker.replication.role import GroupRole

from popmq.clock import LoopClock
from popmq.config import BrokerConfig, StoreConfig
from popmq.pb.replication.v1 import replication_pb2 as pb

pytestmark = pytest.mark.looptime
HISTORY = [(1, 0)]


class OneBatchCall:
    """A leader's stream that sends one batch, then nothing (the stream stays open)."""

    def __init__(self, batch: pb.ReplicaBatch) -> None:
        self._batches = [batch]
        self.acks: list[pb.Ack] = []

    async def read(self) -> Any:
        if self._batches:
            return self._batches.pop()
        await anyio.sleep_forever()
        return grpc.aio.EOF

    async def write(self, report: pb.ReplicaReport) -> None:
        self.acks.append(report.ack)


async def test_an_idle_follower_indexes_what_waited_after_index_every_s_of_loop_time(
    tmp_path: Path,
) -> None:
    leader = Broker(BrokerConfig(name="broker-a", data_dir=tmp_path / "leader",
                                 store=StoreConfig(flush="async")))  # fmt: skip
    await leader.start()
    try:
        await leader.create_topic("T", 1)
        await leader.send([Message(topic="T", body=b"small")] * 3, 0)
        snapshot = DataSnapshotter(tmp_path / "leader", 0).take(HISTORY, 0.0)
        assert snapshot.complete
    finally:
        await leader.aclose()
    clock = LoopClock()
    writer = ReplicaWriter(tmp_path / "follower", clock=clock)
    writer.open()
    waits: list[float] = []
    due_in = writer.indexing_due_in

    def counted_due_in() -> float:
        waits.append(due_in())
        return waits[-1]

    writer.indexing_due_in = counted_due_in
    role = GroupRole(1, "broker-a-0", "127.0.0.1:1", is_leader=False)
    # no channel: the test drives the stream itself
    follower = ReplicaFollower(writer, "broker-a-1", role, lambda _: None, clock=clock)
    call = OneBatchCall(make_batch(snapshot, 1, 1, HISTORY))
    try:
        async with anyio.create_task_group() as group:
            group.start_soon(follower._stream, call)
            started = asyncio.get_running_loop().time()
            # a few bytes, below INDEX_AT_BYTES: they wait INDEX_EVERY_S of the loop's time.
            # (Worker-thread hops let looptime skip ahead to the next timer: elapsed virtual
            # time is only bounded below; the count of the follower's waits is the check.)
            # The hang guard counts real seconds: while a worker thread applies or indexes,
            # each virtual sleep below returns at once, so a virtual deadline could pass
            # before the thread's real work is done (it did, about 1 run in 6).
            real_deadline = time.monotonic() + 60
            while not (  # the position moves in a worker thread
                call.acks and writer.indexer.position == call.acks[0].commitlog_end
            ):
                assert time.monotonic() < real_deadline, "the follower never indexed"
                await anyio.sleep(0.05)
            took = asyncio.get_running_loop().time() - started
            group.cancel_scope.cancel()
        assert took >= indexer_module.INDEX_EVERY_S  # it waited for more, as it should
        # one wait of INDEX_EVERY_S, then the work: no wake-up that found nothing due (with
        # time.monotonic each wake-up came back to a wait of almost INDEX_EVERY_S again)
        finite = [wait for wait in waits if wait != float("inf")]
        assert len(finite) <= 3, finite
        assert not writer.indexer.stopped and writer.indexer.records_indexed == 3
    finally:
        writer.close()
