"""spark.readStream.format("popmq"): offset-based micro-batches, like Spark's Kafka source.

Per-queue offsets live in Spark's checkpoint; the proxy keeps nothing for the stream. A batch
is planned as [previous end, new end) per queue, so a restart replays a failed batch exactly.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from popmq.client import OffsetPolicy, ProxyError, ProxyUnavailable
from popmq.spark import offsets as off
from popmq.spark.options import ReadOptions
from popmq.spark.partitions import PullSettings, QueueRange, plan_ranges
from popmq.spark.range_reader import DataLossError, read_range
from popmq.spark.topology import connect, readable_queues
from popmq.spark.trigger_delay import MinTrigger, min_trigger

log = logging.getLogger(__name__)


class OffsetStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        # Trigger.AvailableNow: the end offsets at query start; nothing past them is read.
        self._target: off.Offsets | None = None
        self._min: MinTrigger | None = min_trigger(options)

    def _latest(self) -> off.Offsets:
        with connect(self.options.connection) as client:
            queues = readable_queues(client, self.options.topic)
            return client.query_offsets(queues, OffsetPolicy.END)

    # -- planning (driver) -----------------------------------------------------------------

    def initialOffset(self) -> dict:
        with connect(self.options.connection) as client:
            queues = readable_queues(client, self.options.topic)
            start = off.resolve(client, queues, self.options.starting, "startingOffsets", "latest")
        return off.to_spark(start)

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_messages_per_trigger
        return ReadMaxRows(limit) if limit else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._latest()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = off.from_spark(start)
        latest = self._latest()
        if self._target is not None:
            # Queues born after the AvailableNow target are left for the next run.
            latest = {k: min(v, self._target.get(k, begin.get(k, 0))) for k, v in latest.items()}
        for key in sorted(latest):
            if key in begin and latest[key] < begin[key]:
                self._queue_went_back(key, begin[key], latest[key])
        if self._min is not None and self._target is None and self._min.hold(begin, latest):
            return start  # minOffsetsPerTrigger: wait for more (AvailableNow never waits)
        if isinstance(limit, ReadMaxRows):
            latest = off.cap_total(begin, latest, limit.max_rows)
        merged = {**begin, **latest}
        return off.to_spark(merged)

    def _queue_went_back(self, key: off.QueueKey, was: int, now: int) -> None:
        message = (
            f"popmq: queue {off.describe(key)} of topic {self.options.topic} now ends at {now}, "
            f"before the stream's offset {was}: was the topic deleted and recreated?"
        )
        if self.options.fail_on_data_loss:
            raise DataLossError(message + " Set failOnDataLoss=false to go on from its end.")
        log.warning("%s Going on from %d.", message, now)

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        begin, stop = off.from_spark(start), off.from_spark(end)
        new_queues = frozenset(k for k in stop if k not in begin)
        return plan_ranges(
            PullSettings.of(self.options),
            begin,
            stop,
            self.options.max_messages_per_partition,
            new_queues,
        )

    def commit(self, end: dict) -> None:
        """With option 'group', record progress there so lag shows in the group's stats.

        Informational only: the checkpoint is the truth, and this arrives one batch late."""
        group = self.options.group
        if not group:
            return
        done = off.from_spark(end)
        try:
            with connect(self.options.connection) as client:
                for queue in readable_queues(client, self.options.topic):
                    if queue.key in done:
                        client.update_offset(group, queue, done[queue.key])
        except (ProxyError, ProxyUnavailable, ConnectionError) as error:
            log.warning("could not record offsets for group %s: %s", group, error)

    # -- reading (executors) -------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, QueueRange)
        return read_range(partition)
