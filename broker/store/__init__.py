"""The broker's durable store: topics split in queues over a segmented, checksummed commitlog.

Public API: MessageStore (message_store.py), TopicMeta, ReadResult, OffsetPurgedError,
OffsetOutOfRangeError; framing.py for any other append-only file of the broker.
"""

from popmq.broker.store.errors import OffsetOutOfRangeError, OffsetPurgedError
from popmq.broker.store.message_store import MessageStore
from popmq.broker.store.reads import ReadResult
from popmq.broker.store.topics import TopicMeta

__all__ = [
    "MessageStore",
    "OffsetOutOfRangeError",
    "OffsetPurgedError",
    "ReadResult",
    "TopicMeta",
]
