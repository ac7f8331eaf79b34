"""Elections, the in-sync set and fencing (popmq.coord.group) against a real etcd."""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import anyio
import anyio.abc
import pytest
from support.etcd import EtcdCluster

from popmq.coord.etcd import EtcdStore
from popmq.coord.group import GroupMember, GroupRole, MemberSettings, join_group
from popmq.coord.keys import GroupKeys, decode

pytestmark = [pytest.mark.wallclock, pytest.mark.subprocess]  # a real etcd
TTL_S = 2  # etcd's smallest lease with a 1 s election timeout


@pytest.fixture
async def etcd(tmp_path: Path) -> AsyncIterator[EtcdCluster]:
    async with EtcdCluster.started(tmp_path) as cluster:
        yield cluster


@contextlib.asynccontextmanager
async def node(etcd: EtcdCluster, name: str, **options: object) -> AsyncIterator[GroupMember]:
    store = EtcdStore(etcd.endpoints, timeout_s=0.5)
    settings = MemberSettings("g", name, f"127.0.0.1:{100 + int(name[-1])}", lease_ttl_s=TTL_S,
                              poll_interval_s=0.3, retry_s=0.2, **options)  # type: ignore[arg-type]  # fmt: skip
    try:
        async with join_group(store, settings) as member:
            yield member
    finally:
        await store.aclose()


async def until(member: GroupMember, test: Callable[[GroupRole], bool], within_s: float) -> None:
    with anyio.fail_after(within_s):
        while not test(member.role):
            await member.role_changed()


async def test_first_node_leads_and_its_epoch_is_the_leader_key_revision(
    etcd: EtcdCluster,
) -> None:
    async with node(etcd, "n0") as n0:
        await until(n0, lambda r: r.is_leader, 5)
        assert n0.may_write() and n0.in_sync == ["n0"]
        store = EtcdStore(etcd.endpoints)
        try:
            leader = await store.get(GroupKeys("/popmq/", "g").leader)
        finally:
            await store.aclose()
        assert leader is not None and leader.create_revision == n0.role.epoch
        assert decode(leader.value) == {"name": "n0", "address": "127.0.0.1:100"}


async def test_follower_knows_the_leader_and_takes_over_when_it_leaves(
    etcd: EtcdCluster,
) -> None:
    async with node(etcd, "n1") as n1:
        await until(n1, lambda r: r.is_leader, 5)
        async with node(etcd, "n0") as n0:
            await until(n0, lambda r: r.leader_name == "n1", 5)
            assert not n0.role.is_leader and not n0.may_write()
            assert n0.role.leader_address == "127.0.0.1:101"
            first_epoch = n1.role.epoch
            assert await n1.set_in_sync(["n0"])
        # n0 left (revoking its lease): n1 still leads. Now n1 leaves and n0 comes back.
    async with node(etcd, "n0") as n0:
        await until(n0, lambda r: r.is_leader, 5)  # in the in-sync set, so it may lead
        assert n0.role.epoch > first_epoch


async def test_only_in_sync_nodes_are_elected_unless_unclean(etcd: EtcdCluster) -> None:
    async with node(etcd, "n0") as n0:
        await until(n0, lambda r: r.is_leader, 5)
    # n0 led alone and left: n1 is not in the in-sync set.
    async with node(etcd, "n1") as n1:
        await anyio.sleep(2 * TTL_S)
        assert not n1.role.has_leader, "a node outside the in-sync set was elected"
    async with node(etcd, "n1", unclean_election=True) as n1:
        await until(n1, lambda r: r.is_leader, 5)
        assert n1.in_sync == ["n1"]


async def test_a_deposed_leader_cannot_change_the_in_sync_set(etcd: EtcdCluster) -> None:
    async with node(etcd, "n0") as n0:
        await until(n0, lambda r: r.is_leader, 5)
        old = n0.role
    async with node(etcd, "n1", unclean_election=True) as n1:
        await until(n1, lambda r: r.is_leader, 5)
        # Pretend n0 still believes it leads at its old epoch (a zombie): its write fails.
        zombie = GroupMember(EtcdStore(etcd.endpoints), n0.settings)
        zombie._role = old
        try:
            assert not await zombie.set_in_sync(["n0"])
        finally:
            await zombie.store.aclose()
        assert await n1.set_in_sync(["n1", "n2"])
        assert n1.in_sync == ["n1", "n2"]


