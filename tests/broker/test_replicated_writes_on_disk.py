"""A replicated write is answered after its barrier, and the barrier only carries what is in
the data directory when its batch is taken (replication copies files). So each write of
replicated state must be on disk before the node port asks for the barrier. Review of the
sync-state branch (a snapshot looks only at what a writer marked): a writer that writes
nothing before the barrier is missed with or without the marks.

In process: a real broker behind the node port; the barrier is a stub that reads the files
followers would get at that instant."""

from __future__ import annotations

from pathlib import Path

from popmq.broker.contract.types import AckEntry, GroupConfig, Message, PopRequest
from popmq.broker.core import Broker
from popmq.broker.local import LocalBrokerPort
from popmq.broker.replication.port import Leading, NodePort

from popmq.config import BrokerConfig, StoreConfig

NOT_REPLICATED = ("LOCK", "index/", "checkpoint.json", "quarantine/", "replication/")


def replicated_files(root: Path) -> dict[str, bytes]:
    """What a follower copies (as test_replication_marks.files)."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in root.rglob("*")
        if p.is_file()
        and not str(p.relative_to(root)).startswith(NOT_REPLICATED)
        and not p.name.endswith((".prev", ".tmp"))
    }


class FilesAtBarrier:
    """The replication leader as the port sees it: its barrier records the replicated files
    as the data directory holds them when it is asked for (what the next batch carries)."""

    def __init__(self, data_dir: Path) -> None:
        self._root = data_dir
        self.files: dict[str, bytes] = {}

    def leads(self) -> bool:
        return True

    def check_available(self) -> None:
        return None

    async def replicated(self) -> None:
        self.files = replicated_files(self._root)


async def test_every_replicated_write_is_on_disk_when_its_barrier_is_asked_for(
    tmp_path: Path,
) -> None:
    """Nothing a write changed is left to write after its barrier (it would reach the
    followers only with a later batch: lost at a failover in between). It failed at the
    deletion of a group with its offsets (deleteSubGroup with cleanOffset): answered OK, the
    offsets stayed in consumer_offsets.json until the next flush, and a follower promoted
    meanwhile brought them back (the group's consumers resumed from the old offsets
    instead of the group's start policy)."""
    store = StoreConfig(flush="async", flush_interval_ms=3_600_000)  # no flush of its own
    config = BrokerConfig(name="broker-a", data_dir=tmp_path, store=store)
    broker = Broker(config)
    await broker.start()
    barrier = FilesAtBarrier(tmp_path)
    port = NodePort("broker-a")
    port.leading = Leading(broker, LocalBrokerPort(broker), barrier)  # type: ignore[arg-type]

    async def check(step: str, offsets: bool = False) -> None:
        # Whatever the write left pending is written now: nothing of it may be new here.
        # The committed offsets move with POP acks too, lazily (the pop journal holds the
        # acks; a follower's offsets behind them deliver nothing again): compared only where
        # the write is an offset's.
        broker.journal_in_flight()
        await broker.store.checkpoint()
        now = replicated_files(tmp_path)
        if not offsets:
            for files in (now, barrier.files):
                files.pop("consumer_offsets.json", None)
        assert now == barrier.files, step
        barrier.files = {}

    try:
        await port.create_topic("T", 1)
        await check("create topic")
        await port.update_group(GroupConfig("G", max_attempts=2))
        await check("update group")
        await port.send([Message(topic="T", body=f"m{i}".encode()) for i in range(4)], 0)
        await check("send")
        popped = await port.pop(PopRequest("G", "T", 0, max_messages=4))
        await check("pop")
        handles = [m.receipt_handle for m in popped.messages]
        await port.ack("G", "T", [AckEntry(handles[0])])
        await check("ack")
        await port.change_invisible_time("G", "T", handles[1], 5_000)
        await check("change invisible time")
        await port.hand_back("G", "T", [handles[2]])
        await check("hand back")
        await port.forward_to_dlq("G", "T", handles[3])
        await check("forward to DLQ")
        await port.update_group(GroupConfig("G2", max_attempts=2))
        await check("another group")
        await port.update_consumer_offset("G2", "T", 0, 2)
        await check("consumer offset", offsets=True)
        await port.delete_group("G2", clean_offsets=True, force=True)
        await check("delete group with its offsets", offsets=True)
        await port.delete_topic("T")
        await check("delete topic")
    finally:
        await broker.aclose()
