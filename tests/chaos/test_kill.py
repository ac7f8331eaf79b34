"""kill -9 of brokers and proxies under bounded load (issue 9: chaos suite).

Two `popmq broker` processes behind one `popmq proxy` (all real, 127.0.0.1). A producer and a
consumer run through the proxy while each broker in turn, the FIRST included, is killed with
SIGKILL, kept down for a few seconds and restarted on its port. Counted per broker:

- receive errors while the broker is down (goal 0: the live broker serves);
- send failures while it is down (unordered sends move to the live broker);
- lost: acknowledged sends never received (must be 0);
- duplicated: messages received more than once (at-least-once allows it; reported);
- never redelivered: messages whose ack failed (their broker was down) and that never came
  back (must be 0).
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from popmq.broker.contract.types import Message
from support.official_clients import SERVER_SETTINGS, PopmqProcess, cluster_proxy, unique

from popmq.client.aio import AsyncClient

INVISIBLE_MS = 2_000
DOWN_S = 4.0
SEND_INTERVAL_S = 0.05


def start_broker(name: str, root: Path, port: int = 0) -> PopmqProcess:
    args = ["broker", "--name", name, "--port", str(port), "--data-dir", str(root / name)]
    for setting in SERVER_SETTINGS:
        if setting.startswith("broker."):
            args += ["--set", setting]
    log = root / f"{name}-{time.monotonic_ns()}.log"
    return PopmqProcess(args, log)


@dataclass
class Tally:
    sent: set[bytes] = field(default_factory=set)  # acknowledged by the proxy
    send_failures: int = 0
    send_failures_down: int = 0
    received: Counter[bytes] = field(default_factory=Counter)
    receive_errors: int = 0
    receive_errors_down: int = 0
    receives_down: int = 0
    received_down: int = 0
    ack_failed: set[bytes] = field(default_factory=set)
    redelivered_after_ack_failure: set[bytes] = field(default_factory=set)
    down: bool = False
    errors: list[str] = field(default_factory=list)


async def _produce(client: AsyncClient, topic: str, tally: Tally, stop: asyncio.Event) -> None:
    n = 0
    while not stop.is_set():
        body = f"m-{n}".encode()
        n += 1
        try:
            await client.send([Message(topic, body)])
            tally.sent.add(body)
        except Exception as exc:
            tally.send_failures += 1
            tally.send_failures_down += tally.down
            tally.errors.append(f"send: {exc}")
        await asyncio.sleep(SEND_INTERVAL_S)


async def _consume(
    client: AsyncClient, topic: str, group: str, tally: Tally, stop: asyncio.Event
) -> None:
    queues = await client.query_route(topic)
    turn = 0
    while not stop.is_set():
        queue = queues[turn % len(queues)]
        turn += 1
        down = tally.down
        try:
            got = await client.receive(
                group, queue, batch_size=16, invisible_ms=INVISIBLE_MS, long_polling_ms=1_000
            )
        except Exception as exc:
            tally.receive_errors += 1
            tally.receive_errors_down += down
            tally.errors.append(f"receive: {exc}")
            await asyncio.sleep(0.1)
            continue
        tally.receives_down += down
        tally.received_down += down and len(got)
        for message in got:
            if message.body in tally.ack_failed:
                tally.redelivered_after_ack_failure.add(message.body)
            tally.received[message.body] += 1
        if not got:
            continue
        try:
            outcomes = await client.ack(
                group, topic, [(m.message_id, m.receipt_handle) for m in got]
            )
            failed = [m.body for m, o in zip(got, outcomes, strict=True) if o.code != 20000]
        except Exception:
            failed = [m.body for m in got]
        tally.ack_failed.update(failed)


async def _until(predicate: Callable[[], bool], what: str, within_s: float = 60.0) -> None:
    deadline = time.monotonic() + within_s
    while not predicate():
        assert time.monotonic() < deadline, f"no {what} within {within_s} s"
        await asyncio.sleep(0.1)


async def _kill_round(
    endpoint: str, root: Path, brokers: dict[str, PopmqProcess], ports: dict[str, int], victim: str
) -> Tally:
    topic, group = unique("kill"), unique("g")
    tally = Tally()
    stop_producer, stop_consumer = asyncio.Event(), asyncio.Event()
    async with AsyncClient(endpoint) as client:
        await client.query_route(topic)  # creates the topic on both brokers
        producer = asyncio.create_task(_produce(client, topic, tally, stop_producer))
        consumer = asyncio.create_task(_consume(client, topic, group, tally, stop_consumer))
        # Phases end on counts, not only on time: a loaded CI machine sends far fewer than
        # one message per SEND_INTERVAL_S.
        await asyncio.sleep(2.0)  # steady state
        await _until(lambda: len(tally.sent) >= 30, "steady-state sends")
        brokers[victim].process.send_signal(signal.SIGKILL)
        brokers[victim].process.wait(10)
        tally.down = True
        await asyncio.sleep(DOWN_S)
        await _until(lambda: tally.received_down > 0, "a delivery while a broker was down")
        tally.down = False
        brokers[victim].stop()
        brokers[victim] = start_broker(victim, root, ports[victim])
        await asyncio.to_thread(brokers[victim].wait_listening, "broker")
        await asyncio.sleep(1.0)
        restarted = len(tally.sent)
        await _until(lambda: len(tally.sent) >= restarted + 25, "sends after the restart")
        stop_producer.set()
        await producer
        # Drain: everything acknowledged must arrive, unacked ones after their invisible time.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            missing = tally.sent - set(tally.received)
            unreturned = tally.ack_failed - tally.redelivered_after_ack_failure
            if not missing and not unreturned:
                break
            await asyncio.sleep(0.5)
        stop_consumer.set()
        await consumer
    return tally


@pytest.fixture
def cluster(tmp_path: Path):
    brokers: dict[str, PopmqProcess] = {}
    ports: dict[str, int] = {}
    proxy: PopmqProcess | None = None
    try:
        for name in ("broker-a", "broker-b"):
            brokers[name] = start_broker(name, tmp_path)
            ports[name] = brokers[name].wait_listening("broker")
        proxy = cluster_proxy(ports, tmp_path)
        endpoint = f"127.0.0.1:{proxy.wait_listening()}"
        yield endpoint, tmp_path, brokers, ports
    finally:
        if proxy is not None:
            proxy.stop()
        for process in brokers.values():
            process.stop()


async def test_kill_each_broker_in_turn(cluster, record_property) -> None:
    endpoint, root, brokers, ports = cluster
    rows = []
    tallies = []
    for victim in ("broker-a", "broker-b"):  # the first broker included
        tally = await _kill_round(endpoint, root, brokers, ports, victim)
        tallies.append((victim, tally))
        lost = tally.sent - set(tally.received)
        duplicated = sum(1 for count in tally.received.values() if count > 1)
        never_redelivered = tally.ack_failed - tally.redelivered_after_ack_failure
        rows.append(
            (victim, len(tally.sent), len(lost), duplicated, len(never_redelivered),
             tally.receive_errors_down, tally.receives_down, tally.received_down,
             tally.send_failures_down)
        )  # fmt: skip
    header = ("killed", "sent", "lost", "duplicated", "never redelivered",
              "receive errors (down)", "receives (down)", "received (down)",
              "send failures (down)")  # fmt: skip
    print("\n" + " | ".join(header))
    for row in rows:
        print(" | ".join(str(v) for v in row))
    for victim, tally in tallies:
        for line in tally.errors[:5]:
            print(victim, line)
    record_property("kill_rows", rows)
    for victim, sent, lost, _dup, never, errors_down, receives_down, got_down, _sf in rows:
        assert sent > 50, victim
        assert lost == 0, (victim, "acknowledged sends lost")
        assert never == 0, (victim, "un-acked messages never redelivered")
        assert errors_down == 0, (victim, "receive errors while a broker was down")
        assert receives_down > 0 and got_down > 0, (victim, "the live broker kept serving")


async def test_kill_proxy_mid_long_poll(tmp_path: Path) -> None:
    """A proxy killed while it holds a client's long poll: the message it may have popped for
    that client is not lost; another proxy delivers it after its invisible time."""
    processes: list[PopmqProcess] = []
    try:
        ports = {}
        for name in ("broker-a", "broker-b"):
            processes.append(start_broker(name, tmp_path))
            ports[name] = processes[-1].wait_listening("broker")
        doomed = cluster_proxy(ports, tmp_path, tag="doomed")
        doomed_endpoint = f"127.0.0.1:{doomed.wait_listening()}"
        survivor = cluster_proxy(ports, tmp_path, tag="survivor")
        processes += [doomed, survivor]
        survivor_endpoint = f"127.0.0.1:{survivor.wait_listening()}"
        topic, group = unique("pkill"), unique("g")
        async with AsyncClient(survivor_endpoint) as other, AsyncClient(doomed_endpoint) as client:
            queues = await other.query_route(topic)
            poll = asyncio.create_task(
                client.receive(
                    group, queues[0], batch_size=4, invisible_ms=INVISIBLE_MS, long_polling_ms=5_000
                )
            )
            await asyncio.sleep(0.5)  # the long poll is held
            await other.send([Message(topic, b"precious")])
            await asyncio.sleep(0.3)  # the doomed proxy pops it for its client
            doomed.process.send_signal(signal.SIGKILL)
            doomed.process.wait(10)
            await asyncio.gather(poll, return_exceptions=True)
            got: list = []
            deadline = time.monotonic() + 30
            while not got and time.monotonic() < deadline:
                got = await other.receive(
                    group, queues[0], batch_size=4, invisible_ms=10_000, long_polling_ms=1_000
                )
            assert [m.body for m in got] == [b"precious"]
            await other.ack(group, topic, [(m.message_id, m.receipt_handle) for m in got])
    finally:
        for process in reversed(processes):
            process.stop()
