"""EtcdStore against a real etcd member on 127.0.0.1 (tests/support/etcd.py)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
from support.etcd import EtcdCluster

from popmq.coord import Compare, CoordUnavailableError, Delete, LeaseLostError, Put, WatchEvent
from popmq.coord.etcd import EtcdStore, prefix_end

pytestmark = pytest.mark.subprocess  # a real etcd


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[EtcdStore]:
    async with EtcdCluster.started(tmp_path) as cluster:
        client = EtcdStore(cluster.endpoints)
        try:
            yield client
        finally:
            await client.aclose()


def test_prefix_end() -> None:
    assert prefix_end(b"/a/") == b"/a0"
    assert prefix_end(b"a\xff") == b"b"


async def test_put_get_and_prefix(store: EtcdStore) -> None:
    revision = await store.put(b"/g/a", b"1")
    await store.put(b"/g/b", b"2")
    await store.put(b"/h", b"3")
    kv = await store.get(b"/g/a")
    assert kv is not None and kv.value == b"1" and kv.create_revision == revision
    kvs, read_at = await store.get_prefix(b"/g/")
    assert [(k.key, k.value) for k in kvs] == [(b"/g/a", b"1"), (b"/g/b", b"2")]
    assert read_at >= revision + 1
    await store.delete(b"/g/a")
    assert await store.get(b"/g/a") is None


async def test_txn_create_only_once(store: EtcdStore) -> None:
    absent = [Compare(b"/leader", "create", 0)]
    first = await store.txn(absent, [Put(b"/leader", b"n0")])
    second = await store.txn(absent, [Put(b"/leader", b"n1")])
    assert first.succeeded and not second.succeeded
    kv = await store.get(b"/leader")
    assert kv is not None and kv.value == b"n0" and kv.create_revision == first.revision
    # A writer holding the epoch may change a key guarded by it; another epoch may not.
    guarded = [Compare(b"/leader", "create", first.revision)]
    assert (await store.txn(guarded, [Put(b"/isr", b"x")])).succeeded
    stale = [Compare(b"/leader", "create", first.revision - 1)]
    result = await store.txn(stale, [Put(b"/isr", b"y")], [Delete(b"/nothing")])
    assert not result.succeeded
    kv = await store.get(b"/isr")
    assert kv is not None and kv.value == b"x"


async def test_value_compare(store: EtcdStore) -> None:
    await store.put(b"/k", b"v1")
    assert not (await store.txn([Compare(b"/k", "value", b"v0")], [Put(b"/k", b"v2")])).succeeded
    assert (await store.txn([Compare(b"/k", "value", b"v1")], [Put(b"/k", b"v2")])).succeeded


async def test_lease_binds_keys_and_revoke_deletes_them(store: EtcdStore) -> None:
    lease = await store.grant(5)
    assert await store.keepalive(lease) >= 4
    await store.put(b"/member", b"me", lease)
    kv = await store.get(b"/member")
    assert kv is not None and kv.lease == lease
    await store.revoke(lease)
    assert await store.get(b"/member") is None
    with pytest.raises(LeaseLostError):
        await store.keepalive(lease)
    with pytest.raises(LeaseLostError):
        await store.put(b"/member", b"again", lease)
    await store.revoke(lease)  # gone already: no error


@pytest.mark.wallclock
async def test_expired_lease_drops_its_keys(store: EtcdStore) -> None:
    lease = await store.grant(1)
    await store.put(b"/short", b"x", lease)
    started = time.monotonic()
    while await store.get(b"/short") is not None:
        assert time.monotonic() - started < 10, "the key outlived its 1 s lease"
        await anyio.sleep(0.2)
    with pytest.raises(LeaseLostError):
        await store.keepalive(lease)


async def test_watch_prefix_sees_puts_and_deletes(store: EtcdStore) -> None:
    _, revision = await store.get_prefix(b"/w/")
    seen: list[WatchEvent] = []

    async def watch() -> None:
        async for event in store.watch_prefix(b"/w/", revision + 1):
            seen.append(event)
            if len(seen) == 3:
                return

    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            group.start_soon(watch)
            await store.put(b"/w/a", b"1")
            await store.put(b"/outside", b"x")
            await store.put(b"/w/a", b"2")
            await store.delete(b"/w/a")
    assert [(e.kind, e.kv.key, e.kv.value) for e in seen] == [
        ("put", b"/w/a", b"1"),
        ("put", b"/w/a", b"2"),
        ("delete", b"/w/a", b""),
    ]


async def test_unreachable_etcd_is_coord_unavailable() -> None:
    store = EtcdStore(["http://127.0.0.1:9"], timeout_s=0.5)
    try:
        with pytest.raises(CoordUnavailableError) as error:
            await store.get(b"/x")
        assert "127.0.0.1:9" in error.value.message
    finally:
        await store.aclose()


async def test_second_endpoint_is_used_when_the_first_is_down(tmp_path: Path) -> None:
    async with EtcdCluster.started(tmp_path) as cluster:
        store = EtcdStore(["http://127.0.0.1:9", *cluster.endpoints], timeout_s=0.5)
        try:
            await store.put(b"/x", b"1")
            assert store.endpoints[0] == cluster.endpoints[0]  # the working one goes first
        finally:
            await store.aclose()
