"""The store's open-file budget: descriptors stay bounded however many queues exist, and
closing idle files loses nothing (issue 9, defect 7)."""

from __future__ import annotations

import os

from popmq.broker.api.types import Message
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
    assert open_fds() == before


async def test_thousands_of_queues_keep_descriptors_bounded(store_factory) -> None:
    before = open_fds()
    store = store_factory(max_open_files=16, segment_bytes=4096)
    topics = [f"t{i}" for i in range(150)]
    for name in topics:
        store.create_topic(name, 8)  # 1,200 queue index files
    for round_ in range(2):
        for name in topics:
            for queue_id in range(8):
                body = f"{name}/{queue_id}/{round_}".encode()
                await store.append(name, queue_id, [Message(topic=name, body=body)])
        # The whole store: the budget, the active segment, the lock (and a spare or two).
        assert open_fds() - before <= 16 + 4
    await store.checkpoint()
    assert store.open_files.evictions > 0
    await store.close()
    assert open_fds() == before

    reopened = store_factory(max_open_files=16, segment_bytes=4096)
    assert open_fds() - before <= 16 + 4
    for name in topics:
        for queue_id in range(8):
            got = reopened.read(name, queue_id, 0, 10).messages
            assert [m.body for m in got] == [f"{name}/{queue_id}/{r}".encode() for r in (0, 1)]
