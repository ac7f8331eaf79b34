"""A caught-up follower applies its small batches on its event loop, fsyncs included (issue 19:
the hop to a worker thread and back cost about as much CPU as the apply), and still
acknowledges a batch only once every byte of it is fsynced (reliability.md). What could block
the loop for long (a big group, a reset or a cut, a disk that was slow) goes to a thread."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import anyio
import grpc
import pytest
from popmq.broker.contract.types import Message
from popmq.broker.core import Broker
from popmq.broker.replication import follower as follower_module
from popmq.broker.replication.files import DataSnapshotter, list_segments, log_end
from popmq.broker.replication.follower import ReplicaFollower
from popmq.broker.replication.leader import make_batch
from popmq.broker.replication.replica import ReplicaWriter
from popmq.broker.replication.role import GroupRole

from popmq.config import BrokerConfig, StoreConfig
from popmq.pb.replication.v1 import replication_pb2 as pb

HISTORY = [(1, 0)]


class Disk:
    """Which files of the follower's directory were fsynced, and from which thread (the
    leader's own flush thread fsyncs its files too)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, data_dir: Path) -> None:
        self.synced: list[tuple[str, int]] = []  # (path, thread id)
        real_fsync = os.fsync
        under = os.path.realpath(data_dir) + os.sep

        def fsync(fd: int) -> None:
            real_fsync(fd)
            path = os.readlink(f"/proc/self/fd/{fd}")
            if (path + os.sep).startswith(under):
                self.synced.append((path, threading.get_ident()))

        monkeypatch.setattr(os, "fsync", fsync)

    def threads_since(self, mark: int) -> set[int]:
        return {thread for _, thread in self.synced[mark:]}


class LeaderCall:
    """The leader's side of a stream: batches put in, acknowledgements recorded with what was
    fsynced when each was written."""

    def __init__(self, disk: Disk) -> None:
        self._disk = disk
        self._send, self._receive = anyio.create_memory_object_stream[pb.ReplicaBatch](10)
        self.acks: list[tuple[int, int, set[str]]] = []  # (sequence, commitlog end, synced)
        self._acked = anyio.Event()

    async def read(self) -> Any:
        try:
            return await self._receive.receive()
        except anyio.EndOfStream:
            return grpc.aio.EOF

    async def write(self, report: pb.ReplicaReport) -> None:
        synced = {path for path, _ in self._disk.synced}
        self.acks.append((report.ack.sequence, report.ack.commitlog_end, synced))
        self._acked.set()

    async def round_trip(self, batch: pb.ReplicaBatch) -> tuple[int, int, set[str]]:
        """Send ``batch`` and wait for its acknowledgement."""
        self._acked = anyio.Event()
        await self._send.send(batch)
        with anyio.fail_after(30):  # a hang guard, not a timing: an ack takes milliseconds
            await self._acked.wait()
        return self.acks[-1]


async def leader_at(path: Path) -> Broker:
    broker = Broker(BrokerConfig(name="broker-a", data_dir=path, store=StoreConfig(flush="async")))
    await broker.start()
    await broker.create_topic("T", 1)
    return broker


def segment_name(data_dir: Path) -> str:
    return os.path.realpath(data_dir / "commitlog" / f"{list_segments(data_dir)[-1][0]:020d}")


