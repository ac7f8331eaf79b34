"""Broker groups end to end: real etcd, `popmq broker --etcd --group` nodes and a
`popmq proxy --etcd` with no broker list, as separate processes on 127.0.0.1."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from chaos.processes import PopmqProcess, free_port, scrape
from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.types import Message
from popmq.broker.wire.remote import RemoteBrokerPort
from support.etcd import EtcdCluster

from popmq.client.aio import AsyncClient
from popmq.coord.etcd import EtcdStore
from popmq.coord.keys import GroupKeys, decode
from popmq.errors import PopmqError

pytestmark = [pytest.mark.wallclock, pytest.mark.slow, pytest.mark.subprocess]

FAST = ["--set", "broker.etcd.lease_ttl_s=2", "--set", "broker.topics.queue_count=2"]


def node_args(etcd: EtcdCluster, group: str, name: str, data: Path, *extra: str) -> list[str]:
    return ["broker", "--name", name, "--group", group, "--etcd", etcd.endpoint_arg,
            "--host", "127.0.0.1", "--port", "0", "--data-dir", str(data / name),
            *FAST, *extra]  # fmt: skip


@contextlib.asynccontextmanager
async def running(*processes: PopmqProcess) -> AsyncIterator[list[PopmqProcess]]:
    try:
        for process in processes:
            await process.start()
        yield list(processes)
    finally:
        for process in processes:
            await process.kill()


async def leader_of(etcd: EtcdCluster, group: str) -> tuple[str, int] | None:
    store = EtcdStore(etcd.endpoints)
    try:
        kv = await store.get(GroupKeys("/popmq/", group).leader)
    finally:
        await store.aclose()
    return (str(decode(kv.value)["name"]), kv.create_revision) if kv else None


async def wait_leader(etcd: EtcdCluster, group: str, within_s: float) -> tuple[str, int]:
    with anyio.fail_after(within_s):
        while True:  # polled: etcd is read the way an operator would
            found = await leader_of(etcd, group)
            if found is not None:
                return found
            await anyio.sleep(0.1)


async def send_until_ok(client: AsyncClient, topic: str, within_s: float) -> float:
    """Seconds until a send through the proxy is acknowledged."""
    started = time.monotonic()
    last: object = None
    while time.monotonic() - started < within_s:
        try:
            receipts = await client.send([Message(topic, b"x")])
            if receipts[0].code == Code.OK:
                return time.monotonic() - started
            last = receipts[0]
        except PopmqError as exc:
            last = exc
        await anyio.sleep(0.1)
    raise AssertionError(f"no send acknowledged within {within_s}s; last: {last}")


async def test_proxy_follows_the_leader_and_new_groups(tmp_path: Path) -> None:
    async with EtcdCluster.started(tmp_path) as etcd:
        metrics = {name: free_port() for name in ("ga-0", "ga-1")}
        nodes = {
            name: PopmqProcess(node_args(etcd, "ga", name, tmp_path, "--unclean-election",
                                         "--set", f"broker.metrics_port={metrics[name]}"),
                               tmp_path / f"{name}.log")
            for name in ("ga-0", "ga-1")
        }  # fmt: skip
        proxy = PopmqProcess(["proxy", "--host", "127.0.0.1", "--port", "0", "--etcd",
                              etcd.endpoint_arg], tmp_path / "proxy.log")  # fmt: skip
        async with running(*nodes.values(), proxy):
            first, epoch = await wait_leader(etcd, "ga", 10)
            follower = "ga-1" if first == "ga-0" else "ga-0"
            page = await anyio.to_thread.run_sync(scrape, metrics[first])
            labels = f'group="ga",node="{first}"'
            assert f"popmq_ha_epoch{{{labels}}} {float(epoch)}" in page
            assert f"popmq_ha_is_leader{{{labels}}} 1.0" in page
            assert f"popmq_ha_in_sync_size{{{labels}}} 1.0" in page
            assert f"popmq_ha_elections_won_total{{{labels}}} 1.0" in page
            topic = f"t{uuid.uuid4().hex[:8]}"
            async with AsyncClient(proxy.address) as client:
                await send_until_ok(client, topic, 15)
                route = await client.query_route(topic)
                assert {q.broker for q in route} == {"ga"}  # the group's name, not a node's

                # The follower refuses proxies' calls with HA_NOT_AVAILABLE.
                port = RemoteBrokerPort("ga", nodes[follower].address)
                try:
                    with pytest.raises(RefusedError) as refused:
                        await port.send([Message(topic, b"to the follower")])
                    assert refused.value.code == Code.HA_NOT_AVAILABLE
                    assert "follower" in refused.value.message
                finally:
                    await port.aclose()

                # kill -9 the leader: the other node is elected and the proxy moves to it.
                killed_at = time.monotonic()
                await nodes[first].kill()
                await send_until_ok(client, topic, 20)
                recovered_s = time.monotonic() - killed_at
                new_leader, new_epoch = await wait_leader(etcd, "ga", 10)
                assert new_leader == follower and new_epoch > epoch
                assert recovered_s < 15, f"serving again after {recovered_s:.1f}s"
                # Receives and acks go to the new leader too (through the proxy's new port).
                await client.send([Message(topic, b"after failover")])
                queues = await client.query_route(topic)
                got = []
                with anyio.fail_after(40):
                    while not any(m.body == b"after failover" for m in got):
                        for queue in queues:
                            got += await client.receive("cg", queue, long_polling_ms=5000)
                entries = [(m.message_id, m.receipt_handle) for m in got]
                outcomes = await client.ack("cg", topic, entries)
                assert outcomes and all(o.ok for o in outcomes), outcomes
                print(f"kill -9 of the leader: sends acknowledged again after {recovered_s:.2f}s")

                # A group started now is routed within seconds, with no proxy restart.
                async with running(PopmqProcess(node_args(etcd, "gb", "gb-0", tmp_path),
                                                tmp_path / "gb-0.log")):  # fmt: skip
                    await wait_leader(etcd, "gb", 10)
                    fresh = f"t{uuid.uuid4().hex[:8]}"
                    with anyio.fail_after(10):
                        while True:
                            await send_until_ok(client, fresh, 10)
                            if {q.broker for q in await client.query_route(fresh)} == {"ga", "gb"}:
                                break
                            await anyio.sleep(0.3)
        assert "ga" in proxy.log()


def admin(etcd: EtcdCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "popmq", "admin", *args, "--etcd", etcd.endpoint_arg],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


async def broker_max_offsets(address: str, group: str, topic: str) -> int:
    port = RemoteBrokerPort(group, address)
    try:
        info = await port.get_topic(topic)
    finally:
        await port.aclose()
    return sum(q.max_offset for q in info.queues)


async def test_cluster_status_drain_and_remove(tmp_path: Path) -> None:
    async with EtcdCluster.started(tmp_path) as etcd:
        ga = PopmqProcess(node_args(etcd, "ga", "ga-0", tmp_path), tmp_path / "ga-0.log")
        gb = PopmqProcess(node_args(etcd, "gb", "gb-0", tmp_path), tmp_path / "gb-0.log")
        proxy = PopmqProcess(["proxy", "--host", "127.0.0.1", "--port", "0", "--etcd",
                              etcd.endpoint_arg], tmp_path / "proxy.log")  # fmt: skip
        async with running(ga, gb, proxy):
            await wait_leader(etcd, "ga", 10)
            await wait_leader(etcd, "gb", 10)
            status = await anyio.to_thread.run_sync(admin, etcd, "cluster", "status", "--json")
            assert status.returncode == 0, status.stderr
            groups = {g["name"]: g for g in json.loads(status.stdout)["groups"]}
            assert set(groups) == {"ga", "gb"}
            assert groups["ga"]["leader"] == "ga-0" and groups["ga"]["epoch"] > 0
            assert groups["ga"]["in_sync"] == ["ga-0"]
            assert groups["ga"]["nodes"] == [
                {"name": "ga-0", "role": "leader", "lag_bytes": 0, "lag_s": 0.0}
            ]

            topic = f"t{uuid.uuid4().hex[:8]}"
            async with AsyncClient(proxy.address) as client:
                with anyio.fail_after(15):  # both groups routed
                    while True:
                        await send_until_ok(client, topic, 10)
                        if {q.broker for q in await client.query_route(topic)} == {"ga", "gb"}:
                            break
                        await anyio.sleep(0.3)
                for _ in range(10):  # round robin: some land on gb
                    assert (await client.send([Message(topic, b"m")]))[0].code == Code.OK
                assert await broker_max_offsets(gb.address, "gb", topic) > 0
                # A consumer group holds one of gb's messages in flight: not empty yet.
                gb_queues = [q for q in await client.query_route(topic) if q.broker == "gb"]
                held = []
                with anyio.fail_after(30):
                    while not any(m.broker == "gb" for m in held):
                        for queue in gb_queues:
                            held += await client.receive("cg", queue, long_polling_ms=5000)
                busy = await anyio.to_thread.run_sync(
                    admin, etcd, "brokers", "drain", "gb", "--wait", "1"
                )
                assert busy.returncode == 1 and "not empty yet" in busy.stdout, busy.stdout
                assert "cg on " in busy.stdout
                # Drain with messages still on gb, a producer and a consumer running: the
                # drain reports empty once the consumer has acked all of gb's; nothing new
                # lands on gb once the proxy follows the mark. Figures in docs/operations.md.
                figures = await drain_under_traffic(client, etcd, gb, topic, gb_queues, held)
                print("drain and remove under traffic:", json.dumps(figures))
                assert figures["lost_on_gb"] == 0 and figures["ack_failures"] == 0
                assert figures["sent_during_drain"] > 0
                assert figures["sent_to_gb_after_mark_followed"] == 0

                refused = await anyio.to_thread.run_sync(admin, etcd, "brokers", "remove", "gb")
                assert refused.returncode == 2 and "still has running nodes" in refused.stderr
                stopped = time.monotonic()
                await gb.kill()
                with anyio.fail_after(10):  # its member key goes with its lease
                    while True:
                        removed = await anyio.to_thread.run_sync(
                            admin, etcd, "brokers", "remove", "gb"
                        )
                        if removed.returncode == 0:
                            break
                        await anyio.sleep(0.5)
                print(f"gb stopped, then removed after {time.monotonic() - stopped:.2f} s")
                status = await anyio.to_thread.run_sync(admin, etcd, "cluster", "status", "--json")
                assert [g["name"] for g in json.loads(status.stdout)["groups"]] == ["ga"]
                fresh = f"t{uuid.uuid4().hex[:8]}"
                with anyio.fail_after(10):
                    while True:
                        await send_until_ok(client, fresh, 10)
                        if {q.broker for q in await client.query_route(fresh)} == {"ga"}:
                            break
                        await anyio.sleep(0.3)


async def drain_under_traffic(client: AsyncClient, etcd: EtcdCluster, gb: PopmqProcess,
                              topic: str, gb_queues: list[Any],
                              held: list[Any]) -> dict[str, Any]:  # fmt: skip
    """`brokers drain gb --wait` while a producer sends to ``topic`` and a consumer (group cg)
    acks what gb holds, ``held`` first. What it took and what moved, as numbers."""
    on_gb_at_start = await broker_max_offsets(gb.address, "gb", topic)
    consumed: set[str] = set()
    counts = {"sent": 0, "ack_failures": 0}
    producing = True

    async def produce() -> None:
        while producing:
            if (await client.send([Message(topic, b"during")]))[0].code == Code.OK:
                counts["sent"] += 1
            await anyio.sleep(0.02)

    async def consume(first: list[Any]) -> None:
        batch = first
        while True:
            if batch:
                outcomes = await client.ack("cg", topic, [(m.message_id, m.receipt_handle)
                                                          for m in batch])  # fmt: skip
                for message, outcome in zip(batch, outcomes, strict=True):
                    if not outcome.ok:
                        counts["ack_failures"] += 1
                    elif message.broker == "gb":  # a receive may be served from any queue
                        consumed.add(message.message_id)
            batch = []
            for queue in gb_queues:
                batch += await client.receive("cg", queue, long_polling_ms=5000)

    started = time.monotonic()
    async with anyio.create_task_group() as traffic:
        traffic.start_soon(produce)
        traffic.start_soon(consume, [m for m in held if m.broker == "gb"])
        drained = await anyio.to_thread.run_sync(admin, etcd, "brokers", "drain", "gb",
                                                 "--wait", "30")  # fmt: skip
        empty_after = time.monotonic() - started
        assert drained.returncode == 0, drained.stdout + drained.stderr
        assert "is empty" in drained.stdout
        await anyio.sleep(1.5)  # the proxy follows the drain mark (its etcd watch)
        followed = await broker_max_offsets(gb.address, "gb", topic)
        await anyio.sleep(1.0)  # sends go on: none may land on gb now; late ones are consumed
        producing = False
        await anyio.sleep(0.1)
        traffic.cancel_scope.cancel()
    on_gb = await broker_max_offsets(gb.address, "gb", topic)
    return {
        "on_gb_at_drain": on_gb_at_start,
        "drain_reported_empty_s": round(empty_after, 2),
        "sent_during_drain": counts["sent"],
        "sent_to_gb_during_drain": on_gb - on_gb_at_start,
        "sent_to_gb_after_mark_followed": on_gb - followed,
        "consumed_from_gb": len(consumed),
        "lost_on_gb": on_gb - len(consumed),
        "ack_failures": counts["ack_failures"],
    }


async def test_a_paused_leader_acknowledges_nothing_once_replaced(tmp_path: Path) -> None:
    """SIGSTOP the leader for longer than its lease; another node is elected; after SIGCONT
    the old leader refuses writes (it fenced itself by its own clock)."""
    async with EtcdCluster.started(tmp_path) as etcd:
        nodes = {
            name: PopmqProcess(node_args(etcd, "ga", name, tmp_path, "--unclean-election"),
                               tmp_path / f"{name}.log")
            for name in ("ga-0", "ga-1")
        }  # fmt: skip
        async with running(*nodes.values()):
            first, epoch = await wait_leader(etcd, "ga", 10)
            other = "ga-1" if first == "ga-0" else "ga-0"
            zombie = nodes[first]
            assert zombie.proc is not None
            port = RemoteBrokerPort("ga", zombie.address, rpc_timeout_s=5)
            try:
                await port.send([Message("z", b"before")])  # it leads and acknowledges
                zombie.proc.send_signal(signal.SIGSTOP)
                try:
                    with anyio.fail_after(15):
                        while True:
                            found = await leader_of(etcd, "ga")
                            if found is not None and found[0] == other:
                                break
                            await anyio.sleep(0.2)
                finally:
                    zombie.proc.send_signal(signal.SIGCONT)
                with pytest.raises(RefusedError) as refused:
                    await port.send([Message("z", b"from the zombie")])
                assert refused.value.code == Code.HA_NOT_AVAILABLE
            finally:
                await port.aclose()
            new_leader, new_epoch = await wait_leader(etcd, "ga", 10)
            assert (new_leader, new_epoch > epoch) == (other, True)


async def test_no_etcd_quorum_refuses_writes_until_it_returns(tmp_path: Path) -> None:
    """Three etcd members: losing one changes nothing visible; losing two of three
    (no quorum) makes the group refuse sends with HA_NOT_AVAILABLE within its lease, and it
    serves again once quorum is back."""
    async with EtcdCluster.started(tmp_path, members=3) as etcd:
        # The default lease (3 s): it must outlast etcd's own election (election timeout 1 s).
        args = [*node_args(etcd, "ga", "ga-0", tmp_path), "--set", "broker.etcd.lease_ttl_s=3"]
        node = PopmqProcess(args, tmp_path / "ga-0.log")
        proxy = PopmqProcess(["proxy", "--host", "127.0.0.1", "--port", "0", "--etcd",
                              etcd.endpoint_arg], tmp_path / "proxy.log")  # fmt: skip
        async with running(node, proxy), AsyncClient(proxy.address) as client:
            await wait_leader(etcd, "ga", 10)
            await send_until_ok(client, "q", 15)
            etcd.kill(0)  # maybe etcd's leader: etcd elects another within about a second
            await anyio.sleep(4)  # longer than the lease: renewed through the other members
            await send_until_ok(client, "q", 10)
            etcd.kill(1)
            refused_after = time.monotonic()
            with anyio.fail_after(10):  # the lease TTL (2 s) plus the keepalive period
                while True:
                    try:
                        receipt = (await client.send([Message("q", b"no quorum")]))[0]
                    except PopmqError as exc:  # the whole request failed with this code
                        assert exc.code == Code.HA_NOT_AVAILABLE, exc
                        break
                    assert receipt.code == Code.OK, receipt
                    await anyio.sleep(0.2)
            print(f"no quorum: sends refused after {time.monotonic() - refused_after:.2f}s")
            await etcd.restart(0)
            await etcd.restart(1)
            recovered = await send_until_ok(client, "q", 30)
            print(f"quorum back: sends acknowledged again after {recovered:.2f}s")
