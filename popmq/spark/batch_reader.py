"""spark.read.format("popmq"): a bounded read of offset ranges (or one pop, with mode=pop)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from popmq.spark import offsets as off
from popmq.spark.options import OptionError, ReadOptions
from popmq.spark.partitions import PopSlice, PullSettings, QueueRange, plan_ranges
from popmq.spark.pop_reader import plan_pop_slices, read_pop_slice
from popmq.spark.range_reader import read_range
from popmq.spark.topology import connect, readable_queues


class BatchReader(DataSourceReader):
    def __init__(self, options: ReadOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        options = self.options
        if options.mode == "pop":
            return plan_pop_slices(options, options.max_messages)
        with connect(options.connection) as client:
            queues = readable_queues(client, options.topic)
            start = off.resolve(client, queues, options.starting, "startingOffsets", "earliest")
            end = off.resolve(client, queues, options.ending, "endingOffsets", "latest")
        backwards = [k for k in sorted(end) if start[k] > end[k]]
        if backwards:
            key = backwards[0]
            raise OptionError(
                f"startingOffsets ({start[key]}) is after endingOffsets ({end[key]}) for queue "
                f"{off.describe(key)}"
            )
        return plan_ranges(PullSettings.of(options), start, end, options.max_messages_per_partition)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, QueueRange):
            return read_range(partition)
        if isinstance(partition, PopSlice):
            return read_pop_slice(partition)
        raise TypeError(f"popmq: unexpected partition {partition!r}")
