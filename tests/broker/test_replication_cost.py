"""What a follower does per batch is kept to what the batch needs (issue 19: each follower
cost about as much CPU per message as its leader). Its indexing waits until a chunk is worth a
call, and its view of the commitlog's segments follows its own writes instead of listing the
directory twice per batch; neither may ever disagree with the directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from popmq.broker.contract.types import Message
from popmq.broker.core import Broker
from popmq.broker.replication import indexer as indexer_module
from popmq.broker.replication.files import DataSnapshotter, list_segments, log_end
from popmq.broker.replication.indexer import ReplicaIndexer
from popmq.broker.replication.leader import make_batch
from popmq.broker.replication.replica import ReplicaWriter

from popmq.config import BrokerConfig, StoreConfig
from popmq.pb.replication.v1 import replication_pb2 as pb

HISTORY = [(1, 0)]


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def broker_at(path: Path, **store: int) -> Broker:
    config = StoreConfig(flush="async", **store)  # type: ignore[arg-type]
    return Broker(BrokerConfig(name="broker-a", data_dir=path, store=config))


def apply_one(writer: ReplicaWriter, snapshotter: DataSnapshotter, sequence: int) -> int:
    """Copy what changed as one batch (complete: small enough for one)."""
    snapshot = snapshotter.take(HISTORY, 0.0)
    assert snapshot.complete
    return writer.apply(make_batch(snapshot, sequence, 1, HISTORY), known_epoch=0)


async def test_the_follower_indexes_a_chunk_at_a_time_not_after_every_batch(
    tmp_path: Path,
) -> None:
    leader = broker_at(tmp_path / "leader")
    await leader.start()
    clock = FakeClock()
    writer = ReplicaWriter(tmp_path / "follower")
    writer.indexer = ReplicaIndexer(tmp_path / "follower", monotonic=clock)
    writer.open()
    try:
        await leader.create_topic("T", 2)
        snapshotter = DataSnapshotter(tmp_path / "leader", 0)
        apply_one(writer, snapshotter, 1)
        writer.index_some()  # the topic's first batch, indexed
        clock.now += indexer_module.CHECKPOINT_EVERY_S
        writer.index_some()  # and its checkpoint: nothing is owed now
        assert not writer.indexing_due() and writer.indexer.due_in() is None

        # A few records: they wait (a call per batch cost a thread hop, a listing, an open)
        await leader.send([Message(topic="T", body=b"small")] * 3, 0)
        end = apply_one(writer, snapshotter, 2)
        assert writer.indexer.behind and not writer.indexing_due()
        assert writer.indexing_due_in() == indexer_module.INDEX_EVERY_S
        await leader.send([Message(topic="T", body=b"more")], 1)
        end = apply_one(writer, snapshotter, 3)
        clock.now += indexer_module.INDEX_EVERY_S / 2
        assert not writer.indexing_due()  # the wait counts from the oldest waiting bytes
        assert writer.indexing_due_in() == indexer_module.INDEX_EVERY_S / 2
        clock.now += indexer_module.INDEX_EVERY_S / 2
        assert writer.indexing_due()  # ... and ends: whatever waited is indexed
        writer.index_some()
        assert writer.indexer.position == end and not writer.indexer.behind
        assert writer.indexer.records_indexed >= 4

        # A chunk's worth is indexed at once, without waiting
        body = b"x" * 4096
        await leader.send([Message(topic="T", body=body)] * 70, 0)  # ~280 KiB
        end = apply_one(writer, snapshotter, 4)
        assert writer.indexer.indexable_end - writer.indexer.position >= (
            indexer_module.INDEX_AT_BYTES
        )
        assert writer.indexing_due() and writer.indexing_due_in() == 0
        writer.index_some()
        assert writer.indexer.position == end
        assert not writer.indexer.stopped
    finally:
        writer.close()
        await leader.aclose()


async def test_the_writer_s_segment_view_follows_new_segments_cuts_and_retention(
    tmp_path: Path,
) -> None:
    source, target = tmp_path / "leader", tmp_path / "follower"
    leader = broker_at(source, segment_bytes=4096, retention_bytes=9000)
    await leader.start()
    writer = ReplicaWriter(target)
    writer.open()
    try:
        await leader.create_topic("T", 1)
        snapshotter = DataSnapshotter(source, 0)
        sequence = 0
        for i in range(12):  # each batch a few records: new segments now and then
            await leader.send([Message(topic="T", body=f"m-{i}".encode() * 60)] * 3, 0)
            while True:
                sequence += 1
                snapshot = snapshotter.take(HISTORY, 0.0)
                end = writer.apply(make_batch(snapshot, sequence, 1, HISTORY), known_epoch=0)
                assert end == writer.commitlog_end == log_end(list_segments(target))
                if snapshot.complete:
                    break
        assert len(list_segments(target)) > 2
        assert list_segments(target) == list_segments(source)

        # retention on the leader: the next batch drops the follower's old segments too
        await leader.store.checkpoint()
        assert leader.store.apply_retention() > 0
        await leader.send([Message(topic="T", body=b"after retention")], 0)
        sequence += 1
        end = apply_one(writer, snapshotter, sequence)
        assert list_segments(target) == list_segments(source)
        assert end == writer.commitlog_end == log_end(list_segments(source))

        # a cut back to an earlier position (a new epoch began there on another node)
        segments = list_segments(target)
        cut = segments[-1][0] + 1  # inside the last segment: leaves it shorter
        cut_to = make_batch(snapshotter.take(HISTORY, 0.0), sequence + 1, 1, HISTORY,
                            truncate=cut)  # fmt: skip
        assert writer.apply(cut_to, known_epoch=0) == cut == log_end(list_segments(target))
    finally:
        writer.close()
        await leader.aclose()


def test_the_follower_keeps_its_files_open_and_never_writes_through_a_stale_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Appends to the commitlog segment and the append logs go through descriptors kept open
    between batches (no open, close or exists() per file and batch); a log rewritten on the
    leader (REPLACE) and a reset (the data moved aside) are followed by writes to the new
    files, never to the old inode a kept descriptor would still point at."""
    root = tmp_path / "follower"
    writer = ReplicaWriter(root)
    writer.open()

    def batch(sequence: int, data: bytes, offset: int, *changes: pb.FileChange,
              reset: bool = False) -> pb.ReplicaBatch:  # fmt: skip
        return pb.ReplicaBatch(sequence=sequence, epoch=1, truncate_to=-1, reset=reset,
                               commitlog_segment=0, commitlog_offset=offset,
                               commitlog_data=data, files=list(changes))  # fmt: skip

    def append(offset: int, data: bytes) -> pb.FileChange:
        return pb.FileChange(path="topics.log", kind=pb.FileChange.APPEND, offset=offset, data=data)

    opened: list[object] = []
    real_open = os.open
    try:
        writer.apply(batch(1, b"c1", 0, append(0, b"t1")), 0)
        monkeypatch.setattr(
            os, "open", lambda *a, **k: (opened.append(a[0]), real_open(*a, **k))[1]
        )
        writer.apply(batch(2, b"c2", 2, append(2, b"t2")), 0)
        writer.apply(batch(3, b"c3", 4, append(4, b"t3")), 0)
        assert opened == []  # written and fsynced through the descriptors kept open
        monkeypatch.setattr(os, "open", real_open)
        assert (root / "topics.log").read_bytes() == b"t1t2t3"
        replace = pb.FileChange(path="topics.log", kind=pb.FileChange.REPLACE, data=b"NEW")
        writer.apply(batch(4, b"", 6, replace, append(3, b"+a")), 0)
        assert (root / "topics.log").read_bytes() == b"NEW+a"
        writer.apply(batch(5, b"fresh", 0, append(0, b"T"), reset=True), 0)
        assert (root / "commitlog" / f"{0:020d}").read_bytes() == b"fresh"
        assert (root / "topics.log").read_bytes() == b"T"
        [aside] = (root / "quarantine").glob("replication-replaced-*")
        assert (aside / "commitlog" / f"{0:020d}").read_bytes() == b"c1c2c3"
        assert (aside / "topics.log").read_bytes() == b"NEW+a"
    finally:
        writer.close()
    assert writer._fds == {}  # closed with the writer
