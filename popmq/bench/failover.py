"""`popmq bench failover`: how long a replicated group takes to serve again after kill -9 of
its leader, N times in a row.

Started here, all on 127.0.0.1 in a temporary directory: one etcd member (Debian's
etcd-server; fast raft timings), three `popmq broker --etcd --group --replication sync
--min-in-sync 2` nodes and a `popmq proxy --etcd`. A producer (one message per send, one send at
a time) and a consumer (POP on each queue, then ack) run through the proxy throughout. Each
round waits until the in-sync set holds all three nodes, kills the leader with SIGKILL, and
measures **elected** (until etcd names another leader) and **recovered** (until a send started
after the kill is acknowledged: the group serves again through the proxy); the killed node is
then restarted on its data directory (it rejoins as a follower). A watch on the group's keys
splits each recovery into phases (``phases``): **expired** (the dead leader's key deleted: its
lease ran out), **elected** (the new leader key written), **in_sync** (the new leader's in-sync
set holds a follower again: with ``--min-in-sync 2`` sends wait for it) and **served**. At
the end the consumer drains: **lost** counts acknowledged sends never delivered,
**duplicates** messages consumed twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from popmq.bench import progress
from popmq.bench.table_text import grid
from popmq.broker.contract.errors import Code
from popmq.broker.contract.types import Message
from popmq.client.aio import AsyncClient
from popmq.client.model import QueueRef, ReceivedMessage
from popmq.coord.etcd import EtcdStore
from popmq.coord.keys import GroupKeys, decode
from popmq.errors import PopmqError

GROUP = "bench-ha"
NODES = ("bench-ha-0", "bench-ha-1", "bench-ha-2")
TOPIC = "BenchFailover"
START_TIMEOUT_S = 120.0  # python imports alone take tens of seconds on a loaded machine
ROUND_TIMEOUT_S = 60.0
INVISIBLE_MS = 2_000  # short: a message whose ack failed in the switch comes back soon


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class _Child:
    """One child process; its stderr goes to a log file in the run's directory."""

    def __init__(self, args: list[str], log: Path, announces: bool = True) -> None:
        self.args, self.log, self.announces = args, log, announces
        self.process: asyncio.subprocess.Process | None = None
        self.address = ""

    async def start(self) -> None:
        with self.log.open("ab") as log:
            self.process = await asyncio.create_subprocess_exec(
                *self.args, stdout=asyncio.subprocess.PIPE if self.announces else log,
                stderr=log,
            )  # fmt: skip
        if not self.announces:
            return
        assert self.process.stdout is not None
        async with asyncio.timeout(START_TIMEOUT_S):
            while True:
                line = (await self.process.stdout.readline()).decode()
                if not line:
                    raise RuntimeError(f"{self.args[3]} exited at start; see {self.log}")
                if "listening on" in line:
                    self.address = line.rsplit(" ", 1)[1].strip()
                    return

    async def kill(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.kill()
            await self.process.wait()


def _etcd(root: Path) -> tuple[_Child, str]:
    binary = shutil.which("etcd")
    if binary is None:
        raise SystemExit("etcd is not installed (Debian: apt-get install etcd-server)")
    client, peer = _free_port(), _free_port()
    url = f"http://127.0.0.1:{client}"
    args = [binary, "--name", "e0", "--data-dir", str(root / "etcd"),
            "--listen-client-urls", url, "--advertise-client-urls", url,
            "--listen-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-cluster", f"e0=http://127.0.0.1:{peer}",
            "--heartbeat-interval", "100", "--election-timeout", "1000"]  # fmt: skip
    return _Child(args, root / "etcd.log", announces=False), url


def _node(root: Path, name: str, etcd: str, lease_ttl_s: int) -> _Child:
    args = [sys.executable, "-m", "popmq", "broker", "--name", name, "--group", GROUP,
            "--etcd", etcd, "--replication", "sync", "--min-in-sync", "2",
            "--host", "127.0.0.1", "--port", "0", "--data-dir", str(root / name),
            "--set", f"broker.etcd.lease_ttl_s={lease_ttl_s}",
            "--set", "broker.topics.queue_count=2",
            "--set", f"broker.pop.min_invisible_ms={INVISIBLE_MS}"]  # fmt: skip
    return _Child(args, root / f"{name}.log")


@dataclass
class _GroupEvents:
    """The group's key changes as this process saw them through an etcd watch (monotonic time
    of arrival): where a recovery's seconds went."""

    seen: list[tuple[float, str, str, dict[str, Any]]] = field(default_factory=list)

    async def watch(self, store: EtcdStore) -> None:
        keys = GroupKeys("/popmq/", GROUP)
        names = {keys.leader: "leader", keys.in_sync: "in_sync"}
        while True:
            with contextlib.suppress(PopmqError):
                _, revision = await store.get_prefix(keys.root)
                async for event in store.watch_prefix(keys.root, revision + 1):
                    if (name := names.get(event.kv.key)) is not None:
                        value = decode(event.kv.value) if event.kind == "put" else {}
                        self.seen.append((time.monotonic(), event.kind, name, value))
            await anyio.sleep(0.05)

    def elections(self) -> int:
        """Leader keys written while the bench watched: one a kill, and one more each time a
        leader lost its lease without a kill (starved of CPU, its keepalives came too late)."""
        return sum(1 for _, kind, name, _ in self.seen if name == "leader" and kind == "put")

    def phases(self, killed_at: float, leader: str, served_at: float) -> dict[str, float | None]:
        """Seconds from the kill to each phase (None: not seen)."""
        expired = elected = in_sync = None
        for at, kind, name, value in self.seen:
            if at < killed_at:
                continue
            if name == "leader" and kind == "delete" and expired is None:
                expired = at
            elif name == "leader" and kind == "put" and value.get("name") != leader:
                elected = elected or at
            elif name == "in_sync" and elected and len(value.get("members", [])) >= 2:
                in_sync = in_sync or at
        return {phase: None if at is None else round(at - killed_at, 2)
                for phase, at in (("expired", expired), ("elected", elected),
                                  ("in_sync", in_sync), ("served", served_at))}  # fmt: skip


@dataclass
class _Traffic:
    client: AsyncClient
    # (when the send started, when it was acknowledged, body)
    acked: list[tuple[float, float, bytes]] = field(default_factory=list)
    send_failures: int = 0
    delivered: Counter[bytes] = field(default_factory=Counter)
    consumed: Counter[bytes] = field(default_factory=Counter)  # delivered and acked
    receive_errors: int = 0  # issue 19: no receive may fail during a leader change
    last_receive_error: str = ""
    ack_errors: int = 0  # allowed: the acks of the instant of a switch (the message comes back)
    last_ack_error: str = ""
    producing: bool = True

    async def produce(self) -> None:
        sequence = 0
        while self.producing:
            body = f"m-{sequence}".encode()
            sequence += 1
            started = time.monotonic()
            try:
                ok = (await self.client.send([Message(TOPIC, body)]))[0].code == Code.OK
            except PopmqError:
                ok = False
            if ok:
                self.acked.append((started, time.monotonic(), body))
                progress.count(1)
            else:
                self.send_failures += 1
                await anyio.sleep(0.02)

    async def consume(self, queue: QueueRef) -> None:
        while True:
            try:
                got = await self.client.receive("bench-failover", queue, batch_size=16,
                                                invisible_ms=INVISIBLE_MS,
                                                long_polling_ms=5_000)  # fmt: skip
            except PopmqError as error:
                self.receive_errors += 1
                self.last_receive_error = str(error)
                await anyio.sleep(0.05)
                continue
            self.delivered.update(m.body for m in got)
            if got:
                await self._ack(got)

    async def _ack(self, got: list[ReceivedMessage]) -> None:
        try:
            outcomes = await self.client.ack(
                "bench-failover", TOPIC, [(m.message_id, m.receipt_handle) for m in got]
            )
        except PopmqError as error:
            self.ack_errors += len(got)
            self.last_ack_error = str(error)
            return
        for message, outcome in zip(got, outcomes, strict=True):
            if outcome.ok:
                self.consumed[message.body] += 1
            else:
                self.ack_errors += 1
                self.last_ack_error = f"{outcome.code}: {outcome.detail}"

    def served_since(self, instant: float) -> float | None:
        """When the first send started after ``instant`` was acknowledged (None: not yet)."""
        return next((done for started, done, _ in self.acked if started > instant), None)

    def lost(self) -> int:
        return sum(1 for _, _, body in self.acked if body not in self.delivered)

    def unconsumed(self) -> int:
        return sum(1 for _, _, body in self.acked if body not in self.consumed)


async def _until(predicate: Callable[[], bool]) -> None:
    """Return once ``predicate()`` holds (the caller bounds the wait)."""
    while not predicate():  # noqa: ASYNC110 (counters the traffic tasks bump, not an event)
        await anyio.sleep(0.02)


def _copy_logs(root: Path, into: Path) -> None:
    into.mkdir(parents=True, exist_ok=True)
    for log in root.glob("*.log"):
        shutil.copy(log, into / log.name)


async def _group_state(store: EtcdStore) -> tuple[str, set[str]]:
    keys = GroupKeys("/popmq/", GROUP)
    leader, in_sync = await store.get(keys.leader), await store.get(keys.in_sync)
    return (str(decode(leader.value).get("name", "")) if leader else "",
            set(decode(in_sync.value).get("members", [])) if in_sync else set())  # fmt: skip


async def _poll(store: EtcdStore, want: Any, timeout_s: float = ROUND_TIMEOUT_S) -> str:
    """Poll etcd until ``want(leader, in_sync)``; the leader then."""
    with anyio.fail_after(timeout_s):
        while True:
            with contextlib.suppress(PopmqError):
                leader, in_sync = await _group_state(store)
                if want(leader, in_sync):
                    return leader
            await anyio.sleep(0.05)


@contextlib.asynccontextmanager
async def _cluster(root: Path, lease_ttl_s: int) -> AsyncIterator[tuple[dict[str, _Child], str,
                                                                       str]]:  # fmt: skip
    etcd, url = _etcd(root)
    nodes = {name: _node(root, name, url, lease_ttl_s) for name in NODES}
    proxy = _Child([sys.executable, "-m", "popmq", "proxy", "--host", "127.0.0.1", "--port", "0",
                    "--etcd", url, "--set", f"proxy.min_invisible_ms={INVISIBLE_MS}"],
                   root / "proxy.log")  # fmt: skip
    children = [etcd, *nodes.values(), proxy]
    try:
        await etcd.start()
        async with anyio.create_task_group() as starting:  # in parallel: a shorter start
            for child in children[1:]:
                starting.start_soon(child.start)
        yield nodes, url, proxy.address
    finally:
        for child in children:
            await child.kill()


async def bench_failover(kills: int = 3, lease_ttl_s: int = 2, keep_logs: str | None = None,
                         drain_s: float = INVISIBLE_MS / 1000 + 5) -> dict[str, Any]:  # fmt: skip
    """``drain_s``: how long the consumer may take at the end for the messages not consumed
    yet (one whose ack failed in a switch comes back after the invisible time)."""
    rounds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="popmq-bench-failover-") as tmp:
        root = Path(tmp)
        try:
            async with _cluster(root, lease_ttl_s) as (nodes, etcd_url, proxy), \
                    AsyncClient(proxy, timeout_s=10) as client:  # fmt: skip
                store = EtcdStore([etcd_url])
                traffic = _Traffic(client)
                events = _GroupEvents()
                try:
                    progress.phase("start")
                    await _poll(store, lambda leader, in_sync: len(in_sync) == 3)
                    with anyio.fail_after(ROUND_TIMEOUT_S):
                        while not traffic.acked:
                            with contextlib.suppress(PopmqError):
                                sent = await client.send([Message(TOPIC, b"m-first")])
                                if sent[0].code == Code.OK:
                                    traffic.acked.append((0.0, time.monotonic(), b"m-first"))
                            await anyio.sleep(0.1)
                    queues = await client.query_route(TOPIC)
                    progress.phase("kills (acknowledged sends)")
                    async with anyio.create_task_group() as tasks:
                        tasks.start_soon(events.watch, store)
                        tasks.start_soon(traffic.produce)
                        for queue in queues:
                            tasks.start_soon(traffic.consume, queue)
                        for index in range(kills):
                            last = index == kills - 1  # the killed node stays down
                            rounds.append(await _kill_round(index + 1, nodes, store,
                                                            traffic, events,
                                                            restart=not last))  # fmt: skip
                        traffic.producing = False
                        progress.phase("drain")
                        with anyio.move_on_after(drain_s):
                            await _until(lambda: not traffic.unconsumed())
                        tasks.cancel_scope.cancel()
                finally:
                    await store.aclose()
        finally:
            if keep_logs:
                _copy_logs(root, Path(keep_logs))
    recovered = [r["recovered_s"] for r in rounds]
    consumed_twice = sum(count - 1 for count in traffic.consumed.values() if count > 1)
    return {
        "params": {
            "kills": kills,
            "lease_ttl_s": lease_ttl_s,
            "nodes": len(NODES),
            "replication": "sync",
            "min_in_sync": 2,
        },
        "kills": rounds,
        "recovered_median_s": round(statistics.median(recovered), 2) if recovered else None,
        "recovered_max_s": round(max(recovered), 2) if recovered else None,
        "acknowledged": len(traffic.acked),
        "send_failures": traffic.send_failures,
        "lost": traffic.lost(),
        "duplicates": consumed_twice,
        "unconsumed_after_drain": traffic.unconsumed(),
        "receive_errors": traffic.receive_errors,
        "last_receive_error": traffic.last_receive_error,
        "ack_errors": traffic.ack_errors,
        "last_ack_error": traffic.last_ack_error,
        "elections": events.elections(),
    }


