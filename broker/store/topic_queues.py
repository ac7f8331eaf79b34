"""The store's topics and the index of each of their queues: create, grow, delete, look up.

topics.log (topics.py) is the record of which topics exist; every queue of a topic has one
QueueIndex under index/<topic>/<queue>. Memory always matches topics.log: a topic the log
does not hold would be dropped, with every message sent to it, at the next start.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.message_types import MessageType
from popmq.broker.store.commitlog import CommitLog
from popmq.broker.store.file_budget import FileBudget
from popmq.broker.store.queue_index import IndexDamaged, QueueIndex
from popmq.broker.store.recovery import QueueKey
from popmq.broker.store.topics import (
    TopicMeta,
    TopicRecord,
    TopicTable,
    check_queue_count,
    check_topic_name,
)

log = logging.getLogger(__name__)


class TopicQueues:
    def __init__(
        self,
        data_dir: Path,
        table: TopicTable,
        commitlog: CommitLog,
        handles: FileBudget,
        index_entries_per_file: int,
    ) -> None:
        self._dir = data_dir
        self.table = table
        self._commitlog = commitlog
        self._handles = handles
        self._per_file = index_entries_per_file
        self.indexes: dict[QueueKey, QueueIndex] = {}
        self.topic_bytes: dict[str, bytes] = {}  # encoded once: every append writes it

    @property
    def topics(self) -> dict[str, TopicRecord]:
        return self.table.topics

    def open_indexes(self) -> set[QueueKey]:
        """Open the index of every queue of every topic; the queues whose index is damaged
        (recovery rebuilds them from the commitlog)."""
        damaged: set[QueueKey] = set()
        for topic in self.topics.values():
            self.topic_bytes[topic.name] = topic.name.encode()
            for queue_id in range(topic.queue_count):
                index = self._new_index(topic.name, queue_id)
                try:
                    index.open()
                except IndexDamaged as exc:
                    log.warning("store: %s", exc)
                    damaged.add((topic.name, queue_id))
        return damaged

    def _new_index(self, topic: str, queue_id: int) -> QueueIndex:
        index = QueueIndex(self._dir / "index" / topic / str(queue_id), self._per_file,
                           self._handles)  # fmt: skip
        self.indexes[(topic, queue_id)] = index
        return index

    def create(
        self, name: str, queue_count: int, message_type: MessageType | None = None
    ) -> TopicMeta:
        """Create a topic, or grow its queue count. Shrinking is refused (BAD_REQUEST).
        ``message_type`` (None: MIXED) is set at creation only; see set_type."""
        check_topic_name(name)
        check_queue_count(queue_count)
        topics = self.topics
        existing = topics.get(name)
        if existing is not None:
            if queue_count < existing.queue_count:
                raise RefusedError(
                    Code.BAD_REQUEST,
                    f"topic {name} has {existing.queue_count} queues; they cannot be reduced "
                    f"to {queue_count}",
                )
            if queue_count == existing.queue_count:
                return existing.meta
            first_new = existing.queue_count
            existing.queue_count = queue_count
            record = existing
        else:
            shutil.rmtree(self._dir / "index" / name, ignore_errors=True)
            record = TopicRecord(name, queue_count, self._commitlog.write_position,
                                 message_type or MessageType.MIXED)  # fmt: skip
            topics[name] = record
            self.topic_bytes[name] = name.encode()
            first_new = 0
        try:
            for queue_id in range(first_new, queue_count):
                self._new_index(name, queue_id).open()
            self.table.put(record)
        except OSError as exc:
            # Keep memory as topics.log has it: a topic missing there would be dropped, with
            # every message sent to it meanwhile, at the next start.
            for queue_id in range(first_new, queue_count):
                index = self.indexes.pop((name, queue_id), None)
                if index is not None:
                    index.destroy()
            if existing is None:
                del topics[name]
                self.topic_bytes.pop(name, None)
                shutil.rmtree(self._dir / "index" / name, ignore_errors=True)
            else:
                existing.queue_count = first_new
            log.error("store: cannot create topic %s (%d queues): %s", name, queue_count, exc)
            raise RefusedError(
                Code.INTERNAL_ERROR, f"cannot create topic {name}: store write failed: {exc}"
            ) from exc
        return record.meta

    def set_type(self, name: str, message_type: MessageType) -> TopicMeta:
        """Give a topic its message type (durable before it returns, like creation)."""
        record = self.topics.get(name)
        if record is None:
            raise RefusedError(Code.TOPIC_NOT_FOUND, f"topic {name} does not exist")
        if record.message_type != message_type:
            previous, record.message_type = record.message_type, message_type
            try:
                self.table.put(record)
            except OSError as exc:
                record.message_type = previous
                raise RefusedError(
                    Code.INTERNAL_ERROR, f"cannot type topic {name}: store write failed: {exc}"
                ) from exc
        return record.meta

    def get(self, name: str) -> TopicMeta | None:
        record = self.topics.get(name)
        return record.meta if record is not None else None

    def list(self) -> list[TopicMeta]:
        return [record.meta for record in sorted(self.topics.values(), key=lambda r: r.name)]

    def delete(self, name: str) -> None:
        """Forget a topic and its indexes; its records age out with retention."""
        record = self.record(name)
        del self.topics[name]
        self.topic_bytes.pop(name, None)
        self.table.remove(name)
        for queue_id in range(record.queue_count):
            self.indexes.pop((name, queue_id)).destroy()
        shutil.rmtree(self._dir / "index" / name, ignore_errors=True)

    def record(self, name: str) -> TopicRecord:
        record = self.topics.get(name)
        if record is None:
            raise RefusedError(Code.TOPIC_NOT_FOUND, f"topic {name} does not exist")
        return record

    def queue(self, topic: str, queue_id: int) -> QueueIndex:
        """The index of a queue; TOPIC_NOT_FOUND or BAD_REQUEST (no such queue) otherwise."""
        index = self.indexes.get((topic, queue_id))
        if index is None:
            record = self.record(topic)
            raise RefusedError(
                Code.BAD_REQUEST,
                f"queue {queue_id!r} does not exist: topic {topic} has queues "
                f"0..{record.queue_count - 1}",
            )
        return index
