"""Failover of a replicated broker group under load (issue 19's chaos suite).

Real etcd (one member) and three `popmq broker --etcd --group ga --replication sync
--min-in-sync 2` nodes, elected and replicating by themselves, behind a `popmq proxy --etcd`
with no broker list. A producer and a consumer run through the proxy throughout. Measured and
printed: the time from the fault until a send is acknowledged again (issue 19's target is 5 s;
the bound asserted is generous, CI is a loaded 2-core VM), duplicates. Asserted: no
acknowledged send is lost, and a zombie leader acknowledges nothing once it was replaced.
"""

from __future__ import annotations

import contextlib
import itertools
import signal
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import pytest
from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.types import Message
from popmq.broker.wire.remote import RemoteBrokerPort
from support.etcd import EtcdCluster

from chaos.processes import PopmqProcess
from popmq.client.aio import AsyncClient
from popmq.client.model import QueueRef
from popmq.coord.etcd import EtcdStore
from popmq.coord.keys import GroupKeys, decode
from popmq.errors import PopmqError

pytestmark = [pytest.mark.wallclock, pytest.mark.slow, pytest.mark.subprocess]

GROUP = "ga"
NODES = ("ga-0", "ga-1", "ga-2")
LEASE_TTL_S = 2
RECOVERY_BOUND_S = 20.0  # generous; the figure printed is what matters (target <= 5 s)
INVISIBLE_MS = 10_000  # the minimum
KILLS = 3


def node(etcd: EtcdCluster, name: str, root: Path) -> PopmqProcess:
    args = ["broker", "--name", name, "--group", GROUP, "--etcd", etcd.endpoint_arg,
            "--replication", "sync", "--min-in-sync", "2",
            "--host", "127.0.0.1", "--port", "0", "--data-dir", str(root / name),
            "--set", f"broker.etcd.lease_ttl_s={LEASE_TTL_S}",
            "--set", "broker.topics.queue_count=2"]  # fmt: skip
    return PopmqProcess(args, root / f"{name}.log")


Running = tuple[EtcdCluster, dict[str, PopmqProcess], PopmqProcess]


@contextlib.asynccontextmanager
async def group_behind_proxy(root: Path) -> AsyncIterator[Running]:
    async with EtcdCluster.started(root) as etcd:
        nodes = {name: node(etcd, name, root) for name in NODES}
        proxy = PopmqProcess(["proxy", "--host", "127.0.0.1", "--port", "0", "--etcd",
                              etcd.endpoint_arg], root / "proxy.log")  # fmt: skip
        started: list[PopmqProcess] = []
        try:
            for process in (*nodes.values(), proxy):
                started.append(await process.start())
            yield etcd, nodes, proxy
        finally:
            for process in started:
                await process.kill()


async def until(predicate: Callable[[], bool]) -> None:
    """Return once ``predicate()`` holds (the caller bounds the wait)."""
    while True:
        if predicate():
            return
        await anyio.sleep(0.05)


async def leader_of(etcd: EtcdCluster) -> tuple[str, int] | None:
    store = EtcdStore(etcd.endpoints)
    try:
        kv = await store.get(GroupKeys("/popmq/", GROUP).leader)
    finally:
        await store.aclose()
    return (str(decode(kv.value)["name"]), kv.create_revision) if kv else None


async def retried(attempt: Callable[[], Awaitable[bool]]) -> None:
    """Try until ``attempt()`` succeeds (the caller bounds the wait)."""
    while True:
        if await attempt():
            return
        await anyio.sleep(0.1)


async def all_in_sync(etcd: EtcdCluster) -> bool:
    store = EtcdStore(etcd.endpoints)
    try:
        kv = await store.get(GroupKeys("/popmq/", GROUP).in_sync)
    finally:
        await store.aclose()
    return kv is not None and set(decode(kv.value).get("members", [])) == set(NODES)


async def reported_lags(etcd: EtcdCluster) -> dict[str, dict[str, object]]:
    """The followers' lag the leader published (what `popmq admin cluster status` shows)."""
    store = EtcdStore(etcd.endpoints)
    try:
        kvs, _ = await store.get_prefix(GroupKeys("/popmq/", GROUP).root + b"lag/")
    finally:
        await store.aclose()
    return {kv.key.rsplit(b"/", 1)[1].decode(): decode(kv.value) for kv in kvs}


