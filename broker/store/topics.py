"""The durable topic table: which topics exist and how many queues each has."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from popmq.broker.api.errors import BrokerError, Code
from popmq.broker.store import metafile

# RocketMQ's topic charset; names are also directory names, so nothing else is allowed.
_TOPIC_NAME = re.compile(r"^[%|a-zA-Z0-9_-]{1,255}$")
MAX_QUEUES = 1024


@dataclass(slots=True, frozen=True)
class TopicMeta:
    name: str
    queue_count: int


@dataclass(slots=True)
class TopicRecord:
    """A topic as the store keeps it. ``since`` is the commitlog position at creation:
    records before it belong to an earlier, deleted topic of the same name."""

    name: str
    queue_count: int
    since: int

    @property
    def meta(self) -> TopicMeta:
        return TopicMeta(self.name, self.queue_count)


def check_topic_name(name: str) -> None:
    if not isinstance(name, str) or not _TOPIC_NAME.match(name):
        raise BrokerError(
            Code.ILLEGAL_TOPIC,
            f"illegal topic name {name!r}: use 1..255 of the characters a-z A-Z 0-9 _ - % |",
        )


def check_queue_count(queue_count: int) -> None:
    if not isinstance(queue_count, int) or not 1 <= queue_count <= MAX_QUEUES:
        raise BrokerError(
            Code.BAD_REQUEST, f"queue count must be 1..{MAX_QUEUES}, got {queue_count!r}"
        )


class TopicTable:
    def __init__(self, path: Path) -> None:
        self._path = path
        self.topics: dict[str, TopicRecord] = {}

    def load_doc(self, doc: dict) -> None:
        """Take the table from a document read by the caller (metafile.read)."""
        self.topics = {
            name: TopicRecord(name, int(entry["queue_count"]), int(entry["since"]))
            for name, entry in doc.get("topics", {}).items()
        }

    def save(self) -> None:
        doc = {
            "version": 1,
            "topics": {
                t.name: {"queue_count": t.queue_count, "since": t.since}
                for t in self.topics.values()
            },
        }
        metafile.write(self._path, doc)
