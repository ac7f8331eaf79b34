"""Retention by size and age: whole old segments go, min offsets move up, purged reads fail."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from pathlib import Path

import pytest
from popmq.broker.contract.errors import Code
from popmq.broker.contract.types import Message
from popmq.broker.store import MessageStore, OffsetPurgedError

from popmq.clock import LoopClock

SEGMENT = 4096


def body_for(queue_id: int, offset: int) -> bytes:
    return f"{queue_id}:{offset}:".encode() * 30  # ~ 200 bytes, ~ 15 records a segment


async def fill(store: MessageStore, per_queue: int, queues: int = 2) -> None:
    if store.get_topic("T") is None:
        store.create_topic("T", queues)
    for _ in range(per_queue):
        for q in range(queues):
            offset = store.max_offset("T", q)
            await store.append("T", q, [Message("T", body_for(q, offset), tag=f"t{q}")])


def segments(store: MessageStore) -> list[Path]:
    return sorted((store.data_dir / "commitlog").iterdir())


def commitlog_bytes(store: MessageStore) -> int:
    return sum(p.stat().st_size for p in segments(store))


def assert_readable_from_min(store: MessageStore, queue_id: int) -> None:
    low, high = store.min_offset("T", queue_id), store.max_offset("T", queue_id)
    result = store.read("T", queue_id, low, high - low)
    assert [m.queue_offset for m in result.messages] == list(range(low, high))
    assert [m.body for m in result.messages] == [body_for(queue_id, o) for o in range(low, high)]


async def test_retention_by_size_purges_old_segments(store_factory) -> None:
    store = store_factory(segment_bytes=SEGMENT, retention_bytes=3 * SEGMENT,
                          index_entries_per_file=8)  # fmt: skip
    await fill(store, 60)
    await store.flush()
    before = {p: p.stat().st_size for p in segments(store)}
    assert len(before) > 6
    freed = store.apply_retention()
    after = segments(store)
    assert freed >= sum(size for p, size in before.items() if p not in after)
    assert after[-1] == max(before)  # the active segment stays
    assert commitlog_bytes(store) <= 3 * SEGMENT
    for q in range(2):
        low = store.min_offset("T", q)
        assert 0 < low < store.max_offset("T", q) == 60
        with pytest.raises(OffsetPurgedError) as purged:
            store.read("T", q, low - 1, 1)
        assert purged.value.code == Code.ILLEGAL_OFFSET
        assert "purged" in purged.value.message and str(low) in purged.value.message
        assert purged.value.min_offset == low
        assert_readable_from_min(store, q)
        assert store.offset_for_timestamp("T", q, 0) == low
        assert store.count_matching("T", q, 0, 60, None) == 60 - low
    await store.checkpoint()  # index files emptied by retention go once checkpointed
    for q in range(2):
        files = sorted((store.data_dir / "index" / "T" / str(q)).iterdir())
        assert int(files[0].name) > store.min_offset("T", q) - 8
    assert store.apply_retention() == 0  # nothing more to do
    await store.aclose()

    reopened = store_factory(segment_bytes=SEGMENT, retention_bytes=3 * SEGMENT,
                             index_entries_per_file=8)  # fmt: skip
    assert reopened.recovery is not None and reopened.recovery.rebuilt_queues == []
    for q in range(2):
        assert reopened.min_offset("T", q) == store.min_offset("T", q)
        assert_readable_from_min(reopened, q)
    await fill(reopened, 3)
    assert reopened.max_offset("T", 0) == 63


async def test_retention_by_age_uses_segment_last_write_time(store_factory) -> None:
    store = store_factory(segment_bytes=SEGMENT, retention_hours=1.0)
    await fill(store, 40)
    await store.flush()
    all_segments = segments(store)
    sizes = [p.stat().st_size for p in all_segments]
    assert store.apply_retention() == 0  # nothing is an hour old
    two_hours_ago = time.time() - 7200
    for path in all_segments:  # every segment old, the active one included
        os.utime(path, (two_hours_ago, two_hours_ago))
    recent = all_segments[3]
    os.utime(recent, None)  # segment 3 was written just now
    freed = store.apply_retention()
    assert freed >= sum(sizes[:3])
    assert segments(store) == all_segments[3:]  # stops at the first young segment
    os.utime(recent, (two_hours_ago, two_hours_ago))
    store.apply_retention()
    assert segments(store) == [all_segments[-1]]  # everything but the active segment
    for q in range(2):
        low = store.min_offset("T", q)
        assert low > 0
        assert_readable_from_min(store, q)


async def test_fully_purged_queue_keeps_its_offsets(store_factory) -> None:
    store = store_factory(segment_bytes=SEGMENT, retention_bytes=1, index_entries_per_file=4)
    await fill(store, 20, queues=1)
    store.create_topic("U", 1)
    for _ in range(20):  # U's records push all of T's into old segments
        await store.append("U", 0, [Message("U", b"u" * 300)])
    await store.flush()
    store.apply_retention()
    assert store.min_offset("T", 0) == store.max_offset("T", 0) == 20
    assert store.read("T", 0, 20, 5).messages == []
    with pytest.raises(OffsetPurgedError):
        store.read("T", 0, 0, 5)
    assert store.offset_for_timestamp("T", 0, 0) == 20
    await store.aclose()
    reopened = store_factory(segment_bytes=SEGMENT, retention_bytes=1, index_entries_per_file=4)
    assert reopened.min_offset("T", 0) == reopened.max_offset("T", 0) == 20
    stored = await reopened.append("T", 0, [Message("T", body_for(0, 20))])
    assert stored[0].queue_offset == 20


async def test_retention_never_deletes_data_not_yet_fsynced(store_factory) -> None:
    store = store_factory(flush="async", segment_bytes=SEGMENT, retention_bytes=1)
    await fill(store, 30)
    assert len(segments(store)) > 2
    assert store.apply_retention() == 0  # async flush: nothing fsynced yet
    await store.flush()
    assert store.apply_retention() > 0
    assert len(segments(store)) == 1


@pytest.mark.looptime
async def test_started_store_applies_retention_on_its_interval(store_factory) -> None:
    # The flush loop runs on the injected timer: on virtual time its intervals are exact.
    store = store_factory(segment_bytes=SEGMENT, retention_bytes=SEGMENT, flush_interval_ms=500,
                          retention_interval_s=30.0, timer=LoopClock())  # fmt: skip
    await fill(store, 30)
    before = len(segments(store))
    await store.start()
    await asyncio.sleep(29)
    assert len(segments(store)) == before  # not yet due: fsynced, but kept
    await asyncio.sleep(2)
    assert len(segments(store)) <= 2
    assert store.min_offset("T", 0) > 0
    assert_readable_from_min(store, 0)


async def test_crash_right_after_retention_recovers_without_rebuild(store_factory) -> None:
    """A copy of the live directory taken between retention and the next checkpoint is what
    a kill -9 at that moment leaves behind."""
    store = store_factory(segment_bytes=SEGMENT, retention_bytes=2 * SEGMENT,
                          index_entries_per_file=4)  # fmt: skip
    await fill(store, 50)
    await store.checkpoint()
    await store.flush()
    assert store.apply_retention() > 0
    shutil.copytree(store.data_dir, store.data_dir.parent / "copy")
    copy = store_factory("copy", segment_bytes=SEGMENT, retention_bytes=2 * SEGMENT,
                         index_entries_per_file=4)  # fmt: skip
    assert copy.recovery is not None and copy.recovery.rebuilt_queues == []
    for q in range(2):
        assert copy.min_offset("T", q) == store.min_offset("T", q) > 0
        assert_readable_from_min(copy, q)
