"""A follower that copies its leader after retention deleted a queue's every record (a node
replaced, wiped or reset in a long-running group) holds no record of that queue, so nothing
tells its index where the queue's offsets had reached. Promoted, the queue must not restart
at offset 0 under a group that had committed further: the next messages would get offsets
the group has already passed, and it would never receive them."""

from __future__ import annotations

from pathlib import Path

from popmq.broker.contract.types import Message, PopRequest
from popmq.broker.core import Broker
from popmq.broker.replication.files import DataSnapshotter, list_segments
from popmq.broker.replication.replica import ReplicaWriter

from popmq.config import BrokerConfig, StoreConfig
from tests.broker.test_replication_indexer import copy


def small_segments_at(path: Path) -> Broker:
    store = StoreConfig(flush="async", segment_bytes=4096, retention_bytes=5000)
    return Broker(BrokerConfig(name="broker-a", data_dir=path, store=store))


async def test_a_queue_retention_emptied_keeps_its_offsets_on_a_promoted_copy(
    tmp_path: Path,
) -> None:
    source, copy_dir = tmp_path / "leader", tmp_path / "follower"
    leader = small_segments_at(source)
    await leader.start()
    try:
        await leader.create_topic("T", 2)
        await leader.send([Message(topic="T", body=b"old" * 20) for _ in range(5)], 1)
        popped = await leader.pop(PopRequest("G", "T", 1, max_messages=32))
        assert len(popped.messages) == 5
        await leader.update_consumer_offset("G", "T", 1, 5)  # the group is done with them
        for i in range(40):  # queue 0 fills segments; retention deletes queue 1's records
            await leader.send([Message(topic="T", body=f"q0-{i}".encode() * 20)], 0)
        await leader.store.checkpoint()
        assert leader.store.apply_retention() > 0
        assert leader.store.min_offset("T", 1) == leader.store.max_offset("T", 1) == 5
        writer = ReplicaWriter(copy_dir)  # a new node: copies what retention left
        writer.open()
        copy(writer, DataSnapshotter(source, list_segments(source)[0][0]), [(1, 0)])
        writer.close()
    finally:
        await leader.aclose()
    promoted = small_segments_at(copy_dir)
    await promoted.start()
    try:
        assert promoted.store.max_offset("T", 1) == 5
        await promoted.send([Message(topic="T", body=f"new-{i}".encode()) for i in range(3)], 1)
        popped = await promoted.pop(PopRequest("G", "T", 1, max_messages=32))
        assert [m.message.body for m in popped.messages] == [b"new-0", b"new-1", b"new-2"]
    finally:
        await promoted.aclose()
