"""What the HA chaos tests share: a replicated group on etcd behind a proxy (real processes),
etcd lookups, and a producer/consumer pair that records what each saw.

The group: three `popmq broker --etcd --group ga --replication sync --min-in-sync 2` nodes
(lease TTL 2 s, the smallest etcd accepts with the test etcd's 1 s election timeout) and a
`popmq proxy --etcd` with no broker list. Invisible times may be short (``min_invisible_ms``
lowered on nodes and proxy) so that a message whose ack failed comes back quickly.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import anyio
from popmq.broker.contract.errors import Code
from popmq.broker.contract.types import Message
from support.etcd import EtcdCluster

from chaos.processes import PopmqProcess
from popmq.client.aio import AsyncClient
from popmq.client.model import QueueRef
from popmq.coord.etcd import EtcdStore
from popmq.coord.keys import GroupKeys, decode
from popmq.errors import PopmqError

GROUP = "ga"
NODES = ("ga-0", "ga-1", "ga-2")
LEASE_TTL_S = 2


def node(etcd: EtcdCluster, name: str, root: Path, *sets: str) -> PopmqProcess:
    args = ["broker", "--name", name, "--group", GROUP, "--etcd", etcd.endpoint_arg,
            "--replication", "sync", "--min-in-sync", "2",
            "--host", "127.0.0.1", "--port", "0", "--data-dir", str(root / name),
            "--set", f"broker.etcd.lease_ttl_s={LEASE_TTL_S}",
            "--set", "broker.topics.queue_count=2"]  # fmt: skip
    for item in sets:
        args += ["--set", item]
    return PopmqProcess(args, root / f"{name}.log")


Running = tuple[EtcdCluster, dict[str, PopmqProcess], PopmqProcess]


@contextlib.asynccontextmanager
async def group_behind_proxy(
    root: Path,
    *,
    etcd_members: int = 1,
    node_sets: tuple[str, ...] = (),
    proxy_sets: tuple[str, ...] = (),
) -> AsyncIterator[Running]:
    async with EtcdCluster.started(root, members=etcd_members) as etcd:
        nodes = {name: node(etcd, name, root, *node_sets) for name in NODES}
        proxy_args = ["proxy", "--host", "127.0.0.1", "--port", "0", "--etcd", etcd.endpoint_arg]
        for item in proxy_sets:
            proxy_args += ["--set", item]
        proxy = PopmqProcess(proxy_args, root / "proxy.log")
        try:
            async with anyio.create_task_group() as starting:  # in parallel: a shorter start
                for process in (*nodes.values(), proxy):
                    starting.start_soon(process.start)
            yield etcd, nodes, proxy
        finally:
            for process in (*nodes.values(), proxy):  # a restarted one too
                await process.kill()


async def until(predicate: Callable[[], bool]) -> None:
    """Return once ``predicate()`` holds (the caller bounds the wait)."""
    while True:
        if predicate():
            return
        await anyio.sleep(0.05)


async def retried(attempt: Callable[[], Awaitable[bool]]) -> None:
    """Try until ``attempt()`` succeeds (the caller bounds the wait)."""
    while True:
        if await attempt():
            return
        await anyio.sleep(0.1)


async def leader_of(etcd: EtcdCluster) -> tuple[str, int] | None:
    store = EtcdStore(etcd.endpoints)
    try:
        kv = await store.get(GroupKeys("/popmq/", GROUP).leader)
    finally:
        await store.aclose()
    return (str(decode(kv.value)["name"]), kv.create_revision) if kv else None


async def in_sync_set(etcd: EtcdCluster) -> set[str]:
    store = EtcdStore(etcd.endpoints)
    try:
        kv = await store.get(GroupKeys("/popmq/", GROUP).in_sync)
    finally:
        await store.aclose()
    return set(decode(kv.value).get("members", [])) if kv is not None else set()


async def all_in_sync(etcd: EtcdCluster) -> bool:
    return await in_sync_set(etcd) == set(NODES)


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


def _code_name(code: int) -> str:
    try:
        return Code(code).name
    except ValueError:
        return str(code)


@dataclass(frozen=True, slots=True)
class Event:
    """Something the consumer saw of one message."""

    at: float  # monotonic
    what: str  # delivered, acked, ack refused, ack failed
    detail: str = ""  # delivered: broker/topic/queue@offset (the stored copy); else the error
    attempt: int = 0
    message_id: str = ""

    def text(self, start: float) -> str:
        extra = f" attempt {self.attempt} id {self.message_id}" if self.what == "delivered" else ""
        return f"{self.at - start:.2f}s {self.what} {self.detail}{extra}".strip()


@dataclass
class Traffic:
    """A producer and a consumer through the proxy; what each saw."""

    client: AsyncClient
    topic: str
    invisible_ms: int = 10_000
    # (monotonic time the send started, when it was acknowledged, body)
    acked: list[tuple[float, float, bytes]] = field(default_factory=list)
    send_failures: int = 0
    failure_codes: Counter[str] = field(default_factory=Counter)  # why sends were refused
    received: Counter[bytes] = field(default_factory=Counter)  # acked by the consumer
    delivered: Counter[bytes] = field(default_factory=Counter)  # received, acked or not
    receive_errors: int = 0  # issue 19: no receive may fail during a leader change
    last_receive_error = ""
    ack_errors: int = 0  # an ack call that failed as a whole (its messages come back)
    last_ack_error = ""
    producing: bool = True
    # Per body, in order: each delivery (where from, which attempt) and each ack's answer, so
    # that a duplicate can be told apart (see classify_duplicates).
    history: dict[bytes, list[Event]] = field(default_factory=dict)

    def _note(self, body: bytes, event: Event) -> None:
        self.history.setdefault(body, []).append(event)

    async def first_send(self) -> None:
        """One acknowledged send (a follower must be in sync before sends are taken); the
        caller bounds the wait."""
        while not self.acked:
            try:
                receipt = (await self.client.send([Message(self.topic, b"m-first")]))[0]
                if receipt.code == Code.OK:
                    self.acked.append((0.0, time.monotonic(), b"m-first"))
            except PopmqError:
                pass
            await anyio.sleep(0.2)

    async def produce(self) -> None:
        sequence = 0
        while self.producing:
            body = f"m-{sequence}".encode()
            sequence += 1
            started = time.monotonic()
            try:
                receipt = (await self.client.send([Message(self.topic, body)]))[0]
                code = receipt.code
            except PopmqError as error:
                code = error.code
            if code == Code.OK:
                self.acked.append((started, time.monotonic(), body))
            else:
                self.send_failures += 1
                self.failure_codes[_code_name(code)] += 1
                await anyio.sleep(0.05)

    async def consume(self, queue: QueueRef) -> None:
        while True:
            try:
                messages = await self.client.receive("cg", queue, batch_size=16,
                                                     invisible_ms=self.invisible_ms,
                                                     long_polling_ms=5_000)  # fmt: skip
            except PopmqError as error:
                self.receive_errors += 1
                self.last_receive_error = str(error)
                await anyio.sleep(0.1)
                continue
            self.delivered.update(m.body for m in messages)
            if not messages:
                continue
            now = time.monotonic()
            for m in messages:
                self._note(
                    m.body,
                    Event(
                        now,
                        "delivered",
                        f"{m.broker}/{m.topic}/{m.queue_id}@{m.offset}",
                        m.delivery_attempt,
                        m.message_id,
                    ),
                )
            try:
                outcomes = await self.client.ack(
                    "cg", self.topic, [(m.message_id, m.receipt_handle) for m in messages]
                )
            except PopmqError as error:
                self.ack_errors += 1
                self.last_ack_error = str(error)
                for m in messages:
                    self._note(m.body, Event(time.monotonic(), "ack failed", str(error)))
                await anyio.sleep(0.1)
                continue
            now = time.monotonic()
            for message, outcome in zip(messages, outcomes, strict=True):
                if outcome.ok:  # an unacked one comes back: counted then
                    self.received[message.body] += 1
                    self._note(message.body, Event(now, "acked"))
                else:
                    self._note(message.body, Event(now, "ack refused", str(outcome)))

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

    def duplicates(self) -> int:
        return sum(count - 1 for count in self.received.values() if count > 1)

    def classify_duplicates(self) -> dict[str, list[bytes]]:
        """Each body acked more than once, by cause (from its history). A revive (the ack
        failed or never came) writes a new copy with the next attempt number; so:
        - ``revived after an ack``: a delivery after an ack answered OK, of that copy or of
          a later attempt: a defect (an acknowledged ack did not hold);
        - ``copied twice``: two copies of the same attempt, each delivered and acked once:
          one revive written twice (a revive cut by the failover: see docs/reliability.md),
          or, at attempt 1, one send stored twice.
        A later attempt is blamed on an acked copy only when no copy of a lower attempt was
        left un-acked: a send stored twice, one copy acked and the other's ack lost, comes
        back as the other's retry (copied twice, not an ack that did not hold)."""
        causes: dict[str, list[bytes]] = {}
        for body, count in self.received.items():
            if count < 2:
                continue
            acked: list[Event] = []  # the deliveries whose ack was answered OK
            seen: list[Event] = []  # every delivery so far
            cause = "copied twice"
            last: Event | None = None
            for event in self.history.get(body, []):
                if event.what == "delivered":
                    unacked = [d for d in seen if not any(d is a for a in acked)]
                    revivable = any(d.attempt < event.attempt for d in unacked)
                    if any(
                        event.detail == a.detail or (event.attempt > a.attempt and not revivable)
                        for a in acked
                    ):
                        cause = "revived after an ack"
                    seen.append(event)
                    last = event
                elif event.what == "acked" and last is not None:
                    acked.append(last)
            causes.setdefault(cause, []).append(body)
        return causes

    def describe(self, body: bytes) -> str:
        start = min((e.at for events in self.history.values() for e in events), default=0.0)
        return f"{body.decode()}: " + "; ".join(e.text(start) for e in self.history.get(body, []))

    def summary(self) -> str:
        return (f"{len(self.acked)} acknowledged, {self.send_failures} send failures "
                f"({dict(self.failure_codes)}), "
                f"{len(self.lost())} lost, {self.duplicates()} duplicates "
                f"({ {k: len(v) for k, v in self.classify_duplicates().items()} }), "
                f"{len(self.unconsumed())} delivered with an unconfirmed ack and not again, "
                f"{self.receive_errors} receive errors "
                f"(last: {self.last_receive_error or '-'}), {self.ack_errors} ack errors "
                f"(last: {self.last_ack_error or '-'})")  # fmt: skip