async def _kill_round(number: int, nodes: dict[str, _Child], store: EtcdStore,
                      traffic: _Traffic, events: _GroupEvents, *,
                      restart: bool) -> dict[str, Any]:  # fmt: skip
    leader = await _poll(store, lambda leader, in_sync: bool(leader) and len(in_sync) == 3)
    await anyio.sleep(0.5)  # some traffic on the full group first
    killed_at = time.monotonic()
    await nodes[leader].kill()
    successor = await _poll(store, lambda new, _in_sync: bool(new) and new != leader)
    elected_s = time.monotonic() - killed_at
    with anyio.fail_after(ROUND_TIMEOUT_S):
        await _until(lambda: traffic.served_since(killed_at) is not None)
    served_at = traffic.served_since(killed_at)
    assert served_at is not None
    recovered_s = served_at - killed_at
    await anyio.sleep(0.1)  # the watch's last events (the in-sync set came before the send)
    phases = events.phases(killed_at, leader, served_at)
    if restart:
        await nodes[leader].start()  # back on its data directory, as a follower
    return {"kill": number, "leader": leader, "successor": successor,
            "elected_s": round(elected_s, 2), "recovered_s": round(recovered_s, 2),
            "phases": phases}  # fmt: skip


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def format_table(result: dict[str, Any]) -> str:
    p = result["params"]
    head = (
        f"{p['kills']} leader kills (SIGKILL), {p['nodes']} nodes, --replication "
        f"{p['replication']} --min-in-sync {p['min_in_sync']}, lease TTL {p['lease_ttl_s']} s"
    )
    rows = [["kill", "leader", "successor", "lease expired s", "elected s", "follower in sync s",
             "recovered s"]]  # fmt: skip
    for r in result["kills"]:
        phases = r.get("phases", {})
        rows.append([str(r["kill"]), r["leader"], r["successor"], _seconds(phases.get("expired")),
                     f"{r['elected_s']:.2f}", _seconds(phases.get("in_sync")),
                     f"{r['recovered_s']:.2f}"])  # fmt: skip
    rows.append(["median", "", "", "", "", "", f"{result['recovered_median_s']}"])
    rows.append(["max", "", "", "", "", "", f"{result['recovered_max_s']}"])
    tail = (f"{result['acknowledged']} acknowledged, {result['send_failures']} send failures, "
            f"{result['lost']} lost, {result['duplicates']} duplicates, "
            f"{result['unconsumed_after_drain']} not consumed after the drain, "
            f"{result['receive_errors']} receive errors, "
            f"{result['ack_errors']} acks refused or failed (each message comes back)")  # fmt: skip
    if "elections" in result:  # more than the kills: leases lost without a kill
        tail += f"; {result['elections']} elections for {p['kills']} kills"
    return head + "\n\n" + "\n".join(grid(rows)) + "\n\n" + tail
