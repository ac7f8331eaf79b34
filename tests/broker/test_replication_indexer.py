"""The follower's indexes (broker/replication/indexer.py) survive a role change and a cut of the
log: a former leader's surplus is cut from its indexes before its commitlog, and the copy, once
promoted, opens without walking anything and serves exactly the group's messages."""

from __future__ import annotations

from pathlib import Path

from popmq.broker.contract.types import Message, PopRequest
from popmq.broker.core import Broker
from popmq.broker.replication import epochs
from popmq.broker.replication.files import DataSnapshotter, list_segments, log_end, segment_path
from popmq.broker.replication.indexer import ReplicaIndexer
from popmq.broker.replication.leader import make_batch
from popmq.broker.replication.replica import ReplicaWriter

from popmq.config import BrokerConfig, StoreConfig


def broker_at(path: Path) -> Broker:
    return Broker(BrokerConfig(name="broker-a", data_dir=path, store=StoreConfig(flush="async")))


def copy(writer: ReplicaWriter, snapshotter: DataSnapshotter, history: list[epochs.Entry],
         truncate: int = -1) -> None:  # fmt: skip
    """Apply batches until one is complete, then index what was applied."""
    sent = 0
    while True:
        snapshot = snapshotter.take(history, 0.0)
        sent += 1
        first = {"truncate": truncate} if sent == 1 and truncate >= 0 else {}
        batch = make_batch(snapshot, sent, history[-1][0], history, **first)  # type: ignore[arg-type]
        writer.apply(batch, known_epoch=0)
        if snapshot.complete:
            break
    while writer.indexer.behind:
        writer.index_some()


async def test_a_cut_follower_keeps_its_indexes_and_promotes_without_a_walk(
    tmp_path: Path,
) -> None:
    a0, a1, f = tmp_path / "a0", tmp_path / "a1", tmp_path / "f"
    old = broker_at(a0)
    await old.start()
    await old.create_topic("T", 1)
    await old.send([Message(topic="T", body=f"e1-{i}".encode()) for i in range(3)], 0)
    # a1 and f copy the first three; only f gets the two a0 writes next
    for target in (a1, f):
        writer = ReplicaWriter(target)
        writer.open()
        copy(writer, DataSnapshotter(a0, 0), [(1, 0)])
        writer.close()
    follower = ReplicaWriter(f)
    follower.open()
    shared_end = log_end(list_segments(f))
    assert follower.indexer.position == shared_end  # resumed from its own checkpoint
    await old.send([Message(topic="T", body=b"lost-1"), Message(topic="T", body=b"lost-2")], 0)
    copy(follower, DataSnapshotter(a0, shared_end), [(1, 0)])
    f_end = log_end(list_segments(f))
    assert follower.indexer.position == f_end > shared_end
    follower.close()
    await old.aclose()

    # a1 leads epoch 2 from the shared end; f comes back as its follower and is cut back
    new = broker_at(a1)
    await new.start()
    history = [(1, 0), (2, shared_end)]
    await new.send([Message(topic="T", body=b"e2-0")], 0)
    point = epochs.consistent_point(history, log_end(list_segments(a1)), [(1, 0)], f_end)
    assert point == shared_end
    back = ReplicaWriter(f)
    back.open()
    assert back.indexer.position == f_end  # it resumed: the cut has to fix its indexes
    copy(back, DataSnapshotter(a1, point), history, truncate=point)
    assert not back.indexer.stopped
    back.close()
    await new.aclose()

    promoted = broker_at(f)
    await promoted.start()
    try:
        report = promoted.store.recovery
        assert report is not None
        assert report.records_scanned == 0 and report.holes == 0, report
        assert not promoted.store.faults.damage and not promoted.store.faults.metadata
        popped = await promoted.pop(PopRequest("G", "T", 0, max_messages=32))
        assert [m.message.body for m in popped.messages] == [b"e1-0", b"e1-1", b"e1-2", b"e2-0"]
    finally:
        await promoted.aclose()


def tear(path: Path) -> None:
    with open(path, "ab") as segment:
        segment.write(b"\x40\x00\x00\x00torn")  # a frame header promising more than follows


async def test_recovery_walks_from_a_followers_checkpoint_and_cuts_a_torn_tail(
    tmp_path: Path,
) -> None:
    """Recovery starts mid-segment at a follower's checkpoint: records after it are indexed,
    a torn tail after them is cut exactly (its offsets are relative to that start)."""
    data = tmp_path / "copy"
    broker = broker_at(data)
    await broker.start()
    await broker.create_topic("T", 1)
    await broker.send([Message(topic="T", body=f"m{i}".encode() * 50) for i in range(10)], 0)
    await broker.aclose()
    end = log_end(list_segments(data))
    indexer = ReplicaIndexer(data)
    indexer.start()  # as a follower that copied this log
    indexer.applied(end, complete=True)
    indexer.index_some(max_bytes=end // 2)  # part of it: stops at a record's end
    assert 0 < indexer.position < end
    walked_from = indexer.position
    indexer.close()
    [(start, _)] = list_segments(data)
    tear(segment_path(data, start))
    promoted = broker_at(data)
    await promoted.start()
    try:
        report = promoted.store.recovery
        assert report is not None
        assert report.scanned_from == walked_from and report.bytes_cut == 8
        assert 0 < report.records_scanned < 10 and report.holes == 0
        popped = await promoted.pop(PopRequest("G", "T", 0, max_messages=32))
        assert [m.message.body for m in popped.messages] == [
            f"m{i}".encode() * 50 for i in range(10)
        ]
    finally:
        await promoted.aclose()


async def test_a_topic_deleted_on_a_leader_that_lost_its_epoch_is_indexed_again(
    tmp_path: Path,
) -> None:
    """f applies its leader's deletion of T (a0 dies before a1 has it): f's indexer drops T's
    index. a1 leads with T still there, so f's topic table goes back to holding T: the records
    of T that f's index no longer holds must not be missing once f is promoted."""
    a0, a1, f = tmp_path / "a0", tmp_path / "a1", tmp_path / "f"
    old = broker_at(a0)
    await old.start()
    await old.create_topic("T", 1)
    await old.send([Message(topic="T", body=f"e1-{i}".encode()) for i in range(3)], 0)
    for target in (a1, f):
        writer = ReplicaWriter(target)
        writer.open()
        copy(writer, DataSnapshotter(a0, 0), [(1, 0)])
        writer.close()
    shared_end = log_end(list_segments(f))
    await old.delete_topic("T")  # only f gets this and the write after it
    await old.send([Message(topic="U", body=b"lost")], 0)
    follower = ReplicaWriter(f)
    follower.open()
    copy(follower, DataSnapshotter(a0, shared_end), [(1, 0)])
    f_end = log_end(list_segments(f))
    follower.close()
    await old.aclose()

    new = broker_at(a1)
    await new.start()
    history = [(1, 0), (2, shared_end)]
    await new.send([Message(topic="T", body=b"e2-0")], 0)
    point = epochs.consistent_point(history, log_end(list_segments(a1)), [(1, 0)], f_end)
    back = ReplicaWriter(f)
    back.open()
    copy(back, DataSnapshotter(a1, point), history, truncate=point)
    back.close()
    await new.aclose()

    promoted = broker_at(f)
    await promoted.start()
    try:
        popped = await promoted.pop(PopRequest("G", "T", 0, max_messages=32))
        assert [m.message.body for m in popped.messages] == [b"e1-0", b"e1-1", b"e1-2", b"e2-0"]
    finally:
        await promoted.aclose()
