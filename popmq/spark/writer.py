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
import os
import uuid
from collections import deque
from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from popmq.broker.contract.types import Message
from popmq.client import Client, PendingSend
from popmq.client.checker import CheckerSession
from popmq.spark.arrow_rows import batch_to_messages
from popmq.spark.exactly_once import (
    Transaction,
    TransactionalReport,
    abort_batch,
    commit_batch,
    decide,
    new_task_token,
    tag_properties,
)
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
) -> SentReport | TransactionalReport:
    context = TaskContext.get()
    partition = context.partitionId() if context is not None else 0
    inflight_limit = 1 if ordered else options.max_inflight
    inflight: deque[PendingSend] = deque()
    transactional = options.commit_log is not None
    task = new_task_token() if transactional else ""
    transactions: list[Transaction] = []
    row = requests = 0
    timeout_s = options.connection.timeout_ms / 1000
    with (
        Client(
            options.connection.endpoint, timeout_s, security=options.connection.security
        ) as client,
        _checker(client, options),
    ):

        def finish_one() -> None:
            receipts = inflight.popleft().result()
            if transactional:
                transactions.extend(
                    (options.topic, r.message_id, r.transaction_id) for r in receipts
                )

        def start(chunk: list[Message]) -> None:
            nonlocal requests
            while len(inflight) >= inflight_limit:
                finish_one()
            inflight.append(client.send_async(chunk, transactional))
            requests += 1

        try:
            for batch in batches:
                by_topic: dict[str, list[Message]] = {}
                for message in batch_to_messages(batch, options.topic):
                    message.keys.append(write_key(write_id, batch_id, partition, row))
                    if options.commit_log is not None:
                        tag_properties(message.properties, options.commit_log, batch_id, task)
                    row += 1
                    chunk = by_topic.setdefault(message.topic, [])
                    chunk.append(message)
                    if len(chunk) >= options.send_batch_size:
                        start(by_topic.pop(message.topic))
                for chunk in by_topic.values():
                    start(chunk)
            while inflight:
                finish_one()
        except BaseException:
            if transactional:
                _roll_back_quietly(client, transactions)
            raise
    if transactional:
        return TransactionalReport(partition, row, requests, task, transactions)
    return SentReport(partition, row, requests)


def _checker(client: Client, options: WriteOptions) -> AbstractContextManager[object]:
    """While an exactly-once task runs, it answers check-backs for the sink's orphans."""
    if options.commit_log is None:
        return nullcontext()
    return CheckerSession(client, [options.topic], decide)


def _roll_back_quietly(client: Client, transactions: list[Transaction]) -> None:
    """A failing task takes back what it sent; what it cannot, check-backs roll back (its
    task attempt is in no batch's record)."""
    try:
        for topic, message_id, transaction_id in transactions:
            client.end_transaction(topic, message_id, transaction_id, commit=False)
    except Exception as exc:
        log.warning("popmq: could not roll back a failed task's messages: %s", exc)


def _total(messages: list[WriterCommitMessage | None]) -> int:
    return sum(m.messages for m in messages if isinstance(m, SentReport | TransactionalReport))


class BatchWriter(DataSourceArrowWriter):
    def __init__(self, options: WriteOptions, ordered: bool) -> None:
        self.options = options
        self.ordered = ordered
        # Made on the driver, so retried tasks of this write reuse it.
        self.write_id = uuid.uuid4().hex

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SentReport | TransactionalReport:
        return send_rows(self._write_options(), iterator, self.write_id, "0", self.ordered)

    def _write_options(self) -> WriteOptions:
        """exactlyOnce: each batch write keeps its record in its own folder of commitLogDir."""
        if self.options.commit_log is None:
            return self.options
        return replace(
            self.options, commit_log=os.path.join(self.options.commit_log, self.write_id)
        )

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.options.exactly_once:
            committed, _ = commit_batch(self._write_options(), 0, messages)
            log.info("popmq: committed %d messages to %s", committed, self.options.topic)
            return
        log.info("popmq: wrote %d messages to %s", _total(messages), self.options.topic)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.options.exactly_once:
            rolled_back = abort_batch(self._write_options(), 0, messages)
            log.warning("popmq: write aborted: %d messages rolled back", rolled_back)
            return
        # Sent messages cannot be taken back; their keys let consumers spot them.
        log.warning("popmq: write aborted after %d messages had been sent", _total(messages))


class StreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: WriteOptions, ordered: bool) -> None:
        self.options = options
        self.ordered = ordered

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SentReport | TransactionalReport:
        context = TaskContext.get()
        query_id = batch_id = None
        if context is not None:
            query_id = context.getLocalProperty(QUERY_ID_PROPERTY)
            batch_id = context.getLocalProperty(BATCH_ID_PROPERTY)
        return send_rows(
            self.options, iterator, query_id or "unknown-query", batch_id or "0", self.ordered
        )

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        if self.options.exactly_once:
            committed, rolled_back = commit_batch(self.options, batchId, messages)
            log.info("popmq: batch %d committed %d messages (%d rolled back)",
                     batchId, committed, rolled_back)  # fmt: skip
            return
        log.info("popmq: batch %d wrote %d messages", batchId, _total(messages))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        if self.options.exactly_once:
            rolled_back = abort_batch(self.options, batchId, messages)
            log.warning("popmq: batch %d aborted: %d messages rolled back", batchId, rolled_back)
            return
        log.warning("popmq: batch %d aborted after %d messages", batchId, _total(messages))
