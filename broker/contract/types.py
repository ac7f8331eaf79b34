"""Plain data carried across the broker port.

These are the request and result shapes of every broker operation. The in-process port passes
them as they are; the gRPC port converts them to and from protos/popmq/broker/v1/broker.proto.
All times are milliseconds since the epoch (``*_ms``) or durations in milliseconds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum

from popmq.broker.contract.errors import Code, RefusedError

# System topic prefixes and derived names: one set of rules, in popmq.broker.names.
from popmq.broker.names import (  # noqa: F401  (re-exported for the port's users)
    DLQ_PREFIX,
    RETRY_PREFIX,
    SYSTEM_PREFIX,
    dlq_topic,
    legacy_retry_topic,
    retry_topic,
)

# User-property keys the broker sets on retried and dead-lettered messages.
PROP_ORIGIN_TOPIC = "__popmq.origin_topic"
PROP_ORIGIN_MESSAGE_ID = "__popmq.origin_message_id"
PROP_ORIGIN_QUEUE = "__popmq.origin_queue"
PROP_ORIGIN_OFFSET = "__popmq.origin_offset"
# The producer's W3C trace context (SystemProperties.trace_context), handed on to consumers.
PROP_TRACE_CONTEXT = "__popmq.trace_context"
# Set on a message its producer sent as TRANSACTION (kept on the committed copy).
PROP_TRANSACTION = "__popmq.transaction"
# A half message's traceparent: the span of its half send, which the check and the decision
# spans join or link to.
PROP_TX_TRACE = "__popmq.tx_trace"
# RocketMQ's property: a half message is not checked back before this many seconds.
PROP_CHECK_IMMUNITY = "CHECK_IMMUNITY_TIME_IN_SECONDS"


@dataclass(slots=True)
class Message:
    """A message as a producer hands it to a broker."""

    topic: str
    # A memoryview for a large send's body, left where grpc received it (broker.wire.bodies):
    # the store writes it from there. Whatever keeps a message past its send copies it.
    body: bytes | memoryview
    tag: str = ""
    keys: list[str] = field(default_factory=list)
    properties: dict[str, str] = field(default_factory=dict)
    message_id: str = ""  # client-made; the broker makes one when empty
    message_group: str = ""  # FIFO: same group -> same queue, delivered in order
    delivery_timestamp_ms: int = 0  # delay: invisible until then (0 = now)
    born_timestamp_ms: int = 0
    born_host: str = ""
    reconsume_times: int = 0  # raised on each redelivery through the retry topic


@dataclass(slots=True)
class StoredMessage:
    """A message as the store holds it, with where and when it was stored."""

    topic: str
    queue_id: int
    queue_offset: int
    body: bytes | memoryview  # a view only in what the store's append returns
    tag: str
    keys: list[str]
    properties: dict[str, str]
    message_id: str
    message_group: str
    delivery_timestamp_ms: int
    born_timestamp_ms: int
    born_host: str
    store_timestamp_ms: int
    store_host: str  # the broker name
    reconsume_times: int


FILTER_TAG = "TAG"
FILTER_SQL92 = "SQL92"


def _compile_sql92(expression: str) -> Callable[[str, Mapping[str, str]], bool]:
    # Imported on first use: the parser (lark and its grammar) costs a process that never
    # sees a SQL92 filter about 3 MiB (a proxy holding idle long polls, a broker).
    from popmq.broker.contract.sql92 import compile_sql92

    return compile_sql92(expression)


@dataclass(slots=True, frozen=True)
class FilterExpression:
    """A tag filter ('*' or empty matches all; 'TagA || TagB' matches either tag), or, with
    kind SQL92, a condition on the message's properties and tag (sql92.py)."""

    expression: str = "*"
    kind: str = FILTER_TAG  # FILTER_TAG or FILTER_SQL92

    @property
    def is_sql(self) -> bool:
        return self.kind == FILTER_SQL92

    def tags(self) -> frozenset[str] | None:
        """The accepted tags, or None for 'every tag' (and for SQL92: see ``selects``)."""
        text = self.expression.strip()
        if self.is_sql or text in ("", "*"):
            return None
        return frozenset(part.strip() for part in text.split("||") if part.strip())

    def check(self) -> None:
        """ILLEGAL_FILTER_EXPRESSION for a malformed SQL92 expression (compiled and cached)."""
        if self.is_sql:
            _compile_sql92(self.expression)
        elif self.kind != FILTER_TAG:
            raise RefusedError(Code.ILLEGAL_FILTER_EXPRESSION, f"unknown filter type {self.kind!r}")

    def selects(self) -> Callable[[StoredMessage], bool] | None:
        """For SQL92, whether a stored message matches (what the tag hash in the queue index
        cannot tell); None for tag filters, which the store applies itself."""
        if not self.is_sql:
            return None
        matches = _compile_sql92(self.expression)
        return lambda message: matches(message.tag, message.properties)

    def matches(self, tag: str, properties: Mapping[str, str] | None = None) -> bool:
        if self.is_sql:
            return _compile_sql92(self.expression)(tag, properties or {})
        accepted = self.tags()
        return accepted is None or tag in accepted


