"""The connector's pure parts: options, offsets, planning, Arrow conversion (no Spark run)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from popmq.client import ReceivedMessage
from popmq.spark.arrow_rows import batch_to_messages, messages_to_batch
from popmq.spark.offsets import cap_total, from_spark, to_spark
from popmq.spark.options import (
    Connection,
    OptionError,
    parse_offset_spec,
    parse_read_options,
    parse_write_options,
)
from popmq.spark.partitions import PullSettings, plan_ranges


def test_offset_specs() -> None:
    assert parse_offset_spec("s", "EARLIEST").kind == "earliest"
    assert parse_offset_spec("s", "timestamp:1700000000000").timestamp_ms == 1_700_000_000_000
    assert parse_offset_spec("s", "2023-11-14T22:13:20Z").timestamp_ms == 1_700_000_000_000
    spec = parse_offset_spec("s", '{"b": {"1": 5, "0": -2}}')
    assert spec.queue_offsets() == {("b", 0): -2, ("b", 1): 5}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"b": {"0": 1', "not valid JSON"),
        ('{"b": 3}', "must be an object of queue id"),
        ('{"b": {"x": 3}}', "queue id 'x'"),
        ('{"b": {"0": -3}}', "must be an integer >= 0"),
        ('{"b": {"0": true}}', "must be an integer >= 0"),
        ("{}", "non-empty JSON object"),
        ("yesterday", "is not understood"),
        ("timestamp:abc", "epoch milliseconds"),
    ],
)
def test_bad_offset_specs(text: str, message: str) -> None:
    with pytest.raises(OptionError, match=message):
        parse_offset_spec("startingOffsets", text)


def test_read_options_defaults_and_errors() -> None:
    options = parse_read_options({"endpoint": "h:1", "topic": "t"}, streaming=True)
    assert options.starting.kind == "latest" and options.mode == "offset"
    assert parse_read_options({"endpoint": "h:1", "topic": "t"}, False).starting.kind == "earliest"
    with pytest.raises(OptionError, match="option 'topic' is required"):
        parse_read_options({"endpoint": "h:1"}, False)
    with pytest.raises(OptionError, match="expected HOST:PORT"):
        parse_read_options({"endpoint": "nowhere", "topic": "t"}, False)
    with pytest.raises(OptionError, match="endingOffsets is for batch reads"):
        parse_read_options({"endpoint": "h:1", "topic": "t", "endingOffsets": "latest"}, True)
    with pytest.raises(OptionError, match="'maxMessagesPerTrigger'=0 must be >= 1"):
        parse_read_options({"endpoint": "h:1", "topic": "t", "maxMessagesPerTrigger": "0"}, True)
    with pytest.raises(OptionError, match="must be true or false"):
        parse_read_options({"endpoint": "h:1", "topic": "t", "failOnDataLoss": "no"}, True)


def test_write_options_need_a_topic_or_a_topic_column() -> None:
    with pytest.raises(OptionError, match="option 'topic' is required"):
        parse_write_options({"endpoint": "h:1"}, has_topic_column=False)
    assert parse_write_options({"endpoint": "h:1"}, has_topic_column=True).topic == ""
    with pytest.raises(OptionError, match="unknown option"):
        parse_write_options({"endpoint": "h:1", "topic": "t", "startingOffsets": "x"}, False)


def test_spark_offsets_round_trip() -> None:
    offsets = {("b", 1): 7, ("a", 0): 3, ("b", 0): 0}
    assert to_spark(offsets) == {"a": {"0": 3}, "b": {"0": 0, "1": 7}}
    assert from_spark(to_spark(offsets)) == offsets


def test_cap_total_shares_the_limit_by_backlog() -> None:
    start = {("a", 0): 0, ("a", 1): 10, ("b", 0): 5}
    latest = {("a", 0): 90, ("a", 1): 20, ("b", 0): 5, ("b", 1): 4}  # b/1 is new
    capped = cap_total(start, latest, 10)
    moved = {k: capped[k] - start.get(k, 0) for k in latest}
    assert sum(moved.values()) == 10
    assert moved[("a", 0)] > moved[("a", 1)] and moved[("b", 0)] == 0
    assert all(capped[k] <= latest[k] for k in latest)
    assert cap_total(start, latest, 1000) == latest
    # Tiny limits still move: the remainder goes to the biggest backlog.
    assert sum(cap_total(start, latest, 1)[k] - start.get(k, 0) for k in latest) == 1


def test_plan_ranges_splits_and_skips_empty_queues() -> None:
    settings = PullSettings(Connection("h:1"), "t", 32, "*", True, "")
    ranges = plan_ranges(
        settings,
        {("a", 0): 0, ("a", 1): 5},
        {("a", 0): 25, ("a", 1): 5, ("b", 0): 3},
        max_per_partition=10,
        new_queues=frozenset({("b", 0)}),
    )
    assert [(r.broker, r.queue_id, r.start, r.end, r.from_earliest) for r in ranges] == [
        ("a", 0, 0, 10, False),
        ("a", 0, 10, 20, False),
        ("a", 0, 20, 25, False),
        ("b", 0, 0, 3, True),
    ]


def test_arrow_round_trip() -> None:
    message = ReceivedMessage(
        "t", "b", 1, 9, "id", b"\x00x", tag="", keys=["k"], properties={"p": "v"},
        born_timestamp_ms=1_700_000_000_123, store_timestamp_ms=0, receipt_handle="h",
    )  # fmt: skip
    row = messages_to_batch([message], pop=True).to_pylist()[0]
    assert row["tag"] is None and row["store_timestamp"] is None and row["receipt_handle"] == "h"
    assert row["born_timestamp"].timestamp() == 1_700_000_000.123
    assert row["properties"] == [("p", "v")]

    batch = pa.RecordBatch.from_pylist(
        [{"body": "text", "keys": "one", "delivery_timestamp": 1_700_000_000_000_456}],
        schema=pa.schema(
            [("body", pa.string()), ("keys", pa.string()),
             ("delivery_timestamp", pa.timestamp("us", tz="UTC"))]
        ),
    )  # fmt: skip
    (out,) = batch_to_messages(batch, "t")
    assert (out.body, out.keys, out.delivery_timestamp_ms) == (b"text", ["one"], 1_700_000_000_000)
    with pytest.raises(ValueError, match="body is null"):
        batch_to_messages(pa.RecordBatch.from_pylist([{"body": None, "x": 1}]), "t")


def test_connection_security_options() -> None:
    import pickle

    plain = parse_read_options({"endpoint": "h:1", "topic": "t"}, False).connection
    assert plain.security is None
    options = parse_write_options(
        {"endpoint": "h:1", "topic": "t", "accessKey": "app", "secretKey": "s3cret",
         "tlsCaFile": "/etc/ca.pem"},
        False,
    )  # fmt: skip
    security = options.connection.security
    assert security is not None and security.tls and str(security.ca_file) == "/etc/ca.pem"
    assert "s3cret" not in repr(options)  # never in a repr (Spark logs plans)
    assert pickle.loads(pickle.dumps(options.connection)) == options.connection  # to executors
    with pytest.raises(OptionError, match="accessKey"):
        parse_write_options({"endpoint": "h:1", "topic": "t", "accessKey": "app"}, False)
    mtls = parse_read_options(
        {"endpoint": "h:1", "topic": "t", "tlsCertFile": "/c.pem", "tlsKeyFile": "/k.pem"}, False
    ).connection.security
    assert mtls is not None and mtls.tls  # a client certificate implies TLS
    assert (str(mtls.cert_file), str(mtls.key_file)) == ("/c.pem", "/k.pem")
    with pytest.raises(OptionError, match="tlsKeyFile"):
        parse_read_options({"endpoint": "h:1", "topic": "t", "tlsCertFile": "/c.pem"}, False)


def test_pyspark_older_than_4_2_is_refused_with_its_version() -> None:
    from popmq.spark.compat import check_pyspark

    check_pyspark("4.2.0")
    check_pyspark("4.3.0")
    with pytest.raises(ImportError, match=r"PySpark >= 4\.2.*this is PySpark 4\.1\.4"):
        check_pyspark("4.1.4")