async def test_a_small_batch_is_applied_on_the_loop_and_fsynced_before_its_ack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    leader = await leader_at(tmp_path / "leader")
    snapshotter = DataSnapshotter(tmp_path / "leader", 0)
    writer = ReplicaWriter(tmp_path / "follower")
    writer.open()
    disk = Disk(monkeypatch, tmp_path / "follower")
    call = LeaderCall(disk)
    role = GroupRole(1, "broker-a-0", "127.0.0.1:1", is_leader=False)
    follower = ReplicaFollower(writer, "broker-a-1", role, lambda _: None)
    loop_thread = threading.get_ident()
    try:
        async with anyio.create_task_group() as group:
            group.start_soon(follower._stream, call)
            for sequence in range(1, 4):
                await leader.send([Message(topic="T", body=f"m{sequence}".encode() * 50)], 0)
                snapshot = snapshotter.take(HISTORY, 0.0)
                assert snapshot.complete and snapshot.commitlog_data
                mark = len(disk.synced)
                acked, end, synced = await call.round_trip(
                    make_batch(snapshot, sequence, 1, HISTORY)
                )
                assert acked == sequence
                assert end == log_end(list_segments(tmp_path / "leader"))
                # every byte durable before the acknowledgement: the segment was fsynced for
                # this batch, before the ack was written
                assert segment_name(tmp_path / "follower") in synced
                assert any(path == segment_name(tmp_path / "follower")
                           for path, _ in disk.synced[mark:])  # fmt: skip
                assert disk.threads_since(mark) == {loop_thread}  # no thread hop
            group.cancel_scope.cancel()
        assert follower.loop_applies == 3 and follower.batches == 3
    finally:
        writer.close()
        await leader.aclose()
    follower_copy = tmp_path / "follower" / "commitlog"
    leader_copy = tmp_path / "leader" / "commitlog"
    for segment in leader_copy.iterdir():
        assert (follower_copy / segment.name).read_bytes() == segment.read_bytes()


async def test_big_groups_resets_and_the_time_after_a_slow_apply_go_to_a_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    leader = await leader_at(tmp_path / "leader")
    snapshotter = DataSnapshotter(tmp_path / "leader", 0)
    writer = ReplicaWriter(tmp_path / "follower")
    writer.open()
    disk = Disk(monkeypatch, tmp_path / "follower")
    call = LeaderCall(disk)
    role = GroupRole(1, "broker-a-0", "127.0.0.1:1", is_leader=False)
    follower = ReplicaFollower(writer, "broker-a-1", role, lambda _: None)
    loop_thread = threading.get_ident()
    sequence = 0

    async def next_batch(**first: bool) -> tuple[set[int], set[str]]:
        """A send's batch, its round trip: (the threads that fsynced, what was fsynced at
        the ack)."""
        nonlocal sequence
        sequence += 1
        await leader.send([Message(topic="T", body=f"m{sequence}".encode() * 50)], 0)
        snapshot = snapshotter.take(HISTORY, 0.0)
        mark = len(disk.synced)
        acked, _, synced = await call.round_trip(
            make_batch(snapshot, sequence, 1, HISTORY, **first)
        )
        assert acked == sequence
        assert segment_name(tmp_path / "follower") in synced  # durable before the ack
        return disk.threads_since(mark), synced

    try:
        async with anyio.create_task_group() as group:
            group.start_soon(follower._stream, call)
            threads, _ = await next_batch(reset=True)  # a reset moves files: a thread
            assert loop_thread not in threads
            threads, _ = await next_batch()
            assert threads == {loop_thread}
            monkeypatch.setattr(follower_module, "LOOP_APPLY_BYTES", 100)  # a big group
            threads, _ = await next_batch()
            assert loop_thread not in threads
            monkeypatch.setattr(follower_module, "LOOP_APPLY_BYTES", 256 << 10)
            monkeypatch.setattr(follower_module, "LOOP_APPLY_SLOW_S", -1.0)  # every one slow
            threads, _ = await next_batch()
            assert threads == {loop_thread}  # applied on the loop, found slow ...
            threads, _ = await next_batch()
            assert loop_thread not in threads  # ... so the next ones go to a thread
            follower._threads_until = 0.0  # the pause is over: the loop again
            threads, _ = await next_batch()
            assert threads == {loop_thread}
            group.cancel_scope.cancel()
        assert follower.loop_applies == 3 and follower.batches == 6
    finally:
        writer.close()
        await leader.aclose()
