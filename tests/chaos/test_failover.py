"""Failover of a replicated broker group under load (issue 19's chaos suite).

Real etcd (one member) and three `popmq broker --etcd --group ga --replication sync
--min-in-sync 2` nodes, elected and replicating by themselves, behind a `popmq proxy --etcd`
with no broker list. A producer and a consumer run through the proxy throughout. Measured and
printed: the time from the fault until a send is acknowledged again (issue 19's target is 5 s;
the bound asserted is generous, CI is a loaded 2-core VM), duplicates. Asserted: no
acknowledged send is lost, and a zombie leader acknowledges nothing once it was replaced.
"""

from __future__ import annotations

import signal
import time
import uuid
from pathlib import Path

import anyio
import pytest
from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.types import Message
from popmq.broker.wire.remote import RemoteBrokerPort

from chaos.ha_kit import (
    GROUP,
    LEASE_TTL_S,
    NODES,
    Traffic,
    all_in_sync,
    group_behind_proxy,
    reported_lags,
    retried,
    until,
    wait_leader,
)
from popmq.client.aio import AsyncClient
from popmq.errors import PopmqError

pytestmark = [pytest.mark.wallclock, pytest.mark.slow, pytest.mark.subprocess]

RECOVERY_BOUND_S = 20.0  # generous; the figure printed is what matters (target <= 5 s)
INVISIBLE_MS = 10_000  # the minimum
KILLS = 3


async def test_kill_9_of_the_leader_three_times_loses_no_acknowledged_send(
    tmp_path: Path,
) -> None:
    """kill -9 the leader, each time the new one, 3 times in a row; the killed node is
    restarted on its data directory after each failover (it cuts what it wrote after the new
    epoch began and catches up) so the group has 3 nodes again before the next kill."""
    async with group_behind_proxy(tmp_path) as (etcd, nodes, proxy):
        leader, epoch = await wait_leader(etcd, 15)
        topic = f"t{uuid.uuid4().hex[:8]}"
        figures: list[str] = []
        async with AsyncClient(proxy.address, timeout_s=10) as client:
            traffic = Traffic(client, topic, INVISIBLE_MS)
            with anyio.fail_after(30):  # a follower must be in sync before sends are taken
                await traffic.first_send()
            queues = await client.query_route(topic)
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(traffic.produce)
                for queue in queues:
                    tasks.start_soon(traffic.consume, queue)
                for round_ in range(KILLS):
                    await anyio.sleep(2)
                    lags = await reported_lags(etcd)
                    assert set(lags) == set(NODES) - {leader}  # both followers, as numbers
                    assert all(isinstance(lag["lag_bytes"], int) for lag in lags.values())
                    killed_at = time.monotonic()
                    await nodes[leader].kill()
                    successor, new_epoch = await wait_leader(etcd, RECOVERY_BOUND_S, not_=leader)
                    elected_s = time.monotonic() - killed_at
                    with anyio.fail_after(RECOVERY_BOUND_S):
                        await until(lambda: traffic.sent_since(killed_at))  # noqa: B023
                    await anyio.sleep(1)
                    outage_s = traffic.outage_after(killed_at)
                    figures.append(f"kill {round_ + 1}: {leader} (epoch {epoch}) -> {successor} "
                                   f"(epoch {new_epoch}) elected after {elected_s:.2f}s, "
                                   f"outage {outage_s:.2f}s")  # fmt: skip
                    assert new_epoch > epoch
                    assert outage_s < RECOVERY_BOUND_S
                    try:
                        await nodes[leader].start()  # back as a follower of the new leader
                    except AssertionError:
                        process = nodes[leader].proc
                        code = process.returncode if process is not None else None
                        raise AssertionError(f"{leader} did not restart (exit {code})") from None
                    with anyio.fail_after(30):
                        await retried(lambda: all_in_sync(etcd))
                    leader, epoch = successor, new_epoch
                traffic.producing = False
                # Drain. A message whose ack failed comes back after INVISIBLE_MS; one whose
                # ack failed at the client but was applied (the leader died after applying
                # it) is consumed and rightly stays away.
                with anyio.move_on_after(INVISIBLE_MS / 1000 + 5):
                    await until(lambda: not traffic.unconsumed())
                tasks.cancel_scope.cancel()
        print("\n" + "\n".join(figures))
        print(traffic.summary())
        duplicates = traffic.classify_duplicates()
        for cause, bodies in duplicates.items():
            for body in bodies:
                print(f"duplicate ({cause}): {traffic.describe(body)}")
        assert traffic.lost() == [], f"acknowledged sends lost: {traffic.lost()[:10]}"
        # An ack answered OK is durable on min_in_sync nodes: its message never comes back.
        assert "revived after an ack" not in duplicates, traffic.summary()
        # Issue 19: a receive during a leader change may end empty, never fail.
        assert traffic.receive_errors == 0, traffic.summary()


