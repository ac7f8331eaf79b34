"""df.write / writeStream .format("popmq"), read back through popmq.client."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from .helpers import produce, read_everything
from .queries import run_to_end

pytestmark = pytest.mark.spark


def test_batch_write_then_read_back(spark, endpoint: str, topic: str) -> None:
    rows = [(f"body-{i}".encode(), f"tag{i % 3}", [f"k{i}"], {"i": str(i)}) for i in range(30)]
    df = spark.createDataFrame(
        rows, "body binary, tag string, keys array<string>, properties map<string,string>"
    ).repartition(3)
    df.write.format("popmq").mode("append").option("endpoint", endpoint).option(
        "topic", topic
    ).option("sendBatchSize", "4").save()

    got = read_everything(endpoint, topic)
    assert sorted(m.body for m in got) == sorted(r[0] for r in rows)
    by_body = {m.body: m for m in got}
    sample = by_body[b"body-4"]
    assert sample.tag == "tag1" and sample.properties == {"i": "4"}
    # The user's key, then the deterministic write key.
    user_key, write_key = sample.keys
    assert user_key == "k4" and write_key.startswith("popmq-write:")
    write_keys = [m.keys[-1] for m in got]
    assert len(set(write_keys)) == 30
    assert len({k.split(":")[1] for k in write_keys}) == 1  # one write id for the whole job


def test_batch_write_strings_topic_column_and_delivery_time(
    spark, endpoint: str, new_topic
) -> None:  # type: ignore[no-untyped-def]
    first, second = new_topic(), new_topic()
    soon = datetime.now(UTC)
    df = spark.createDataFrame(
        [("a", first, soon), ("b", second, soon), ("c", first, None)],
        "body string, topic string, delivery_timestamp timestamp",
    )
    df.write.format("popmq").mode("append").option("endpoint", endpoint).save()
    assert sorted(m.body for m in read_everything(endpoint, first)) == [b"a", b"c"]
    assert [m.body for m in read_everything(endpoint, second)] == [b"b"]


def test_stream_write_then_read_back(spark, endpoint: str, new_topic, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    source, sink = new_topic(), new_topic()
    ids = produce(endpoint, source, 25)
    query = run_to_end(
        lambda: (
            spark.readStream.format("popmq")
            .option("endpoint", endpoint)
            .option("topic", source)
            .option("startingOffsets", "earliest")
            .option("maxMessagesPerTrigger", "10")
            .load()
            .selectExpr("body", "tag", "array(message_id) AS keys", "properties")
            .writeStream.format("popmq")
            .option("endpoint", endpoint)
            .option("topic", sink)
            .option("checkpointLocation", str(tmp_path / "cp"))
            .trigger(availableNow=True)
            .start()
        )
    )
    assert query.exception() is None

    copied = read_everything(endpoint, sink)
    assert sorted(m.keys[0] for m in copied) == sorted(ids)
    assert sorted(m.body for m in copied) == sorted(f"m-{i}".encode() for i in range(25))
    # Write keys name the query and the micro-batch: 10 + 10 + 5 messages in batches 0..2.
    write_keys = [m.keys[-1].split(":") for m in copied]
    assert {k[1] for k in write_keys} == {query.id}
    per_batch: dict[str, int] = {}
    for key in write_keys:
        per_batch[key[2]] = per_batch.get(key[2], 0) + 1
    assert per_batch == {"0": 10, "1": 10, "2": 5}
