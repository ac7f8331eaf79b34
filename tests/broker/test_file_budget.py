"""The store's open-file budget: descriptors stay bounded however many queues exist, and
closing idle files loses nothing (issue 9, defect 7)."""

from __future__ import annotations

import asyncio
import errno
import logging
import os

import pytest
from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.types import Message
from popmq.broker.store.file_budget import FileBudget


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_budget_closes_the_least_recently_used(tmp_path) -> None:
    budget = FileBudget(3)
    paths = [tmp_path / f"f{i}" for i in range(5)]
    before = open_fds()
    for path in paths:
        os.pwrite(budget.get(path, create=True), path.name.encode(), 0)
    assert budget.open_count == 3 and budget.evictions == 2
    assert open_fds() - before == 3
    # A closed file reopens with its data; the most recently used ones stayed open.
    assert os.pread(budget.get(paths[0]), 2, 0) == b"f0"
    assert budget.opens == 6
    budget.get(paths[4])
    assert budget.opens == 6  # still open: no new descriptor
    budget.close()
    assert open_fds() <= before  # nothing leaked (other tests' descriptors may close meanwhile)


async def test_hundreds_of_queues_keep_descriptors_bounded(store_factory) -> None:
    before = open_fds()
    store = store_factory(max_open_files=16, segment_bytes=4096)
    topics = [f"t{i}" for i in range(40)]
    for name in topics:
        store.create_topic(name, 8)  # 320 queue index files, 20 times the budget
    for round_ in range(2):
        for name in topics:
            for queue_id in range(8):
                body = f"{name}/{queue_id}/{round_}".encode()
                await store.append(name, queue_id, [Message(topic=name, body=body)])
        # The whole store: the budget, the active segment, the lock (and a spare or two).
        assert open_fds() - before <= 16 + 4
    await store.checkpoint()
    assert store.open_files.evictions > 0
    await store.aclose()
    assert open_fds() <= before  # nothing leaked (other tests' descriptors may close meanwhile)

    reopened = store_factory(max_open_files=16, segment_bytes=4096)
    assert open_fds() - before <= 16 + 4
    for name in topics:
        for queue_id in range(8):
            got = reopened.read(name, queue_id, 0, 10).messages
            assert [m.body for m in got] == [f"{name}/{queue_id}/{r}".encode() for r in (0, 1)]


async def test_a_failing_flush_makes_sends_wait_for_their_own_fsync(
    store_factory, monkeypatch, caplog
) -> None:
    # Every flush a checkpoint: the failure is injected into the checkpoint's file writes.
    store = store_factory(flush_interval_ms=10, checkpoint_interval_ms=10)
    store.create_topic("t", 1)
    await store.start()

    def emfile(*_args: object) -> None:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(store._checkpointer, "_write", emfile)
    with caplog.at_level(logging.ERROR):
        for _ in range(500):  # the flush loop runs every 10 ms
            if store.flush_failing:
                break
            await asyncio.sleep(0.01)
    assert store.flush_failures >= 1
    assert any("periodic flush failed" in r.getMessage() for r in caplog.records)
    # While the flush fails, an async-mode send is acknowledged only after its own fsync.
    before = store.commitlog_fsyncs
    await store.append("t", 0, [Message(topic="t", body=b"durable")])
    assert store.commitlog_fsyncs > before
    # And a send whose fsync fails is refused, never acknowledged.
    monkeypatch.setattr(store._commitlog, "sync_fds", emfile)
    with pytest.raises(RefusedError) as err:
        await store.append("t", 0, [Message(topic="t", body=b"not durable")])
    assert err.value.code == Code.MASTER_PERSISTENCE_TIMEOUT
    monkeypatch.undo()


async def test_a_failing_offsets_write_between_checkpoints_counts_and_is_retried(
    store_factory, monkeypatch
) -> None:
    """Flushes between checkpoints write only the consumer offsets: one that fails is a
    failing flush too, and the offsets stay to be written by the next one."""
    store = store_factory(flush_interval_ms=10, checkpoint_interval_ms=60_000)
    store.create_topic("t", 1)
    await store.start()
    real_write = store._checkpointer._write_offsets

    def emfile(*_args: object) -> None:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(store._checkpointer, "_write_offsets", emfile)
    store.set_consumer_offset("g", "t", 0, 3)
    for _ in range(1000):  # the flush loop runs every 10 ms
        if store.flush_failing:
            break
        await asyncio.sleep(0.01)
    assert store.flush_failing and store.durable_consumer_offset("g", "t", 0) == -1
    monkeypatch.setattr(store._checkpointer, "_write_offsets", real_write)
    for _ in range(1000):  # written (in the thread), then the loop sees the flush worked
        if store.durable_consumer_offset("g", "t", 0) == 3 and not store.flush_failing:
            break
        await asyncio.sleep(0.01)
    assert store.durable_consumer_offset("g", "t", 0) == 3
    assert not store.flush_failing
