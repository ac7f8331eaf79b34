"""Damaged data files: nothing intact is lost, nothing lost goes unreported (issue 9: 4, 5, 6,
10c). Each test damages a closed store the way a bad disk or an operator would, reopens it,
and checks what survived, what was reported (faults, log, quarantine) and that the store
still works."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import logging
import os
from pathlib import Path

import pytest
from popmq.broker.contract.errors import RefusedError
from popmq.broker.contract.types import Message
from popmq.broker.metrics import BrokerMetrics
from popmq.broker.pop.checkpoint import Checkpoint
from popmq.broker.pop.journal import PopJournal
from popmq.broker.store import MessageStore, metafile
from popmq.broker.store.framing import HEADER_SIZE, iter_frames
from popmq.broker.store.queue_index import ENTRY
from popmq.broker.verify import verify

from popmq.cli import main as popmq_main

pytestmark = pytest.mark.slow  # scheduled first in make check (tests/conftest.py)

QUEUES = 3
TOTAL = 300


def body(i: int) -> bytes:
    return f"message-{i:04d}-".encode() * 4


async def fill(store: MessageStore, total: int = TOTAL) -> None:
    store.create_topic("T", QUEUES)
    for i in range(total):
        await store.append("T", i % QUEUES, [Message("T", body(i), tag="x")])


def readable(store: MessageStore) -> set[bytes]:
    bodies: set[bytes] = set()
    for q in range(QUEUES):
        result = store.read("T", q, store.min_offset("T", q), TOTAL + 10)
        bodies.update(m.body for m in result.messages)
    return bodies


def segments(store: MessageStore) -> list[Path]:
    return sorted((store.data_dir / "commitlog").iterdir())


def flip(path: Path, at: int, count: int = 8) -> None:
    with path.open("r+b") as f:
        f.seek(at)
        data = f.read(count)
        f.seek(at)
        f.write(bytes(b ^ 0xFF for b in data))


def tree_digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


# -- defect 4: damage inside the commitlog -----------------------------------------------------


async def test_flip_inside_the_log_loses_only_the_damaged_frame(store_factory, caplog) -> None:
    """8 flipped bytes at 10% of the log: on 7bac2a5 recovery cut the log there (30 of 300
    left, WARNING only). Now one frame is lost, reported, and everything after it is read."""
    store = store_factory(flush="sync")
    await fill(store)
    await store.aclose()
    [segment] = segments(store)
    flip(segment, segment.stat().st_size // 10)
    with caplog.at_level(logging.WARNING):
        reopened = store_factory(flush="sync")
    survivors = readable(reopened)
    assert len(survivors) == TOTAL - 1
    assert reopened.faults.frames_lost == 1
    [event] = reopened.faults.damage
    assert event.reason == "damaged" and event.file == f"commitlog/{segment.name}"
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert any("1 frames lost" in r.getMessage() and str(event.start) in r.getMessage()
               for r in errors)  # fmt: skip
    record = json.loads((reopened.data_dir / f"{event.quarantined_to[:-4]}.json").read_text())
    assert (record["start"], record["end"], record["frames_lost"]) == (event.start, event.end, 1)
    assert (reopened.data_dir / event.quarantined_to).stat().st_size == event.size
    # Offsets are not reused: the lost one is a hole, new messages go after the old end.
    before = reopened.max_offset("T", 0)
    stored = await reopened.append("T", 0, [Message("T", b"after")])
    assert stored[0].queue_offset == before


async def test_damage_in_an_old_segment_keeps_every_later_segment(store_factory) -> None:
    """Without a checkpoint recovery walks every segment (with one, it walks from the
    checkpoint's segment on; older damage is caught by the reads' checksums and by
    `popmq broker verify`)."""
    store = store_factory(flush="sync", segment_bytes=4096)
    await fill(store)
    await store.aclose()
    files = segments(store)
    assert len(files) >= 4
    flip(files[1], 100, 40)
    (store.data_dir / "checkpoint.json").unlink()
    (store.data_dir / "checkpoint.json.prev").unlink()
    reopened = store_factory(flush="sync", segment_bytes=4096)
    assert segments(reopened) == files
    lost = reopened.faults.frames_lost
    assert 1 <= lost <= 2
    assert len(readable(reopened)) == TOTAL - lost


async def test_damage_across_a_checkpointed_index_resyncs(store_factory) -> None:
    """Damage behind the checkpoint, found by a full rebuild (checkpoint gone, index gone)."""
    store = store_factory(flush="sync")
    await fill(store)
    await store.aclose()
    [segment] = segments(store)
    flip(segment, segment.stat().st_size // 2, 16)
    (store.data_dir / "checkpoint.json").unlink()
    os.unlink(next((store.data_dir / "index" / "T" / "1").iterdir()))
    reopened = store_factory(flush="sync")
    lost = reopened.faults.frames_lost
    assert 1 <= lost <= 2
    assert len(readable(reopened)) == TOTAL - lost


async def test_quarantine_metrics_name_file_and_reason(store_factory) -> None:
    store = store_factory(flush="sync")
    await fill(store, 30)
    await store.aclose()
    [segment] = segments(store)
    flip(segment, 400)
    reopened = store_factory(flush="sync")
    metrics = BrokerMetrics("b1")
    metrics.store_faults(reopened.faults.damage, reopened.faults.metadata)
    labels = {"broker": "b1", "file": f"commitlog/{segment.name}", "reason": "damaged"}
    registry = metrics.registry
    assert registry.get_sample_value("popmq_broker_store_quarantined_frames_total", labels) == 1
    size = reopened.faults.damage[0].size
    assert registry.get_sample_value("popmq_broker_store_quarantined_bytes_total", labels) == size


async def test_known_damage_is_not_counted_twice(store_factory) -> None:
    store = store_factory(flush="sync")
    await fill(store, 30)
    await store.aclose()
    flip(segments(store)[0], 400)
    first = store_factory(flush="sync")
    assert first.faults.frames_lost == 1
    await first.aclose()
    again = store_factory(flush="sync")
    assert again.faults.damage == []
    assert len(readable(again)) == 29


# -- defect 5: missing topic table -------------------------------------------------------------


async def test_missing_topics_log_rebuilds_topics_and_deletes_nothing(
    store_factory, caplog
) -> None:
    """On 7bac2a5 the store started with no topics and deleted every index directory."""
    store = store_factory(flush="sync")
    await fill(store)
    await store.aclose()
    (store.data_dir / "topics.log").unlink()
    with caplog.at_level(logging.ERROR):
        reopened = store_factory(flush="sync")
    assert reopened.get_topic("T") is not None
    assert reopened.get_topic("T").queue_count == QUEUES
    assert len(readable(reopened)) == TOTAL
    assert [(m.file, m.action) for m in reopened.faults.metadata] == [("topics.log", "rebuilt")]
    assert any("topics.log" in r.getMessage() for r in caplog.records)
    assert (reopened.data_dir / "topics.log").exists()


async def test_missing_topics_log_keeps_index_dirs_of_topics_without_records(
    store_factory,
) -> None:
    store = store_factory(flush="sync")
    store.create_topic("Empty", 4)
    await store.aclose()
    (store.data_dir / "topics.log").unlink()
    reopened = store_factory(flush="sync")
    assert reopened.get_topic("Empty") is not None
    assert (reopened.data_dir / "index" / "Empty").is_dir()


# -- defect 6: damaged metadata files ----------------------------------------------------------


@pytest.mark.parametrize("name", ["checkpoint.json", "consumer_offsets.json"])
async def test_corrupt_metadata_falls_back_to_previous_copy(store_factory, name) -> None:
    """On 7bac2a5 each of these ended open() with a raw JSONDecodeError."""
    store = store_factory(flush="sync")
    await fill(store, 30)
    store.set_consumer_offset("g", "T", 0, 7)
    await store.checkpoint()
    store.set_consumer_offset("g", "T", 0, 9)  # the current copy; 7 is in the previous one
    await store.aclose()
    (store.data_dir / name).write_bytes(b'{"format":1,"crc32":1,"bo')
    reopened = store_factory(flush="sync")
    assert [(m.file, m.action) for m in reopened.faults.metadata] == [(name, "previous_copy")]
    assert len(readable(reopened)) == 30
    assert reopened.get_consumer_offset("g", "T", 0) == (7 if "offsets" in name else 9)


@pytest.mark.parametrize("where", [0.5, 0.999])
async def test_damaged_topics_log_is_quarantined_and_rebuilt(store_factory, where) -> None:
    """A damaged record inside (or at the end of) topics.log: nothing is deleted, the table is
    rebuilt from the data, the bytes are kept in quarantine/ and counted."""
    store = store_factory(flush="sync")
    await fill(store)
    for i in range(6):
        store.create_topic(f"Empty{i}", 2)  # topics without records: found by their index dirs
    await store.aclose()
    path = store.data_dir / "topics.log"
    flip(path, int(path.stat().st_size * where), 4)
    reopened = store_factory(flush="sync")
    assert len(readable(reopened)) == TOTAL
    assert {f"Empty{i}" for i in range(6)} <= {t.name for t in reopened.list_topics()}
    assert [(m.file, m.action) for m in reopened.faults.metadata] == [("topics.log", "rebuilt")]
    [event] = reopened.faults.damage
    assert event.file == "topics.log" and event.quarantined_to
    assert (reopened.data_dir / event.quarantined_to).exists()
    await reopened.aclose()
    again = store_factory(flush="sync")  # the rebuilt log is intact: nothing more to report
    assert again.faults.metadata == [] and again.faults.damage == []


async def test_topic_registration_appends_a_record(store_factory) -> None:
    """Issue 9: topics.json was rewritten (and fsynced) whole on every creation, O(N^2) bytes
    for N topics; the log grows by one small record per topic."""
    store = store_factory(flush="sync")
    path = store.data_dir / "topics.log"
    sizes = []
    for i in range(300):
        store.create_topic(f"t{i:04d}", 1)
        sizes.append(path.stat().st_size)
    growth = [b - a for a, b in itertools.pairwise(sizes)]
    assert max(growth) < 100  # one record, not the table
    store.delete_topic("t0007")
    store.create_topic("t0008", 3)  # grown
    await store.aclose()
    again = store_factory(flush="sync")
    names = {t.name: t.queue_count for t in again.list_topics()}
    assert "t0007" not in names and names["t0008"] == 3 and len(names) == 299
    assert again.faults.metadata == []


async def test_old_topics_json_is_migrated(store_factory) -> None:
    store = store_factory(flush="sync")
    await fill(store, 30)
    await store.aclose()
    data = store.data_dir
    table = {t: {"queue_count": QUEUES, "since": 0} for t in ("T",)}
    metafile.write(data / "topics.json", {"version": 1, "topics": table})
    (data / "topics.log").unlink()
    reopened = store_factory(flush="sync")
    assert reopened.faults.metadata == []
    assert reopened.get_topic("T").queue_count == QUEUES and len(readable(reopened)) == 30
    assert (data / "topics.log").exists() and (data / "topics.json.migrated").exists()
    assert not (data / "topics.json").exists()


async def test_corrupt_metadata_without_previous_copy(store_factory, caplog) -> None:
    store = store_factory(flush="sync")
    await fill(store, 30)
    store.set_consumer_offset("g", "T", 0, 7)
    await store.aclose()
    for name in ("checkpoint.json", "consumer_offsets.json"):
        (store.data_dir / name).write_bytes(b"\x00garbage")
        (store.data_dir / (name + ".prev")).unlink(missing_ok=True)
    with caplog.at_level(logging.ERROR):
        reopened = store_factory(flush="sync")
    actions = {m.file: m.action for m in reopened.faults.metadata}
    assert actions == {"checkpoint.json": "full_scan", "consumer_offsets.json": "reset"}
    assert len(readable(reopened)) == 30
    assert reopened.get_consumer_offset("g", "T", 0) == -1  # redelivery, reported
    assert any("consumer_offsets.json" in r.getMessage() for r in caplog.records)


async def test_missing_consumer_offsets_is_reported(store_factory) -> None:
    store = store_factory(flush="sync")
    await fill(store, 3)
    await store.aclose()
    (store.data_dir / "consumer_offsets.json").unlink()
    (store.data_dir / "consumer_offsets.json.prev").unlink(missing_ok=True)
    reopened = store_factory(flush="sync")
    assert [(m.file, m.action) for m in reopened.faults.metadata] == [
        ("consumer_offsets.json", "reset")
    ]


async def test_a_new_store_reports_nothing(store_factory) -> None:
    store = store_factory()
    assert store.faults.metadata == [] and store.faults.damage == []
    assert (store.data_dir / "FORMAT").read_text().split() == ["popmq-store-format", "1"]


async def test_unknown_future_format_is_refused(store_factory) -> None:
    store = store_factory()
    await store.aclose()
    (store.data_dir / "FORMAT").write_text("popmq-store-format 99\n")
    with pytest.raises(RefusedError, match="format 99"):
        store_factory()


async def test_corrupt_state_document_falls_back(store_factory) -> None:
    store = store_factory()
    store.save_state("groups", {"g": 1})
    store.save_state("groups", {"g": 2})
    path = store.data_dir / "state" / "groups.json"
    path.write_bytes(path.read_bytes()[:-3])
    assert store.load_state("groups") == {"g": 1}
    assert [m.action for m in store.faults.metadata] == ["previous_copy"]


def test_metafile_reads_legacy_json_and_detects_bit_flips(tmp_path: Path) -> None:
    path = tmp_path / "doc.json"
    path.write_text('{"a": 1}')
    assert metafile.read(path).body == {"a": 1}
    metafile.write(path, {"a": 2})
    data = bytearray(path.read_bytes())
    data[data.index(b"2")] = ord("3")
    path.write_bytes(bytes(data))
    result = metafile.read(path)
    assert result.source is metafile.Source.PREVIOUS and result.body == {"a": 1}
    assert result.problem


# -- defect 10c: damaged pop journal -----------------------------------------------------------


def _checkpoint(ck_id: int) -> Checkpoint:
    return Checkpoint(ck_id=ck_id, group="g", topic="T", queue_id=0, pop_time_ms=1,
                      invisible_until_ms=60_000, fifo=False, offsets=[ck_id],
                      attempts=[0])  # fmt: skip


def test_damaged_pop_journal_keeps_records_after_the_damage(tmp_path: Path, caplog) -> None:
    """On 7bac2a5 the journal was cut at the damage without a log line: the in-flight
    messages of every later checkpoint went out again early."""
    path = tmp_path / "pop" / "journal.log"
    journal = PopJournal(path)
    for ck_id in range(10):
        journal.write_checkpoint(_checkpoint(ck_id))
    journal.close()
    frames = list(iter_frames(path.read_bytes()))
    flip(path, frames[3][0] + HEADER_SIZE + 5, 4)
    with caplog.at_level(logging.WARNING):
        reopened = PopJournal(path)
    loaded = sorted(ck.ck_id for ck in reopened.load())
    assert loaded == [0, 1, 2, 4, 5, 6, 7, 8, 9]
    [event] = reopened.faults
    assert event.reason == "damaged" and event.frames_lost == 1
    assert any(r.levelno == logging.ERROR and "pop journal" in r.getMessage()
               for r in caplog.records)  # fmt: skip
    assert (tmp_path / "pop" / event.quarantined_to).exists()


# -- verify ------------------------------------------------------------------------------------


async def test_verify_reports_damage_and_changes_nothing(store_factory, capsys) -> None:
    store = store_factory(flush="sync")
    await fill(store, 60)
    await store.aclose()
    assert popmq_main(["broker", "verify", "--data-dir", str(store.data_dir)]) == 0
    assert "no unhandled damage" in capsys.readouterr().out
    [segment] = segments(store)
    flip(segment, segment.stat().st_size // 3)
    (store.data_dir / "topics.log").write_bytes(b"{broken")
    before = tree_digest(store.data_dir)
    code = popmq_main(["broker", "verify", "--data-dir", str(store.data_dir), "--json"])
    assert tree_digest(store.data_dir) == before
    assert code == 1
    report = json.loads(capsys.readouterr().out)
    assert report["damaged"] is True
    damaged = {(f["area"], f["file"]) for f in report["findings"] if f["status"] == "damaged"}
    assert ("commitlog", f"commitlog/{segment.name}") in damaged
    assert ("metadata", "topics.log") in damaged
    assert any(area == "index" for area, _ in damaged)  # the lost record's entry
    # A start quarantines the damage; verify then reports it as handled.
    reopened = store_factory(flush="sync")
    await reopened.aclose()
    assert not verify(store.data_dir).damaged


# -- index damage anywhere in its files ---------------------------------------------------------


async def test_flipped_bytes_inside_an_index_are_rebuilt_not_lost(store_factory) -> None:
    """On 7bac2a5 only an index's last entry was checked: a damaged middle entry made reads
    skip its message for good."""
    store = store_factory(flush="sync", segment_bytes=4096)
    await fill(store)
    await store.aclose()
    assert len(segments(store)) > 3  # recovery walks only the last ones
    [path] = (store.data_dir / "index" / "T" / "1").iterdir()
    flip(path, 24 * 5 + 2, 8)  # entry 5 (first segment): its position and size fields
    reopened = store_factory(flush="sync", segment_bytes=4096)
    assert len(readable(reopened)) == TOTAL
    assert ("index/T/1", "rebuilt") in [(m.file, m.action) for m in reopened.faults.metadata]


def test_verify_finds_pop_journal_damage_and_refuses_a_missing_dir(tmp_path: Path) -> None:
    path = tmp_path / "data" / "pop" / "journal.log"
    journal = PopJournal(path)
    for ck_id in range(5):
        journal.write_checkpoint(_checkpoint(ck_id))
    journal.close()
    flip(path, list(iter_frames(path.read_bytes()))[2][0] + HEADER_SIZE + 3, 4)
    report = verify(tmp_path / "data")
    assert [(f.area, f.status) for f in report.findings if f.area == "pop-journal"] == [
        ("pop-journal", "damaged")
    ]
    assert popmq_main(["broker", "verify", "--data-dir", str(tmp_path / "nowhere")]) == 2


async def test_verify_finds_a_flipped_tag_hash(store_factory) -> None:
    """A wrong tag hash in an index entry hides its (intact) message from every tag-filtered
    reader, and no start notices (the docs send operators to verify for it): verify must."""
    store = store_factory(flush="sync")
    await fill(store, 60)
    await store.aclose()
    [path] = (store.data_dir / "index" / "T" / "1").iterdir()
    flip(path, 24 * 5 + 12, 4)  # entry 5: its tag hash field
    report = verify(store.data_dir)
    assert report.damaged
    [finding] = [f for f in report.findings if f.status == "damaged"]
    assert (finding.area, finding.file) == ("index", "index/T/1")
    assert "offsets 5" in finding.detail


async def test_verify_on_a_running_store_is_not_fooled_by_new_writes(store_factory) -> None:
    """verify reads the commitlog, then the indexes: on a running broker the indexes hold
    entries of records written in between. Those are not damage (verify used to report
    every queue DAMAGED and advise deleting its index directory)."""
    from popmq.broker import verify as verify_module

    store = store_factory(flush="sync")
    await fill(store, 60)
    loop = asyncio.get_running_loop()
    walk = verify_module._check_commitlog

    async def write_more() -> None:
        for q in range(QUEUES):
            await store.append("T", q, [Message("T", body(1000 + q), tag="x")])

    def walk_then_write(*args: object) -> object:
        walked = walk(*args)
        asyncio.run_coroutine_threadsafe(write_more(), loop).result(10)
        return walked

    verify_module._check_commitlog = walk_then_write
    try:
        report = await asyncio.to_thread(verify, store.data_dir)
    finally:
        verify_module._check_commitlog = walk
    assert not report.damaged, [f for f in report.findings if f.status == "damaged"]
    notes = [f.detail for f in report.findings if f.area == "index" and f.status == "info"]
    assert len(notes) == QUEUES and all("after the commitlog was read" in n for n in notes)

    # At rest, index entries past the end of the log are still damage (the log lost them).
    await store.aclose()
    [segment] = segments(store)
    with segment.open("r+b") as f:
        f.truncate(segment.stat().st_size - 10)
    assert verify(store.data_dir).damaged


async def test_a_wrong_size_in_an_index_entry_does_not_lose_its_intact_record(
    store_factory, caplog
) -> None:
    """A smaller size in an index entry passes the start's sanity checks (positions still
    grow). Reads used to call the intact record "damaged commitlog", quarantine it and skip
    it for good; now the record is read by its own frame length and the entry is reported."""
    store = store_factory(flush="sync", segment_bytes=4096)
    await fill(store)
    await store.aclose()
    assert len(segments(store)) > 3  # the start walks only the last ones
    [path] = (store.data_dir / "index" / "T" / "1").iterdir()
    raw = bytearray(path.read_bytes())
    position, size, code, ts = ENTRY.unpack_from(raw, ENTRY.size * 5)
    ENTRY.pack_into(raw, ENTRY.size * 5, position, size - 8, code, ts)  # one bit of rot
    path.write_bytes(bytes(raw))
    with caplog.at_level(logging.ERROR):
        reopened = store_factory(flush="sync", segment_bytes=4096)
        assert len(readable(reopened)) == TOTAL
        assert len(readable(reopened)) == TOTAL  # reported once
    assert reopened.corrupt_records_read == 1
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "index entry of T/1 offset 5" in errors[0]
    assert not (reopened.data_dir / "quarantine").exists()  # the log is not damaged


async def test_a_full_disk_refuses_sends_loudly_but_not_once_per_send(
    store_factory, caplog, monkeypatch
) -> None:
    """A full (or read-only) volume refuses every send; the broker used to log nothing at
    all, so the operator saw only clients' INTERNAL_ERRORs."""
    import errno

    store = store_factory(flush="sync")
    store.create_topic("T", 1)

    def no_space(frames: list[bytes]) -> list[int]:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store._commitlog, "append", no_space)
    with caplog.at_level(logging.ERROR):
        for i in range(20):
            with pytest.raises(RefusedError, match="store write failed"):
                await store.append("T", 0, [Message("T", body(i))])
    assert store.write_failures == 20  # exported as popmq_broker_store_write_failures
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(lines) == 1 and "No space left" in lines[0] and str(store.data_dir) in lines[0]
    monkeypatch.undo()
    await store.append("T", 0, [Message("T", body(99))])  # space again: sends work
    assert store.max_offset("T", 0) == 1