async def wait_leader(etcd: EtcdCluster, within_s: float, not_: str = "") -> tuple[str, int]:
    with anyio.fail_after(within_s):
        while True:
            found = await leader_of(etcd)
            if found is not None and found[0] != not_:
                return found
            await anyio.sleep(0.1)


@dataclass
class Traffic:
    """A producer and a consumer through the proxy; what each saw."""

    client: AsyncClient
    topic: str
    # (monotonic time the send started, when it was acknowledged, body)
    acked: list[tuple[float, float, bytes]] = field(default_factory=list)
    send_failures: int = 0
    received: Counter[bytes] = field(default_factory=Counter)  # acked by the consumer
    delivered: Counter[bytes] = field(default_factory=Counter)  # received, acked or not
    receive_errors: int = 0
    last_receive_error = ""
    producing: bool = True

    async def produce(self) -> None:
        sequence = 0
        while self.producing:
            body = f"m-{sequence}".encode()
            sequence += 1
            started = time.monotonic()
            try:
                receipt = (await self.client.send([Message(self.topic, body)]))[0]
            except PopmqError:
                receipt = None
            if receipt is not None and receipt.code == Code.OK:
                self.acked.append((started, time.monotonic(), body))
            else:
                self.send_failures += 1
                await anyio.sleep(0.05)

    async def consume(self, queue: QueueRef) -> None:
        while True:
            try:
                messages = await self.client.receive("cg", queue, batch_size=16,
                                                     invisible_ms=INVISIBLE_MS,
                                                     long_polling_ms=5_000)  # fmt: skip
                self.delivered.update(m.body for m in messages)
                if messages:
                    outcomes = await self.client.ack(
                        "cg", self.topic, [(m.message_id, m.receipt_handle) for m in messages]
                    )
                    for message, outcome in zip(messages, outcomes, strict=True):
                        if outcome.ok:  # an unacked one comes back: counted then
                            self.received[message.body] += 1
            except PopmqError as error:
                self.receive_errors += 1
                self.last_receive_error = str(error)
                await anyio.sleep(0.1)

    def sent_since(self, instant: float) -> bool:
        """Whether a send started after ``instant`` was acknowledged."""
        return any(started > instant for started, _, _ in self.acked)

    def outage_after(self, instant: float) -> float:
        """The longest time without an acknowledged send from ``instant`` on (a send in
        flight at the fault may still be answered by the old leader: the gap after it)."""
        times = [at for _, at, _ in self.acked]
        return max(
            (later - max(earlier, instant)
             for earlier, later in itertools.pairwise(times) if later > instant),
            default=0.0,
        )  # fmt: skip

    def lost(self) -> list[bytes]:
        """Acknowledged sends never delivered."""
        return [body for _, _, body in self.acked if body not in self.delivered]

    def unconsumed(self) -> list[bytes]:
        """Acknowledged sends not yet consumed (delivered, and that delivery acked)."""
        return [body for _, _, body in self.acked if body not in self.received]


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
            traffic = Traffic(client, topic)
            with anyio.fail_after(30):  # a follower must be in sync before sends are taken
                while not traffic.acked:
                    try:
                        receipt = (await client.send([Message(topic, b"m-first")]))[0]
                        if receipt.code == Code.OK:
                            traffic.acked.append((0.0, time.monotonic(), b"m-first"))
                    except PopmqError:
                        pass
                    await anyio.sleep(0.2)
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
        duplicates = sum(count - 1 for count in traffic.received.values() if count > 1)
        print("\n" + "\n".join(figures))
        print(f"{len(traffic.acked)} acknowledged, {traffic.send_failures} send failures, "
              f"{len(traffic.lost())} lost, {duplicates} duplicates, "
              f"{len(traffic.unconsumed())} delivered with an unconfirmed ack and not again, "
              f"{traffic.receive_errors} receive errors "
              f"(last: {traffic.last_receive_error or '-'})")  # fmt: skip
        assert traffic.lost() == [], f"acknowledged sends lost: {traffic.lost()[:10]}"


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
