"""Plain data the client hands back: queues from the route, received messages, receipts.

Messages to send are broker.contract.types.Message (topic, body, tag, keys, properties,
message_group, delivery_timestamp_ms).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


@dataclass(slots=True, frozen=True)
class QueueRef:
    """One message queue of a topic, as QueryRoute names it: (broker, queue id)."""

    topic: str
    broker: str
    queue_id: int
    # The address the route says serves this queue ("host:port"); popmq's proxies write
    # their own address here, so any proxy can serve any queue.
    endpoint: str = ""
    readable: bool = True
    writable: bool = True

    @property
    def key(self) -> tuple[str, int]:
        return (self.broker, self.queue_id)


@dataclass(slots=True)
class ReceivedMessage:
    """A message read by PullMessage (receipt_handle empty) or ReceiveMessage (popped)."""

    topic: str
    broker: str
    queue_id: int
    offset: int
    message_id: str
    body: bytes
    tag: str = ""
    keys: list[str] = field(default_factory=list)
    properties: dict[str, str] = field(default_factory=dict)
    message_group: str = ""
    born_timestamp_ms: int = 0
    store_timestamp_ms: int = 0
    delivery_timestamp_ms: int = 0
    delivery_attempt: int = 1
    receipt_handle: str = ""


@dataclass(slots=True)
class PullResult:
    messages: list[ReceivedMessage]
    next_offset: int  # where the next pull of this queue starts


@dataclass(slots=True, frozen=True)
class SendReceipt:
    message_id: str
    offset: int
    code: int  # RocketMQ Code of this entry (OK = 20000)
    detail: str = ""
    transaction_id: str = ""  # a transactional send's: what EndTransaction names


@dataclass(slots=True, frozen=True)
class AckOutcome:
    message_id: str
    receipt_handle: str
    code: int
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.code == 20000


class OffsetPolicy(Enum):
    BEGINNING = "BEGINNING"
    END = "END"
    TIMESTAMP = "TIMESTAMP"