async def test_leader_fences_itself_when_etcd_is_gone(etcd: EtcdCluster) -> None:
    """Past its lease deadline the leader stops writing, but a fence is not a lost key: its
    published role stays, so a node that regains its lease (same epoch) serves again without
    closing and reopening its broker (it used to step down and lead again)."""
    async with node(etcd, "n0") as n0:
        await until(n0, lambda r: r.is_leader, 5)
        epoch, led = n0.role.epoch, n0.role
        changes: list[GroupRole] = []
        n0.on_change(changes.append)
        etcd.stop_all()
        remaining = n0.lease_remaining_s()
        assert 0 < remaining <= TTL_S  # never later than etcd could expire the lease
        await anyio.sleep(remaining + 0.05)
        assert not n0.may_write()
        with anyio.fail_after(2):
            await holds(lambda: n0.fenced)
        assert n0.role == led  # fenced, not deposed: nobody knows of a successor
        # etcd comes back with the lease (a new etcd leader refreshes every lease): n0 writes
        # again at the same epoch, its leader key never went away.
        await etcd.restart(0)
        with anyio.fail_after(10):
            await holds(n0.may_write)
        assert n0.role.epoch == epoch and not n0.fenced
        assert changes == []  # no step-down, no second "leads"


async def test_a_blocked_event_loop_does_not_lose_the_lease(etcd: EtcdCluster) -> None:
    """Keepalives go from a thread of their own: a leader whose event loop is held up longer
    than its TTL (a promotion, a backlog of calls on a starved host) keeps its lease and its
    epoch. From the loop, the keepalives waited too: the lease expired at etcd, a healthy
    leader lost its key and the group went through another election. (A stall bound of
    its own: the default, 2 TTLs, is just past this block; a loaded host needs slack.)"""
    async with node(etcd, "n0", loop_stall_limit_s=3 * TTL_S) as n0:
        await until(n0, lambda r: r.is_leader, 5)
        led = n0.role
        changes: list[GroupRole] = []
        n0.on_change(changes.append)
        assert n0._keeper is not None
        sent_before = n0._keeper.sent
        time.sleep(TTL_S + 1.5)  # noqa: ASYNC251 (blocks the loop: the point of the test)
        assert n0._keeper.sent >= sent_before + 3  # every TTL/3 all the same
        assert n0.may_write() and not n0.fenced
        await anyio.sleep(1)  # what the loop hears now: nothing lost
        assert changes == [] and n0.role == led and n0.may_write()
        leader = await n0.store.get(n0.keys.leader)
        assert leader is not None and leader.create_revision == led.epoch


async def test_a_wedged_event_loop_lets_the_lease_expire(etcd: EtcdCluster) -> None:
    """Liveness: the keepalive thread stops renewing once the loop has not run for
    ``loop_stall_limit_s``, so a leader whose loop is wedged loses its lease (its key goes,
    another node can lead) instead of holding the group for ever."""
    async with node(etcd, "n0", loop_stall_limit_s=0.5) as n0:
        await until(n0, lambda r: r.is_leader, 5)
        epoch = n0.role.epoch
        changes: list[GroupRole] = []
        n0.on_change(changes.append)
        assert n0._keeper is not None
        time.sleep(TTL_S + 1.5)  # noqa: ASYNC251 (a wedged loop: the point of the test)
        assert n0._keeper.stalled and not n0.may_write()
        # The loop runs again: the next keepalive finds the lease gone; n0 steps down, then
        # (alone in the group) leads again at a new epoch.
        await until(n0, lambda r: r.is_leader and r.epoch != epoch, 10)
        assert not changes[0].is_leader  # stepped down first
        leader = await n0.store.get(n0.keys.leader)
        assert leader is not None and leader.create_revision > epoch


async def holds(check: Callable[[], bool]) -> None:
    while True:
        if check():
            return
        await anyio.sleep(0.05)


async def test_an_unclean_election_never_elects_an_emptied_node(etcd: EtcdCluster) -> None:
    """A wiped node must not lead a group that had a leader, even with unclean election
    (it would start the group empty and reset every node that comes back with data): it
    waits for a node with data, and says so loudly when none is live."""
    async with node(etcd, "n0") as n0:
        await until(n0, lambda r: r.is_leader, 5)
    # n0 led and left. n1 comes with an emptied directory and unclean election.
    store = EtcdStore(etcd.endpoints, timeout_s=0.5)
    settings = MemberSettings("g", "n1", "127.0.0.1:101", lease_ttl_s=TTL_S,
                              poll_interval_s=0.3, retry_s=0.2, unclean_election=True)  # fmt: skip
    empty = True
    try:
        async with join_group(store, settings, holds_data=lambda: not empty) as n1:
            with anyio.fail_after(5):  # it declined (the cause), and declines at every look
                await holds(lambda: n1.empty_copy_declines == 1)
            await anyio.sleep(3 * 0.3)  # a few more looks (poll_interval_s 0.3)
            assert not n1.role.has_leader, "an emptied node was elected"
            assert n1.empty_copy_declines == 1  # one stretch, said once
            member = await store.get(GroupKeys("/popmq/", "g").member("n1"))
            assert member is not None and decode(member.value)["data"] is False
            # n2 holds data (out of sync): the unclean election elects it, not n1.
            async with node(etcd, "n2", unclean_election=True) as n2:
                await until(n2, lambda r: r.is_leader, 5)
                await until(n1, lambda r: r.leader_name == "n2", 5)
            # n2 left; n1 bootstrapped meanwhile (its copy holds data now): it may lead.
            empty = False
            await until(n1, lambda r: r.is_leader, 10)
            member = await store.get(GroupKeys("/popmq/", "g").member("n1"))
            assert member is not None and decode(member.value)["data"] is True
    finally:
        await store.aclose()


