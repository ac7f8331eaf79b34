"""Replicated broker groups with real `popmq broker` processes on 127.0.0.1 (issue 19).

A leader and a follower with static roles (--role, --epoch, --leader): a sync send is durable
on both; after kill -9 of the leader the follower is promoted (restarted as the leader of the
next epoch) and every acknowledged message is there, acked ones are not delivered again and a
handle from the old leader still acks; a follower whose data directory was wiped bootstraps
from its leader; a leader of an older epoch gets no follower (its sends are refused); a
former leader that comes back cuts what it wrote after the new epoch began (kept aside) and
catches up; a stopped follower leaves the in-sync set and rejoins; a leader killed under load
loses no acknowledged send.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.types import AckEntry, Message, PopRequest
from popmq.broker.wire.remote import RemoteBrokerPort
from support.broker_process import BrokerProcess

pytestmark = [pytest.mark.wallclock, pytest.mark.slow, pytest.mark.subprocess]

NAME = "broker-r"
IN_SYNC_TIMEOUT_S = 60.0


def node(root: Path, name: str, *flags: str) -> BrokerProcess:
    return BrokerProcess(root / name, NAME, root / f"{name}.log", "--replication", "sync",
                         "--node-name", name, *flags, flush="async")  # fmt: skip


def leader(root: Path, name: str, epoch: int, min_in_sync: int) -> BrokerProcess:
    return node(root, name, "--role", "leader", "--epoch", str(epoch),
                "--min-in-sync", str(min_in_sync))  # fmt: skip


def follower(root: Path, name: str, epoch: int, leader_address: str) -> BrokerProcess:
    return node(root, name, "--role", "follower", "--epoch", str(epoch), "--leader",
                leader_address, "--min-in-sync", "2")  # fmt: skip


@asynccontextmanager
async def port(process: BrokerProcess) -> AsyncIterator[RemoteBrokerPort]:
    remote = RemoteBrokerPort(NAME, process.address)
    try:
        yield remote
    finally:
        await remote.aclose()


@asynccontextmanager
async def running(*processes: BrokerProcess) -> AsyncIterator[None]:
    try:
        yield
    finally:
        for process in processes:
            await process.kill()


async def wait_in_sync(remote: RemoteBrokerPort, topic: str) -> None:
    """Retry creating the topic until the group has enough nodes in sync."""
    deadline = time.monotonic() + IN_SYNC_TIMEOUT_S
    while True:
        try:
            await remote.create_topic(topic, 2)
            return
        except RefusedError as refused:
            assert refused.code == Code.HA_NOT_AVAILABLE, refused
            assert time.monotonic() < deadline, "the follower never came in sync"
            await asyncio.sleep(0.2)


async def logged(process: BrokerProcess, text: str) -> None:
    """Wait until the process's log shows `text` (a loaded machine may take seconds)."""
    deadline = time.monotonic() + IN_SYNC_TIMEOUT_S
    while text not in process.log_text():
        assert time.monotonic() < deadline, f"never logged {text!r}"
        await asyncio.sleep(0.2)


async def send_all(remote: RemoteBrokerPort, topic: str, bodies: list[bytes]) -> None:
    for body in bodies:  # one at a time: each answer is one sync barrier
        await remote.send([Message(topic=topic, body=body)])


async def pop_all(remote: RemoteBrokerPort, group: str, topic: str) -> list[bytes]:
    found: list[bytes] = []
    while True:
        result = await remote.pop(PopRequest(group, topic, max_messages=32))
        if not result.messages:
            return found
        found += [m.message.body for m in result.messages]


