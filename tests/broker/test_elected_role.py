"""ElectedRoleSource: replication's role from the election in a real etcd (one member)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from functools import partial
from pathlib import Path

import anyio
import pytest
from popmq.broker.replication.etcd_role import DeposedError, ElectedRoleSource
from popmq.broker.replication.role import GroupRole
from support.etcd import EtcdCluster

from popmq.coord.etcd import EtcdStore
from popmq.coord.group import GroupMember, MemberSettings, join_group
from popmq.coord.keys import GroupKeys, decode, encode

pytestmark = [pytest.mark.wallclock, pytest.mark.subprocess]  # a real etcd


@contextlib.asynccontextmanager
async def member(etcd: EtcdCluster, name: str) -> AsyncIterator[GroupMember]:
    store = EtcdStore(etcd.endpoints, timeout_s=0.5)
    settings = MemberSettings("g", name, f"127.0.0.1:{100 + int(name[-1])}", lease_ttl_s=2,
                              poll_interval_s=0.3, retry_s=0.2)  # fmt: skip
    try:
        async with join_group(store, settings) as joined:
            yield joined
    finally:
        await store.aclose()


async def in_sync_key(etcd: EtcdCluster) -> list[str]:
    store = EtcdStore(etcd.endpoints)
    try:
        kv = await store.get(GroupKeys("/popmq/", "g").in_sync)
    finally:
        await store.aclose()
    assert kv is not None
    return list(decode(kv.value)["members"])


async def test_roles_in_sync_reports_and_the_fence(tmp_path: Path) -> None:
    async with EtcdCluster.started(tmp_path) as etcd, member(etcd, "n0") as n0:
        source = ElectedRoleSource(n0)
        with anyio.fail_after(5):
            led = await source.wait_changed(GroupRole(0, "", "", False))
        assert led == GroupRole(n0.role.epoch, "n0", "127.0.0.1:100", True)
        assert source.current() == led

        await source.report_in_sync(led.epoch, frozenset({"n0", "n1"}))
        assert await in_sync_key(etcd) == ["n0", "n1"]
        with pytest.raises(DeposedError):  # an older epoch's leader records nothing
            await source.report_in_sync(led.epoch - 1, frozenset({"n0"}))
        assert await in_sync_key(etcd) == ["n0", "n1"]

        async with member(etcd, "n1") as n1:  # a follower: sees the leader, reports nothing
            follower = ElectedRoleSource(n1)
            with anyio.fail_after(5):
                seen = await follower.wait_changed(GroupRole(0, "", "", False))
            assert seen == GroupRole(led.epoch, "n0", "127.0.0.1:100", False)
            with pytest.raises(DeposedError):
                await follower.report_in_sync(led.epoch, frozenset({"n1"}))

            # The fence: once the lease deadline passes without a keepalive, the leader is
            # no leader for replication, before anyone has been elected.
            n0._lease_deadline = anyio.current_time()  # as if the keepalives stopped
            assert not source.current().is_leader


async def test_a_wiped_node_still_named_in_sync_is_not_elected(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The in-sync set in etcd is what a leader last recorded: it may still name a node whose
    data directory was emptied since (the leader died before recording the shrink). That node
    must not campaign until its own copy is whole: elected empty, it served TOPIC_NOT_FOUND
    and would have reset every follower to its empty copy."""
    from popmq.broker.replication.epochs import EpochHistory

    from popmq.cli.broker_cmd import serve_broker
    from popmq.config import BrokerConfig, BrokerGroupConfig, EtcdConfig, ReplicationConfig

    caplog.set_level(logging.WARNING, logger="popmq.coord.group")
    data = tmp_path / "n1"  # wiped: nothing in it
    async with EtcdCluster.started(tmp_path) as etcd:
        store = EtcdStore(etcd.endpoints)
        keys = GroupKeys("/popmq/", "g")
        try:
            await store.put(keys.in_sync, encode({"members": ["n0", "n1"]}))  # n0 is gone
            config = BrokerConfig(
                name="n1", port=0, data_dir=data, etcd=EtcdConfig(endpoints=etcd.endpoints,
                lease_ttl_s=2), group=BrokerGroupConfig(name="g"),
                replication=ReplicationConfig(mode="sync", min_in_sync=2),
            )  # fmt: skip
            stop = asyncio.Event()
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(partial(serve_broker, config, announce=lambda _: None,
                                         stop=stop))  # fmt: skip
                with anyio.fail_after(10):  # it saw no leader, and declined to campaign
                    await polled(lambda: any("does not campaign" in r.getMessage()
                                             for r in caplog.records))  # fmt: skip
                assert await store.get(keys.leader) is None
                EpochHistory(data).begin(1, 0)  # as if it had caught up: its copy is whole
                with anyio.fail_after(10):
                    while True:
                        kv = await store.get(keys.leader)
                        if kv is not None:
                            break
                        await anyio.sleep(0.05)
                assert decode(kv.value)["name"] == "n1"
                stop.set()
        finally:
            await store.aclose()


async def polled(check: Callable[[], bool]) -> None:
    while True:
        if check():
            return
        await anyio.sleep(0.05)
