"""The durable topic table: which topics exist and how many queues each has."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.message_types import MessageType
from popmq.broker.names import check_topic
from popmq.broker.store.framing import DamagedRun, FramedLog, Resync, fsync_dir

log = logging.getLogger(__name__)

MAX_QUEUES = 1024
LOG_NAME = "topics.log"
LEGACY_NAME = "topics.json"  # before the log: one checksummed document (metafile.py)
# Compact at start when the log holds this many more records than there are topics.
_COMPACT_SLACK = 1_000


@dataclass(slots=True, frozen=True)
class TopicMeta:
    name: str
    queue_count: int
    message_type: MessageType = MessageType.MIXED


@dataclass(slots=True)
class TopicRecord:
    """A topic as the store keeps it. ``since`` is the commitlog position at creation:
    records before it belong to an earlier, deleted topic of the same name."""

    name: str
    queue_count: int
    since: int
    # Records from before message types have none: such topics load as MIXED (took anything).
    message_type: MessageType = MessageType.MIXED

    @property
    def meta(self) -> TopicMeta:
        return TopicMeta(self.name, self.queue_count, self.message_type)


def check_topic_name(name: str) -> None:
    """Any name the broker may store (user, retry, DLQ and system topics): the shared rules
    for internal names, which are also directory names."""
    check_topic(name, user=False)


def check_queue_count(queue_count: int) -> None:
    if not isinstance(queue_count, int) or not 1 <= queue_count <= MAX_QUEUES:
        raise RefusedError(
            Code.BAD_REQUEST, f"queue count must be 1..{MAX_QUEUES}, got {queue_count!r}"
        )


def _put_record(topic: TopicRecord) -> dict:
    return {
        "name": topic.name,
        "queue_count": topic.queue_count,
        "since": topic.since,
        "message_type": topic.message_type.value,
    }


def _encode(record: dict) -> bytes:
    return json.dumps(record, separators=(",", ":")).encode()


def _is_record(payload: memoryview) -> bool:
    try:
        record = json.loads(bytes(payload))
    except ValueError:
        return False
    return isinstance(record, dict) and isinstance(record.get("name"), str)


# Every record is a JSON object naming a topic (resync past damage: see framing.Resync).
TOPICS_RESYNC = Resync(b"{", _is_record)


@dataclass(slots=True)
class TopicLogLoad:
    """What loading the topic log found: damage means the table may miss topics."""

    missing: bool = False
    damage: list[DamagedRun] = field(default_factory=list)
    unreadable: list[tuple[int, bytes]] = field(default_factory=list)  # (position, payload)

    @property
    def trusted(self) -> bool:
        return not (self.missing or self.damage or self.unreadable)


class TopicTable:
    """The durable topic table, ``topics.log``: an append-only log of checksummed JSON records
    (framing.FramedLog), one per created or grown topic (``{"name", "queue_count", "since"}``)
    and one tombstone per deleted topic (``{"name", "deleted": true}``). Registering a topic
    appends and fsyncs one small record, so N topics cost O(N) bytes, not the O(N^2) of
    rewriting a whole document each time. The log is compacted (temp file, fsync, rename)
    at start when it holds many superseded records, and after a rebuild."""

    def __init__(self, directory: Path) -> None:
        self._dir = Path(directory)
        self.path = self._dir / LOG_NAME
        self.topics: dict[str, TopicRecord] = {}
        self._log: FramedLog | None = None
        self._records = 0
        # Topics read from records without a message type (an upgraded data directory).
        self.untyped: set[str] = set()

    def exists(self) -> bool:
        return self.path.exists()

    def load(self) -> TopicLogLoad:
        """Replay the log (missing: an empty table, reported). Damaged frames are skipped
        and returned (the caller reports them and completes the table from the data)."""
        self.close()
        result = TopicLogLoad(missing=not self.path.exists())
        self._log = FramedLog(self.path, TOPICS_RESYNC)
        result.damage = list(self._log.damage)
        self.topics, self._records = {}, 0
        self.untyped = set()
        for position, payload in self._log.iter_from(0):
            self._records += 1
            try:
                self._apply(json.loads(payload))
            except (ValueError, KeyError, TypeError, AttributeError):
                result.unreadable.append((position, payload))
        if result.trusted and self.untyped:
            self._upgrade_untyped()
        elif result.trusted and self._records > len(self.topics) + _COMPACT_SLACK:
            self.rewrite()
        return result

    def _upgrade_untyped(self) -> None:
        """Topics written before message types took every kind of message: they become MIXED,
        said once in the log and written down so (the rewrite gives every record its type)."""
        names = sorted(self.untyped)
        shown = ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")
        log.warning("store: %d topics from before topic message types are now MIXED (they "
                    "accept every message type, as before): %s; `popmq admin topics create NAME "
                    "--message-type TYPE` on a new topic gives it one type", len(names),
                    shown)  # fmt: skip
        self.rewrite()
        self.untyped = set()

    def _apply(self, record: dict) -> None:
        name = str(record["name"])
        if record.get("deleted") is True:
            self.topics.pop(name, None)
            self.untyped.discard(name)
            return
        typed = "message_type" in record
        kind = MessageType(record["message_type"]) if typed else MessageType.MIXED
        if typed:
            self.untyped.discard(name)
        else:
            self.untyped.add(name)
        self.topics[name] = TopicRecord(
            name, int(record["queue_count"]), int(record["since"]), kind
        )

    def load_doc(self, doc: dict) -> None:
        """Take the table from an old topics.json document (migration)."""
        self.topics = {
            name: TopicRecord(name, int(entry["queue_count"]), int(entry["since"]))
            for name, entry in doc.get("topics", {}).items()
        }
        self.untyped = set(self.topics)
        if self.untyped:
            self._upgrade_untyped()

    def _append(self, record: dict) -> None:
        if self._log is None:
            self._log = FramedLog(self.path, TOPICS_RESYNC)
        self._log.append(_encode(record))
        self._log.flush(fsync=True)  # durable before any message of the topic is written
        self._records += 1

    def put(self, record: TopicRecord) -> None:
        """Record a created or grown topic (already in ``topics``)."""
        self._append(_put_record(record))

    def remove(self, name: str) -> None:
        """Record a deleted topic (already gone from ``topics``)."""
        self._append({"name": name, "deleted": True})

    def rewrite(self) -> None:
        """Write every topic to a fresh log (temp file, fsync, rename over, fsync the dir)."""
        self.close()
        tmp = self._dir / (LOG_NAME + ".tmp")
        tmp.unlink(missing_ok=True)
        fresh = FramedLog(tmp, TOPICS_RESYNC)
        for t in self.topics.values():
            fresh.append(_encode(_put_record(t)))
        fresh.close()
        os.replace(tmp, self.path)
        fsync_dir(self._dir)
        self._records = len(self.topics)
        self._log = FramedLog(self.path, TOPICS_RESYNC)

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None
