"""`popmq bench spark`: the Spark connector's read and write rates against raw protocol rates.

One run, one `popmq serve` process (B embedded brokers), one topic of N messages:

- raw PullMessage: popmq.client pulls every queue from offset 0 to its end (batch 32), all
  queues at once, no Spark;
- raw SendMessage: the same client sends the N messages (requests of 64, 8 in flight, the
  connector's defaults): this also fills the topic;
- Spark read: spark.read.format("popmq") ... .write.parquet(tmp) (planning, pulls, Arrow,
  Parquet), after a warm-up read that starts the Python workers;
- Spark write: a cached DataFrame of the N bodies -> df.write.format("popmq") to a second
  topic.

The goal is a connector read rate of at least half the raw pull rate. Spark, the proxy and the
load generator share the machine's cores: compare the ratios, not the absolute figures.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

from popmq.bench import progress as live
from popmq.bench.table_text import grid
from popmq.broker.contract.types import Message
from popmq.client import AsyncClient, OffsetPolicy, QueueRef
from popmq.client.local_server import LocalServer
from popmq.lifecycle import fan_out

SOURCE_TOPIC = "bench-spark-in"
SINK_TOPIC = "bench-spark-out"
PULL_BATCH = 32
SEND_BATCH = 64
SEND_INFLIGHT = 8


async def _send_all(endpoint: str, topic: str, count: int, body_bytes: int) -> float:
    """Fill the topic; returns the elapsed seconds."""
    body = os.urandom(body_bytes)
    started = time.perf_counter()
    async with AsyncClient(endpoint) as client:
        limiter = asyncio.Semaphore(SEND_INFLIGHT)

        async def send(first: int) -> None:
            batch = [
                Message(topic=topic, body=body, keys=[f"k{i}"])
                for i in range(first, min(first + SEND_BATCH, count))
            ]
            async with limiter:
                await client.send(batch)

        async with anyio.create_task_group() as group:
            for first in range(0, count, SEND_BATCH):
                group.start_soon(send, first)
    return time.perf_counter() - started


async def _pull_all(endpoint: str, topic: str) -> tuple[int, float]:
    """Pull every queue to its end, all queues concurrently: (messages, seconds)."""
    async with AsyncClient(endpoint) as client:
        queues = await client.query_route(topic)

        async def drain(queue: QueueRef) -> int:
            offset = await client.query_offset(queue, OffsetPolicy.BEGINNING)
            end = await client.query_offset(queue, OffsetPolicy.END)
            read = 0
            while offset < end:
                result = await client.pull(queue, offset, batch_size=PULL_BATCH)
                read += len(result.messages)
                offset = result.next_offset
            return read

        started = time.perf_counter()
        read = await fan_out(drain(q) for q in queues)
        elapsed = time.perf_counter() - started
    return sum(read), elapsed


def _spark_session(master: str) -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    import popmq.spark

    spark = (
        SparkSession.builder.master(master)
        .appName("popmq-bench-spark")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    popmq.spark.register(spark)
    return spark


def _cpu(pid: int | None) -> float:
    if pid is None:
        return 0.0
    from popmq.bench.brokers import process_cpu_s

    return process_cpu_s(pid)


def _per_10k(cpu_s: float, count: float) -> float:
    return round(cpu_s * 10_000 / count, 3) if count else 0.0


def _spark_runs(
    spark: Any, endpoint: str, work: Path, source: str, sink: str, proxy_pid: int | None
) -> dict[str, float]:
    def reader() -> Any:
        return spark.read.format("popmq").option("endpoint", endpoint).option("topic", source)

    # Warm-up: starts the Python workers and loads the connector in them.
    reader().load().limit(10).collect()

    cpu = _cpu(proxy_pid)
    started = time.perf_counter()
    reader().load().write.mode("overwrite").parquet(str(work / "read.parquet"))
    read_s = time.perf_counter() - started
    read_proxy_cpu_s = _cpu(proxy_pid) - cpu
    written = spark.read.parquet(str(work / "read.parquet"))
    read_rows = written.count()

    # One partition per core, as a DataFrame coming out of a real job would be spread.
    cores = spark.sparkContext.defaultParallelism
    bodies = written.select("body").repartition(cores).cache()
    bodies.count()
    started = time.perf_counter()
    bodies.write.format("popmq").mode("append").option("endpoint", endpoint).option(
        "topic", sink
    ).save()
    write_s = time.perf_counter() - started
    bodies.unpersist()
    return {
        "read_s": read_s,
        "read_rows": read_rows,
        "write_s": write_s,
        "read_proxy_cpu_s": read_proxy_cpu_s,
    }


async def bench_spark(
    messages: int = 100_000,
    body_bytes: int = 256,
    brokers: int = 2,
    queues: int = 4,
    master: str = "local[2]",
    endpoint: str | None = None,
) -> dict[str, Any]:
    """Run the four measurements; return JSON-serialisable figures (see the module doc).

    With `endpoint`, use that proxy (topics are created through its admin API) instead of
    starting `popmq serve`."""
    params = {
        "messages": messages, "body_bytes": body_bytes, "brokers": brokers,
        "queues_per_broker": queues, "master": master, "pull_batch": PULL_BATCH,
        "send_batch": SEND_BATCH, "send_inflight": SEND_INFLIGHT,
    }  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="popmq-bench-spark-") as tmp:
        work = Path(tmp)
        server = LocalServer(work / "server", brokers=brokers)
        if endpoint:
            server.endpoint = endpoint
        else:
            server.start()
        try:
            suffix = f"-{int(time.time())}" if endpoint else ""
            source, sink = SOURCE_TOPIC + suffix, SINK_TOPIC + suffix
            server.create_topic(source, queues)
            server.create_topic(sink, queues)
            proxy_pid = None if endpoint else server.pid
            live.phase("send")
            send_s = await _send_all(server.endpoint, source, messages, body_bytes)
            cpu = _cpu(proxy_pid)
            live.phase("raw pull")
            pulled, pull_s = await _pull_all(server.endpoint, source)
            raw_cpu = _cpu(proxy_pid) - cpu
            live.phase("Spark read and write")
            spark = await asyncio.to_thread(_spark_session, master)
            try:
                spark_figures = await asyncio.to_thread(
                    _spark_runs, spark, server.endpoint, work, source, sink, proxy_pid
                )
                # Again with Spark's JVM up and idle: the machine is shared, so the raw rate
                # is the mean of one measurement before and one after the Spark runs.
                pulled_after, pull_after_s = await _pull_all(server.endpoint, source)
            finally:
                await asyncio.to_thread(spark.stop)
        finally:
            if not endpoint:
                server.stop()
    raw_pull_before, raw_pull_after = pulled / pull_s, pulled_after / pull_after_s
    raw_pull = (raw_pull_before + raw_pull_after) / 2
    raw_send = messages / send_s
    spark_read = spark_figures["read_rows"] / spark_figures["read_s"]
    spark_write = messages / spark_figures["write_s"]
    return {
        "params": params,
        "results": {
            "raw_pull_msgs_per_s": round(raw_pull),
            "raw_pull_before_msgs_per_s": round(raw_pull_before),
            "raw_pull_after_msgs_per_s": round(raw_pull_after),
            # Proxy CPU seconds per 10,000 messages read: the proxy's own cost of a read.
            "proxy_cpu_s_per_10k_raw_pull": _per_10k(raw_cpu, pulled),
            "proxy_cpu_s_per_10k_spark_read": _per_10k(
                spark_figures["read_proxy_cpu_s"], spark_figures["read_rows"]
            ),
            "raw_send_msgs_per_s": round(raw_send),
            "spark_read_msgs_per_s": round(spark_read),
            "spark_write_msgs_per_s": round(spark_write),
            "spark_read_rows": spark_figures["read_rows"],
            "raw_pulled": pulled,
            "spark_read_s": round(spark_figures["read_s"], 3),
            "spark_write_s": round(spark_figures["write_s"], 3),
        },
        "read_vs_raw_pull": round(spark_read / raw_pull, 3),
        "write_vs_raw_send": round(spark_write / raw_send, 3),
        "goal_met": spark_read >= raw_pull / 2,
    }


def format_table(result: dict[str, Any]) -> str:
    p, r = result["params"], result["results"]
    rows = [
        ["path", "msg/s", "vs raw"],
        ["raw PullMessage (all queues at once)", str(r["raw_pull_msgs_per_s"]), "1.00"],
        ["Spark read -> Parquet", str(r["spark_read_msgs_per_s"]),
         f"{result['read_vs_raw_pull']:.2f}"],
        ["raw SendMessage (64/request, 8 in flight)", str(r["raw_send_msgs_per_s"]), "1.00"],
        ["Spark DataFrame -> write", str(r["spark_write_msgs_per_s"]),
         f"{result['write_vs_raw_send']:.2f}"],
    ]  # fmt: skip
    lines = [
        f"{p['messages']} messages x {p['body_bytes']} B; {p['brokers']} brokers x "
        f"{p['queues_per_broker']} queues; Spark {p['master']}",
        "",
    ]
    lines += grid(rows)
    verdict = "met" if result["goal_met"] else "NOT met"
    lines += ["", f"goal (Spark read >= 1/2 raw pull): {verdict}"]
    return "\n".join(lines)


if __name__ == "__main__":  # python -m popmq.bench.spark [messages]
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 50_000
    print(format_table(asyncio.run(bench_spark(messages=count))))
