"""MessageStore's public API: topics, append/read, offsets, listeners, state, group commit."""

from __future__ import annotations

import asyncio

import pytest
from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.types import Message
from popmq.broker.store import OffsetOutOfRangeError, TopicMeta
from popmq.broker.store.framing import HEADER_SIZE, iter_frames


def msg(body: bytes, tag: str = "", **kw: object) -> Message:
    return Message(topic="T", body=body, tag=tag, **kw)  # type: ignore[arg-type]


async def test_append_ids_stores_as_append_does(store_factory) -> None:
    """A send's append answers only ids and the first offset; what it stores reads back
    exactly as ``append`` would have stored it, after earlier appends' offsets."""
    store = store_factory(clock=lambda: 7_000)
    store.create_topic("T", 1)
    await store.append("T", 0, [msg(b"before", message_id="ID0")])
    ids, base = await store.append_ids(
        "T", 0, [msg(b"one", "TagA", keys=["k"], properties={"a": "1"}, message_id="ID1"),
                 msg(b"two", message_id="")],
    )  # fmt: skip
    assert base == 1
    assert ids[0] == "ID1" and ids[1]  # an empty id is given one
    read = store.read("T", 0, 0, 10).messages
    assert [(m.queue_offset, m.message_id, bytes(m.body)) for m in read] == [
        (0, "ID0", b"before"), (1, "ID1", b"one"), (2, ids[1], b"two"),
    ]  # fmt: skip
    assert (read[1].tag, read[1].keys, read[1].properties) == ("TagA", ["k"], {"a": "1"})
    assert read[1].store_timestamp_ms == 7_000
    assert await store.append_ids("T", 0, []) == ([], 3)
    await store.aclose()


async def test_topics_are_durable_and_validated(store_factory) -> None:
    store = store_factory()
    assert store.create_topic("orders", 4) == TopicMeta("orders", 4)
    assert store.create_topic("orders", 4) == TopicMeta("orders", 4)  # idempotent
    assert store.create_topic("orders", 6) == TopicMeta("orders", 6)  # grows
    with pytest.raises(RefusedError) as shrink:
        store.create_topic("orders", 2)
    assert shrink.value.code == Code.BAD_REQUEST
    store.create_topic("%RETRY%g_orders", 1)
    for bad in ("", "a/b", "..", "x" * 256, "sp ace"):
        with pytest.raises(RefusedError) as err:
            store.create_topic(bad, 1)
        assert err.value.code == Code.ILLEGAL_TOPIC
    with pytest.raises(RefusedError) as zero:
        store.create_topic("zero", 0)
    assert zero.value.code == Code.BAD_REQUEST
    await store.aclose()

    reopened = store_factory()
    assert reopened.list_topics() == [TopicMeta("%RETRY%g_orders", 1), TopicMeta("orders", 6)]
    assert reopened.get_topic("missing") is None
    reopened.delete_topic("orders")
    assert reopened.get_topic("orders") is None
    with pytest.raises(RefusedError) as err:
        reopened.delete_topic("orders")
    assert err.value.code == Code.TOPIC_NOT_FOUND


