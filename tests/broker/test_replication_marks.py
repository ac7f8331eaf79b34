"""A leader's snapshot looks only at what a writer marked as changed (store/changes.py), so
every writer of a replicated file must move a mark: with the once-a-second full look turned
off, each kind of state written between two batches still travels in the next one."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
from popmq.broker.contract.types import AckEntry, GroupConfig, Message, PopRequest
from popmq.broker.core import Broker
from popmq.broker.pop import handle_keys
from popmq.broker.replication.files import DataSnapshotter
from popmq.broker.replication.leader import make_batch
from popmq.broker.replication.replica import ReplicaWriter
from popmq.broker.store import changes

from popmq.clock import ManualClock
from popmq.config import BrokerConfig, StoreConfig

# Derived or local files (as test_replication_copy.NOT_REPLICATED).
NOT_REPLICATED = ("LOCK", "index/", "checkpoint.json", "quarantine/", "replication/")


def files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in root.rglob("*")
        if p.is_file()
        and not str(p.relative_to(root)).startswith(NOT_REPLICATED)
        and not p.name.endswith((".prev", ".tmp"))
    }


async def test_every_writer_moves_a_mark_so_its_change_travels_in_the_next_batch(
    tmp_path: Path,
) -> None:
    # No background flush during the test: every file changes only at the steps below.
    config = BrokerConfig(name="broker-a", data_dir=tmp_path / "leader",
                          store=StoreConfig(flush="async", flush_interval_ms=3_600_000,
                                            segment_bytes=4096))  # fmt: skip
    leader = Broker(config)
    await leader.start()
    writer = ReplicaWriter(tmp_path / "follower")
    writer.open()
    snapshotter = DataSnapshotter(tmp_path / "leader", 0, full_look_s=math.inf)
    sequence = 0

    def copy_and_compare(step: str) -> None:
        nonlocal sequence
        while True:
            sequence += 1
            snapshot = snapshotter.take([(1, 0)], 0.0)
            writer.apply(make_batch(snapshot, sequence, 1, [(1, 0)]), known_epoch=0)
            if snapshot.complete:
                break
        # The follower's own writes (same process) move marks too: a look now takes them in
        # (and finds nothing), so the next step's marks are the leader's writers' alone.
        assert snapshotter.take([(1, 0)], 0.0).empty, step
        # (an empty file the leader made, such as a new segment, has nothing to copy yet)
        leader_files = {n: b for n, b in files(tmp_path / "leader").items() if b}
        copied = {n: b for n, b in files(tmp_path / "follower").items() if b}
        assert sorted(copied) == sorted(leader_files), step
        assert [n for n in leader_files if leader_files[n] != copied[n]] == [], step

    try:
        copy_and_compare("start")
        copy_and_compare("nothing changed")
        await leader.create_topic("T", 1)
        copy_and_compare("topic")
        await leader.update_group(GroupConfig("G", max_attempts=3))
        copy_and_compare("group")
        await leader.send([Message(topic="T", body=b"x" * 1500) for _ in range(3)], 0)
        copy_and_compare("sends, new segments")
        await leader.send([Message(topic="T", body=b"later", delivery_timestamp_ms=2**42)], 0)
        copy_and_compare("a timer message")
        popped = await leader.pop(PopRequest("G", "T", 0, max_messages=2))
        leader.journal_in_flight()
        copy_and_compare("pop journal")
        await leader.ack("G", "T", [AckEntry(popped.messages[0].receipt_handle)])
        leader.journal_in_flight()
        copy_and_compare("ack")
        await leader.update_consumer_offset("G2", "T", 0, 1)
        await leader.store.checkpoint()
        copy_and_compare("consumer offsets")
        leader.store.save_state("doc", {"a": 1})
        copy_and_compare("state document")
        path = tmp_path / "leader" / handle_keys.DEFAULT_NAME
        handle_keys.rotate(path)
        copy_and_compare("handle keys")
        journal = leader._journal
        assert journal is not None
        journal.rewrite([])
        copy_and_compare("journal rewritten")
        leader.store.apply_retention()
        leader.store._commitlog.delete_oldest()  # as retention does once segments are old
        copy_and_compare("retention")
    finally:
        writer.close()
        await leader.aclose()


def test_an_unchanged_directory_is_not_looked_at(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No mark moved: the snapshot stats and lists nothing (it did ~10 syscalls per batch)."""
    (tmp_path / "commitlog").mkdir()
    (tmp_path / "commitlog" / f"{0:020d}").write_bytes(b"")
    (tmp_path / "FORMAT").write_text("popmq 1\n")
    snapshotter = DataSnapshotter(tmp_path, 0)
    snapshotter.take([(1, 0)], 0.0)
    looks: list[str] = []
    real_stat, real_listdir = os.stat, os.listdir
    monkeypatch.setattr(os, "stat", lambda *a, **k: (looks.append("stat"), real_stat(*a, **k))[1])
    monkeypatch.setattr(os, "listdir", lambda *a: (looks.append("list"), real_listdir(*a))[1])
    assert snapshotter.take([(1, 0)], 0.5).empty
    assert looks == []
    changes.note(changes.LOGS)  # an append: the logs are looked at, nothing else
    snapshotter.take([(1, 0)], 0.6)
    assert looks and "list" not in looks
    looks.clear()
    with open(tmp_path / "commitlog" / f"{0:020d}", "ab") as segment:
        segment.write(b"\x04\0\0\0\0\0\0\0abcd")  # one frame, appended to the last segment
    changes.note(changes.COMMITLOG)
    snapshot = snapshotter.take([(1, 0)], 0.7)
    assert snapshot.commitlog_data.endswith(b"abcd")
    assert looks == ["stat"]  # the last segment's size: no listing of the commitlog
    looks.clear()
    snapshotter.take([(1, 0)], 1.0)  # a second after the last full look: everything again
    assert "list" in looks


def test_a_keyring_written_by_another_process_moves_the_mark_when_the_broker_sees_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / handle_keys.DEFAULT_NAME
    key = handle_keys.new_key()
    handle_keys.write_keys(path, key.key_id, [key])
    clock = ManualClock()
    keyring = handle_keys.HandleKeyring(path, clock=clock)
    newer = handle_keys.new_key()
    # as `popmq handle-keys rotate` in another process: the same file, no mark moved here
    tmp = path.with_name("other-process.tmp")
    tmp.write_text(json.dumps({"active": newer.key_id,
                               "keys": [key.to_json(), newer.to_json()]}))  # fmt: skip
    os.replace(tmp, path)
    before = changes.marks()
    clock.now_s += 1.5
    assert keyring.active()[0] == newer.key_id
    assert changes.marks()[changes.ENTRIES] != before[changes.ENTRIES]
