"""What the leader's replication stream costs per batch, and the bounds it keeps (virtual
time, no network)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from popmq.broker.replication.epochs import EpochHistory
from popmq.broker.replication.files import DataSnapshotter
from popmq.broker.replication.leader import ReplicationLeader, _Session
from popmq.broker.replication.role import GroupRole, StaticRoleSource
from popmq.broker.store import changes

from popmq.clock import LoopClock
from popmq.config import ReplicationConfig
from popmq.pb.replication.v1 import replication_pb2 as pb

pytestmark = pytest.mark.looptime

ROLE = GroupRole(epoch=3, leader_name="broker-a", leader_address="127.0.0.1:1", is_leader=True)


def _session(tmp_path: Path, max_lag_s: float) -> tuple[ReplicationLeader, _Session]:
    config = ReplicationConfig(mode="sync", min_in_sync=2, max_lag_s=max_lag_s)
    leader = ReplicationLeader(tmp_path, "a0", ROLE, StaticRoleSource(ROLE), config,
                               EpochHistory(tmp_path), clock=LoopClock())  # fmt: skip
    session = _Session(leader, "a1", DataSnapshotter(tmp_path, 0), generation=1)
    leader._sessions["a1"] = 1
    leader.in_sync.connected("a1")
    return leader, session


def _ack(session: _Session, leader: ReplicationLeader, sequence: int) -> pb.ReplicaReport:
    loop = asyncio.get_running_loop()
    session.in_flight.append((sequence, changes.newest(), loop.time(), True))
    return pb.ReplicaReport(ack=pb.Ack(sequence=sequence, commitlog_end=0))


async def test_reading_acknowledgements_makes_no_timer_per_acknowledgement(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wait for each acknowledgement is bounded by one timer per stream, not by a
    deadline moved (a timer cancelled and made again) twice per acknowledgement."""
    leader, session = _session(tmp_path, max_lag_s=15.0)
    loop = asyncio.get_running_loop()
    made = 0
    call_at = loop.call_at

    def counting_call_at(*args: object, **kwargs: object) -> asyncio.TimerHandle:
        nonlocal made
        made += 1
        return call_at(*args, **kwargs)  # type: ignore[arg-type]

    async def reports() -> AsyncIterator[pb.ReplicaReport]:
        for sequence in range(1, 201):
            yield _ack(session, leader, sequence)

    monkeypatch.setattr(loop, "call_at", counting_call_at)
    with pytest.raises(StopAsyncIteration):
        await session._read_acks(reports())
    assert made <= 2, f"{made} timers for 200 acknowledgements"
    assert not session.in_flight


