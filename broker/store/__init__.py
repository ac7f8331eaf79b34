"""The broker's durable store: topics split in queues over a segmented, checksummed commitlog.

Public API: MessageStore (message_store.py), TopicMeta, ReadResult, OffsetPurgedError,
OffsetOutOfRangeError; framing.py for any other append-only file of the broker.
"""

from broker.store.errors import OffsetOutOfRangeError, OffsetPurgedError
from broker.store.message_store import MessageStore, ReadResult, now_ms
from broker.store.topics import TopicMeta

__all__ = [
    "MessageStore",
    "OffsetOutOfRangeError",
    "OffsetPurgedError",
    "ReadResult",
    "TopicMeta",
    "now_ms",
]