async def test_a_paused_leader_acknowledges_nothing_once_replaced(tmp_path: Path) -> None:
    """SIGSTOP the leader past its lease; a follower in sync is elected; after SIGCONT the old
    leader refuses every send (fenced by its own clock, then by the new epoch)."""
    async with group_behind_proxy(tmp_path) as (etcd, nodes, proxy):
        first, epoch = await wait_leader(etcd, 15)
        zombie = nodes[first]
        assert zombie.proc is not None
        direct = RemoteBrokerPort(GROUP, zombie.address, rpc_timeout_s=10)
        try:
            with anyio.fail_after(30):  # until a follower is in sync
                while True:
                    try:
                        await direct.send([Message("z", b"before")])
                        break
                    except RefusedError:
                        await anyio.sleep(0.2)
            zombie.proc.send_signal(signal.SIGSTOP)
            paused_at = time.monotonic()
            try:
                second, new_epoch = await wait_leader(etcd, RECOVERY_BOUND_S, not_=first)
                elected_s = time.monotonic() - paused_at
            finally:
                zombie.proc.send_signal(signal.SIGCONT)
            refused = 0
            for attempt in range(5):  # at once after SIGCONT, and for a while after
                with pytest.raises(RefusedError) as error:
                    await direct.send([Message("z", f"zombie-{attempt}".encode())])
                assert error.value.code in (Code.HA_NOT_AVAILABLE, Code.SLAVE_PERSISTENCE_TIMEOUT)
                refused += 1
                await anyio.sleep(0.2)
        finally:
            await direct.aclose()
        async with AsyncClient(proxy.address, timeout_s=10) as client:
            with anyio.fail_after(RECOVERY_BOUND_S):
                while True:
                    try:
                        if (await client.send([Message("z", b"after")]))[0].code == Code.OK:
                            break
                    except PopmqError:
                        pass
                    await anyio.sleep(0.1)
        print(f"\nSIGSTOP of leader {first} (epoch {epoch}): {second} elected (epoch "
              f"{new_epoch}) after {elected_s:.2f}s; the zombie refused {refused} of "
              f"{refused} sends after SIGCONT")  # fmt: skip
        assert new_epoch > epoch


async def test_etcd_down_the_leader_fences_itself_and_serves_again(tmp_path: Path) -> None:
    """etcd (its only member) killed: nothing can be decided, so the leader stops
    acknowledging within its lease and no other node leads; once etcd is back the group
    serves again, and everything acknowledged is still there."""
    async with group_behind_proxy(tmp_path) as (etcd, nodes, proxy):
        first, _ = await wait_leader(etcd, 15)
        leader = RemoteBrokerPort(GROUP, nodes[first].address, rpc_timeout_s=10)
        acknowledged: list[bytes] = []
        try:
            async with AsyncClient(proxy.address, timeout_s=10) as client:

                async def send(body: bytes) -> bool:
                    try:
                        ok = (await client.send([Message("e", body)]))[0].code == Code.OK
                    except PopmqError:
                        ok = False
                    if ok:
                        acknowledged.append(body)
                    return ok

                with anyio.fail_after(30):  # until a follower is in sync
                    await retried(lambda: send(b"before"))
                etcd.kill(0)
                down_at = time.monotonic()
                with anyio.fail_after(LEASE_TTL_S + 5):  # the fence: at most one lease
                    while True:
                        try:
                            await leader.send([Message("e", b"direct")])
                            acknowledged.append(b"direct")
                        except RefusedError as error:
                            if error.code == Code.HA_NOT_AVAILABLE:
                                break
                        await anyio.sleep(0.1)
                fenced_s = time.monotonic() - down_at
                assert not await send(b"while etcd is down")  # no node leads
                await etcd.restart(0)
                back_at = time.monotonic()
                with anyio.fail_after(RECOVERY_BOUND_S):
                    await retried(lambda: send(b"after"))
                served_s = time.monotonic() - back_at
                queues = await client.query_route("e")
                seen: set[bytes] = set()
                with anyio.fail_after(30):
                    while not set(acknowledged) <= seen:
                        for queue in queues:
                            got = await client.receive("ce", queue, long_polling_ms=5_000)
                            seen.update(m.body for m in got)
        finally:
            await leader.aclose()
        print(f"\netcd killed: leader {first} refused writes after {fenced_s:.2f}s (lease "
              f"{LEASE_TTL_S} s); etcd back: sends acknowledged after {served_s:.2f}s; "
              f"{len(acknowledged)} acknowledged, all received")  # fmt: skip