async def test_a_slow_acknowledgement_step_does_not_count_against_the_next_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bound is per read: time the leader spends counting an acknowledgement (here 9 s,
    as a report to etcd that hangs) is not the follower's silence. After it, the next read
    still gets all of max_lag_s (5 s), then the stream ends."""
    leader, session = _session(tmp_path, max_lag_s=5.0)
    loop = asyncio.get_running_loop()
    acknowledge = session._acknowledge

    async def slow_acknowledge(report: pb.ReplicaReport) -> bool:
        await asyncio.sleep(9.0)
        return await acknowledge(report)

    monkeypatch.setattr(session, "_acknowledge", slow_acknowledge)

    async def reports() -> AsyncIterator[pb.ReplicaReport]:
        await asyncio.sleep(4.9)
        yield _ack(session, leader, 1)
        await asyncio.sleep(4.9)  # 13.9 s after the start, 4.9 s after the read began
        yield _ack(session, leader, 2)
        await asyncio.sleep(3600)

    started = loop.time()
    await session._read_acks(reports())
    assert session.failure is not None and session.failure[1] == "no acknowledgement"
    # 4.9 + 9 + 4.9 + 9 = 27.8 s of reads and counting, then a silent read of 5 s.
    assert loop.time() - started == pytest.approx(27.8 + 5.0, abs=0.1)
    assert not session.in_flight


class _AckingStream:
    """A follower's Replicate stream without gRPC that acknowledges each batch after
    ``round_trip_s`` (its transfer and fsync)."""

    def __init__(self, node: str, round_trip_s: float) -> None:
        self.reports: asyncio.Queue[pb.ReplicaReport] = asyncio.Queue()
        self.reports.put_nowait(pb.ReplicaReport(hello=pb.Hello(node=node)))  # an empty copy
        self.written_at: list[float] = []
        self.batches: list[pb.ReplicaBatch] = []
        self.acked_at: list[float] = []
        self.round_trip_s = round_trip_s

    def __aiter__(self) -> _AckingStream:
        return self

    async def __anext__(self) -> pb.ReplicaReport:
        return await self.reports.get()

    async def write(self, batch: pb.ReplicaBatch) -> None:
        loop = asyncio.get_running_loop()
        self.written_at.append(loop.time())
        self.batches.append(batch)

        def ack() -> None:
            self.acked_at.append(loop.time())
            self.reports.put_nowait(pb.ReplicaReport(ack=pb.Ack(sequence=batch.sequence)))

        loop.call_later(self.round_trip_s, ack)

    async def abort(self, code: object, details: str) -> None:
        raise RuntimeError(f"aborted: {code} {details}")


async def _batches_under_writes(
    tmp_path: Path, interval_ms: float, round_trip_s: float
) -> tuple[_AckingStream, list[float]]:
    """0.2 s of sync writes (4 writers, one every 2 ms each) against a follower with the
    given round trip: the stream, and how long each write waited on the barrier."""
    config = ReplicationConfig(mode="sync", min_in_sync=2, batch_interval_ms=interval_ms)
    leader = ReplicationLeader(tmp_path, "a0", ROLE, StaticRoleSource(ROLE), config,
                               EpochHistory(tmp_path), clock=LoopClock())  # fmt: skip
    stream = _AckingStream("a1", round_trip_s)
    loop = asyncio.get_running_loop()
    waits: list[float] = []
    async with leader:
        task = asyncio.ensure_future(leader.Replicate(stream, stream))
        while True:  # until the follower joined the in-sync set
            if "a1" in leader.in_sync.members:
                break
            await asyncio.sleep(0.01)
        start = loop.time()
        written = len(stream.written_at)

        async def writer() -> None:
            while loop.time() - start < 0.2:
                began = loop.time()
                changes.note(changes.LOGS)  # a write of a replicated file
                await leader.replicated()
                waits.append(loop.time() - began)
                await asyncio.sleep(0.002)

        await asyncio.gather(*(writer() for _ in range(4)))
        task.cancel()
        del stream.written_at[:written]
    return stream, waits


async def test_a_batch_interval_makes_fewer_fuller_batches_and_bounds_the_added_wait(
    tmp_path: Path,
) -> None:
    """With a follower that answers in 1 ms, batches go out at most every batch_interval_ms
    (20 ms): about 10 in 0.2 s of writes instead of one per round trip (about 100), and no
    write waits longer than one interval and two round trips."""
    at_once, at_once_waits = await _batches_under_writes(tmp_path / "a", 0, 0.001)
    spaced, spaced_waits = await _batches_under_writes(tmp_path / "b", 20, 0.001)
    assert len(at_once.written_at) > 60
    assert 8 <= len(spaced.written_at) <= 12
    gaps = [b - a for a, b in zip(spaced.written_at, spaced.written_at[1:], strict=False)]
    assert min(gaps) >= 0.020 - 1e-6
    assert max(spaced_waits) <= 0.020 + 2 * 0.001 + 1e-3
    assert max(at_once_waits) <= 2 * 0.001 + 1e-3


async def test_a_round_trip_longer_than_the_batch_interval_adds_no_wait(
    tmp_path: Path,
) -> None:
    """A follower slower than the interval (30 ms against 20): the batches go out when they
    would without an interval, and the writes wait as long."""
    plain, plain_waits = await _batches_under_writes(tmp_path / "a", 0, 0.030)
    spaced, spaced_waits = await _batches_under_writes(tmp_path / "b", 20, 0.030)
    assert len(spaced.written_at) >= 5
    start_plain, start_spaced = plain.written_at[0], spaced.written_at[0]
    assert [round(t - start_spaced, 6) for t in spaced.written_at] == [
        round(t - start_plain, 6) for t in plain.written_at
    ]
    assert max(spaced_waits) == pytest.approx(max(plain_waits), abs=1e-6)


async def test_a_write_whose_bytes_are_in_the_batch_in_flight_waits_for_that_batch_only(
    tmp_path: Path,
) -> None:
    """A write's bytes can go out in a batch taken before the write asks the barrier (taken
    while the write waited for its local fsync, or for another write). That batch's
    acknowledgement answers it: no empty batch and second round trip after it. A write made
    after the batch was taken still waits for the next one, which carries it."""
    config = ReplicationConfig(mode="sync", min_in_sync=2, poll_ms=100)
    leader = ReplicationLeader(tmp_path, "a0", ROLE, StaticRoleSource(ROLE), config,
                               EpochHistory(tmp_path), clock=LoopClock())  # fmt: skip
    stream = _AckingStream("a1", round_trip_s=0.5)
    journal = tmp_path / "pop" / "journal.log"
    journal.parent.mkdir()
    journal.write_bytes(b"")
    loop = asyncio.get_running_loop()

    def append(data: bytes) -> None:  # as the pop journal does: the bytes, then the mark
        with journal.open("ab") as file:
            file.write(data)
        changes.note(changes.LOGS)

    def journal_bytes(batch: pb.ReplicaBatch) -> bytes:
        return b"".join(f.data for f in batch.files if f.path == "pop/journal.log")

    async with leader:
        task = asyncio.ensure_future(leader.Replicate(stream, stream))
        while True:  # until the follower joined the in-sync set
            if "a1" in leader.in_sync.members:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)  # the stream is idle: caught up, no batch in flight
        sent = len(stream.batches)

        append(b"first")  # written; the leader's next look (poll_ms) takes it ...
        await asyncio.sleep(0.15)
        assert len(stream.batches) == sent + 1  # ... into a batch, in flight for 0.5 s
        assert journal_bytes(stream.batches[-1]) == b"first"
        asked = loop.time()
        first = asyncio.ensure_future(leader.replicated())  # the first write asks only now
        await asyncio.sleep(0)
        append(b"second")  # written after that batch was taken
        second = asyncio.ensure_future(leader.replicated())

        await first
        answered = loop.time() - asked
        assert answered < 0.5, f"answered after {answered:.3f} s: one more round trip"
        assert not second.done()  # the batch in flight does not hold it
        await second
        assert loop.time() - asked == pytest.approx(0.35 + 0.5, abs=0.05)
        assert len(stream.batches) == sent + 2
        assert journal_bytes(stream.batches[-1]) == b"second"
        task.cancel()
