"""What a follower does per batch is kept to what the batch needs (issue 19: each follower
cost about as much CPU per message as its leader). Its indexing waits until a chunk is worth a
call, and its view of the commitlog's segments follows its own writes instead of listing the
directory twice per batch; neither may ever disagree with the directory."""

from __future__ import annotations

from pathlib import Path

from popmq.broker.contract.types import Message
from popmq.broker.core import Broker
from popmq.broker.replication import indexer as indexer_module
from popmq.broker.replication.files import DataSnapshotter, list_segments, log_end
from popmq.broker.replication.indexer import ReplicaIndexer
from popmq.broker.replication.leader import make_batch
from popmq.broker.replication.replica import ReplicaWriter

from popmq.config import BrokerConfig, StoreConfig

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
