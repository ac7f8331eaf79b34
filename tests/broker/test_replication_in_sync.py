"""The leader's in-sync bookkeeping and sync barrier, on virtual time (no network)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import anyio
import pytest
from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.replication.epochs import EpochHistory
from popmq.broker.replication.in_sync import InSyncSet
from popmq.broker.replication.leader import ReplicationLeader
from popmq.broker.replication.role import GroupRole, StaticRoleSource
from popmq.broker.store import changes

from popmq.clock import LoopClock
from popmq.config import ReplicationConfig
from popmq.pb.replication.v1 import replication_pb2 as pb

pytestmark = pytest.mark.looptime

ROLE = GroupRole(epoch=3, leader_name="broker-a", leader_address="127.0.0.1:1", is_leader=True)


class ManualClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_follower_joins_when_caught_up_and_leaves_after_the_lag_bound() -> None:
    clock = ManualClock()
    in_sync = InSyncSet("a0", max_lag_s=15.0, clock=clock)
    in_sync.connected("a1")
    assert not in_sync.evaluate()  # connected, never caught up: not in sync
    in_sync.acked("a1", 1, taken_at=100.0, complete=False, end=10)
    assert not in_sync.evaluate()  # a clipped batch says nothing about catching up
    in_sync.acked("a1", 2, taken_at=100.0, complete=True, end=20)
    change = in_sync.evaluate()
    assert change.joined == {"a1"} and not change.left
    in_sync.apply(change)
    assert in_sync.size == 2
    clock.now = 115.0
    assert not in_sync.evaluate()  # exactly at the bound: still in
    clock.now = 115.001
    change = in_sync.evaluate()
    assert change.left == {"a1"}
    in_sync.apply(change)
    assert in_sync.size == 1
    in_sync.acked("a1", 3, taken_at=115.0, complete=True, end=30)  # caught up again
    assert in_sync.evaluate().joined == {"a1"}


def test_a_disconnected_follower_leaves_at_once() -> None:
    clock = ManualClock()
    in_sync = InSyncSet("a0", max_lag_s=15.0, clock=clock)
    in_sync.connected("a1")
    in_sync.acked("a1", 1, taken_at=100.0, complete=True, end=0)
    in_sync.apply(in_sync.evaluate())
    in_sync.disconnected("a1")
    assert in_sync.evaluate().left == {"a1"}


def test_a_reconnected_follower_rejoins_only_once_it_caught_up_again() -> None:
    """Its new stream may start over (an emptied disk: a reset) or be cut back: what it
    acknowledged on the old one says nothing about what it holds now. Counted in sync at once,
    an empty node could be recorded in the in-sync set and elected leader."""
    clock = ManualClock()
    in_sync = InSyncSet("a0", max_lag_s=15.0, clock=clock)
    in_sync.connected("a1")
    in_sync.acked("a1", 1, taken_at=100.0, complete=True, end=500)
    in_sync.apply(in_sync.evaluate())
    in_sync.disconnected("a1")
    in_sync.apply(in_sync.evaluate())
    clock.now = 101.0
    in_sync.connected("a1")
    assert not in_sync.evaluate()  # its last catch-up is 1 s old, but from the old stream
    in_sync.acked("a1", 2, taken_at=101.0, complete=False, end=40)  # bootstrapping
    assert not in_sync.evaluate()
    in_sync.acked("a1", 3, taken_at=101.5, complete=True, end=500)
    assert in_sync.evaluate().joined == {"a1"}


class RecordingRoles(StaticRoleSource):
    """Records each report with the members the leader was waiting for at that moment."""

    def __init__(self) -> None:
        super().__init__(ROLE)
        self.leader: ReplicationLeader | None = None
        self.seen: list[tuple[frozenset[str], frozenset[str]]] = []

    async def report_in_sync(self, epoch: int, members: frozenset[str]) -> None:
        assert self.leader is not None
        self.seen.append((members, frozenset(self.leader.in_sync.members)))
        await super().report_in_sync(epoch, members)


def write() -> None:
    """A write of a replicated file (the barrier's tickets are the change marks it moves)."""
    changes.note(changes.LOGS)


def make_leader(tmp_path: Path, roles: StaticRoleSource, **config: object) -> ReplicationLeader:
    settings = ReplicationConfig(**{"mode": "sync", "min_in_sync": 2, **config})
    return ReplicationLeader(
        tmp_path, "a0", ROLE, roles, settings, EpochHistory(tmp_path), clock=LoopClock()
    )


async def test_reports_shrink_before_and_growth_after_changing_who_is_waited_for(
    tmp_path: Path,
) -> None:
    roles = RecordingRoles()
    leader = roles.leader = make_leader(tmp_path, roles)
    loop = asyncio.get_running_loop()
    async with leader:
        await asyncio.sleep(0.1)
        assert roles.seen[-1] == ({"a0"}, set())
        leader.in_sync.connected("a1")
        await leader.acknowledged("a1", changes.newest(), loop.time(), True, 0)
        # growth: a1 was already waited for when the set {a0, a1} was reported
        assert roles.seen[-1] == ({"a0", "a1"}, {"a1"})
        await asyncio.sleep(16.0)  # no acknowledgement for longer than max_lag_s
        # shrink: reported while a1 was still waited for, then dropped
        assert roles.seen[-1] == ({"a0"}, {"a1"})
        assert leader.in_sync.members == set()
    assert [(e, set(m)) for e, m in roles.reports] == [
        (3, {"a0"}), (3, {"a0", "a1"}), (3, {"a0"}),
    ]  # fmt: skip


async def test_a_send_is_refused_at_once_when_too_few_nodes_are_in_sync(tmp_path: Path) -> None:
    leader = make_leader(tmp_path, StaticRoleSource(ROLE))
    async with leader:
        with pytest.raises(RefusedError) as refused:
            leader.check_available()
        assert refused.value.code == Code.HA_NOT_AVAILABLE
        assert "only 1 of the 2 nodes" in refused.value.message


async def test_the_barrier_waits_for_a_batch_taken_after_the_write(tmp_path: Path) -> None:
    leader = make_leader(tmp_path, StaticRoleSource(ROLE))
    loop = asyncio.get_running_loop()
    async with leader:
        leader.in_sync.connected("a1")
        old = changes.newest()  # a batch in flight when the write happens
        await leader.acknowledged("a1", old, loop.time(), True, 0)
        leader.check_available()
        write()
        waiter = asyncio.ensure_future(leader.replicated())
        await asyncio.sleep(1.0)
        assert not waiter.done()  # the batch it acknowledged was taken before the write
        await leader.acknowledged("a1", changes.newest(), loop.time(), True, 0)
        await asyncio.wait_for(waiter, 0.1)
        assert loop.time() == pytest.approx(1.0, abs=0.01)


async def test_the_barrier_times_out_with_slave_persistence_timeout(tmp_path: Path) -> None:
    leader = make_leader(tmp_path, StaticRoleSource(ROLE), sync_timeout_ms=2_000)
    loop = asyncio.get_running_loop()
    async with leader:
        leader.in_sync.connected("a1")
        await leader.acknowledged("a1", changes.newest(), loop.time(), True, 0)
        start = loop.time()
        write()
        with pytest.raises(RefusedError) as refused:
            await leader.replicated()
        assert refused.value.code == Code.SLAVE_PERSISTENCE_TIMEOUT
        assert loop.time() - start == pytest.approx(2.0, abs=0.01)


async def test_async_mode_does_not_wait(tmp_path: Path) -> None:
    leader = make_leader(tmp_path, StaticRoleSource(ROLE), mode="async")
    async with leader:
        leader.in_sync.connected("a1")
        await leader.acknowledged("a1", changes.newest(), 0.0, True, 0)
        await asyncio.wait_for(leader.replicated(), 0.001)


async def test_a_write_is_not_acknowledged_once_the_node_stopped_leading(tmp_path: Path) -> None:
    roles = StaticRoleSource(ROLE)
    leader = make_leader(tmp_path, roles, min_in_sync=1)
    async with leader:
        await roles.set(GroupRole(4, "broker-a", "127.0.0.1:2", is_leader=False))
        with pytest.raises(RefusedError) as refused:
            await leader.replicated()
        assert refused.value.code == Code.HA_NOT_AVAILABLE


class FlakyRoles(StaticRoleSource):
    """An election store that refuses in-sync changes until ``ok`` is set."""

    def __init__(self) -> None:
        super().__init__(ROLE)
        self.ok = True

    async def report_in_sync(self, epoch: int, members: frozenset[str]) -> None:
        if not self.ok:
            raise ConnectionError("etcd unreachable")
        await super().report_in_sync(epoch, members)


async def test_a_shrink_that_cannot_be_recorded_keeps_the_member_waited_for(
    tmp_path: Path,
) -> None:
    roles = FlakyRoles()
    leader = make_leader(tmp_path, roles, min_in_sync=1)
    loop = asyncio.get_running_loop()
    async with leader:
        leader.in_sync.connected("a1")
        await leader.acknowledged("a1", changes.newest(), loop.time(), True, 0)
        assert leader.in_sync.members == {"a1"}
        roles.ok = False
        await asyncio.sleep(20.0)  # a1 is behind, but its leaving cannot be recorded
        assert leader.in_sync.members == {"a1"}  # so writes still wait for it
        roles.ok = True
        await asyncio.sleep(1.0)  # retried at the next evaluation
        assert leader.in_sync.members == set()
        assert roles.reports[-1] == (3, frozenset({"a0"}))


async def test_one_acknowledgement_answers_every_write_made_before_its_batch(
    tmp_path: Path,
) -> None:
    """Group commit: writes waiting on the barrier are all answered by the first batch taken
    after them, whatever their number; a write after that batch waits for the next one."""
    leader = make_leader(tmp_path, StaticRoleSource(ROLE))
    loop = asyncio.get_running_loop()
    async with leader:
        leader.in_sync.connected("a1")
        await leader.acknowledged("a1", changes.newest(), loop.time(), True, 0)
        write()
        early = [asyncio.ensure_future(leader.replicated()) for _ in range(50)]
        await asyncio.sleep(0.1)
        batch = changes.newest()  # taken after the 50 writes
        write()
        late = asyncio.ensure_future(leader.replicated())
        await asyncio.sleep(0.1)
        await leader.acknowledged("a1", batch, loop.time(), True, 0)
        await asyncio.sleep(0)
        assert all(w.done() and w.exception() is None for w in early)
        assert not late.done()
        await leader.acknowledged("a1", changes.newest(), loop.time(), True, 0)
        await asyncio.wait_for(late, 0.1)


async def test_a_cancelled_write_leaves_the_barrier_to_the_others(tmp_path: Path) -> None:
    leader = make_leader(tmp_path, StaticRoleSource(ROLE), sync_timeout_ms=2_000)
    loop = asyncio.get_running_loop()
    async with leader:
        leader.in_sync.connected("a1")
        await leader.acknowledged("a1", changes.newest(), loop.time(), True, 0)
        write()
        gone = asyncio.ensure_future(leader.replicated())
        kept = asyncio.ensure_future(leader.replicated())
        await asyncio.sleep(0.5)
        gone.cancel()
        with pytest.raises(RefusedError) as refused:
            await kept  # still timed out at its own deadline
        assert refused.value.code == Code.SLAVE_PERSISTENCE_TIMEOUT
        assert loop.time() == pytest.approx(2.0, abs=0.01)


async def test_the_barrier_waits_for_every_member_s_complete_batch_taken_after_the_write(
    tmp_path: Path,
) -> None:
    """Two followers: acknowledgements in any order, an incomplete batch (it may not hold the
    write), an older batch acknowledged late answer nothing until each member acknowledged a
    complete batch taken after the write."""
    leader = make_leader(tmp_path, StaticRoleSource(ROLE), min_in_sync=3)
    loop = asyncio.get_running_loop()
    async with leader:
        for node in ("a1", "a2"):
            leader.in_sync.connected(node)
            await leader.acknowledged(node, changes.newest(), loop.time(), True, 0)
        assert leader.in_sync.members == {"a1", "a2"}
        stale = changes.newest()  # taken before the write, acknowledged after it
        write()
        waiter = asyncio.ensure_future(leader.replicated())
        await asyncio.sleep(0.1)
        await leader.acknowledged("a1", changes.newest(), loop.time(), True, 0)
        await leader.acknowledged("a2", changes.newest(), loop.time(), False, 0)
        await leader.acknowledged("a2", stale, loop.time(), True, 0)
        await asyncio.sleep(0.1)
        assert not waiter.done()
        await leader.acknowledged("a2", changes.newest(), loop.time(), True, 0)
        await asyncio.wait_for(waiter, 0.1)


class FakeStream:
    """One follower's Replicate stream, without gRPC: reports in, batches out."""

    def __init__(self, node: str, leader: ReplicationLeader) -> None:
        self.reports: asyncio.Queue[pb.ReplicaReport] = asyncio.Queue()
        self.reports.put_nowait(pb.ReplicaReport(hello=pb.Hello(node=node)))  # an empty copy
        self.batches: list[pb.ReplicaBatch] = []
        self.wrote = asyncio.Event()
        self.leader = leader
        self.members_at_first_write: frozenset[str] | None = None

    def __aiter__(self) -> FakeStream:
        return self

    async def __anext__(self) -> pb.ReplicaReport:
        return await self.reports.get()

    async def write(self, batch: pb.ReplicaBatch) -> None:
        if not self.batches:
            self.members_at_first_write = self.leader.members
        self.batches.append(batch)
        self.wrote.set()

    async def abort(self, code: object, details: str) -> None:
        raise RuntimeError(f"aborted: {code} {details}")

    def ack(self, sequence: int) -> None:
        self.reports.put_nowait(pb.ReplicaReport(ack=pb.Ack(sequence=sequence)))


async def until(check: Callable[[], bool]) -> None:
    while True:
        if check():
            return
        await asyncio.sleep(0.01)


async def test_a_reconnecting_follower_leaves_the_recorded_set_before_it_is_sent_anything(
    tmp_path: Path,
) -> None:
    """A new stream may reset or cut the follower's copy (a wiped disk bootstraps from
    nothing). Until the shrink is recorded, the election could pick that node while it holds
    nothing: so the shrink is recorded before the first batch goes out, not at the next
    evaluation."""
    roles = RecordingRoles()
    leader = roles.leader = make_leader(tmp_path, roles)
    loop = asyncio.get_running_loop()
    async with leader:
        leader.in_sync.connected("a1")
        await leader.acknowledged("a1", changes.newest(), loop.time(), True, 0)
        assert roles.reports[-1] == (3, frozenset({"a0", "a1"}))
        await asyncio.sleep(0.1)  # between two periodic evaluations
        stream = FakeStream("a1", leader)
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(leader.Replicate, stream, stream)
            await asyncio.wait_for(stream.wrote.wait(), 5)
            assert stream.batches[0].reset  # it starts over from nothing
            assert stream.members_at_first_write == {"a0"}
            assert roles.reports[-1] == (3, frozenset({"a0"}))
            stream.ack(1)  # the complete batch: it holds everything now, and rejoins
            await asyncio.wait_for(until(lambda: "a1" in leader.in_sync.members), 5)
            assert roles.reports[-1] == (3, frozenset({"a0", "a1"}))
            tasks.cancel_scope.cancel()


async def test_a_late_ack_of_an_older_stream_does_not_count_as_caught_up(tmp_path: Path) -> None:
    """An acknowledgement read from the old stream after the follower opened a new one (which
    may have reset its copy) says nothing of what the follower holds now."""
    leader = make_leader(tmp_path, StaticRoleSource(ROLE))
    async with leader:
        old, new = FakeStream("a1", leader), FakeStream("a1", leader)
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(leader.Replicate, old, old)
            await asyncio.wait_for(old.wrote.wait(), 5)
            tasks.start_soon(leader.Replicate, new, new)  # e.g. the follower restarted, wiped
            await asyncio.wait_for(new.wrote.wait(), 5)
            old.ack(1)  # the old stream's complete batch, read only now
            await asyncio.sleep(1.0)
            assert "a1" not in leader.in_sync.members
            assert leader.in_sync.followers["a1"].caught_up_at is None
            new.ack(1)
            await asyncio.wait_for(until(lambda: "a1" in leader.in_sync.members), 5)
            tasks.cancel_scope.cancel()


async def test_a_closed_leader_records_no_in_sync_set(tmp_path: Path) -> None:
    """After a fence the node leads again through a new ReplicationLeader (same epoch): an
    acknowledgement still read by the old one must not overwrite what the new one recorded."""
    roles = StaticRoleSource(ROLE)
    leader = make_leader(tmp_path, roles)
    loop = asyncio.get_running_loop()
    async with leader:
        await asyncio.sleep(0.1)
    reported = list(roles.reports)
    leader.in_sync.connected("a1")
    await leader.acknowledged("a1", changes.newest(), loop.time(), True, 0)
    await leader.reevaluate()
    assert roles.reports == reported


async def test_a_bootstrapping_follower_is_in_sync_only_once_the_topics_reached_it(
    tmp_path: Path,
) -> None:
    """The leader counts a follower that starts from nothing in sync only when it acknowledged
    the batch that carried the documents (topics.log among them), not the clipped ones before
    it (here: the bytes of the older epoch, which no batch may cross)."""
    from popmq.broker.contract.types import Message
    from popmq.broker.core import Broker
    from popmq.broker.replication.files import list_segments, log_end

    from popmq.config import BrokerConfig, StoreConfig

    broker = Broker(BrokerConfig(name="broker-a", data_dir=tmp_path,
                                 store=StoreConfig(flush="async")))  # fmt: skip
    await broker.start()
    await broker.create_topic("T", 1)
    await broker.send([Message(topic="T", body=b"epoch 2")], 0)
    middle = log_end(list_segments(tmp_path))
    await broker.send([Message(topic="T", body=b"epoch 3")], 0)
    await broker.aclose()
    history = EpochHistory(tmp_path)
    history.begin(2, 0)
    history.begin(3, middle)
    leader = ReplicationLeader(tmp_path, "a0", ROLE, StaticRoleSource(ROLE),
                               ReplicationConfig(mode="sync", min_in_sync=2), history,
                               clock=LoopClock())  # fmt: skip
    async with leader:
        stream = FakeStream("a1", leader)
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(leader.Replicate, stream, stream)
            await asyncio.wait_for(stream.wrote.wait(), 5)
            first = stream.batches[0]
            assert first.reset and not first.complete and not first.files
            stream.ack(1)
            await asyncio.sleep(1.0)
            assert "a1" not in leader.in_sync.members  # it holds bytes, not the topics
            await asyncio.wait_for(until(lambda: len(stream.batches) >= 2), 5)
            second = stream.batches[1]
            assert second.complete and "topics.log" in {f.path for f in second.files}
            stream.ack(2)
            await asyncio.wait_for(until(lambda: "a1" in leader.in_sync.members), 5)
            tasks.cancel_scope.cancel()


async def test_a_follower_that_stops_acknowledging_loses_its_stream_after_max_lag(
    tmp_path: Path,
) -> None:
    """The wait for each acknowledgement is bounded by max_lag_s (one scope and one timer
    per stream, which looks at the read in progress): acknowledgements that keep coming keep
    the stream, a silence of max_lag_s ends it."""
    from popmq.broker.replication.files import DataSnapshotter
    from popmq.broker.replication.leader import _Session

    leader = make_leader(tmp_path, StaticRoleSource(ROLE), max_lag_s=5.0)
    session = _Session(leader, "a1", DataSnapshotter(tmp_path, 0), generation=1)
    leader._sessions["a1"] = 1
    leader.in_sync.connected("a1")
    loop = asyncio.get_running_loop()

    async def reports() -> AsyncIterator[pb.ReplicaReport]:
        for sequence in (1, 2, 3):  # each 4 s after the last: inside max_lag_s
            await asyncio.sleep(4.0)
            session.in_flight.append((sequence, changes.newest(), loop.time(), True))
            yield pb.ReplicaReport(ack=pb.Ack(sequence=sequence, commitlog_end=0))
        await asyncio.sleep(3600)  # then nothing

    started = loop.time()
    await session._read_acks(reports())
    assert session.failure is not None and session.failure[1] == "no acknowledgement"
    assert loop.time() - started == pytest.approx(12.0 + 5.0, abs=0.1)
    assert not session.in_flight
