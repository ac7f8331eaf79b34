"""Input partitions: everything a freshly unpickled reader on an executor needs.

read() runs in a Python worker that knows nothing but the partition, so each one carries the
connection and read settings alongside its range.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pyspark.sql.datasource import InputPartition

from popmq.spark.offsets import QueueKey
from popmq.spark.options import Connection, ReadOptions


@dataclass(frozen=True)
class PullSettings:
    connection: Connection
    topic: str
    pull_batch_size: int
    filter_expression: str
    fail_on_data_loss: bool
    group: str
    pull_concurrency: int = 8

    @classmethod
    def of(cls, options: ReadOptions) -> PullSettings:
        return cls(
            connection=options.connection,
            topic=options.topic,
            pull_batch_size=options.pull_batch_size,
            filter_expression=options.filter_expression,
            fail_on_data_loss=options.fail_on_data_loss,
            group=options.group,
            pull_concurrency=options.pull_concurrency,
        )


@dataclass
class QueueRange(InputPartition):
    """Offsets [start, end) of one queue. Replaying it reads exactly the same messages."""

    settings: PullSettings
    broker: str
    queue_id: int
    start: int
    end: int
    # The queue appeared after the stream started: its start is "the beginning", so finding
    # the first offsets purged by retention is not data loss.
    from_earliest: bool = False


@dataclass(frozen=True)
class PopSettings:
    connection: Connection
    topic: str
    group: str
    invisible_time_ms: int
    long_polling_ms: int
    filter_expression: str


@dataclass
class PopSlice(InputPartition):
    """Pop up to max_messages for the group, through the route entry of one broker."""

    settings: PopSettings
    broker: str
    queue_id: int
    max_messages: int


def plan_ranges(
    settings: PullSettings,
    start: Mapping[QueueKey, int],
    end: Mapping[QueueKey, int],
    max_per_partition: int,
    new_queues: frozenset[QueueKey] = frozenset(),
) -> list[QueueRange]:
    """One range per queue with something to read, split into pieces of max_per_partition.

    Deterministic in (start, end): Spark replays a batch by planning it again."""
    ranges = []
    for key in sorted(end):
        first, last = start.get(key, 0), end[key]
        position = first
        while position < last:
            stop = min(position + max_per_partition, last)
            ranges.append(QueueRange(settings, key[0], key[1], position, stop, key in new_queues))
            position = stop
    return ranges