async def test_append_assigns_offsets_and_reads_back_everything(store_factory) -> None:
    clock_now = [1_000]
    store = store_factory(clock=lambda: clock_now[0])
    store.create_topic("T", 2)
    first = await store.append(
        "T",
        1,
        [
            msg(b"one", "TagA", keys=["k1", "k2"], properties={"a": "1"}, message_id="ID1",
                message_group="g", delivery_timestamp_ms=5_000, born_timestamp_ms=900,
                born_host="10.0.0.1", reconsume_times=3),
            msg(b"", "", message_id=""),
        ],
    )  # fmt: skip
    assert [m.queue_offset for m in first] == [0, 1]
    assert first[1].message_id  # the store made one
    assert all(m.store_timestamp_ms == 1_000 and m.store_host == "broker-t" for m in first)
    clock_now[0] = 2_000
    second = await store.append("T", 1, [msg(b"three")])
    assert second[0].queue_offset == 2
    assert store.max_offset("T", 1) == 3
    assert store.min_offset("T", 1) == 0
    assert store.max_offset("T", 0) == 0

    result = store.read("T", 1, 0, 10)
    assert result.next_offset == 3
    assert result.messages == first + second
    got = result.messages[0]
    assert (got.keys, got.properties, got.message_group, got.reconsume_times) == (
        ["k1", "k2"], {"a": "1"}, "g", 3,
    )  # fmt: skip
    assert (got.delivery_timestamp_ms, got.born_timestamp_ms, got.born_host) == (
        5_000, 900, "10.0.0.1",
    )  # fmt: skip
    # partial reads and reading at the end
    assert [m.queue_offset for m in store.read("T", 1, 1, 1).messages] == [1]
    assert store.read("T", 1, 3, 10).messages == []
    assert store.read("T", 1, 3, 10).next_offset == 3


async def test_bad_offsets_queues_and_topics(store_factory) -> None:
    store = store_factory()
    store.create_topic("T", 2)
    await store.append("T", 0, [msg(b"a"), msg(b"b")])
    with pytest.raises(OffsetOutOfRangeError) as beyond:
        store.read("T", 0, 3, 1)
    assert beyond.value.code == Code.ILLEGAL_OFFSET
    assert "max offset" in beyond.value.message
    with pytest.raises(OffsetOutOfRangeError):
        store.read("T", 0, -1, 1)
    with pytest.raises(RefusedError) as no_topic:
        await store.append("nope", 0, [msg(b"x")])
    assert no_topic.value.code == Code.TOPIC_NOT_FOUND
    with pytest.raises(RefusedError) as no_topic_read:
        store.read("nope", 0, 0, 1)
    assert no_topic_read.value.code == Code.TOPIC_NOT_FOUND
    for bad_queue in (2, -1):
        with pytest.raises(RefusedError) as bad:
            await store.append("T", bad_queue, [msg(b"x")])
        assert bad.value.code == Code.BAD_REQUEST
        with pytest.raises(RefusedError):
            store.max_offset("T", bad_queue)
    with pytest.raises(RefusedError) as too_long_tag:
        await store.append("T", 0, [msg(b"x", tag="t" * 70_000)])
    assert too_long_tag.value.code == Code.BAD_REQUEST
    assert store.max_offset("T", 0) == 2  # the refused batch left nothing behind


async def test_tag_filter_skips_but_advances(store_factory) -> None:
    store = store_factory()
    store.create_topic("T", 1)
    tags = ["A", "B", "A", "C", "B", "B", "A"]
    await store.append("T", 0, [msg(f"m{i}".encode(), tag) for i, tag in enumerate(tags)])
    result = store.read("T", 0, 0, 2, tags=frozenset({"B"}))
    assert [m.queue_offset for m in result.messages] == [1, 4]
    assert result.next_offset == 5
    rest = store.read("T", 0, 5, 10, tags=frozenset({"B"}))
    assert [m.queue_offset for m in rest.messages] == [5]
    assert rest.next_offset == 7
    none = store.read("T", 0, 0, 10, tags=frozenset({"Z"}))
    assert none.messages == [] and none.next_offset == 7
    assert store.count_matching("T", 0, 0, 7, frozenset({"A"})) == 3
    assert store.count_matching("T", 0, 2, 7, frozenset({"A", "C"})) == 3
    assert store.count_matching("T", 0, 0, 7, None) == 7
    assert store.count_matching("T", 0, 3, 100, None) == 4


async def test_max_bytes_limits_a_read_but_returns_at_least_one(store_factory) -> None:
    store = store_factory()
    store.create_topic("T", 1)
    await store.append("T", 0, [msg(bytes(1000)) for _ in range(10)])
    small = store.read("T", 0, 0, 10, max_bytes=2500)
    assert len(small.messages) == 2 and small.next_offset == 2
    tiny = store.read("T", 0, 0, 10, max_bytes=1)
    assert len(tiny.messages) == 1 and tiny.next_offset == 1


