"""Bad options fail early with errors that say what to fix."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.spark


def _load(spark, **options: str):  # type: ignore[no-untyped-def]
    reader = spark.read.format("popmq")
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def test_unknown_topic(spark, endpoint: str) -> None:
    with pytest.raises(Exception, match="topic 'no-such-topic' does not exist"):
        _load(spark, endpoint=endpoint, topic="no-such-topic").collect()


def test_bad_offsets_json(spark, endpoint: str, topic: str) -> None:
    with pytest.raises(Exception, match="startingOffsets is not valid JSON"):
        _load(spark, endpoint=endpoint, topic=topic, startingOffsets="{broker-0: 1").collect()
    with pytest.raises(Exception, match="queue\\(s\\) nowhere/0 that the topic does not have"):
        _load(
            spark, endpoint=endpoint, topic=topic, startingOffsets='{"nowhere": {"0": 1}}'
        ).collect()


def test_missing_endpoint(spark, topic: str) -> None:
    with pytest.raises(Exception, match="option 'endpoint' is required"):
        _load(spark, topic=topic).collect()


def test_unreachable_endpoint(spark, topic: str) -> None:
    with pytest.raises(Exception, match=r"cannot reach the proxy at 127\.0\.0\.1:1"):
        _load(spark, endpoint="127.0.0.1:1", topic=topic, requestTimeoutMs="500").collect()


def test_misspelled_option(spark, endpoint: str, topic: str) -> None:
    with pytest.raises(Exception, match="unknown option\\(s\\) startingoffset"):
        _load(spark, endpoint=endpoint, topic=topic, startingOffset="earliest").collect()


def test_write_without_body_or_in_overwrite_mode(spark, endpoint: str, topic: str) -> None:
    df = spark.createDataFrame([("x",)], "payload string")
    with pytest.raises(Exception, match="needs a 'body' column"):
        df.write.format("popmq").mode("append").option("endpoint", endpoint).option(
            "topic", topic
        ).save()
    with pytest.raises(Exception, match="append-only"):
        df.withColumnRenamed("payload", "body").write.format("popmq").mode("overwrite").option(
            "endpoint", endpoint
        ).option("topic", topic).save()


def test_pop_mode_needs_a_group(spark, endpoint: str, topic: str) -> None:
    with pytest.raises(Exception, match="mode=pop needs option 'group'"):
        _load(spark, endpoint=endpoint, topic=topic, mode="pop").collect()
