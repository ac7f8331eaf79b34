"""mode=pop: at-least-once shared consumption, acked only after the batch is written."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from popmq.spark import AckReport, pop_foreach_batch

from .helpers import produce, receive_all
from .queries import run_to_end

pytestmark = pytest.mark.spark

# Long enough that a Spark batch on a loaded 2-core machine is written and acked before its
# messages become visible again (4 s expired mid-batch under load); the checks that wait for the
# invisible time to pass wait this long.
INVISIBLE_MS = 10_000


def _pop_stream(spark, endpoint: str, topic: str, group: str):  # type: ignore[no-untyped-def]
    return (
        spark.readStream.format("popmq")
        .option("endpoint", endpoint)
        .option("topic", topic)
        .option("mode", "pop")
        .option("group", group)
        .option("invisibleTimeMs", str(INVISIBLE_MS))
        .option("popLongPollingMs", "100")
        .load()
    )


def test_everything_is_acked_after_a_good_batch(
    spark, endpoint: str, topic: str, tmp_path: Path
) -> None:
    group = f"g-{uuid.uuid4().hex[:8]}"
    ids = produce(endpoint, topic, 20)
    out = str(tmp_path / "out")
    reports: list[AckReport] = []

    def write(batch_df, batch_id: int) -> None:  # type: ignore[no-untyped-def]
        batch_df.write.mode("append").parquet(out)

    query = run_to_end(
        lambda: (
            _pop_stream(spark, endpoint, topic, group)
            .writeStream.foreachBatch(
                pop_foreach_batch(write, endpoint, group, on_acked=lambda _, r: reports.append(r))
            )
            .option("checkpointLocation", str(tmp_path / "cp"))
            .trigger(availableNow=True)
            .start()
        )
    )
    assert query.exception() is None

    stored = spark.read.parquet(out).collect()
    assert sorted(r.message_id for r in stored) == sorted(ids)
    assert all(r.receipt_handle and r.delivery_attempt == 1 for r in stored)
    assert sum(r.acked for r in reports) == 20 and sum(r.failed for r in reports) == 0
    # Acked: nothing comes back for the group, even after the invisible time is over.
    assert receive_all(endpoint, topic, group, wait_s=INVISIBLE_MS / 1000 + 1.0) == []


def test_messages_come_back_after_a_failed_batch(
    spark, endpoint: str, topic: str, tmp_path: Path
) -> None:
    group = f"g-{uuid.uuid4().hex[:8]}"
    ids = produce(endpoint, topic, 10)
    popped: list[str] = []

    def failing_sink(batch_df, batch_id: int) -> None:  # type: ignore[no-untyped-def]
        popped.extend(r.message_id for r in batch_df.select("message_id").collect())
        raise RuntimeError("the sink is down")

    stream = (
        _pop_stream(spark, endpoint, topic, group)
        .writeStream.foreachBatch(pop_foreach_batch(failing_sink, endpoint, group))
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(availableNow=True)
    )
    with pytest.raises(Exception, match="the sink is down"):
        run_to_end(stream.start)
    assert sorted(popped) == sorted(ids)

    # Not acked: once the invisible time is over, the group gets them all again.
    again = receive_all(endpoint, topic, group, wait_s=INVISIBLE_MS / 1000 + 10, expected=len(ids))
    assert sorted(m.message_id for m in again) == sorted(ids)
    assert {m.delivery_attempt for m in again} == {2}


def _pop_batch(spark, endpoint: str, topic: str, group: str, **options: str):  # type: ignore[no-untyped-def]
    """One batch read in pop mode, computed once (what gets acked is what was read)."""
    reader = (
        spark.read.format("popmq")
        .option("endpoint", endpoint)
        .option("topic", topic)
        .option("mode", "pop")
        .option("group", group)
        .option("popLongPollingMs", "100")
    )
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load().localCheckpoint(eager=True)


def test_batch_pop_read_and_ack(spark, endpoint: str, topic: str) -> None:
    from popmq.spark import ack_messages

    group = f"g-{uuid.uuid4().hex[:8]}"
    ids = produce(endpoint, topic, 12)
    df = _pop_batch(spark, endpoint, topic, group)
    assert sorted(r.message_id for r in df.collect()) == sorted(ids)
    report = ack_messages(df, endpoint, group)
    assert (report.acked, report.failed) == (12, 0)


def test_a_batch_acked_after_its_invisible_time_counts_its_handles_failed(
    spark, endpoint: str, topic: str
) -> None:
    # Every handle of the batch expired (a slow batch, or a loaded machine: a CI run failed its
    # query this way): the acks report them failed, and the messages come back; nothing raises.
    from popmq.spark import ack_messages

    group = f"g-{uuid.uuid4().hex[:8]}"
    ids = produce(endpoint, topic, 6)
    df = _pop_batch(spark, endpoint, topic, group, invisibleTimeMs="1000")
    assert sorted(r.message_id for r in df.collect()) == sorted(ids)
    time.sleep(2.0)  # past the invisible time: waiting longer only makes them more expired
    report = ack_messages(df, endpoint, group)
    assert (report.acked, report.failed) == (0, 6)
    again = receive_all(endpoint, topic, group, wait_s=10, expected=len(ids))
    assert sorted(m.message_id for m in again) == sorted(ids)