async def test_damage_that_cannot_be_set_aside_refuses_to_start_with_a_clear_message(
    store_factory,
) -> None:
    """A quarantine that cannot be written (disk full, read-only, not a directory) must not
    let recovery cut or skip bytes; the start used to die with a bare '[Errno 17] File
    exists'."""
    store = store_factory(flush="sync")
    await fill(store, 60)
    await store.aclose()
    [segment] = segments(store)
    flip(segment, segment.stat().st_size // 3)
    (store.data_dir / "quarantine").write_text("not a directory")
    before = segment.read_bytes()
    with pytest.raises(OSError, match=r"cannot set damaged bytes aside in .*quarantine"):
        store_factory(flush="sync")
    assert segment.read_bytes() == before


async def test_a_topic_whose_creation_failed_to_persist_takes_no_sends(
    store_factory, monkeypatch
) -> None:
    """topics.log could not be written (disk full) while creating a topic: the topic stayed
    in memory, later sends to it were acknowledged, and the next start dropped it (its index
    directory looked stray) with every one of those messages, silently."""
    import errno

    from popmq.broker.store import topics as topics_module

    store = store_factory(flush="sync")
    store.create_topic("A", 1)
    real_put = topics_module.TopicTable.put

    def disk_full_once(self: object, record: object) -> None:
        monkeypatch.setattr(topics_module.TopicTable, "put", real_put)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(topics_module.TopicTable, "put", disk_full_once)
    with pytest.raises(RefusedError, match="cannot create topic X"):
        store.create_topic("X", 2)
    assert store.get_topic("X") is None
    with pytest.raises(RefusedError):
        await store.append("X", 0, [Message("X", b"never acknowledged")])
    store.create_topic("X", 2)  # space again: created for real
    await store.append("X", 0, [Message("X", b"acknowledged")])
    await store.aclose()
    reopened = store_factory(flush="sync")
    assert [m.body for m in reopened.read("X", 0, 0, 10).messages] == [b"acknowledged"]


def test_topics_log_is_compacted_at_start(tmp_path: Path, monkeypatch) -> None:
    from popmq.broker.store import topics as topics_module
    from popmq.broker.store.topics import TopicRecord, TopicTable

    monkeypatch.setattr(topics_module, "_COMPACT_SLACK", 5)
    table = TopicTable(tmp_path)
    table.load()
    for i in range(10):  # 20 records for 1 topic
        table.topics["gone"] = record = TopicRecord("gone", 1, i)
        table.put(record)
        del table.topics["gone"]
        table.remove("gone")
    table.topics["kept"] = record = TopicRecord("kept", 2, 7)
    table.put(record)
    table.close()
    before = (tmp_path / "topics.log").stat().st_size
    again = TopicTable(tmp_path)
    assert again.load().trusted
    assert list(again.topics.values()) == [TopicRecord("kept", 2, 7)]
    assert (tmp_path / "topics.log").stat().st_size < before / 10  # one record left
    again.close()
