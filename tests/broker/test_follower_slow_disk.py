"""A disk that stays slow keeps a follower's applies in a thread (review, helper
review-s10b). The switch timed only loop applies: once the pause ran out, the next small
group went back to the loop and blocked it for the disk's whole stall again (a stall past 2
lease TTLs stops the keepalives: the follower loses its lease and its stream)."""

from __future__ import annotations

import threading
from pathlib import Path

import anyio
import pytest
from popmq.broker.contract.types import Message
from popmq.broker.replication import follower as follower_module
from popmq.broker.replication.files import DataSnapshotter
from popmq.broker.replication.follower import ReplicaFollower
from popmq.broker.replication.leader import make_batch
from popmq.broker.replication.replica import ReplicaWriter
from popmq.broker.replication.role import GroupRole
from test_replication_follower_loop import HISTORY, Disk, LeaderCall, leader_at


class SlowDisk:
    """time.monotonic() for the follower module; each fsync round of the writer takes
    ``stall_s`` of it while ``stall_s`` is set (a slow disk, no real time passes)."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.stall_s = 0.0

    def monotonic(self) -> float:
        return self.now


async def test_a_disk_that_stays_slow_keeps_the_applies_in_a_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    leader = await leader_at(tmp_path / "leader")
    snapshotter = DataSnapshotter(tmp_path / "leader", 0)
    writer = ReplicaWriter(tmp_path / "follower")
    writer.open()
    clock = SlowDisk()
    monkeypatch.setattr(follower_module, "time", clock)
    real_sync = writer.sync

    def slow_sync() -> None:
        real_sync()
        clock.now += clock.stall_s

    monkeypatch.setattr(writer, "sync", slow_sync)
    disk = Disk(monkeypatch, tmp_path / "follower")
    call = LeaderCall(disk)
    role = GroupRole(1, "broker-a-0", "127.0.0.1:1", is_leader=False)
    follower = ReplicaFollower(writer, "broker-a-1", role, lambda _: None)  # type: ignore[arg-type, return-value]
    loop_thread = threading.get_ident()
    sequence = 0

    async def next_batch() -> set[int]:
        nonlocal sequence
        sequence += 1
        await leader.send([Message(topic="T", body=f"m{sequence}".encode() * 50)], 0)
        mark = len(disk.synced)
        acked, _, _ = await call.round_trip(
            make_batch(snapshotter.take(HISTORY, 0.0), sequence, 1, HISTORY)
        )
        assert acked == sequence
        return disk.threads_since(mark)

    try:
        async with anyio.create_task_group() as group:
            group.start_soon(follower._stream, call)
            assert await next_batch() == {loop_thread}  # a fast disk: on the loop
            clock.stall_s = 2.5  # the disk turns slow, and stays slow
            assert await next_batch() == {loop_thread}  # found slow (it blocked the loop) ...
            for _ in range(4):  # ... so the next ones go to a thread, slow as well
                assert loop_thread not in await next_batch()
            # The pause after the loop apply is over (4 * 2.5 s in a thread); the disk is as
            # slow as ever, and the thread applies said so: not back on the loop.
            assert clock.now >= 1000.0 + 2.5 + follower_module.LOOP_APPLY_PAUSE_S
            assert loop_thread not in await next_batch(), "a slow disk blocked the loop again"
            group.cancel_scope.cancel()
    finally:
        writer.close()
        await leader.aclose()
