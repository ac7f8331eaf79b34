"""option("exactlyOnce", "true"): each batch's rows become visible once, when Spark commits it.

Tasks send their rows as transactional (half) messages, which no consumer sees, and return the
transaction ids in their commit message. Spark's driver-side commit then

1. writes the batch's *record* (its batch id, the task attempts whose rows count, and their
   transaction ids) into the commit log, atomically and durably, and only then
2. commits every recorded transaction (EndTransaction COMMIT) and rolls back the rest.

The record is the decision. A driver that dies after it rolls the batch forward at the restart:
Spark re-runs a batch whose own commit it had not logged, the re-run finds the record, commits
the recorded transactions again (a repeat answers OK) and rolls back its own. So a replayed
batch id commits nothing twice. A check-back for an orphaned half message (a crashed driver's,
or a failed task attempt's) is answered from the same log by every task of the sink, which
keeps a producer's Telemetry stream open while it runs: the message's batch recorded with its
task: COMMIT; recorded without it, or a later batch recorded: ROLLBACK; else unknown yet.

The commit log is a directory of one JSON file per batch: by default under the stream's
checkpoint (<checkpointLocation>/popmq-exactly-once), with the other files Spark keeps per
batch. Messages carry the batch, the task attempt and the log's path as properties.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import uuid
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from pyspark.sql.datasource import WriterCommitMessage

from popmq.client import Client, ReceivedMessage
from popmq.spark.options import WriteOptions

log = logging.getLogger(__name__)

# Message properties that tie a half message to its batch and task attempt.
PROP_BATCH = "popmq.spark.batch"
PROP_TASK = "popmq.spark.task"
PROP_LOG = "popmq.spark.commitLog"

# One transaction: (topic, message id, transaction id), what EndTransaction names.
Transaction = tuple[str, str, str]

_END_CONCURRENCY = 8


def new_task_token() -> str:
    """Names one task attempt: a retried or speculative attempt gets another."""
    return uuid.uuid4().hex


def tag_properties(properties: dict[str, str], commit_log: str, batch: str, task: str) -> None:
    properties[PROP_BATCH] = batch
    properties[PROP_TASK] = task
    properties[PROP_LOG] = commit_log


@dataclass
class TransactionalReport(WriterCommitMessage):
    """A task's commit message: its half messages, by task attempt."""

    partition: int
    messages: int
    requests: int
    task: str
    transactions: list[Transaction] = field(default_factory=list)


@dataclass(frozen=True)
class BatchRecord:
    batch: int
    tasks: frozenset[str]
    transactions: tuple[Transaction, ...]

    def to_json(self) -> str:
        return json.dumps(
            {
                "batch": self.batch,
                "tasks": sorted(self.tasks),
                "transactions": [list(t) for t in self.transactions],
            }
        )

    @classmethod
    def from_json(cls, text: str) -> BatchRecord:
        data = json.loads(text)
        return cls(
            int(data["batch"]),
            frozenset(data["tasks"]),
            tuple((t[0], t[1], t[2]) for t in data["transactions"]),
        )


class CommitLog:
    """One file per committed batch, <batch>.json, written by rename (all or nothing)."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)

    def _path(self, batch: int) -> Path:
        return self.directory / f"{batch}.json"

    def read(self, batch: int) -> BatchRecord | None:
        try:
            return BatchRecord.from_json(self._path(batch).read_text())
        except FileNotFoundError:
            return None

    def latest(self) -> int | None:
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return None
        batches = [int(n[:-5]) for n in names if n.endswith(".json") and n[:-5].isdigit()]
        return max(batches, default=None)

    def write(self, record: BatchRecord) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(dir=self.directory, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "w") as out:
                out.write(record.to_json())
                out.flush()
                os.fsync(out.fileno())
            os.replace(temp, self._path(record.batch))
        except BaseException:
            Path(temp).unlink(missing_ok=True)
            raise
        directory = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(directory)  # the rename itself survives a crash
        finally:
            os.close(directory)


def decide(message: ReceivedMessage) -> bool | None:
    """A check-back's answer for one of the sink's half messages: True commit, False roll
    back, None unknown yet (its batch may still be running, or the log is out of reach)."""
    props = message.properties
    try:
        batch, task, directory = int(props[PROP_BATCH]), props[PROP_TASK], props[PROP_LOG]
    except (KeyError, ValueError):
        return None  # not the sink's: someone else's producer must answer it
    if not os.path.isdir(directory):
        return None
    commit_log = CommitLog(directory)
    record = commit_log.read(batch)
    if record is not None:
        return task in record.tasks
    latest = commit_log.latest()
    if latest is not None and latest > batch:
        return False  # Spark commits batches in order: this one was never committed
    return None


def _reports(messages: Sequence[WriterCommitMessage | None]) -> list[TransactionalReport]:
    return [m for m in messages if isinstance(m, TransactionalReport)]


def _end_all(options: WriteOptions, transactions: Iterable[Transaction], commit: bool) -> int:
    chosen = list(transactions)
    if not chosen:
        return 0
    timeout_s = options.connection.timeout_ms / 1000
    with (
        Client(options.connection.endpoint, timeout_s, security=options.connection.security) as c,
        ThreadPoolExecutor(_END_CONCURRENCY, thread_name_prefix="popmq-end-tx") as pool,
    ):
        list(pool.map(lambda t: c.end_transaction(t[0], t[1], t[2], commit), chosen))
    return len(chosen)


def commit_batch(
    options: WriteOptions, batch: int, messages: Sequence[WriterCommitMessage | None]
) -> tuple[int, int]:
    """The driver's commit: record the decision, then carry it out. Returns (committed,
    rolled back) transaction counts."""
    assert options.commit_log is not None
    commit_log = CommitLog(options.commit_log)
    reports = _reports(messages)
    record = commit_log.read(batch)
    if record is None:
        record = BatchRecord(
            batch,
            frozenset(r.task for r in reports),
            tuple(t for r in reports for t in r.transactions),
        )
        commit_log.write(record)
    else:
        log.warning(
            "popmq: batch %d was committed before (a replay): it commits nothing new", batch
        )
    extra = [t for r in reports if r.task not in record.tasks for t in r.transactions]
    # Recorded first, so a crash from here on is finished by the re-run or a check-back.
    committed = _end_all(options, record.transactions, commit=True)
    rolled_back = _end_all(options, extra, commit=False)
    return committed, rolled_back


def abort_batch(
    options: WriteOptions, batch: int, messages: Sequence[WriterCommitMessage | None]
) -> int:
    """Roll back what the tasks sent, unless the batch's record says it committed (a commit
    that failed after its record stands: the re-run or a check-back finishes it)."""
    assert options.commit_log is not None
    record = CommitLog(options.commit_log).read(batch)
    recorded = record.tasks if record is not None else frozenset()
    pending = [t for r in _reports(messages) if r.task not in recorded for t in r.transactions]
    try:
        return _end_all(options, pending, commit=False)
    except Exception as exc:  # their check-backs roll them back later
        log.warning("popmq: rolling back batch %d failed (%s); check-backs will", batch, exc)
        return 0