async def test_failover_keeps_every_acknowledged_message(tmp_path: Path) -> None:
    a0 = leader(tmp_path, "a0", epoch=1, min_in_sync=2)
    await a0.start()
    a1 = follower(tmp_path, "a1", 1, a0.address)
    async with running(a0, a1):
        async with port(a0) as remote:
            with pytest.raises(RefusedError) as refused:  # alone: too few in sync
                await remote.send([Message(topic="T", body=b"never")])
            assert refused.value.code == Code.HA_NOT_AVAILABLE
            await a1.start()
            await wait_in_sync(remote, "T")
            sent = [f"m{i}".encode() for i in range(40)]
            await send_all(remote, "T", sent)
            popped = (await remote.pop(PopRequest("G", "T", max_messages=10))).messages
            acked, in_flight = popped[:5], popped[5:]
            results = await remote.ack("G", "T", [AckEntry(m.receipt_handle) for m in acked])
            assert [r.code for r in results] == [Code.OK] * len(acked)
        async with port(a1) as remote:
            with pytest.raises(RefusedError) as refused:  # a follower serves nothing
                await remote.pop(PopRequest("G", "T"))
            assert refused.value.code == Code.HA_NOT_AVAILABLE
            assert "follower" in refused.value.message
        await a0.kill()  # kill -9 of the leader
        await a1.terminate()
        promoted = leader(tmp_path, "a1", epoch=2, min_in_sync=1)
        await promoted.start()
        async with running(promoted), port(promoted) as remote:
            assert sorted(await pop_all(remote, "G2", "T")) == sorted(sent)  # all 40 there
            again = await pop_all(remote, "G", "T")
            done = {m.message.body for m in popped}
            assert sorted(again) == sorted(set(sent) - done)  # acked: never; in flight: later
            results = await remote.ack("G", "T", [AckEntry(in_flight[0].receipt_handle)])
            assert results[0].code == Code.OK, results[0].message  # the old leader's handle


async def test_a_wiped_follower_bootstraps_and_a_stale_leader_gets_no_follower(
    tmp_path: Path,
) -> None:
    a0 = leader(tmp_path, "a0", epoch=1, min_in_sync=2)
    await a0.start()
    a1 = follower(tmp_path, "a1", 1, a0.address)
    await a1.start()
    async with running(a0, a1):
        async with port(a0) as remote:
            await wait_in_sync(remote, "T")
            first = [f"first-{i}".encode() for i in range(10)]
            await send_all(remote, "T", first)
            await a1.kill()
            shutil.rmtree(tmp_path / "a1")
            with pytest.raises(RefusedError):  # the follower left: refused, not lost
                await send_all(remote, "T", [b"refused"])
            a1 = follower(tmp_path, "a1", 1, a0.address)
            await a1.start()
            await wait_in_sync(remote, "T")  # back in sync after copying everything
            await send_all(remote, "T", [b"after"])
        await a0.kill()
        await a1.terminate()
        promoted = leader(tmp_path, "a1", epoch=2, min_in_sync=1)
        await promoted.start()
        async with running(promoted), port(promoted) as remote:
            assert sorted(await pop_all(remote, "G", "T")) == sorted([*first, b"after"])
    # The old leader comes back still believing it leads epoch 1; a node that knows epoch 2
    # refuses to follow it, so it never has enough nodes in sync and acknowledges nothing.
    stale = leader(tmp_path, "a0", epoch=1, min_in_sync=2)
    await stale.start()
    a2 = follower(tmp_path, "a2", 2, stale.address)
    await a2.start()
    async with running(stale, a2), port(stale) as remote:
        await logged(a2, "stale")  # a2 has met the stale leader and refused it
        with pytest.raises(RefusedError) as refused:
            await remote.send([Message(topic="T", body=b"stale")])
        assert refused.value.code == Code.HA_NOT_AVAILABLE
        assert not (tmp_path / "a2" / "commitlog").exists()  # nothing copied from it


async def test_a_stopped_follower_leaves_the_in_sync_set_and_rejoins(tmp_path: Path) -> None:
    lag = ("--set", "broker.replication.max_lag_s=2")
    a0 = node(tmp_path, "a0", "--role", "leader", "--epoch", "1", "--min-in-sync", "1", *lag)
    await a0.start()
    a1 = follower(tmp_path, "a1", 1, a0.address)
    await a1.start()
    async with running(a0, a1), port(a0) as remote:
        await wait_in_sync(remote, "T")
        # a1 joins the set with its first complete batch
        await logged(a0, "in-sync set of epoch 1 is now ['a0', 'a1']")
        assert a1.proc is not None
        a1.proc.send_signal(signal.SIGSTOP)
        try:
            start = time.monotonic()
            # Held while a1 is still in the set (it may have the write), then a1 leaves after
            # max_lag_s and the leader answers without it: refused or late, never lost.
            with contextlib.suppress(RefusedError):
                await send_all(remote, "T", [b"while-stopped"])
            await send_all(remote, "T", [b"after-it-left"])
            assert time.monotonic() - start >= 1.5
            assert "left ['a1']" in a0.log_text()
        finally:
            a1.proc.send_signal(signal.SIGCONT)
        deadline = time.monotonic() + IN_SYNC_TIMEOUT_S
        while a0.log_text().count("joined ['a1']") < 2:
            assert time.monotonic() < deadline, "a1 never rejoined"
            await asyncio.sleep(0.2)


