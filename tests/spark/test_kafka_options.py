"""Spark's Kafka source option names on format("popmq"), in the suite's SparkSession (which
never calls register: PySpark found the source by itself)."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest

from popmq.spark.options import OptionError, parse_read_options

from .helpers import end_offsets, produce, read_everything
from .queries import run_to_end

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _bodies(rows) -> list[str]:  # type: ignore[no-untyped-def]
    return sorted(row.body.decode() for row in rows)


def _stream_batches(spark, tmp_path: Path, **options: str) -> list[list[str]]:  # type: ignore[no-untyped-def]
    batches: dict[int, list[str]] = {}
    run_to_end(
        lambda: spark.readStream.format("popmq").options(**options).load()
        .writeStream.foreachBatch(
            lambda df, batch_id: batches.__setitem__(batch_id, _bodies(df.collect()))
        )
        .option("checkpointLocation", str(tmp_path / f"cp-{uuid.uuid4().hex[:6]}"))
        .trigger(availableNow=True).start(),
        None,
    )  # fmt: skip
    return [batches[key] for key in sorted(batches) if batches[key]]


def test_subscribe_reads_a_comma_list_of_topics(spark, endpoint: str, new_topic) -> None:  # type: ignore[no-untyped-def]
    first, second, other = new_topic(), new_topic(), new_topic()
    produce(endpoint, first, 4, prefix="a")
    produce(endpoint, second, 3, prefix="b")
    produce(endpoint, other, 2, prefix="c")
    df = (
        spark.read.format("popmq").option("endpoint", endpoint)
        .option("subscribe", f"{first}, {second}").load()
    )  # fmt: skip
    rows = df.select("topic", "body").collect()
    assert _bodies(rows) == sorted([f"a-{i}" for i in range(4)] + [f"b-{i}" for i in range(3)])
    assert {r.topic for r in rows} == {first, second}


def test_subscribe_pattern_streams_matching_topics_capped_by_max_offsets_per_trigger(
    spark, endpoint: str, popmq_server, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    prefix = f"pat{uuid.uuid4().hex[:6]}"
    for name in ("x", "y", "skip"):
        popmq_server.create_topic(f"{prefix}-{name}", queues=2)
    produce(endpoint, f"{prefix}-x", 6, prefix="x")
    produce(endpoint, f"{prefix}-y", 5, prefix="y")
    produce(endpoint, f"{prefix}-skip", 3, prefix="s")
    batches = _stream_batches(
        spark, tmp_path, endpoint=endpoint, subscribePattern=f"{prefix}-(x|y)",
        startingOffsets="earliest", maxOffsetsPerTrigger="4",
    )  # fmt: skip
    seen = [body for batch in batches for body in batch]
    assert sorted(seen) == sorted([f"x-{i}" for i in range(6)] + [f"y-{i}" for i in range(5)])
    assert len(seen) == len(set(seen))  # each message once
    assert all(len(batch) <= 4 for batch in batches) and len(batches) >= 3


def test_starting_timestamp_and_offsets_by_timestamp(
    spark, endpoint: str, topic: str, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    produce(endpoint, topic, 6, prefix="old")
    old_last = max(m.store_timestamp_ms for m in read_everything(endpoint, topic))
    while int(time.time() * 1000) <= old_last + 5:  # the next store time is strictly later
        time.sleep(0.01)
    produce(endpoint, topic, 5, prefix="new")
    new_first = min(
        m.store_timestamp_ms
        for m in read_everything(endpoint, topic)
        if m.body.decode().startswith("new")
    )
    assert new_first > old_last
    new = [f"new-{i}" for i in range(5)]

    batches = _stream_batches(
        spark, tmp_path, endpoint=endpoint, topic=topic, startingTimestamp=str(new_first)
    )
    assert sorted(b for batch in batches for b in batch) == new

    by_queue: dict[str, dict[str, int]] = {}
    for broker, queue_id in end_offsets(endpoint, topic):
        by_queue.setdefault(broker, {})[str(queue_id)] = new_first
    df = (
        spark.read.format("popmq").option("endpoint", endpoint).option("topic", topic)
        .option("startingOffsetsByTimestamp", json.dumps(by_queue)).load()
    )  # fmt: skip
    assert _bodies(df.select("body").collect()) == new


def test_option_conflicts_are_clear_errors(spark, endpoint: str, topic: str) -> None:  # type: ignore[no-untyped-def]
    def load(**options: str):  # type: ignore[no-untyped-def]
        return spark.read.format("popmq").option("endpoint", endpoint).options(**options).load()

    with pytest.raises(Exception, match="exactly one of 'topic'"):
        load(topic=topic, subscribe=topic).collect()
    with pytest.raises(Exception, match="subscribePattern"):
        load(subscribePattern="(unclosed").collect()
    with pytest.raises(OptionError, match="maxOffsetsPerTrigger=5 disagree"):
        raw = {"maxMessagesPerTrigger": "4", "maxOffsetsPerTrigger": "5"}
        parse_read_options({"endpoint": endpoint, "topic": topic, **raw}, streaming=True)
    alias = {"endpoint": endpoint, "topic": topic, "maxOffsetsPerTrigger": "7"}
    assert parse_read_options(alias, streaming=True).max_messages_per_trigger == 7
    with pytest.raises(Exception, match=r"startingTimestamp.*epoch milliseconds"):
        load(topic=topic, startingTimestamp="yesterday").collect()


def test_min_offsets_per_trigger_waits_for_enough_messages_or_the_delay(
    endpoint: str, topic: str
) -> None:
    """The driver-side reader, on a real server, with a hand-moved clock."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from popmq.spark.stream_reader import OffsetStreamReader

    raw = {"endpoint": endpoint, "topic": topic, "startingOffsets": "earliest",
           "minOffsetsPerTrigger": "5", "maxTriggerDelay": "1h"}  # fmt: skip
    reader = OffsetStreamReader(parse_read_options(raw, streaming=True))
    now = [1000.0]
    assert reader._min is not None
    reader._min.clock = lambda: now[0]

    def total(offsets: dict) -> int:
        return sum(o for queues in offsets.values() for o in queues.values())

    start = reader.initialOffset()
    produce(endpoint, topic, 2, prefix="a")
    first = reader.latestOffset(start, ReadAllAvailable())
    assert total(first) == 2  # the first trigger never waits (as in Kafka)
    produce(endpoint, topic, 3, prefix="b")
    assert reader.latestOffset(first, ReadAllAvailable()) == first  # 3 < 5: no batch
    produce(endpoint, topic, 2, prefix="c")
    second = reader.latestOffset(first, ReadAllAvailable())
    assert total(second) == 7  # 5 new: go
    produce(endpoint, topic, 1, prefix="d")
    assert reader.latestOffset(second, ReadAllAvailable()) == second
    now[0] += 3600  # maxTriggerDelay passed: whatever is there goes
    assert total(reader.latestOffset(second, ReadAllAvailable())) == 8


def test_trigger_option_errors(endpoint: str, topic: str) -> None:
    base = {"endpoint": endpoint, "topic": topic}
    parsed = parse_read_options(
        {**base, "minOffsetsPerTrigger": "2", "maxTriggerDelay": "90s"}, True
    )
    assert (parsed.min_messages_per_trigger, parsed.max_trigger_delay_ms) == (2, 90_000)
    with pytest.raises(OptionError, match="maxTriggerDelay"):
        parse_read_options({**base, "minOffsetsPerTrigger": "2", "maxTriggerDelay": "soon"}, True)
    with pytest.raises(OptionError, match="for streams"):
        parse_read_options({**base, "minOffsetsPerTrigger": "2"}, streaming=False)
    with pytest.raises(OptionError, match="above maxOffsetsPerTrigger"):
        parse_read_options({**base, "minOffsetsPerTrigger": "9", "maxOffsetsPerTrigger": "3"}, True)
