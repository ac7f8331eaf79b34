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

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from pyspark.sql import DataFrame, Row

from popmq.client import Client
from popmq.client.security import ClientSecurity

ACK_CHUNK = 256
_ACK_COLUMNS = ("topic", "message_id", "receipt_handle")


@dataclass(frozen=True)
class AckReport:
    acked: int
    failed: int  # handles that no longer worked: those messages are (or will be) redelivered


def _ack_partition(
    endpoint: str, group: str, timeout_s: float, security: ClientSecurity | None = None
) -> Callable[[Iterable[Row]], Iterator[tuple[int, int]]]:
    def run(rows: Iterable[Row]) -> Iterator[tuple[int, int]]:
        acked = failed = 0
        with Client(endpoint, timeout_s, security=security) as client:
            pending: dict[str, list[tuple[str, str]]] = {}

            def flush(topic: str) -> None:
                nonlocal acked, failed
                outcomes = client.ack(group, topic, pending.pop(topic))
                ok = sum(1 for o in outcomes if o.ok)
                acked += ok
                failed += len(outcomes) - ok

            for topic, message_id, handle in rows:
                entries = pending.setdefault(topic, [])
                entries.append((message_id, handle))
                if len(entries) >= ACK_CHUNK:
                    flush(topic)
            for topic in list(pending):
                flush(topic)
        yield (acked, failed)

    return run


def ack_messages(
    df: DataFrame,
    endpoint: str,
    group: str,
    timeout_ms: int = 10_000,
    security: ClientSecurity | None = None,
) -> AckReport:
    """Ack every row of a pop-mode DataFrame (needs columns topic, message_id, receipt_handle).
    ``security``: AK/SK and TLS for a secured proxy (popmq.client.security.ClientSecurity).

    Runs on the executors. Compute the DataFrame once before (checkpoint it): acking a
    recomputed pop DataFrame would pop, and ack, other messages."""
    missing = [c for c in _ACK_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"popmq: cannot ack: the DataFrame lacks {missing} (read with mode=pop)")
    counts = (
        df.select(*_ACK_COLUMNS)
        .rdd.mapPartitions(_ack_partition(endpoint, group, timeout_ms / 1000, security))
        .collect()
    )
    return AckReport(sum(a for a, _ in counts), sum(f for _, f in counts))


def pop_foreach_batch(
    process: Callable[[DataFrame, int], None],
    endpoint: str,
    group: str,
    timeout_ms: int = 10_000,
    on_acked: Callable[[int, AckReport], None] | None = None,
    security: ClientSecurity | None = None,
) -> Callable[[DataFrame, int], None]:
    """Wraps a foreachBatch function: pop once, run it, then ack what it processed.

    The batch is checkpointed first (localCheckpoint, eager) so `process` and the acks see the
    same popped rows. If `process` raises, nothing is acked and the messages come back after
    the invisible time."""

    def run(batch_df: DataFrame, batch_id: int) -> None:
        frozen = batch_df.localCheckpoint(eager=True)
        try:
            process(frozen, batch_id)
            report = ack_messages(frozen, endpoint, group, timeout_ms, security)
        finally:
            frozen.unpersist()
        if on_acked is not None:
            on_acked(batch_id, report)

    return run
