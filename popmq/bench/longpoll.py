"""`popmq bench longpoll`: real-time delivery of each long-poll strategy, side by side.

Article 001's scenario: B brokers with one topic on all of them, C SimpleConsumer-style loops
(receive with awaitDuration, then ack), and producers sending at a low random (Poisson) rate to
random brokers. Every strategy gets a fresh cluster and the same load. Per strategy it reports
the delivery latency from store to receipt, receives, empty and false-empty answers, broker
RPCs per delivered message and CPU seconds. The busy scenario (many consumers, a high rate)
checks that ``adaptive`` runs as ``pop`` there and keeps its throughput.

The consumer loops call the strategy exactly as the proxy's ReceiveMessage handler does; the
gRPC hop between client and proxy is left out, so the figures are the strategies' own.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import math
import os
import random
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from popmq.bench import progress as live
from popmq.bench.brokers import local_broker, process_cpu_s, remote_broker
from popmq.bench.table_text import grid
from popmq.broker.contract.port import BrokerPort
from popmq.broker.contract.types import AckEntry, Message, PoppedMessage, PopRequest
from popmq.config import BrokerConfig, ProxyConfig
from popmq.proxy.longpoll import LongPollRequest, LongPollStrategy, make_strategy
from popmq.proxy.metrics import BROKER_RPCS, ProxyMetrics

TOPIC = "bench-longpoll"
GROUP = "bench-longpoll-group"
QUEUES_PER_BROKER = 4
STRATEGIES = ("pop", "slices", "notify", "adaptive")
# An empty answer is false when a message stored at least this long before it was still
# waiting for a consumer (shorter gaps are messages in flight, not missed ones).
FALSE_EMPTY_TOLERANCE_MS = 10.0
DRAIN_S = 2.0  # after the producers stop, consumers get this long to take the rest
WARMUP_S = 0.3  # consumers are already long-polling when the first message is sent
RAM_DISK = "/dev/shm"


def _now_ms() -> float:
    return time.time() * 1000


# -- the cluster -------------------------------------------------------------------------------
@contextlib.asynccontextmanager
async def _cluster(
    count: int, root: Path, remote: bool, pids: list[int]
) -> AsyncIterator[list[BrokerPort]]:
    """B fresh brokers with the topic on each; remote ones add their process ids to pids."""
    async with contextlib.AsyncExitStack() as stack:
        ports: list[BrokerPort] = []
        for index in range(count):
            config = BrokerConfig(name=f"broker-{index}", port=0, data_dir=root / f"b{index}")
            if remote:
                port = await stack.enter_async_context(remote_broker(config, pids))
            else:
                port = await stack.enter_async_context(local_broker(config))
            await port.create_topic(TOPIC, QUEUES_PER_BROKER)
            ports.append(port)
        yield ports


# -- one run -------------------------------------------------------------------------------------
@dataclass
class _Record:
    sent_ms: dict[str, float] = field(default_factory=dict)  # message id -> send returned
    stored_ms: dict[str, float] = field(default_factory=dict)  # message id -> store timestamp
    received_ms: dict[str, float] = field(default_factory=dict)  # first receipt
    duplicates: int = 0
    receives: int = 0
    empties: list[tuple[float, float]] = field(default_factory=list)  # (asked, answered)
    stalls_ms: list[float] = field(default_factory=list)  # event-loop lateness samples
    produced_until_ms: float = 0.0


async def _produce(
    ports: Sequence[BrokerPort], rate: float, rng: random.Random, record: _Record, body: bytes
) -> None:
    """Poisson arrivals on an absolute schedule: a slow send delays, but never thins, the load."""
    loop = asyncio.get_running_loop()
    due = loop.time()
    while True:
        due += rng.expovariate(rate)
        delay = due - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        port = rng.choice(ports)
        results = await port.send([Message(topic=TOPIC, body=body)])
        record.sent_ms[results[0].message_id] = _now_ms()


async def _watch_loop(record: _Record) -> None:
    """Samples how late the event loop wakes a 10 ms sleep: the noise floor of the latency
    figures (a busy shared machine stalls the whole process now and then)."""
    loop = asyncio.get_running_loop()
    while True:
        asked = loop.time()
        await asyncio.sleep(0.01)
        record.stalls_ms.append(max(0.0, (loop.time() - asked - 0.01) * 1000))


async def _consume(
    index: int,
    ports: Sequence[BrokerPort],
    strategy: LongPollStrategy,
    metrics: ProxyMetrics,
    record: _Record,
    await_ms: int,
) -> None:
    """A SimpleConsumer: receive (rotating over the route's brokers), then ack what came."""
    by_name = {port.name: port for port in ports}
    turn = index
    while True:
        preferred = ports[turn % len(ports)].name
        turn += 1
        pop = PopRequest(group=GROUP, topic=TOPIC, max_messages=32, invisible_time_ms=60_000)
        asked = _now_ms()
        messages = await strategy.receive(ports, LongPollRequest(pop, await_ms, preferred))
        answered = _now_ms()
        record.receives += 1
        if not messages:
            record.empties.append((asked, answered))
            continue
        for popped in messages:
            message_id = popped.message.message_id
            if message_id in record.received_ms:
                record.duplicates += 1
                continue
            record.received_ms[message_id] = answered
            record.stored_ms[message_id] = popped.message.store_timestamp_ms
        await _ack(by_name, metrics, messages)


async def _ack(
    by_name: dict[str, BrokerPort], metrics: ProxyMetrics, messages: list[PoppedMessage]
) -> None:
    per_broker: dict[str, list[AckEntry]] = {}
    for popped in messages:
        entry = AckEntry(popped.receipt_handle, popped.message.message_id)
        per_broker.setdefault(popped.message.store_host, []).append(entry)
    for name, entries in per_broker.items():
        metrics.broker_call("ack")
        await by_name[name].ack(GROUP, TOPIC, entries)


async def _run_one(
    name: str,
    *,
    brokers: int,
    consumers: int,
    rate: float,
    duration_s: float,
    await_ms: int,
    remote: bool,
    seed: int,
    proxy_overrides: dict[str, Any],
    body_bytes: int,
    data_dir: str | None,
) -> dict[str, Any]:
    metrics = ProxyMetrics()
    config = ProxyConfig(strategy=name, **proxy_overrides)
    strategy = make_strategy(config, metrics)
    record = _Record()
    rng = random.Random(seed)
    body = bytes(body_bytes)
    with tempfile.TemporaryDirectory(prefix=f"popmq-bench-{name}-", dir=data_dir) as root:
        pids: list[int] = []
        async with _cluster(brokers, Path(root), remote, pids) as ports:
            cpu_before = time.process_time()
            brokers_before = sum(process_cpu_s(pid) for pid in pids)
            wall_before = time.perf_counter()
            async with anyio.create_task_group() as group:  # the watcher and the consumers
                group.start_soon(_watch_loop, record)
                for i in range(consumers):
                    group.start_soon(_consume, i, ports, strategy, metrics, record, await_ms)
                await asyncio.sleep(WARMUP_S)
                producers = max(1, min(16, int(rate // 200) + 1))  # sleep granularity
                async with anyio.create_task_group() as producing:
                    for _ in range(producers):
                        producing.start_soon(_produce, ports, rate / producers, rng, record, body)
                    produce_started = time.perf_counter()
                    await asyncio.sleep(duration_s)
                    producing.cancel_scope.cancel()
                produce_s = time.perf_counter() - produce_started
                record.produced_until_ms = _now_ms()
                drain_until = time.perf_counter() + DRAIN_S
                # polled: "all received" has no event of its own, and 50 ms is fine here
                while time.perf_counter() < drain_until and not _all_received(record):  # noqa: ASYNC110
                    await asyncio.sleep(0.05)
                group.cancel_scope.cancel()  # clients going away mid-poll: cancellation path
            await strategy.aclose()
            wall_s = time.perf_counter() - wall_before
            cpu_s = time.process_time() - cpu_before
            broker_cpu_s = (
                sum(process_cpu_s(pid) for pid in pids) - brokers_before if remote else None
            )
    return _summarise(name, record, metrics, cpu_s, broker_cpu_s, wall_s, produce_s)


def _all_received(record: _Record) -> bool:
    return all(message_id in record.received_ms for message_id in record.sent_ms)


# -- figures -------------------------------------------------------------------------------------
def _percentile(sorted_values: list[float], fraction: float) -> float:
    if not sorted_values:
        return 0.0
    rank = max(0, min(len(sorted_values) - 1, math.ceil(fraction * len(sorted_values)) - 1))
    return sorted_values[rank]


def _false_empties(record: _Record, end_ms: float) -> int:
    """Empty answers given while some message had been waiting for a consumer for more than
    the tolerance (stored before, received by nobody until after the answer)."""
    waiting = []
    for message_id, sent in record.sent_ms.items():
        stored = record.stored_ms.get(message_id, sent)
        waiting.append((stored, record.received_ms.get(message_id, end_ms + 1)))
    waiting.sort()
    stores = [stored for stored, _ in waiting]
    latest_receipt: list[float] = []  # prefix max of receipt times, in store order
    for _, received in waiting:
        latest_receipt.append(max(received, latest_receipt[-1] if latest_receipt else received))
    false = 0
    for _asked, answered in record.empties:
        count = bisect.bisect_right(stores, answered - FALSE_EMPTY_TOLERANCE_MS)
        if count and latest_receipt[count - 1] > answered:
            false += 1
    return false


def _metric(metrics: ProxyMetrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


def _summarise(
    name: str,
    record: _Record,
    metrics: ProxyMetrics,
    cpu_s: float,
    broker_cpu_s: float | None,
    wall_s: float,
    produce_s: float,
) -> dict[str, Any]:
    end_ms = _now_ms()
    latencies = []
    undelivered = 0
    for message_id, sent in record.sent_ms.items():
        if message_id in record.received_ms:
            latencies.append(record.received_ms[message_id] - record.stored_ms[message_id])
        else:
            # Not delivered by the end: counted at the time it had waited (a lower bound).
            undelivered += 1
            latencies.append(end_ms - sent)
    latencies.sort()
    stalls = sorted(record.stalls_ms)
    label = name
    rpcs: dict[str, int] = {}
    for sample in next(iter(metrics[BROKER_RPCS].collect())).samples:
        if sample.name.endswith("_total"):
            rpcs[sample.labels["kind"]] = int(sample.value)
    delivered = len(record.received_ms)
    return {
        "strategy": name,
        "sent": len(record.sent_ms),
        "delivered": delivered,
        "undelivered": undelivered,
        "duplicates": record.duplicates,
        "latency_ms": {
            "p50": round(_percentile(latencies, 0.50), 2),
            "p99": round(_percentile(latencies, 0.99), 2),
            "max": round(latencies[-1] if latencies else 0.0, 2),
        },
        "loop_stall_ms": {
            "p99": round(_percentile(stalls, 0.99), 2),
            "max": round(stalls[-1] if stalls else 0.0, 2),
        },
        "receives": record.receives,
        "empty": len(record.empties),
        "false_empty": _false_empties(record, end_ms),
        "false_empty_probe": int(
            _metric(metrics, "popmq_proxy_false_empty_responses_total", strategy=label)
        ),
        "first_pop_hits": int(_metric(metrics, "popmq_proxy_first_pop_hits_total", strategy=label)),
        "pop_with_notify": int(_metric(metrics, "popmq_proxy_pop_with_notify_total")),
        "broker_rpcs": rpcs,
        # The false-empty probe is measurement, not delivery: left out of the cost per message.
        "rpcs_per_message": round(
            sum(n for kind, n in rpcs.items() if kind != "notify_probe") / delivered, 2
        )
        if delivered
        else None,
        "span_s": round(_span_s(record), 3),
        "throughput_per_s": round(delivered / _span_s(record), 1) if _span_s(record) else 0.0,
        "cpu_s": round(cpu_s, 2),
        "broker_cpu_s": None if broker_cpu_s is None else round(broker_cpu_s, 2),
        "wall_s": round(wall_s, 2),
        "produce_s": round(produce_s, 2),
        "adaptive_mode": _adaptive_mode(metrics) if name == "adaptive" else None,
        "adaptive_switches": {
            mode: int(_metric(metrics, "popmq_proxy_adaptive_switches_total", mode=mode))
            for mode in ("pop", "notify")
        }
        if name == "adaptive"
        else None,
    }


def _span_s(record: _Record) -> float:
    """From the first send to the last receipt."""
    if not record.received_ms or not record.sent_ms:
        return 0.0
    return (max(record.received_ms.values()) - min(record.sent_ms.values())) / 1000


def _total_throughput(runs: list[dict[str, Any]]) -> float:
    span = sum(run["span_s"] for run in runs)
    return round(sum(run["delivered"] for run in runs) / span, 1) if span else 0.0


def _adaptive_mode(metrics: ProxyMetrics) -> str:
    for mode in ("pop", "notify"):
        if _metric(metrics, "popmq_proxy_adaptive_mode", mode=mode) == 1:
            return mode
    return "?"


def _default_data_dir() -> str | None:
    return RAM_DISK if os.path.isdir(RAM_DISK) else None


# -- the benchmark -------------------------------------------------------------------------------
async def bench_longpoll(
    brokers: int = 8,
    consumers: int = 1,
    rate: float = 5.0,
    duration_s: float = 30.0,
    await_ms: int = 20_000,
    strategies: Sequence[str] = STRATEGIES,
    remote: bool = False,
    busy: bool = False,
    *,
    busy_consumers: int = 32,
    busy_rate: float = 1000.0,
    busy_duration_s: float | None = None,
    busy_rounds: int = 2,
    body_bytes: int = 1024,
    seed: int = 1,
    proxy_overrides: dict[str, Any] | None = None,
    data_dir: str | None = None,
) -> dict[str, Any]:
    """Run every strategy on a fresh cluster under the same load; return the figures.

    ``proxy_overrides`` are ProxyConfig fields (e.g. notify_threshold_rps) for every strategy.
    With ``busy``, the busy scenario runs ``pop`` and ``adaptive`` with ``busy_consumers`` and
    ``busy_rate`` too. The result is JSON-serialisable; ``format_table`` prints it.

    Broker data goes under ``data_dir``; by default a RAM disk (/dev/shm) when there is one,
    so the disk stalls of a shared machine do not blur the long-polling figures.
    """
    unknown = set(strategies) - set(STRATEGIES)
    if unknown:
        raise ValueError(f"unknown strategies {sorted(unknown)}: choose from {STRATEGIES}")
    overrides = dict(proxy_overrides or {})
    data_dir = data_dir or _default_data_dir()
    common: dict[str, Any] = {
        "brokers": brokers, "await_ms": await_ms, "remote": remote, "seed": seed,
        "proxy_overrides": overrides, "body_bytes": body_bytes, "data_dir": data_dir,
    }  # fmt: skip
    result: dict[str, Any] = {
        "settings": {
            "brokers": brokers, "consumers": consumers, "rate": rate, "duration_s": duration_s,
            "await_ms": await_ms, "remote": remote, "queues_per_broker": QUEUES_PER_BROKER,
            "body_bytes": body_bytes, "seed": seed, "proxy_overrides": overrides,
            "cpus": os.cpu_count(), "data_dir": data_dir or tempfile.gettempdir(),
        },
        "low_rate": [],
    }  # fmt: skip
    for name in strategies:
        live.phase(f"{name}: low rate")
        result["low_rate"].append(
            await _run_one(name, consumers=consumers, rate=rate, duration_s=duration_s, **common)
        )
    if busy:
        # pop and adaptive alternate, so a neighbour's load on a shared machine hits both.
        runs = []
        for round_index in range(busy_rounds):
            for name in ("pop", "adaptive"):
                live.phase(f"{name}: busy, round {round_index + 1}")
                settings = {**common, "seed": seed + round_index}
                run = await _run_one(
                    name, consumers=busy_consumers, rate=busy_rate,
                    duration_s=busy_duration_s or duration_s, **settings,
                )  # fmt: skip
                runs.append(run)
        totals = {name: _total_throughput([r for r in runs if r["strategy"] == name])
                  for name in ("pop", "adaptive")}  # fmt: skip
        result["busy"] = {
            "consumers": busy_consumers,
            "rate": busy_rate,
            "rounds": busy_rounds,
            "runs": runs,
            "throughput_per_s": totals,
            "adaptive_vs_pop_throughput": round(totals["adaptive"] / totals["pop"], 3)
            if totals["pop"]
            else None,
        }
    return result


def format_table(result: dict[str, Any]) -> str:
    """The figures as plain-text tables (the same layout docs/longpolling.md shows)."""
    settings = result["settings"]
    lines = [
        f"low rate: {settings['brokers']} brokers x {settings['queues_per_broker']} queues, "
        f"{settings['consumers']} consumer(s), {settings['rate']} msg/s for "
        f"{settings['duration_s']} s, awaitDuration {settings['await_ms']} ms"
        f"{', remote brokers' if settings['remote'] else ', in-process brokers'}"
        f", data in {settings['data_dir']}",
        "",
    ]
    lines += _table(result["low_rate"])
    busy = result.get("busy")
    if busy:
        totals = busy["throughput_per_s"]
        lines += [
            "",
            f"busy: {busy['consumers']} consumers, {busy['rate']} msg/s offered, "
            f"{busy['rounds']} alternating round(s); throughput pop "
            f"{totals['pop']}/s, adaptive {totals['adaptive']}/s"
            f" = {busy['adaptive_vs_pop_throughput']}x",
            "",
        ]
        lines += _table(busy["runs"], throughput=True)
    return "\n".join(lines)


def _table(runs: list[dict[str, Any]], throughput: bool = False) -> list[str]:
    header = ["strategy", "sent", "delivered", "p50 ms", "p99 ms", "max ms", "receives",
              "empty", "false empty", "RPC/msg", "CPU s", "stall ms"]  # fmt: skip
    if throughput:
        header[2:2] = ["msg/s"]
        header.append("mode")
    rows = [header]
    for run in runs:
        latency = run["latency_ms"]
        row = [
            run["strategy"], str(run["sent"]), str(run["delivered"]),
            f"{latency['p50']:.1f}", f"{latency['p99']:.1f}", f"{latency['max']:.1f}",
            str(run["receives"]), str(run["empty"]),
            f"{run['false_empty']} ({run['false_empty_probe']})",
            "-" if run["rpcs_per_message"] is None else f"{run['rpcs_per_message']:.2f}",
            f"{run['cpu_s']:.2f}", f"{run['loop_stall_ms']['max']:.0f}",
        ]  # fmt: skip
        if throughput:
            row[2:2] = [f"{run['throughput_per_s']:.0f}"]
            row.append(run["adaptive_mode"] or "-")
        rows.append(row)
    out = grid(rows)
    out.append(
        "false empty: measured from delivery times (the proxy's probe metric in brackets); "
        "RPC/msg: pop + notify + ack + change_invisible calls per delivered message"
    )
    out.append("stall ms: the longest the event loop was late during the run (machine noise floor)")
    return out
