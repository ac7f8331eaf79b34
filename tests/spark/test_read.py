"""Batch and streaming reads through format("popmq") from a real popmq server."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from .helpers import end_offsets, group_offsets, produce, read_everything
from .queries import run_to_end

pytestmark = pytest.mark.spark


def _reader(spark, endpoint: str, topic: str, **options: str):  # type: ignore[no-untyped-def]
    reader = spark.read.format("popmq").option("endpoint", endpoint).option("topic", topic)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def test_batch_read_returns_exactly_the_known_set(spark, endpoint: str, topic: str) -> None:
    ids = produce(endpoint, topic, 40)
    rows = _reader(spark, endpoint, topic).collect()

    assert sorted(r.message_id for r in rows) == sorted(ids)
    by_body = {r.body: r for r in rows}
    assert set(by_body) == {f"m-{i}".encode() for i in range(40)}
    sample = by_body[b"m-7"]
    assert (sample.topic, sample.tag, sample.keys) == (topic, "odd", ["key-m-7"])
    assert sample.properties == {"n": "7"} and sample.delivery_attempt == 1
    assert sample.store_timestamp >= sample.born_timestamp
    # Offsets are dense per queue and match what the proxy reports as each queue's end.
    per_queue: dict[tuple[str, int], list[int]] = {}
    for row in rows:
        per_queue.setdefault((row.broker, row.queue_id), []).append(row.offset)
    ends = end_offsets(endpoint, topic)
    assert {k: sorted(v) for k, v in per_queue.items()} == {
        k: list(range(n)) for k, n in ends.items() if n
    }


def test_queues_on_several_brokers_are_all_read(spark, endpoint: str, topic: str) -> None:
    produce(endpoint, topic, 24, per_request=3)
    counts = {
        (r.broker, r.queue_id): r["count"]
        for r in _reader(spark, endpoint, topic).groupBy("broker", "queue_id").count().collect()
    }
    assert {broker for broker, _ in counts} == {"broker-0", "broker-1"}
    assert counts == {k: n for k, n in end_offsets(endpoint, topic).items() if n}


def test_batch_read_between_json_offsets(spark, endpoint: str, topic: str) -> None:
    produce(endpoint, topic, 20)
    ends = end_offsets(endpoint, topic)
    (broker, queue_id), end = max(ends.items(), key=lambda item: item[1])
    assert end >= 3
    starting = json.dumps({broker: {str(queue_id): 1}})
    ending_offsets: dict[str, dict[str, int]] = {}
    for b, q in ends:
        ending_offsets.setdefault(b, {})[str(q)] = end - 1 if (b, q) == (broker, queue_id) else 0
    ending = json.dumps(ending_offsets)
    rows = _reader(spark, endpoint, topic, startingOffsets=starting, endingOffsets=ending).collect()
    # Queues left out of startingOffsets start at the earliest; those ending at 0 give nothing.
    assert sorted((r.broker, r.queue_id, r.offset) for r in rows) == [
        (broker, queue_id, o) for o in range(1, end - 1)
    ]


def test_batch_read_from_a_timestamp(spark, endpoint: str, topic: str) -> None:
    produce(endpoint, topic, 10, prefix="old")
    cut = max(m.store_timestamp_ms for m in read_everything(endpoint, topic)) + 1
    time.sleep(max(0.0, cut / 1000 - time.time()) + 0.005)
    produce(endpoint, topic, 6, prefix="new")
    rows = _reader(spark, endpoint, topic, startingOffsets=f"timestamp:{cut}").collect()
    assert sorted(r.body for r in rows) == sorted(f"new-{i}".encode() for i in range(6))


def test_stream_available_now_then_restart_reads_only_new(
    spark, endpoint: str, topic: str, tmp_path: Path
) -> None:
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")
    group = f"progress-{topic}"

    def run_once() -> list[int]:
        query = run_to_end(
            lambda: (
                spark.readStream.format("popmq")
                .option("endpoint", endpoint)
                .option("topic", topic)
                .option("startingOffsets", "earliest")
                .option("maxMessagesPerTrigger", "12")
                .option("group", group)  # progress recorded there too, for monitoring
                .load()
                .writeStream.format("parquet")
                .option("path", out)
                .option("checkpointLocation", checkpoint)
                .trigger(availableNow=True)
                .start()
            )
        )
        assert query.exception() is None
        return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]

    first_ids = produce(endpoint, topic, 30, prefix="first")
    first_batches = run_once()
    assert sum(first_batches) == 30
    assert max(first_batches) <= 12 and len(first_batches) >= 3  # maxMessagesPerTrigger
    # Spark commits a batch when it plans the next one: the group lags by up to one batch.
    assert 30 - 12 <= sum(group_offsets(endpoint, topic, group).values()) <= 30

    second_ids = produce(endpoint, topic, 17, prefix="second")
    second_batches = run_once()
    assert sum(second_batches) == 17  # the restart resumed from the checkpoint

    stored = spark.read.parquet(out)
    ids = [r.message_id for r in stored.select("message_id").collect()]
    assert sorted(ids) == sorted(first_ids + second_ids)  # each message exactly once


def test_stream_starting_latest_skips_the_backlog(
    spark, endpoint: str, topic: str, tmp_path: Path
) -> None:
    produce(endpoint, topic, 8, prefix="backlog")
    seen: list[bytes] = []
    stream = (
        spark.readStream.format("popmq")
        .option("endpoint", endpoint)
        .option("topic", topic)
        .load()
        .writeStream.foreachBatch(lambda df, _: seen.extend(r.body for r in df.collect()))
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(availableNow=True)
    )
    run_to_end(stream.start, 60)
    assert seen == []
    produce(endpoint, topic, 5, prefix="fresh")
    run_to_end(stream.start, 60)
    assert sorted(seen) == sorted(f"fresh-{i}".encode() for i in range(5))