async def test_large_bodies_and_segment_rollover(store_factory) -> None:
    store = store_factory(segment_bytes=4096)
    store.create_topic("T", 3)
    big = bytes(range(256)) * 400  # 100 KiB: bigger than a segment
    expected: dict[int, list[bytes]] = {0: [], 1: [], 2: []}
    for i in range(60):
        body = big if i % 20 == 7 else f"body-{i}".encode() * 40
        await store.append("T", i % 3, [msg(body, "t")])
        expected[i % 3].append(body)
    segments = sorted((store.data_dir / "commitlog").iterdir())
    assert len(segments) >= 8
    for path in segments:  # whole frames only; oversize only when the frame is alone
        frames = list(iter_frames(path.read_bytes()))
        assert sum(HEADER_SIZE + len(p) for _, p in frames) == path.stat().st_size
        assert path.stat().st_size <= 4096 or len(frames) == 1
    for queue_id, bodies in expected.items():
        assert [m.body for m in store.read("T", queue_id, 0, 100).messages] == bodies
    await store.aclose()
    reopened = store_factory(segment_bytes=4096)
    for queue_id, bodies in expected.items():
        assert [m.body for m in reopened.read("T", queue_id, 0, 100).messages] == bodies


async def test_offset_for_timestamp(store_factory) -> None:
    now = [100]
    store = store_factory(clock=lambda: now[0])
    store.create_topic("T", 1)
    for ts in (100, 200, 200, 300, 450):
        now[0] = ts
        await store.append("T", 0, [msg(str(ts).encode())])
    now[0] = 50  # a clock going backwards must not break the ordering
    await store.append("T", 0, [msg(b"late")])
    assert store.read("T", 0, 5, 1).messages[0].store_timestamp_ms == 450
    cases = {0: 0, 100: 0, 101: 1, 200: 1, 201: 3, 300: 3, 450: 4, 451: 6}
    for ts, offset in cases.items():
        assert store.offset_for_timestamp("T", 0, ts) == offset, ts


async def test_consumer_offsets_and_state_survive_restart(store_factory) -> None:
    store = store_factory()
    store.create_topic("T", 2)
    assert store.get_consumer_offset("g", "T", 1) == -1
    store.set_consumer_offset("g", "T", 1, 42)
    store.set_consumer_offset("h", "T", 0, 7)
    with pytest.raises(RefusedError) as negative:
        store.set_consumer_offset("g", "T", 1, -5)
    assert negative.value.code == Code.BAD_REQUEST
    with pytest.raises(RefusedError) as missing:
        store.set_consumer_offset("g", "nope", 0, 1)
    assert missing.value.code == Code.TOPIC_NOT_FOUND
    store.save_state("pop-groups", {"g": {"fifo": True}, "n": [1, 2]})
    assert store.load_state("never-saved") is None
    with pytest.raises(RefusedError):
        store.save_state("../escape", 1)
    await store.aclose()
    reopened = store_factory()
    assert reopened.get_consumer_offset("g", "T", 1) == 42
    assert reopened.get_consumer_offset("h", "T", 0) == 7
    assert reopened.load_state("pop-groups") == {"g": {"fifo": True}, "n": [1, 2]}
    reopened.delete_topic("T")
    reopened.create_topic("T", 2)  # a new topic of the same name starts from scratch
    assert reopened.get_consumer_offset("g", "T", 1) == -1
    assert reopened.max_offset("T", 1) == 0


async def test_deleted_topic_recreated_does_not_resurrect_old_records(store_factory) -> None:
    store = store_factory()
    store.create_topic("T", 1)
    await store.append("T", 0, [msg(b"old-0"), msg(b"old-1")])
    store.delete_topic("T")
    store.create_topic("T", 1)
    await store.append("T", 0, [msg(b"new-0")])
    await store.aclose()
    (store.data_dir / "checkpoint.json").unlink()  # force a walk over the whole commitlog
    reopened = store_factory()
    assert [m.body for m in reopened.read("T", 0, 0, 10).messages] == [b"new-0"]


