"""df.write / df.writeStream .format("popmq"): every row becomes one message.

Each task converts its Arrow batches to messages and sends them in SendMessage requests of
sendBatchSize messages, up to maxInflight requests at a time (one at a time when rows carry a
message_group, so FIFO order holds). A task's commit message reports what it sent.

Each message gets one extra key, "popmq-write:<write id>:<batch>:<partition>:<row>". The
write id is the streaming query id (stable across restarts) or a fresh id per batch write, the
batch is Spark's micro-batch id ("0" for batch writes). A replayed micro-batch whose input is
recomputed identically (same partitions, same order) carries the same keys, so a consumer
can drop duplicates by key. Sending is at-least-once: a task that fails after some sends and
is retried sends those rows again.
"""

from __future__ import annotations

import logging
import uuid
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from popmq.broker.contract.types import Message
from popmq.client import Client, PendingSend
from popmq.spark.arrow_rows import batch_to_messages
from popmq.spark.options import WriteOptions

log = logging.getLogger(__name__)

KEY_PREFIX = "popmq-write"
# Spark sets these local properties on every task of a micro-batch.
BATCH_ID_PROPERTY = "streaming.sql.batchId"
QUERY_ID_PROPERTY = "sql.streaming.queryId"


@dataclass
class SentReport(WriterCommitMessage):
    partition: int
    messages: int
    requests: int


def write_key(write_id: str, batch_id: str, partition: int, row: int) -> str:
    return f"{KEY_PREFIX}:{write_id}:{batch_id}:{partition}:{row}"


def send_rows(
    options: WriteOptions,
    batches: Iterator[pa.RecordBatch],
    write_id: str,
    batch_id: str,
    ordered: bool,
) -> SentReport:
    context = TaskContext.get()
    partition = context.partitionId() if context is not None else 0
    inflight_limit = 1 if ordered else options.max_inflight
    inflight: deque[PendingSend] = deque()
    row = requests = 0
    timeout_s = options.connection.timeout_ms / 1000
    with Client(
        options.connection.endpoint, timeout_s, security=options.connection.security
    ) as client:

        def start(chunk: list[Message]) -> None:
            nonlocal requests
            while len(inflight) >= inflight_limit:
                inflight.popleft().result()
            inflight.append(client.send_async(chunk))
            requests += 1

        for batch in batches:
            by_topic: dict[str, list[Message]] = {}
            for message in batch_to_messages(batch, options.topic):
                message.keys.append(write_key(write_id, batch_id, partition, row))
                row += 1
                chunk = by_topic.setdefault(message.topic, [])
                chunk.append(message)
                if len(chunk) >= options.send_batch_size:
                    start(by_topic.pop(message.topic))
            for chunk in by_topic.values():
                start(chunk)
        while inflight:
            inflight.popleft().result()
    return SentReport(partition, row, requests)


def _total(messages: list[WriterCommitMessage | None]) -> int:
    return sum(m.messages for m in messages if isinstance(m, SentReport))


class BatchWriter(DataSourceArrowWriter):
    def __init__(self, options: WriteOptions, ordered: bool) -> None:
        self.options = options
        self.ordered = ordered
        # Made on the driver, so retried tasks of this write reuse it.
        self.write_id = uuid.uuid4().hex

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SentReport:
        return send_rows(self.options, iterator, self.write_id, "0", self.ordered)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        log.info("popmq: wrote %d messages to %s", _total(messages), self.options.topic)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        # Sent messages cannot be taken back; their keys let consumers spot them.
        log.warning("popmq: write aborted after %d messages had been sent", _total(messages))


class StreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: WriteOptions, ordered: bool) -> None:
        self.options = options
        self.ordered = ordered

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SentReport:
        context = TaskContext.get()
        query_id = batch_id = None
        if context is not None:
            query_id = context.getLocalProperty(QUERY_ID_PROPERTY)
            batch_id = context.getLocalProperty(BATCH_ID_PROPERTY)
        return send_rows(
            self.options, iterator, query_id or "unknown-query", batch_id or "0", self.ordered
        )

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.info("popmq: batch %d wrote %d messages", batchId, _total(messages))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning("popmq: batch %d aborted after %d messages", batchId, _total(messages))