@dataclass(slots=True)
class SendResult:
    message_id: str
    topic: str
    queue_id: int
    queue_offset: int
    broker_name: str
    recall_handle: str = ""  # delay messages: cancels the delivery until it happens (recall)
    transaction_id: str = ""  # transactional messages: for EndTransaction


@dataclass(slots=True)
class TransactionCheck:
    """A half message without a decision, to ask a producer of its topic about."""

    message: StoredMessage  # as the producer sent it (real topic, original id)
    transaction_id: str
    checks: int  # how many times it has been asked, this one included


@dataclass(slots=True)
class HalfMessageInfo:
    """An undecided transactional message (``popmq admin transactions list``)."""

    topic: str
    message_id: str
    transaction_id: str
    stored_ms: int
    checks: int
    parked: bool


@dataclass(slots=True)
class PopRequest:
    group: str
    topic: str
    queue_id: int = -1  # -1: every queue of the topic on this broker
    max_messages: int = 32
    invisible_time_ms: int = 60_000
    poll_time_ms: int = 0  # 0: answer at once; >0: hold until a message or the timeout
    filter: FilterExpression = field(default_factory=FilterExpression)
    fifo: bool = False


class PopStatus(Enum):
    FOUND = "FOUND"
    NO_MESSAGE = "NO_MESSAGE"  # nothing visible (after holding, if poll_time_ms > 0)
    POLLING_FULL = "POLLING_FULL"  # the hold table is full; retry later


@dataclass(slots=True)
class PoppedMessage:
    message: StoredMessage
    receipt_handle: str
    invisible_until_ms: int

    @property
    def delivery_attempt(self) -> int:
        return self.message.reconsume_times + 1


@dataclass(slots=True)
class PopResult:
    status: PopStatus
    messages: list[PoppedMessage] = field(default_factory=list)
    rest_num: int = 0  # visible backlog left behind in the queues read


@dataclass(slots=True)
class AckEntry:
    receipt_handle: str
    message_id: str = ""


@dataclass(slots=True)
class AckEntryResult:
    receipt_handle: str
    message_id: str
    code: int  # errors.Code value; Code.OK when acked
    message: str = ""


@dataclass(slots=True)
class ChangeInvisibleResult:
    receipt_handle: str  # the new handle; the old one stops working
    invisible_until_ms: int


@dataclass(slots=True)
class NotifyRequest:
    """'Does this group have a visible message on this topic?' without popping one."""

    group: str
    topic: str
    queue_id: int = -1
    poll_time_ms: int = 0
    filter: FilterExpression = field(default_factory=FilterExpression)
    fifo: bool = False


@dataclass(slots=True)
class NotifyResult:
    has_message: bool
    polling_full: bool = False


@dataclass(slots=True)
class PullRequest:
    topic: str
    queue_id: int
    offset: int
    max_messages: int = 32
    poll_time_ms: int = 0
    filter: FilterExpression = field(default_factory=FilterExpression)


class PullStatus(Enum):
    FOUND = "FOUND"
    NO_NEW_MESSAGE = "NO_NEW_MESSAGE"  # offset == max offset (after holding)
    OFFSET_ILLEGAL = "OFFSET_ILLEGAL"  # beyond the max offset
    OFFSET_PURGED = "OFFSET_PURGED"  # below the min offset: retention removed it
    POLLING_FULL = "POLLING_FULL"


@dataclass(slots=True)
class PullResult:
    status: PullStatus
    messages: list[StoredMessage] = field(default_factory=list)
    next_offset: int = 0
    min_offset: int = 0
    max_offset: int = 0


@dataclass(slots=True)
class QueueInfo:
    queue_id: int
    min_offset: int
    max_offset: int  # offset the next message will get


@dataclass(slots=True)
class TopicInfo:
    name: str
    queue_count: int
    queues: list[QueueInfo] = field(default_factory=list)
    message_type: str = "MIXED"  # message_types.MessageType's value


class ConsumeMode(Enum):
    POP = "POP"
    PULL = "PULL"


@dataclass(slots=True)
class GroupConfig:
    name: str
    consume_mode: ConsumeMode = ConsumeMode.POP
    max_attempts: int = 16
    retry_levels: list[str] = field(default_factory=list)  # empty: the broker's default
    fifo: bool = False


@dataclass(slots=True)
class GroupSummary:
    """A registered group on one broker, with what deleting it would touch."""

    config: GroupConfig
    inflight: int = 0  # popped, not yet acked, over every queue
    offset_queues: int = 0  # queues with a committed consumer offset


@dataclass(slots=True)
class GroupDeleted:
    """What a broker did when it deleted a group."""

    inflight: int = 0  # messages still in flight (they revive to %RETRY% as usual)
    offsets_removed: int = 0  # committed offsets removed (clean_offsets only)


@dataclass(slots=True)
class GroupQueueStats:
    topic: str
    queue_id: int
    consumer_offset: int
    max_offset: int
    inflight: int  # popped, not yet acked

    @property
    def backlog(self) -> int:
        return max(self.max_offset - self.consumer_offset, 0)