async def test_arrival_listeners_get_topic_queue_max_and_tags(store_factory) -> None:
    store = store_factory()
    store.create_topic("T", 2)
    calls: list[tuple[str, int, int, set[str]]] = []
    store.add_arrival_listener(lambda *args: calls.append(args))

    def broken(*_: object) -> None:
        raise RuntimeError("listener bug")

    store.add_arrival_listener(broken)
    await store.append("T", 1, [msg(b"a", "x"), msg(b"b", "y"), msg(b"c", "x")])
    await store.append("T", 0, [msg(b"d")])
    await store.append("T", 1, [])  # nothing stored: nobody woken
    assert calls == [("T", 1, 3, {"x", "y"}), ("T", 0, 1, {""})]
    assert store.max_offset("T", 1) == 3  # the broken listener did not fail the append


async def test_sync_flush_listener_runs_after_fsync(store_factory) -> None:
    store = store_factory(flush="sync")
    store.create_topic("T", 1)
    seen: list[int] = []
    store.add_arrival_listener(lambda *_: seen.append(store.commitlog_fsyncs))
    before = store.commitlog_fsyncs
    await store.append("T", 0, [msg(b"a")])
    assert seen == [before + 1]


async def test_group_commit_shares_fsyncs(store_factory) -> None:
    store = store_factory(flush="sync")
    store.create_topic("T", 4)
    before = store.commitlog_fsyncs
    appends = 400
    results = await asyncio.gather(
        *(store.append("T", i % 4, [msg(f"m{i}".encode())]) for i in range(appends))
    )
    fsyncs = store.commitlog_fsyncs - before
    assert 1 <= fsyncs <= appends // 10, fsyncs
    offsets = sorted((r[0].queue_id, r[0].queue_offset) for r in results)
    assert offsets == sorted((q, o) for q in range(4) for o in range(appends // 4))
    # a lone append still gets its own fsync
    lone_before = store.commitlog_fsyncs
    await store.append("T", 0, [msg(b"lone")])
    assert store.commitlog_fsyncs == lone_before + 1


async def test_async_flush_task_fsyncs_periodically(store_factory) -> None:
    store = store_factory(flush="async", flush_interval_ms=20)
    store.create_topic("T", 1)
    await store.start()
    before = store.commitlog_fsyncs
    await store.append("T", 0, [msg(b"a")])
    assert store.commitlog_fsyncs == before  # async: acknowledged before the fsync
    for _ in range(100):
        if store.commitlog_fsyncs > before:
            break
        await asyncio.sleep(0.01)
    assert store.commitlog_fsyncs > before
    await store.aclose()
    await store.aclose()  # idempotent


async def test_idle_flushes_write_no_checkpoint(store_factory) -> None:
    """The periodic flush writes the checkpoint (two metafiles, each fsynced) only when
    something changed since the last one: an idle broker's disk stays quiet."""
    store = store_factory(flush="async", flush_interval_ms=60_000)  # no flush of its own
    store.create_topic("T", 1)
    await store.start()
    periodic = store._checkpointer.checkpoint  # what the flush loop calls, as it calls it

    async def written_by_periodic_flush() -> int:
        before = store.checkpoints_written
        await periodic(only_if_changed=True)
        return store.checkpoints_written - before

    await written_by_periodic_flush()  # whatever start left to write
    assert await written_by_periodic_flush() == 0  # idle: nothing new
    await store.append("T", 0, [msg(b"a")])
    assert await written_by_periodic_flush() == 1  # the append's position and index
    assert await written_by_periodic_flush() == 0
    store.set_consumer_offset("g", "T", 0, 1)
    assert await written_by_periodic_flush() == 1  # a committed offset
    assert await written_by_periodic_flush() == 0
    before = store.checkpoints_written
    await store.checkpoint()  # an explicit checkpoint (close, replication) always writes
    assert store.checkpoints_written == before + 1
    await store.aclose()


async def test_cancelled_sync_append_does_not_break_group_commit(store_factory) -> None:
    store = store_factory(flush="sync")
    store.create_topic("T", 1)
    task = asyncio.create_task(store.append("T", 0, [msg(b"a")]))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    results = await asyncio.gather(*(store.append("T", 0, [msg(b"b")]) for _ in range(5)))
    assert [r[0].queue_offset for r in results] == [1, 2, 3, 4, 5]


async def test_second_store_on_same_directory_is_refused(store_factory) -> None:
    store_factory()
    with pytest.raises(RefusedError) as err:
        store_factory()
    assert "another store" in err.value.message


async def test_filtered_scans_are_bounded(store_factory, monkeypatch) -> None:
    import popmq.broker.store.reader as reader

    monkeypatch.setattr(reader, "_MAX_FILTER_SCAN", 40)
    monkeypatch.setattr(reader, "_FILTER_CHUNK", 16)
    monkeypatch.setattr(reader, "_MAX_COUNT_SCAN", 100)
    store = store_factory()
    store.create_topic("T", 1)
    tags = ["A" if i % 4 == 0 else "B" for i in range(1000)]
    tags[950] = "RARE"
    await store.append("T", 0, [msg(b"m", tag) for tag in tags])
    first = store.read("T", 0, 0, 5, tags=frozenset({"RARE"}))
    assert first.messages == [] and first.next_offset == 40  # gave up after 40 entries
    found = store.read("T", 0, 920, 5, tags=frozenset({"RARE"}))
    assert [m.queue_offset for m in found.messages] == [950] and found.next_offset == 960
    assert store.count_matching("T", 0, 0, 100, frozenset({"A"})) == 25  # exact
    assert store.count_matching("T", 0, 0, 1000, frozenset({"A"})) == 250  # extrapolated
    assert store.count_matching("T", 0, 900, 1000, frozenset({"RARE", "A"})) == 26


async def test_close_while_the_flush_task_is_mid_checkpoint(store_factory) -> None:
    for round_ in range(15):
        store = store_factory(flush_interval_ms=1)
        if store.get_topic("T") is None:
            store.create_topic("T", 1)
        await store.start()
        await store.append("T", 0, [msg(b"x")])
        store.set_consumer_offset("g", "T", 0, round_)
        await asyncio.sleep(0.001 * (round_ % 4))
        await store.aclose()  # cancels the task, whatever it is doing, then checkpoints
    reopened = store_factory()
    assert reopened.max_offset("T", 0) == 15
    assert reopened.get_consumer_offset("g", "T", 0) == 14


async def test_peek_offsets_reads_the_index_only(store_factory, monkeypatch) -> None:
    store = store_factory()
    store.create_topic("T", 1)
    tags = ["A", "B", "A", "C", "B", "B", "A"]
    await store.append("T", 0, [msg(f"m{i}".encode(), tag) for i, tag in enumerate(tags)])
    expected = {
        (start, limit, wanted): store.read("T", 0, start, limit, wanted)
        for start in (0, 3, 7)
        for limit in (1, 2, 10)
        for wanted in (None, frozenset({"B"}), frozenset({"A", "C"}), frozenset({"Z"}))
    }

    def no_fetch(*args: object, **kwargs: object) -> None:
        raise AssertionError("peek_offsets must not fetch records")

    monkeypatch.setattr("popmq.broker.store.reads.fetch_messages", no_fetch)
    for (start, limit, wanted), result in expected.items():
        offsets, next_offset = store.peek_offsets("T", 0, start, limit, wanted)
        assert offsets == [m.queue_offset for m in result.messages], (start, limit, wanted)
        assert next_offset == result.next_offset
    with pytest.raises(OffsetOutOfRangeError):
        store.peek_offsets("T", 0, 8, 1)
