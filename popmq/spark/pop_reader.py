"""mode=pop: messages popped for a consumer group, invisible until acked or timed out.

A pop is not replayable: reading the same partition twice pops different messages. So a pop
batch must be computed once (pop_ack.pop_foreach_batch checkpoints it) and acked after its
output is durable; what is never acked comes back after invisibleTimeMs (at-least-once).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition

from popmq.client import Client, QueueRef
from popmq.spark.arrow_rows import BatchBuffer
from popmq.spark.options import ReadOptions
from popmq.spark.partitions import PopSettings, PopSlice
from popmq.spark.topology import brokers_of, connect, readable_queues

MAX_RECEIVE_BATCH = 32  # the proxy's max batch per ReceiveMessage


def plan_pop_slices(options: ReadOptions, total: int) -> list[PopSlice]:
    """Split `total` between pop tasks: one per broker unless popPartitions says otherwise."""
    with connect(options.connection) as client:
        entries = brokers_of(readable_queues(client, options.topic))
    count = max(1, options.pop_partitions or len(entries))
    settings = PopSettings(
        connection=options.connection,
        topic=options.topic,
        group=options.group,
        invisible_time_ms=options.invisible_time_ms,
        long_polling_ms=options.pop_long_polling_ms,
        filter_expression=options.filter_expression,
    )
    slices = []
    for index in range(count):
        share = total // count + (1 if index < total % count else 0)
        if share > 0:
            entry = entries[index % len(entries)]
            slices.append(PopSlice(settings, entry.broker, entry.queue_id, share))
    return slices


def read_pop_slice(part: PopSlice) -> Iterator[pa.RecordBatch]:
    settings = part.settings
    queue = QueueRef(settings.topic, part.broker, part.queue_id, settings.connection.endpoint)
    buffer = BatchBuffer(pop=True)
    remaining = part.max_messages
    timeout_s = settings.connection.timeout_ms / 1000
    with Client(
        settings.connection.endpoint, timeout_s, security=settings.connection.security
    ) as client:
        while remaining > 0:
            wanted = min(MAX_RECEIVE_BATCH, remaining)
            got = client.receive(
                settings.group,
                queue,
                batch_size=wanted,
                invisible_ms=settings.invisible_time_ms,
                long_polling_ms=settings.long_polling_ms,
                filter_expression=settings.filter_expression,
            )
            yield from buffer.add(got)
            remaining -= len(got)
            # A short answer means the backlog is drained: asking again would only long-poll.
            if len(got) < wanted:
                break
    if len(buffer):
        yield buffer.flush()


class PopStreamReader(DataSourceStreamReader):
    """Every micro-batch pops up to maxMessagesPerTrigger messages.

    Offsets only count batches ({"pop_batch": n}); they make Spark plan one batch per trigger.
    Trigger.AvailableNow runs one batch (Spark's fallback for sources without a fixed end).
    """

    def __init__(self, options: ReadOptions) -> None:
        self.options = options

    def initialOffset(self) -> dict:
        return {"pop_batch": 0}

    def latestOffset(self, start: dict, limit: object) -> dict:
        return {"pop_batch": int(start.get("pop_batch", 0)) + 1}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        if end.get("pop_batch") == start.get("pop_batch"):
            return []
        return plan_pop_slices(self.options, self.options.max_messages_per_trigger or 10_000)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, PopSlice)
        return read_pop_slice(partition)

    def commit(self, end: dict) -> None:
        # Acks cannot wait for this: it arrives only when the next batch is planned, and it
        # runs in the driver's planner, far from the receipt handles. See pop_ack.
        return None
