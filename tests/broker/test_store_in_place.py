"""The store writes a large body from where it is (issue 20): a broker's send left each large
body as a view of grpc's bytes of the request, then copied it into bytes, into its record and
into the write buffer of the whole batch (three more copies of a 100 MiB send at once)."""

from __future__ import annotations

import errno
import os
import tracemalloc

import pytest
from popmq.broker.contract.errors import RefusedError
from popmq.broker.contract.types import Message
from popmq.broker.store import commitlog as commitlog_module
from popmq.broker.store import writer as writer_module

MIB = 1 << 20


async def test_large_bodies_are_written_from_their_views_without_a_copy(store_factory) -> None:
    store = store_factory()
    store.create_topic("T", 1)
    await store.append("T", 0, [Message("T", b"warm")])  # files, index, caches
    request = bytearray(os.urandom(MIB)) * 8  # stands for grpc's bytes of a request
    views = [memoryview(request)[i * 2 * MIB : (i + 1) * 2 * MIB] for i in range(4)]
    tracemalloc.start()
    try:
        stored = await store.append("T", 0, [Message("T", v, tag=f"t{i}") for i, v in
                                             enumerate(views)])  # fmt: skip
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < MIB, f"the append allocated {peak / MIB:.1f} MiB for 8 MiB of views"
    read = store.read("T", 0, stored[0].queue_offset, 10, max_bytes=64 * MIB).messages
    assert [m.body for m in read] == [v.tobytes() for v in views]
    assert [m.tag for m in read] == ["t0", "t1", "t2", "t3"]


async def test_more_buffers_than_one_write_takes(store_factory, monkeypatch) -> None:
    """Over IOV_MAX buffers in one append: written in several pwritev calls, in order."""
    monkeypatch.setattr(writer_module, "WRITE_IN_PLACE_FROM", 1)  # two buffers per message
    store = store_factory()
    store.create_topic("T", 1)
    bodies = [f"body-{i}".encode() for i in range(1500)]
    await store.append("T", 0, [Message("T", memoryview(b)) for b in bodies])
    assert [m.body for m in store.read("T", 0, 0, 2000).messages] == bodies


async def test_a_write_that_fails_half_way_leaves_no_partial_frames(
    store_factory, monkeypatch
) -> None:
    """The first pwritev of an append lands and the next fails (the disk filled up): the
    file is cut back to before the append, which is refused, and the next one is whole."""
    monkeypatch.setattr(writer_module, "WRITE_IN_PLACE_FROM", 1)
    store = store_factory(flush="sync")
    store.create_topic("T", 1)
    await store.append("T", 0, [Message("T", b"before")])
    [segment] = store._commitlog.segments
    size = segment.path.stat().st_size
    real = os.pwritev
    calls = []

    def fail_second(fd: int, buffers: list[bytes], offset: int) -> int:
        calls.append(len(buffers))
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, buffers, offset)

    monkeypatch.setattr(commitlog_module.os, "pwritev", fail_second)
    with pytest.raises(RefusedError, match="store write failed"):
        await store.append("T", 0, [Message("T", b"x" * 10) for _ in range(600)])
    assert calls[0] == 1024 and segment.path.stat().st_size == size
    monkeypatch.setattr(commitlog_module.os, "pwritev", real)
    await store.append("T", 0, [Message("T", b"after")])
    assert [m.body for m in store.read("T", 0, 0, 10).messages] == [b"before", b"after"]
    await store.aclose()
    reopened = store_factory(flush="sync")
    assert [m.body for m in reopened.read("T", 0, 0, 10).messages] == [b"before", b"after"]
