"""A follower killed (-9) after indexing but before its checkpoint, restarted and promoted,
serves every acknowledged message exactly once (issue 19).

kill -9 keeps what was written to the page cache: the index entries past the checkpoint
survive, the checkpoint that would vouch for them does not. The crash is taken here as a copy
of the follower's directory at that instant (what a restart finds). Two ways on: the node
follows again (its indexer resumes from the checkpoint, then it is promoted), or it is
promoted at once (the store's recovery starts at the follower's checkpoint). Either way no
message may be lost or served twice, and no index entry may point past the commitlog."""

from __future__ import annotations

import shutil
from pathlib import Path

from popmq.broker.contract.types import Message, PopRequest
from popmq.broker.core import Broker
from popmq.broker.replication import indexer as indexer_module
from popmq.broker.replication.files import DataSnapshotter, list_segments, log_end
from popmq.broker.replication.indexer import CHECKPOINT, ReplicaIndexer
from popmq.broker.replication.leader import make_batch
from popmq.broker.replication.replica import ReplicaWriter
from popmq.broker.store import metafile
from popmq.broker.store.file_budget import FileBudget
from popmq.broker.store.queue_index import QueueIndex

from popmq.config import BrokerConfig, StoreConfig

HISTORY = [(1, 0)]
QUEUES = 2


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def broker_at(path: Path) -> Broker:
    return Broker(BrokerConfig(name="broker-a", data_dir=path, store=StoreConfig(flush="async")))


def apply_all(writer: ReplicaWriter, snapshotter: DataSnapshotter, sequence: int) -> int:
    """Copy what the leader wrote since the last call (acknowledged once this returns)."""
    while True:
        snapshot = snapshotter.take(HISTORY, 0.0)
        end = writer.apply(make_batch(snapshot, sequence, 1, HISTORY), known_epoch=0)
        sequence += 1
        if snapshot.complete:
            return end


async def send(leader: Broker, prefix: str, count: int) -> list[bytes]:
    bodies = [f"{prefix}-{i}".encode() + b"." * 300 for i in range(count)]
    for queue_id in range(QUEUES):
        mine = bodies[queue_id::QUEUES]
        await leader.send([Message(topic="T", body=body) for body in mine], queue_id)
    return bodies


def checkpoint_position(path: Path) -> int:
    doc = metafile.read(path / CHECKPOINT).body
    assert isinstance(doc, dict)
    return int(doc["position"])


async def serve_everything(path: Path) -> list[bytes]:
    """Promote the copy: start a broker on it, pop until empty. Checks its indexes too."""
    promoted = broker_at(path)
    await promoted.start()
    try:
        assert not promoted.store.faults.damage and not promoted.store.faults.metadata
        end = log_end(list_segments(path))
        for queue_id in range(QUEUES):
            handles = FileBudget(4)
            index = QueueIndex(path / "index" / "T" / str(queue_id), 300_000, handles)
            index.open()
            try:
                positions = [index.entry(o)[0] for o in range(index.first_offset,
                                                               index.max_offset)]  # fmt: skip
            finally:
                index.close()
                handles.close()
            assert positions == sorted(set(positions)), "an index entry twice"
            assert all(p < end for p in positions), "an index entry past the commitlog"
        received: list[bytes] = []
        while True:
            popped = await promoted.pop(PopRequest("G", "T", max_messages=32))
            if not popped.messages:
                return received
            received += [m.message.body for m in popped.messages]
    finally:
        await promoted.aclose()


async def test_a_follower_killed_between_indexing_and_its_checkpoint_promotes_exactly(
    tmp_path: Path,
) -> None:
    leader_dir, follower_dir = tmp_path / "leader", tmp_path / "follower"
    leader = broker_at(leader_dir)
    await leader.start()
    clock = FakeClock()
    writer = ReplicaWriter(follower_dir)
    writer.indexer = ReplicaIndexer(follower_dir, monotonic=clock)
    writer.open()
    snapshotter = DataSnapshotter(leader_dir, 0)
    try:
        await leader.create_topic("T", QUEUES)
        acked = await send(leader, "first", 40)
        apply_all(writer, snapshotter, 1)
        writer.index_some()  # indexed, and a checkpoint (the first one is due at once)
        checkpointed = checkpoint_position(follower_dir)
        assert checkpointed == writer.indexer.position > 0

        acked += await send(leader, "second", 40)
        end = apply_all(writer, snapshotter, 100)
        clock.now += indexer_module.CHECKPOINT_EVERY_S / 10  # no checkpoint due yet
        writer.index_some()
        assert writer.indexer.position == end > checkpointed
        assert checkpoint_position(follower_dir) == checkpointed  # the window of the crash

        # kill -9 now: the page cache (every file as written) is what a restart finds
        crashed = tmp_path / "crashed"
        shutil.copytree(follower_dir, crashed, ignore=shutil.ignore_patterns("LOCK"))
        promoted_at_once = tmp_path / "promoted-at-once"
        shutil.copytree(crashed, promoted_at_once)

        # 1. It restarts as a follower, catches up (more arrives), then is promoted.
        again = ReplicaWriter(crashed)
        again.indexer = ReplicaIndexer(crashed, monotonic=clock)
        again.open()
        assert again.indexer.position == checkpointed  # resumed: what follows is indexed again
        acked_later = acked + await send(leader, "third", 10)
        caught_up = DataSnapshotter(leader_dir, log_end(list_segments(crashed)))
        end = apply_all(again, caught_up, 200)
        while again.indexer.behind:
            again.index_some()
        assert again.indexer.position == end and not again.indexer.stopped
        again.close()
        received = await serve_everything(crashed)
        assert len(received) == len(set(received)), "a message served twice"
        assert sorted(received) == sorted(acked_later), "a message lost"
    finally:
        writer.close()
        await leader.aclose()

    # 2. It is promoted as it restarts: the store's recovery starts at the checkpoint and
    # meets index entries past it.
    received = await serve_everything(promoted_at_once)
    assert len(received) == len(set(received)), "a message served twice"
    assert sorted(received) == sorted(acked), "a message lost"