async def test_a_new_leader_renews_its_lease_as_it_begins_to_lead(etcd: EtcdCluster) -> None:
    """A keepalive goes out when a node wins, beside its promotion: the lease then runs a
    whole TTL from the win, not from the last periodic keepalive (up to TTL/3 earlier; a
    loaded host's promotion once outlasted the rest, fenced the new leader and cost a second
    election). It is not awaited before the role is published: one etcd round trip less
    between the win and serving (the store opens off the event loop, keepalives go on)."""
    ttl = 12  # n1's periodic keepalives come every 4 s: the next one 2.5 s or more after its win
    store = EtcdStore(etcd.endpoints, timeout_s=0.5)
    settings = MemberSettings("g", "n1", "127.0.0.1:101", lease_ttl_s=ttl, poll_interval_s=0.3,
                              retry_s=0.2, unclean_election=True)  # fmt: skip
    won_at: list[float] = []
    try:
        leave = anyio.Event()

        async def n0_leads_until_told(*, task_status: anyio.abc.TaskStatus[None]) -> None:
            async with node(etcd, "n0") as n0:
                await until(n0, lambda r: r.is_leader, 5)
                task_status.started()
                await leave.wait()  # then n0 leaves, revoking its lease: its key goes

        async with anyio.create_task_group() as tasks:
            await tasks.start(n0_leads_until_told)
            async with join_group(store, settings) as n1:
                await until(n1, lambda r: r.leader_name == "n0", 10)
                n1.on_change(lambda role: role.is_leader and won_at.append(anyio.current_time()))
                await anyio.sleep(1)  # into n1's lease: its deadline is 11 s or less away
                leave.set()  # n1 (unclean: not in the in-sync set) takes over
                await until(n1, lambda r: r.is_leader, 5)
                # Fencing as ever: the deadline is a keepalive's send time plus the TTL, so
                # never later than etcd's expiry; this one was sent after the win.
                with anyio.fail_after(1.5):  # the periodic one is >= 2.5 s away
                    await holds(lambda: renewed_since_win(n1, won_at[0], ttl))
                assert n1.may_write()
    finally:
        await store.aclose()
    assert len(won_at) == 1


def renewed_since_win(member: GroupMember, won_at: float, ttl: int) -> bool:
    """Whether the lease deadline comes from a keepalive sent at (or after) the win; 0.5 s
    of slack for one sent just before it."""
    return anyio.current_time() + member.lease_remaining_s() >= won_at + ttl - 0.5


async def test_a_leader_that_cannot_take_up_its_role_hands_it_to_an_in_sync_node(
    etcd: EtcdCluster,
) -> None:
    """Issue 19, a loose end: a node that won the election but whose promotion failed held
    the leader key (its keepalives go on) and refused every call: the group never failed
    over. It now deletes the key and waits before campaigning again. It served nothing, so
    the in-sync set its campaign had narrowed to itself is put back: n0, in sync before that
    election, may lead, and does."""

    async def member_while(name: str, joined: list[GroupMember], stop: anyio.Event,
                           **options: object) -> None:  # fmt: skip
        async with node(etcd, name, **options) as member:
            joined.append(member)
            await stop.wait()

    async def join(tasks: anyio.abc.TaskGroup, name: str, stop: anyio.Event,
                   **options: object) -> GroupMember:  # fmt: skip
        joined: list[GroupMember] = []
        tasks.start_soon(functools.partial(member_while, name, joined, stop, **options))
        with anyio.fail_after(5):
            while not joined:  # noqa: ASYNC110
                await anyio.sleep(0.01)
        return joined[0]

    async with anyio.create_task_group() as tasks:
        restart, end = anyio.Event(), anyio.Event()
        n0 = await join(tasks, "n0", restart)
        await until(n0, lambda r: r.is_leader, 5)
        n1 = await join(tasks, "n1", end, give_up_hold_s=60.0)
        await until(n1, lambda r: r.leader_name == "n0", 5)
        assert await n0.set_in_sync(["n1"])
        restart.set()  # n0 steps away (a restart): n1, in sync, wins alone
        await until(n1, lambda r: r.is_leader, 5)
        assert n1.in_sync == ["n1"]
        n0 = await join(tasks, "n0", end)
        await until(n0, lambda r: r.leader_name == "n1", 5)
        assert await n1.give_up(n1.role.epoch, "its store cannot open", served=False)
        assert not n1.role.is_leader and n1.leadership_given_up == 1
        await until(n0, lambda r: r.is_leader, 5)  # n0 was in sync: it leads
        await until(n1, lambda r: r.leader_name == "n0", 5)
        assert not await n1.give_up(n0.role.epoch, "not its epoch", served=False)
        assert n1.leadership_given_up == 1
        end.set()
