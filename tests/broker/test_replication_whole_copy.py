"""A node knows whether its own copy may lead (completeness.py): not while it is emptied, or
being reset or cut back, whatever the in-sync set recorded in etcd still says of it. No
network: the leader's files travel through DataSnapshotter and ReplicaWriter directly."""

from __future__ import annotations

from pathlib import Path

from popmq.broker.contract.types import Message
from popmq.broker.core import Broker
from popmq.broker.replication import epochs
from popmq.broker.replication.completeness import holds_data, holds_whole_copy
from popmq.broker.replication.files import DataSnapshotter, list_segments
from popmq.broker.replication.replica import ReplicaWriter

from popmq.config import BrokerConfig, StoreConfig
from popmq.pb.replication.v1 import replication_pb2 as pb


def broker_at(path: Path) -> Broker:
    return Broker(BrokerConfig(name="broker-a", data_dir=path, store=StoreConfig(flush="async")))


def send_batch(source: Path, writer: ReplicaWriter, snapshotter: DataSnapshotter, sequence: int,
               history: list[epochs.Entry], *, reset: bool = False,
               truncate: int = -1) -> bool:  # fmt: skip
    """One batch from the leader's directory to the follower, built as the leader builds it;
    whether it was complete."""
    snapshot = snapshotter.take(history, 0.0)
    segments = list_segments(source)
    batch = pb.ReplicaBatch(
        sequence=sequence, epoch=history[-1][0], truncate_to=truncate, reset=reset,
        epochs=[pb.EpochEntry(epoch=e, start_offset=s) for e, s in history],
        commitlog_min=segments[0][0] if segments else 0,
        commitlog_segment=snapshot.commitlog_segment, commitlog_offset=snapshot.commitlog_offset,
        commitlog_data=snapshot.commitlog_data, files=snapshot.files, complete=snapshot.complete,
    )  # fmt: skip
    writer.apply(batch, known_epoch=0)
    return snapshot.complete


async def test_a_bootstrapping_follower_is_whole_only_once_every_document_is_applied(
    tmp_path: Path,
) -> None:
    """The failover that answered TOPIC_NOT_FOUND: a wiped follower, still named in the
    recorded in-sync set, was elected before the topics reached it. Its commitlog bytes and
    epoch history arrive before the documents (a clipped batch carries none): neither makes
    the copy whole."""
    source, copy = tmp_path / "leader", tmp_path / "follower"
    leader = broker_at(source)
    await leader.start()
    history = [(1, 0)]
    try:
        await leader.create_topic("T", 1)
        await leader.send([Message(topic="T", body=b"x" * 1000) for _ in range(20)], 0)
        copy.mkdir()
        assert not holds_whole_copy(copy)  # emptied: it has never held anything
        writer = ReplicaWriter(copy)
        writer.open()
        try:
            snapshotter = DataSnapshotter(source, 0, max_bytes=4096)
            complete = send_batch(source, writer, snapshotter, 1, history, reset=True)
            assert not complete and writer.commitlog_end > 0
            assert epochs.EpochHistory(copy).entries == history  # a history, but...
            assert not (copy / "topics.log").exists()  # ...not the topics yet
            assert not holds_whole_copy(copy)
            sequence = 1
            while not complete:
                sequence += 1
                complete = send_batch(source, writer, snapshotter, sequence, history)
            assert (copy / "topics.log").exists()
            assert holds_whole_copy(copy)
        finally:
            writer.close()
    finally:
        await leader.aclose()
    promoted = broker_at(copy)
    await promoted.start()
    try:
        info = await promoted.get_topic("T")
        assert info.queues[0].max_offset == 20
    finally:
        await promoted.aclose()


async def test_a_copy_stopped_half_way_stays_not_whole_after_a_restart(tmp_path: Path) -> None:
    """The mark is on disk: a follower that stops during its bootstrap and comes back (its
    leader gone) still knows its copy is partial, though its epoch history is not empty."""
    source, copy = tmp_path / "leader", tmp_path / "follower"
    leader = broker_at(source)
    await leader.start()
    try:
        await leader.send([Message(topic="T", body=b"y" * 1000) for _ in range(10)], 0)
        writer = ReplicaWriter(copy)
        writer.open()
        snapshotter = DataSnapshotter(source, 0, max_bytes=4096)
        assert not send_batch(source, writer, snapshotter, 1, [(1, 0)], reset=True)
        writer.close()
    finally:
        await leader.aclose()
    again = ReplicaWriter(copy)
    again.open()
    again.close()
    assert epochs.EpochHistory(copy).entries and not holds_whole_copy(copy)


async def test_a_former_leader_cut_back_is_whole_again_after_its_first_complete_batch(
    tmp_path: Path,
) -> None:
    a0, a1 = tmp_path / "a0", tmp_path / "a1"
    old = broker_at(a0)
    await old.start()
    await old.create_topic("T", 1)
    await old.send([Message(topic="T", body=f"e1-{i}".encode()) for i in range(3)], 0)
    await old.aclose()
    epochs.EpochHistory(a0).begin(1, 0)
    assert holds_whole_copy(a0)  # it led epoch 1
    writer = ReplicaWriter(a1)
    writer.open()
    assert send_batch(a0, writer, DataSnapshotter(a0, 0), 1, [(1, 0)], reset=True)
    writer.close()
    assert holds_whole_copy(a1)
    back = ReplicaWriter(a0)
    back.open()
    try:
        # what the leader sends first when a0 comes back: a cut (here to 0), then the rest
        snapshotter = DataSnapshotter(a1, 0, max_bytes=64)  # one frame a batch
        history = [(1, 0), (2, 0)]
        assert not send_batch(a1, back, snapshotter, 1, history, truncate=0)
        assert not holds_whole_copy(a0)
        sequence = 1
        while not send_batch(a1, back, snapshotter, sequence + 1, history):
            sequence += 1
        assert holds_whole_copy(a0)
    finally:
        back.close()


async def test_a_copy_bootstrapping_from_nothing_holds_no_data_even_for_an_unclean_election(
    tmp_path: Path,
) -> None:
    """holds_data() is what even an unclean election asks (popmq.coord.group): a node that was
    reset and has received only commitlog bytes (no topics, offsets or POP state: a clipped
    batch carries no document) has an epoch history and bytes, yet elected it would open the
    group without its topics and cut every node that came back with its data to its few
    bytes. Its copy counts as empty until the bootstrap completes, even when it had been
    marked incomplete for a cut first (the marker then says reset)."""
    source, copy = tmp_path / "leader", tmp_path / "follower"
    leader = broker_at(source)
    await leader.start()
    history = [(1, 0)]
    try:
        await leader.create_topic("T", 1)
        await leader.send([Message(topic="T", body=b"z" * 1000) for _ in range(10)], 0)
        writer = ReplicaWriter(copy)
        writer.open()
        try:
            snapshotter = DataSnapshotter(source, 0, max_bytes=64)
            # a cut first (to 0, nothing to cut), then a reset in the same incomplete stretch
            assert not send_batch(source, writer, snapshotter, 1, history, truncate=0)
            snapshotter = DataSnapshotter(source, 0, max_bytes=4096)
            assert not send_batch(source, writer, snapshotter, 2, history, reset=True)
            assert writer.commitlog_end > 0 and epochs.EpochHistory(copy).entries
            assert not holds_data(copy)
            sequence, complete = 2, False
            while not complete:
                sequence += 1
                complete = send_batch(source, writer, snapshotter, sequence, history)
            assert holds_data(copy) and holds_whole_copy(copy)
        finally:
            writer.close()
    finally:
        await leader.aclose()
