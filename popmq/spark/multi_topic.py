"""Reading several topics at once: Kafka-style `subscribe=a,b` and `subscribePattern`.

Each topic is read by the one-topic reader it would have on its own; these readers only fan
out and merge. Stream offsets are kept per topic, {"topic": {"broker": {"queue": offset}}},
and maxMessagesPerTrigger is shared across every queue of every topic.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import replace

import grpc
import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from popmq.broker.contract.errors import Code
from popmq.pb.admin.v1 import admin_pb2, admin_pb2_grpc
from popmq.spark import offsets as off
from popmq.spark.batch_reader import BatchReader
from popmq.spark.options import Connection, ReadOptions
from popmq.spark.partitions import QueueRange
from popmq.spark.range_reader import read_range
from popmq.spark.stream_reader import OffsetStreamReader
from popmq.spark.topology import TopicNotFoundError
from popmq.spark.trigger_delay import min_trigger

TopicOffsets = dict[str, dict[str, dict[str, int]]]


def list_topics(connection: Connection) -> list[str]:
    """The proxy's (non-system) topics, through its admin API."""
    with grpc.insecure_channel(connection.endpoint) as channel:
        stub = admin_pb2_grpc.AdminServiceStub(channel)
        try:
            response = stub.ListTopics(
                admin_pb2.ListTopicsRequest(), timeout=connection.timeout_ms / 1000
            )
        except grpc.RpcError as error:
            raise ConnectionError(
                f"popmq: cannot list topics at {connection.endpoint} for subscribePattern: "
                f"{error.code().name} {error.details()}"
            ) from None
    if response.status.code != Code.OK:
        raise ConnectionError(f"popmq: ListTopics refused: {response.status.message}")
    return sorted(topic.name for topic in response.topics)


def resolve_topics(options: ReadOptions) -> list[str]:
    """The topics to read: the subscribe list, or the topics matching the pattern now."""
    if options.topic_pattern is None:
        return list(options.topics)
    pattern = re.compile(options.topic_pattern)
    matched = [name for name in list_topics(options.connection) if pattern.fullmatch(name)]
    if not matched:
        raise TopicNotFoundError(
            f"popmq: no topic at {options.connection.endpoint} matches subscribePattern="
            f"{options.topic_pattern!r}"
        )
    return matched


def one_topic(options: ReadOptions, topic: str) -> ReadOptions:
    # The fan-out reader applies the trigger minimum to all topics together.
    return replace(
        options, topic=topic, topics=(topic,), topic_pattern=None, min_messages_per_trigger=None
    )


class MultiTopicBatchReader(DataSourceReader):
    def __init__(self, options: ReadOptions) -> None:
        self.readers = [BatchReader(one_topic(options, t)) for t in resolve_topics(options)]

    def partitions(self) -> Sequence[InputPartition]:
        return [part for reader in self.readers for part in reader.partitions()]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, QueueRange)  # each range names its own topic
        return read_range(partition)


class MultiTopicStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Topics are resolved when the query starts (a pattern is not re-evaluated while it
    runs); a topic missing from a checkpoint's offsets is read from its first offsets."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self.readers = {
            t: OffsetStreamReader(one_topic(options, t)) for t in resolve_topics(options)
        }
        self._min = min_trigger(options)
        self._available_now = False

    def initialOffset(self) -> dict:
        return {topic: reader.initialOffset() for topic, reader in self.readers.items()}

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_messages_per_trigger
        return ReadMaxRows(limit) if limit else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = True
        for reader in self.readers.values():
            reader.prepareForTriggerAvailableNow()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        latest = {
            topic: reader.latestOffset(start.get(topic, {}), ReadAllAvailable())
            for topic, reader in self.readers.items()
        }
        begin = _flatten({t: start.get(t, {}) for t in self.readers})
        waiting = self._min is not None and not self._available_now
        if waiting and self._min.hold(begin, _flatten(latest)):  # type: ignore[union-attr]
            return start
        if not isinstance(limit, ReadMaxRows):
            return {**start, **latest}
        capped = off.cap_total(begin, _flatten(latest), limit.max_rows)
        return {**start, **_unflatten(capped)}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        return [
            part
            for topic, reader in self.readers.items()
            if topic in end
            for part in reader.partitions(start.get(topic, {}), end[topic])
        ]

    def commit(self, end: dict) -> None:
        for topic, reader in self.readers.items():
            if topic in end:
                reader.commit(end[topic])

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, QueueRange)
        return read_range(partition)


def _flatten(per_topic: dict) -> dict[tuple[str, str, int], int]:
    return {
        (topic, broker, queue_id): offset
        for topic, offsets in per_topic.items()
        for (broker, queue_id), offset in off.from_spark(offsets).items()
    }


def _unflatten(flat: dict[tuple[str, str, int], int]) -> TopicOffsets:
    grouped: dict[str, dict[tuple[str, int], int]] = {}
    for (topic, broker, queue_id), offset in flat.items():
        grouped.setdefault(topic, {})[(broker, queue_id)] = offset
    return {topic: off.to_spark(offsets) for topic, offsets in sorted(grouped.items())}
