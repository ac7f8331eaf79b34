"""Acking popped messages after their batch is durably written (mode=pop).

Spark's source commit() cannot do it: it runs in the driver's planner, one batch late, with no
receipt handles. So acks travel with the data: the executors ack the handles of the rows they
hold, after the user's write succeeded.

    def write(batch_df, batch_id):
        batch_df.write.mode("append").parquet(out)

    (spark.readStream.format("popmq").option("mode", "pop").option("group", "g") ...
        .load().writeStream
        .foreachBatch(pop_foreach_batch(write, endpoint="127.0.0.1:8081", group="g"))
        .start())

Trade-off: at-least-once. A batch that fails, or takes longer than invisibleTimeMs, comes back
(delivery_attempt + 1); a crash between the write and the acks duplicates that batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql import DataFrame

from popmq.client import Client

ACK_CHUNK = 256
_ACK_COLUMNS = ("topic", "message_id", "receipt_handle")


@dataclass(frozen=True)
class AckReport:
    acked: int
    failed: int  # handles that no longer worked: those messages are (or will be) redelivered


def _ack_partition(
    endpoint: str, group: str, timeout_s: float
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        acked = failed = 0
        with Client(endpoint, timeout_s) as client:
            for batch in batches:
                columns = batch.to_pydict()
                by_topic: dict[str, list[tuple[str, str]]] = {}
                for topic, message_id, handle in zip(
                    *(columns[c] for c in _ACK_COLUMNS), strict=True
                ):
                    by_topic.setdefault(topic, []).append((message_id, handle))
                for topic, entries in by_topic.items():
                    for i in range(0, len(entries), ACK_CHUNK):
                        outcomes = client.ack(group, topic, entries[i : i + ACK_CHUNK])
                        ok = sum(1 for o in outcomes if o.ok)
                        acked += ok
                        failed += len(outcomes) - ok
        yield pa.RecordBatch.from_pydict(
            {"acked": [acked], "failed": [failed]},
            schema=pa.schema([("acked", pa.int64()), ("failed", pa.int64())]),
        )

    return run


def ack_messages(df: DataFrame, endpoint: str, group: str, timeout_ms: int = 10_000) -> AckReport:
    """Ack every row of a pop-mode DataFrame (needs columns topic, message_id, receipt_handle).

    Runs on the executors. Compute the DataFrame once before (checkpoint it): acking a
    recomputed pop DataFrame would pop, and ack, other messages."""
    missing = [c for c in _ACK_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"popmq: cannot ack: the DataFrame lacks {missing} (read with mode=pop)")
    counts = (
        df.select(*_ACK_COLUMNS)
        .mapInArrow(_ack_partition(endpoint, group, timeout_ms / 1000), "acked long, failed long")
        .groupBy()
        .sum("acked", "failed")
        .collect()
    )
    acked, failed = counts[0] if counts and counts[0][0] is not None else (0, 0)
    return AckReport(int(acked), int(failed))


def pop_foreach_batch(
    process: Callable[[DataFrame, int], None],
    endpoint: str,
    group: str,
    timeout_ms: int = 10_000,
    on_acked: Callable[[int, AckReport], None] | None = None,
) -> Callable[[DataFrame, int], None]:
    """Wraps a foreachBatch function: pop once, run it, then ack what it processed.

    The batch is checkpointed first (localCheckpoint, eager) so `process` and the acks see the
    same popped rows. If `process` raises, nothing is acked and the messages come back after
    the invisible time."""

    def run(batch_df: DataFrame, batch_id: int) -> None:
        frozen = batch_df.localCheckpoint(eager=True)
        try:
            process(frozen, batch_id)
            report = ack_messages(frozen, endpoint, group, timeout_ms)
        finally:
            frozen.unpersist()
        if on_acked is not None:
            on_acked(batch_id, report)

    return run
