"""A follower's copy of a leader's data directory is a broker: everything that decides delivery
travels (files.py on the leader, replica.py on the follower), with no network in between."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from popmq.broker.contract.errors import Code
from popmq.broker.contract.types import AckEntry, Message, PopRequest
from popmq.broker.core import Broker
from popmq.broker.replication import epochs
from popmq.broker.replication.files import DataSnapshotter, list_segments, log_end
from popmq.broker.replication.leader import make_batch
from popmq.broker.replication.replica import ReplicationError, ReplicaWriter, check_path

from popmq.config import BrokerConfig, StoreConfig
from popmq.pb.replication.v1 import replication_pb2 as pb


def broker_at(path: Path) -> Broker:
    return Broker(BrokerConfig(name="broker-a", data_dir=path, store=StoreConfig(flush="async")))


def copy(source: Path, writer: ReplicaWriter, snapshotter: DataSnapshotter, epoch: int = 1,
         history: list[epochs.Entry] | None = None, **first: object) -> int:  # fmt: skip
    """Send batches until one is complete; returns how many were sent."""
    sent = 0
    while True:
        snapshot = snapshotter.take(history or [(epoch, 0)], 0.0)
        sent += 1
        batch = make_batch(snapshot, sent, epoch, history or [(epoch, 0)],
                           **(first if sent == 1 else {}))  # type: ignore[arg-type]  # fmt: skip
        writer.apply(batch, known_epoch=0)
        if snapshot.complete:
            return sent


async def test_a_promoted_copy_has_the_messages_the_acks_and_the_handles(tmp_path: Path) -> None:
    leader = broker_at(tmp_path / "leader")
    await leader.start()
    try:
        await leader.create_topic("T", 2)
        await leader.send([Message(topic="T", body=f"m{i}".encode()) for i in range(10)], 0)
        popped = await leader.pop(PopRequest("G", "T", 0, max_messages=4, invisible_time_ms=60_000))
        assert len(popped.messages) == 4
        leader.journal_in_flight()
        acked = popped.messages[:2]
        results = await leader.ack("G", "T", [AckEntry(m.receipt_handle) for m in acked])
        assert all(r.code == Code.OK for r in results)
        writer = ReplicaWriter(tmp_path / "follower")
        writer.open()
        copy(tmp_path / "leader", writer, DataSnapshotter(tmp_path / "leader", 0))
        writer.close()
    finally:
        await leader.aclose()
    follower = broker_at(tmp_path / "follower")
    await follower.start()
    try:
        assert [t.name for t in await follower.list_topics() if t.name == "T"] == ["T"]
        again = await follower.pop(PopRequest("G", "T", 0, max_messages=32))
        bodies = sorted(m.message.body for m in again.messages)
        # not the 2 acked, not the 2 still invisible: the 6 never popped
        assert bodies == sorted(f"m{i}".encode() for i in range(4, 10))
        in_flight = popped.messages[2]
        results = await follower.ack("G", "T", [AckEntry(in_flight.receipt_handle)])
        assert results[0].code == Code.OK, results[0].message  # the old leader's handle
    finally:
        await follower.aclose()


async def test_appends_travel_in_later_batches_and_a_large_log_in_several(
    tmp_path: Path,
) -> None:
    leader = broker_at(tmp_path / "leader")
    await leader.start()
    writer = ReplicaWriter(tmp_path / "follower")
    writer.open()
    try:
        await leader.create_topic("T", 1)
        snapshotter = DataSnapshotter(tmp_path / "leader", 0, max_bytes=4096)
        body = b"x" * 1000
        await leader.send([Message(topic="T", body=body) for _ in range(20)], 0)
        assert copy(tmp_path / "leader", writer, snapshotter) > 1  # clipped at whole frames
        await leader.send([Message(topic="T", body=b"late")], 0)
        copy(tmp_path / "leader", writer, snapshotter)
        leader_end = log_end(list_segments(tmp_path / "leader"))
        assert writer.commitlog_end == leader_end
    finally:
        writer.close()
        await leader.aclose()
    follower = broker_at(tmp_path / "follower")
    await follower.start()
    try:
        info = await follower.get_topic("T")
        assert info.queues[0].max_offset == 21
        popped = await follower.pop(PopRequest("G", "T", 0, max_messages=32))
        assert [m.message.body for m in popped.messages] == [body] * 20 + [b"late"]
    finally:
        await follower.aclose()


async def test_a_former_leader_cuts_what_it_wrote_after_the_new_epoch(tmp_path: Path) -> None:
    # a0 led epoch 1; a1 copied 3 messages; a0 wrote 2 more that a1 never got; a1 leads epoch 2
    # from its end and writes 1; a0 comes back as a follower of a1.
    a0, a1 = tmp_path / "a0", tmp_path / "a1"
    old = broker_at(a0)
    await old.start()
    writer = ReplicaWriter(a1)
    writer.open()
    await old.create_topic("T", 1)
    await old.send([Message(topic="T", body=f"e1-{i}".encode()) for i in range(3)], 0)
    copy(a0, writer, DataSnapshotter(a0, 0))
    writer.close()
    await old.send([Message(topic="T", body=b"lost-1"), Message(topic="T", body=b"lost-2")], 0)
    await old.aclose()
    old_end = log_end(list_segments(a0))
    new = broker_at(a1)
    await new.start()
    new_start = log_end(list_segments(a1))
    assert new_start < old_end
    history = [(1, 0), (2, new_start)]
    await new.send([Message(topic="T", body=b"e2-0")], 0)
    point = epochs.consistent_point(history, log_end(list_segments(a1)), [(1, 0)], old_end)
    assert point == new_start
    back = ReplicaWriter(a0)
    back.open()
    copy(a1, back, DataSnapshotter(a1, point), epoch=2, history=history, truncate=point)
    back.close()
    await new.aclose()
    assert (a0 / "commitlog").is_dir()
    assert [p.read_bytes() for p in sorted((a0 / "commitlog").iterdir())] == [
        p.read_bytes() for p in sorted((a1 / "commitlog").iterdir())
    ]
    assert epochs.EpochHistory(a0).entries == history
    kept = list((a0 / "quarantine").glob("replication-truncated-*/*"))
    assert sum(p.stat().st_size for p in kept) == old_end - point  # cut, but kept aside
    promoted = broker_at(a0)
    await promoted.start()
    try:
        popped = await promoted.pop(PopRequest("G", "T", 0, max_messages=32))
        assert [m.message.body for m in popped.messages] == [b"e1-0", b"e1-1", b"e1-2", b"e2-0"]
    finally:
        await promoted.aclose()


async def test_a_reset_moves_the_old_data_aside(tmp_path: Path) -> None:
    old = broker_at(tmp_path / "node")
    await old.start()
    await old.create_topic("T", 1)
    await old.send([Message(topic="T", body=b"precious")], 0)
    await old.aclose()
    writer = ReplicaWriter(tmp_path / "node")
    writer.open()
    try:
        writer.apply(pb.ReplicaBatch(sequence=1, epoch=1, truncate_to=-1, reset=True), 0)
        assert writer.commitlog_end == 0
    finally:
        writer.close()
    [aside] = (tmp_path / "node" / "quarantine").glob("replication-replaced-*")
    segment = next((aside / "commitlog").iterdir())
    assert b"precious" in segment.read_bytes()


def test_a_reset_of_an_empty_node_leaves_no_empty_quarantine_folder(tmp_path: Path) -> None:
    writer = ReplicaWriter(tmp_path / "node")
    writer.open()
    try:
        writer.apply(pb.ReplicaBatch(sequence=1, epoch=1, truncate_to=-1, reset=True), 0)
        assert writer.commitlog_end == 0
    finally:
        writer.close()
    assert not (tmp_path / "node" / "quarantine").exists()  # nothing was held, nothing kept


async def test_a_follower_refuses_a_batch_of_an_older_epoch(tmp_path: Path) -> None:
    writer = ReplicaWriter(tmp_path)
    writer.open()
    try:
        with pytest.raises(ReplicationError, match="epoch 1"):
            writer.apply(pb.ReplicaBatch(sequence=1, epoch=1, truncate_to=-1), known_epoch=2)
        assert writer.commitlog_end == 0
    finally:
        writer.close()


def test_a_follower_writes_only_the_replicated_files() -> None:
    for name in ("pop/journal.log", "topics.log", "state/groups.json", "FORMAT"):
        assert check_path(name) == name
    refused = ("../x", "/etc/passwd", "state/../../x.json", "LOCK", "index/T/0/0", "state/a/b.json")
    for name in refused:
        with pytest.raises(ReplicationError):
            check_path(name)


@pytest.mark.parametrize(
    ("leader", "leader_end", "follower", "follower_end", "expected"),
    [
        ([(1, 0)], 500, [(1, 0)], 300, 300),  # a follower behind: nothing to cut
        ([(1, 0), (2, 500)], 900, [(1, 0)], 800, 500),  # a former leader: cut at epoch 2
        ([(1, 0), (3, 400)], 900, [(1, 0), (2, 450)], 600, 400),  # epoch 2 never reached it
        ([(2, 0)], 100, [(1, 0)], 100, -1),  # nothing shared: start over
        ([(1, 0), (2, 300), (3, 300)], 700, [(1, 0), (2, 300)], 300, 300),  # an empty epoch
    ],
)
def test_the_consistent_point_of_two_histories(
    leader: list[epochs.Entry], leader_end: int, follower: list[epochs.Entry],
    follower_end: int, expected: int,
) -> None:  # fmt: skip
    assert epochs.consistent_point(leader, leader_end, follower, follower_end) == expected


# Files a broker writes that a follower does not need: derived from the commitlog, or local.
NOT_REPLICATED = ("LOCK", "index/", "checkpoint.json", "quarantine/", "replication/")


async def test_every_file_a_broker_writes_travels_unless_it_is_derived(tmp_path: Path) -> None:
    """The RocketMQ users who lost topics after a switch lost the one file nobody copied: any
    file a broker writes (topics, groups, offsets, journal, timer, keys...) must travel."""
    from popmq.broker.contract.types import GroupConfig

    leader = broker_at(tmp_path / "leader")
    await leader.start()
    try:
        await leader.create_topic("T", 2)
        await leader.update_group(GroupConfig("G", max_attempts=3))
        await leader.send([Message(topic="T", body=b"now"), Message(topic="T", body=b"later",
                           delivery_timestamp_ms=2**42)], 0)  # fmt: skip
        popped = await leader.pop(PopRequest("G", "T", 0, max_messages=1))
        leader.journal_in_flight()
        await leader.ack("G", "T", [AckEntry(popped.messages[0].receipt_handle)])
        await leader.update_consumer_offset("G2", "T", 1, 0)
        await leader.store.checkpoint()
        writer = ReplicaWriter(tmp_path / "follower")
        writer.open()
        copy(tmp_path / "leader", writer, DataSnapshotter(tmp_path / "leader", 0))
        writer.close()
    finally:
        await leader.aclose()

    def files(root: Path) -> dict[str, bytes]:
        return {
            str(p.relative_to(root)): p.read_bytes()
            for p in root.rglob("*")
            if p.is_file()
            and not str(p.relative_to(root)).startswith(NOT_REPLICATED)
            and not p.name.endswith(".prev")
        }

    written, copied = files(tmp_path / "leader"), files(tmp_path / "follower")
    assert "state/groups.log" in written and "pop/journal.log" in written
    assert sorted(written) == sorted(copied)
    stopped_late = {"consumer_offsets.json", "pop/journal.log"}  # rewritten by stop()
    assert {n for n in written if written[n] != copied[n]} <= stopped_late


async def test_a_follower_behind_retention_is_told_to_start_over(tmp_path: Path) -> None:
    from popmq.broker.replication.files import FollowerBehindRetention

    config = BrokerConfig(name="broker-a", data_dir=tmp_path / "leader",
                          store=StoreConfig(flush="async", segment_bytes=4096))  # fmt: skip
    leader = Broker(config)
    await leader.start()
    try:
        await leader.create_topic("T", 1)
        await leader.send([Message(topic="T", body=b"x" * 1000) for _ in range(12)], 0)
        snapshotter = DataSnapshotter(tmp_path / "leader", 0)
        segments = list_segments(tmp_path / "leader")
        assert len(segments) > 2
        (tmp_path / "leader" / "commitlog" / f"{0:020d}").unlink()  # as retention would
        with pytest.raises(FollowerBehindRetention):
            snapshotter.take([(1, 0)], 0.0)  # never "complete" with nothing sent
    finally:
        await leader.aclose()


async def test_batches_applied_as_a_group_are_fsynced_once_per_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A follower behind by several batches writes them all, then fsyncs each file once (and
    records the epochs after that), with the same result as one batch at a time."""
    leader = broker_at(tmp_path / "leader")
    await leader.start()
    snapshotter = DataSnapshotter(tmp_path / "leader", 0)
    writer = ReplicaWriter(tmp_path / "follower")
    writer.open()
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    try:
        await leader.send([Message(topic="T", body=b"first")])
        copy(tmp_path / "leader", writer, snapshotter)  # the files exist on both sides now
        batches = []
        for index in range(5):
            await leader.send([Message(topic="T", body=f"m{index}".encode())])
            snapshot = snapshotter.take([(1, 0)], 0.0)
            batches.append(make_batch(snapshot, index + 2, 1, [(1, 0)]))
        synced.clear()
        ends = writer.apply_all(batches, known_epoch=0)
        assert ends == sorted(ends) and ends[-1] == log_end(list_segments(tmp_path / "leader"))
        assert len(synced) == 1  # the commitlog segment, once for five batches
    finally:
        writer.close()
        await leader.aclose()
    assert writer.history is not None and writer.history.entries == [(1, 0)]
    follower = broker_at(tmp_path / "follower")
    await follower.start()
    try:
        popped = await follower.pop(PopRequest("G", "T", max_messages=10))
        assert sorted(m.message.body for m in popped.messages) == [
            b"first",
            *(f"m{i}".encode() for i in range(5)),
        ]
    finally:
        await follower.aclose()