def test_a_follower_without_a_leader_is_a_one_line_config_error(tmp_path: Path) -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "popmq", "broker", "--port", "0", "--data-dir", str(tmp_path),
         "--replication", "sync", "--role", "follower"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "popmq broker: bad config: broker.replication: Value error, replication.role follower "
        "needs replication.leader (host:port)"
    ]


async def test_a_leader_killed_under_load_loses_no_acknowledged_send(tmp_path: Path) -> None:
    """Producers keep sending while the leader is killed with SIGKILL: every send that was
    answered OK is on the promoted follower (sends in flight may fail, never vanish)."""
    a0 = leader(tmp_path, "a0", epoch=1, min_in_sync=2)
    await a0.start()
    a1 = follower(tmp_path, "a1", 1, a0.address)
    await a1.start()
    acknowledged: set[bytes] = set()
    failed = 0
    async with running(a0, a1):
        async with port(a0) as remote:
            await wait_in_sync(remote, "T")

            async def produce(worker: int) -> None:
                nonlocal failed
                for i in range(10_000):
                    body = f"w{worker}-{i}".encode()
                    try:
                        await remote.send([Message(topic="T", body=body)])
                    except Exception:  # the leader died under it: not acknowledged
                        failed += 1
                        return
                    acknowledged.add(body)

            async with anyio.create_task_group() as group:
                for worker in range(4):
                    group.start_soon(produce, worker)
                await asyncio.sleep(2.0)
                await a0.kill()
        await a1.terminate()
        promoted = leader(tmp_path, "a1", epoch=2, min_in_sync=1)
        await promoted.start()
        async with running(promoted), port(promoted) as remote:
            stored = set(await pop_all(remote, "G", "T"))
    assert len(acknowledged) > 20, "too few sends to mean anything"
    assert acknowledged - stored == set(), f"lost {len(acknowledged - stored)} acknowledged"
    assert failed == 4  # every producer saw its send fail once the leader was gone


async def test_a_former_leader_cuts_its_unacknowledged_tail_and_catches_up(
    tmp_path: Path,
) -> None:
    a0 = leader(tmp_path, "a0", epoch=1, min_in_sync=2)
    await a0.start()
    a1 = follower(tmp_path, "a1", 1, a0.address)
    await a1.start()
    async with running(a0, a1):
        async with port(a0) as remote:
            await wait_in_sync(remote, "T")
            await send_all(remote, "T", [b"kept-1", b"kept-2"])
            assert a1.proc is not None
            a1.proc.send_signal(signal.SIGSTOP)  # a1 stops copying
            with pytest.raises(RefusedError):  # written on a0 only: never acknowledged
                await send_all(remote, "T", [b"orphan"])
            await a0.kill()
        await a1.kill()  # still stopped: what waits in its socket is never applied
        a1 = leader(tmp_path, "a1", epoch=2, min_in_sync=1)
        await a1.start()
        async with running(a1), port(a1) as remote:
            await send_all(remote, "T", [b"epoch-2"])
            a0 = follower(tmp_path, "a0", 2, a1.address)  # the former leader comes back
            await a0.start()
            async with running(a0):
                deadline = time.monotonic() + IN_SYNC_TIMEOUT_S
                while "joined ['a0']" not in a1.log_text():
                    assert time.monotonic() < deadline, "a0 never caught up"
                    await asyncio.sleep(0.2)
                assert "cut " in a0.log_text()
    kept = list((tmp_path / "a0" / "quarantine").glob("replication-truncated-*/*"))
    assert any(b"orphan" in path.read_bytes() for path in kept)  # cut, and kept aside
    a0 = leader(tmp_path, "a0", epoch=3, min_in_sync=1)
    await a0.start()
    async with running(a0), port(a0) as remote:
        assert sorted(await pop_all(remote, "G", "T")) == [b"epoch-2", b"kept-1", b"kept-2"]
