"""Recovery: torn commitlog tails, damaged indexes, and a real kill -9 under sync flush."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import textwrap
from pathlib import Path

import pytest
from popmq.broker.contract.types import Message
from popmq.broker.store import MessageStore
from popmq.broker.store.codec import decode_header
from popmq.broker.store.framing import HEADER_SIZE, iter_frames
from popmq.broker.store.queue_index import ENTRY_SIZE

REPO = Path(__file__).resolve().parents[2]
PER_FILE = 8  # small index files, so queues span several


def body_for(queue_id: int, offset: int) -> bytes:
    return f"q{queue_id}-o{offset}-".encode() * (1 + (queue_id * 7 + offset) % 13)


async def fill(store: MessageStore, counts: dict[int, int]) -> None:
    """Append counts[q] messages to each queue, interleaved, bodies derived from (q, offset)."""
    store.create_topic("T", max(counts) + 1)
    written = dict.fromkeys(counts, 0)
    while any(written[q] < counts[q] for q in counts):
        for q in counts:
            if written[q] < counts[q]:
                offset = store.max_offset("T", q)
                await store.append("T", q, [Message("T", body_for(q, offset), tag=f"t{q}")])
                written[q] += 1


def assert_intact(
    store: MessageStore, counts: dict[int, int], lost: dict[int, set[int]] | None = None
) -> None:
    """Every queue q holds offsets 0..counts[q]-1, all readable except ``lost[q]`` (holes:
    records recovery found lost, whose offsets stay reserved)."""
    for q, count in counts.items():
        gone = (lost or {}).get(q, set())
        kept = [o for o in range(count) if o not in gone]
        assert store.max_offset("T", q) == count, q
        result = store.read("T", q, 0, count + 5)
        assert [m.queue_offset for m in result.messages] == kept, q
        assert [m.body for m in result.messages] == [body_for(q, o) for o in kept]
        assert all(m.tag == f"t{q}" for m in result.messages)


def index_files(store: MessageStore, queue_id: int) -> list[Path]:
    return sorted((store.data_dir / "index" / "T" / str(queue_id)).iterdir())


def last_segment(store: MessageStore) -> Path:
    return sorted((store.data_dir / "commitlog").iterdir())[-1]


COUNTS = {0: 30, 1: 21, 2: 5}


async def test_clean_reopen_keeps_everything(store_factory) -> None:
    store = store_factory(index_entries_per_file=PER_FILE, segment_bytes=4096)
    await fill(store, COUNTS)
    await store.aclose()
    reopened = store_factory(index_entries_per_file=PER_FILE, segment_bytes=4096)
    assert reopened.recovery is not None
    assert reopened.recovery.bytes_cut == 0 and reopened.recovery.rebuilt_queues == []
    assert_intact(reopened, COUNTS)


@pytest.mark.parametrize("which", ["queue-dir", "first", "middle", "last", "all-files"])
async def test_index_rebuilt_after_deleting_index_files(store_factory, which: str) -> None:
    store = store_factory(index_entries_per_file=PER_FILE, segment_bytes=4096)
    await fill(store, COUNTS)
    await store.aclose()
    files = index_files(store, 0)
    assert len(files) == 4
    if which == "queue-dir":
        for path in files:
            path.unlink()
        files[0].parent.rmdir()
    elif which == "all-files":
        for path in files:
            path.unlink()
    else:
        files[{"first": 0, "middle": 1, "last": -1}[which]].unlink()
    reopened = store_factory(index_entries_per_file=PER_FILE, segment_bytes=4096)
    assert reopened.recovery is not None
    if which != "last":  # the last file's entries all follow the checkpoint: just re-added
        assert "T/0" in reopened.recovery.rebuilt_queues
    assert_intact(reopened, COUNTS)
    await reopened.append("T", 0, [Message("T", body_for(0, 30), tag="t0")])
    assert_intact(reopened, {**COUNTS, 0: 31})


@pytest.mark.parametrize("keep_bytes", [0, ENTRY_SIZE * 3 + 5, ENTRY_SIZE * 6])
async def test_index_rebuilt_after_truncating_an_index_file(store_factory, keep_bytes) -> None:
    store = store_factory(index_entries_per_file=PER_FILE, segment_bytes=4096)
    await fill(store, COUNTS)
    await store.aclose()
    os.truncate(index_files(store, 1)[-1], keep_bytes)  # the last file: offsets 16..20
    os.truncate(index_files(store, 0)[1], keep_bytes)  # a middle file: offsets 8..15
    reopened = store_factory(index_entries_per_file=PER_FILE, segment_bytes=4096)
    assert_intact(reopened, COUNTS)


async def test_wrong_last_index_entry_is_detected(store_factory) -> None:
    """Queue 0's last record sits in an old segment, far before the checkpoint: only the
    verification of its last entry against the commitlog can catch a bad entry there."""
    store = store_factory(index_entries_per_file=PER_FILE, segment_bytes=4096)
    await fill(store, {0: 12, 1: 0})
    for _ in range(40):
        await store.append("T", 1, [Message("T", body_for(1, store.max_offset("T", 1)), tag="t1")])
    await store.aclose()
    last_file = index_files(store, 0)[-1]
    data = bytearray(last_file.read_bytes())
    data[-ENTRY_SIZE:] = data[-2 * ENTRY_SIZE : -ENTRY_SIZE]  # points at offset 10's record
    last_file.write_bytes(bytes(data))
    reopened = store_factory(index_entries_per_file=PER_FILE, segment_bytes=4096)
    assert reopened.recovery is not None
    assert reopened.recovery.rebuilt_queues == ["T/0"]
    assert_intact(reopened, {0: 12, 1: 40})


async def test_torn_commitlog_tail_is_cut_and_index_follows(store_factory) -> None:
    store = store_factory(index_entries_per_file=PER_FILE)
    await fill(store, COUNTS)
    await store.aclose()
    segment = last_segment(store)
    frames = list(iter_frames(segment.read_bytes()))
    last_offset, last_payload = frames[-1]  # queue 0's offset 29 (fill ends on queue 0)
    os.truncate(segment, last_offset + HEADER_SIZE + len(last_payload) // 2)
    reopened = store_factory(index_entries_per_file=PER_FILE)
    assert reopened.recovery is not None
    assert reopened.recovery.bytes_cut == HEADER_SIZE + len(last_payload) // 2
    assert segment.stat().st_size == last_offset
    # The record was durable (the checkpoint at close covers it): its loss is reported, the
    # cut bytes are kept in the quarantine, and its offset stays reserved as a hole.
    assert reopened.faults.frames_lost == 1
    assert list((store.data_dir / "quarantine").glob("commitlog_*.bin"))
    assert_intact(reopened, COUNTS, lost={0: {29}})
    stored = await reopened.append("T", 0, [Message("T", body_for(0, 30), tag="t0")])
    assert stored[0].queue_offset == 30
    assert_intact(reopened, {**COUNTS, 0: 31}, lost={0: {29}})


@pytest.mark.parametrize("damage", ["garbage", "zeros", "flipped-bit", "half-header"])
async def test_corrupt_commitlog_tail_is_cut(store_factory, damage: str) -> None:
    store = store_factory()
    await fill(store, COUNTS)
    await store.aclose()
    segment = last_segment(store)
    size = segment.stat().st_size
    lost: dict[int, set[int]] = {}
    with segment.open("r+b") as f:
        if damage == "garbage":
            f.seek(size)
            f.write(os.urandom(777))
        elif damage == "zeros":
            f.seek(size)
            f.write(bytes(8192))
        elif damage == "half-header":
            f.seek(size)
            f.write(b"\x10\x00\x00")
        else:  # a bit of the last record's body
            f.seek(size - 3)
            byte = f.read(1)
            f.seek(size - 3)
            f.write(bytes([byte[0] ^ 0x04]))
            lost = {0: {COUNTS[0] - 1}}
    reopened = store_factory()
    assert_intact(reopened, COUNTS, lost)
    assert reopened.faults.frames_lost == len(lost)


async def test_torn_middle_segment_keeps_what_follows(store_factory) -> None:
    """A segment cut short in the middle of the log (a lost page, a bad copy) loses only its
    last record: every later segment is kept and read, the lost offset is a reported hole."""
    store = store_factory(segment_bytes=4096)
    await fill(store, COUNTS)
    await store.aclose()
    segments = sorted((store.data_dir / "commitlog").iterdir())
    middle = segments[len(segments) // 2]
    frames = list(iter_frames(middle.read_bytes()))
    last_payload = frames[-1][1]
    header = decode_header(last_payload)
    os.truncate(middle, middle.stat().st_size - 10)
    reopened = store_factory(segment_bytes=4096)
    assert sorted((store.data_dir / "commitlog").iterdir()) == segments
    lost = {header.queue_id: {header.queue_offset}}
    assert_intact(reopened, COUNTS, lost)
    assert reopened.faults.frames_lost == 1
    await reopened.append("T", 1, [Message("T", body_for(1, COUNTS[1]), tag="t1")])
    assert_intact(reopened, {**COUNTS, 1: COUNTS[1] + 1}, lost)


async def test_lost_checkpoint_means_full_scan_not_data_loss(store_factory) -> None:
    store = store_factory(index_entries_per_file=PER_FILE, segment_bytes=4096)
    await fill(store, COUNTS)
    await store.aclose()
    (store.data_dir / "checkpoint.json").unlink()
    for path in index_files(store, 2):
        path.write_bytes(b"\xff" * ENTRY_SIZE * 2)  # garbage entries
    reopened = store_factory(index_entries_per_file=PER_FILE, segment_bytes=4096)
    assert_intact(reopened, COUNTS)


async def test_corrupt_record_in_an_old_segment_is_skipped_by_reads(store_factory) -> None:
    """Bit rot far behind the checkpoint is not seen by recovery; reads verify checksums."""
    store = store_factory(segment_bytes=4096)
    await fill(store, COUNTS)
    await store.aclose()
    first = sorted((store.data_dir / "commitlog").iterdir())[0]
    frames = list(iter_frames(first.read_bytes()))
    offset, payload = frames[0]  # queue 0, offset 0
    with first.open("r+b") as f:
        f.seek(offset + HEADER_SIZE + len(payload) - 2)
        f.write(b"\xee")
    reopened = store_factory(segment_bytes=4096)
    result = reopened.read("T", 0, 0, 3)
    assert [m.queue_offset for m in result.messages] == [1, 2]
    assert result.next_offset == 3
    assert reopened.corrupt_records_read == 1  # exported as popmq_broker_store_corrupt_reads
    reopened.read("T", 0, 0, 3)  # reported once, not per read
    assert reopened.corrupt_records_read == 1
    assert len(list((reopened.data_dir / "quarantine").glob("commitlog_*.bin"))) == 1
    assert [m.body for m in reopened.read("T", 1, 0, 3).messages] == [
        body_for(1, o) for o in range(3)
    ]


CRASH_WRITER = textwrap.dedent(
    """
    import asyncio, os, sys
    from pathlib import Path
    from popmq.broker.contract.types import Message
    from popmq.broker.store import MessageStore
    from popmq.config import StoreConfig

    def body_for(writer, seq):
        return f"w{writer}-s{seq}|".encode() * (1 + seq % 40)

    async def writer(store, w):
        seq = 0
        while True:
            batch = [Message("T", body_for(w, seq + i), tag=f"w{w}") for i in range(1 + seq % 3)]
            stored = await store.append("T", w % 4, batch)
            acks = "".join(f"{w} {seq + i} {m.queue_id} {m.queue_offset}\\n"
                           for i, m in enumerate(stored))
            os.write(1, acks.encode())  # one small write: whole lines reach the pipe at once
            seq += len(batch)

    async def main():
        config = StoreConfig(flush="sync", segment_bytes=64 * 1024, flush_interval_ms=5)
        store = MessageStore(Path(sys.argv[1]), "crash", config, index_entries_per_file=64)
        store.open()
        await store.start()
        store.create_topic("T", 4)
        store.set_consumer_offset("g", "T", 2, 123)
        await store.checkpoint()
        os.write(1, b"ready\\n")
        await asyncio.gather(*(writer(store, w) for w in range(8)))

    asyncio.run(main())
    """
)


def body_for_writer(writer: int, seq: int) -> bytes:
    return f"w{writer}-s{seq}|".encode() * (1 + seq % 40)


@pytest.mark.subprocess
@pytest.mark.timeout(180)  # starts a process: slow on a loaded CI machine (a failure bound)
async def test_kill_9_loses_nothing_acknowledged_under_sync_flush(tmp_path: Path) -> None:
    data_dir = tmp_path / "crash"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CRASH_WRITER, str(data_dir),
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO / "tests")},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    lines: list[bytes] = []
    try:
        async with asyncio.timeout(15):
            assert (await proc.stdout.readline()).strip() == b"ready"
            while len(lines) < 4000:
                line = await proc.stdout.readline()
                if not line:
                    break
                lines.append(line)
    finally:
        proc.send_signal(signal.SIGKILL)  # mid-stream: appends are in flight right now
        rest, stderr = await proc.communicate()
    assert proc.returncode == -signal.SIGKILL, stderr.decode()[-2000:]
    lines += rest.splitlines(keepends=True)
    acked = [tuple(map(int, line.split())) for line in lines if line.endswith(b"\n")]
    assert len(acked) >= 2000, f"only {len(acked)} acks: {stderr.decode()[-2000:]}"

    store = MessageStore(data_dir, "crash", _sync_config(), index_entries_per_file=64)
    store.open()
    try:
        assert store.recovery is not None
        assert store.recovery.rebuilt_queues == []
        assert store.get_consumer_offset("g", "T", 2) == 123
        assert store.get_consumer_offset("g", "T", 1) == -1
        assert len(list((data_dir / "commitlog").iterdir())) > 3  # rolled over while writing
        for writer, seq, queue_id, offset in acked:
            (message,) = store.read("T", queue_id, offset, 1).messages
            assert message.body == body_for_writer(writer, seq), (writer, seq, offset)
            assert message.tag == f"w{writer}"
        # nothing beyond the acks is garbage either: every stored offset reads back whole
        for queue_id in range(4):
            top = store.max_offset("T", queue_id)
            assert top > max(o for _, _, q, o in acked if q == queue_id)
            read = store.read("T", queue_id, 0, top)
            assert [m.queue_offset for m in read.messages] == list(range(top))
        appended = await store.append("T", 0, [Message("T", b"after the crash")])
        assert (
            store.read("T", 0, appended[0].queue_offset, 1).messages[0].body == b"after the crash"
        )
    finally:
        await store.aclose()


def _sync_config():
    from popmq.config import StoreConfig

    return StoreConfig(flush="sync", segment_bytes=64 * 1024)
