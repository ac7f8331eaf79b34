"""ElectedRoleSource: replication's role from the election in a real etcd (one member)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
from popmq.broker.replication.etcd_role import DeposedError, ElectedRoleSource
from popmq.broker.replication.role import GroupRole
from support.etcd import EtcdCluster

from popmq.coord.etcd import EtcdStore
from popmq.coord.group import GroupMember, MemberSettings, join_group
from popmq.coord.keys import GroupKeys, decode

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
