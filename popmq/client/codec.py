"""apache.rocketmq.v2 request building and response parsing, shared by both clients.

No I/O here: the async and the sync client differ only in how they send the requests.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
import zlib
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import cast

from popmq.broker.contract.errors import Code
from popmq.broker.contract.types import Message
from popmq.client.errors import ProxyError
from popmq.client.model import (
    AckOutcome,
    OffsetPolicy,
    PullResult,
    QueueRef,
    ReceivedMessage,
    SendReceipt,
)
from popmq.pb.pool import Duration, Timestamp
from popmq.pb.rocketmq.v2 import definition_pb2 as d
from popmq.pb.rocketmq.v2 import service_pb2 as s

CLIENT_VERSION = "popmq-client/0.1"
_HOST = socket.gethostname()
_READABLE = (d.READ, d.READ_WRITE)
_WRITABLE = (d.WRITE, d.READ_WRITE)


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """'host:port' -> (host, port); a clear ValueError otherwise."""
    text = (endpoint or "").strip()
    for scheme in ("grpc://", "http://"):
        if text.startswith(scheme):
            text = text[len(scheme) :]
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"bad endpoint {endpoint!r}: expected HOST:PORT, e.g. 127.0.0.1:8081")
    return host.strip("[]"), int(port)


def new_client_id() -> str:
    """RocketMQ clients name themselves host@pid@index@nanotime; we follow the shape."""
    return f"{_HOST}@{os.getpid()}@0@{uuid.uuid4().hex[:12]}"


def call_metadata(client_id: str) -> tuple[tuple[str, str], ...]:
    now = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    return (
        ("x-mq-language", "PYTHON"),
        ("x-mq-protocol", "GRPC_V2"),
        ("x-mq-client-version", CLIENT_VERSION),
        ("x-mq-client-id", client_id),
        ("x-mq-request-id", uuid.uuid4().hex),
        ("x-mq-date-time", now),
    )


def new_message_id() -> str:
    """34 upper-case hex characters, the length of RocketMQ 5 message ids."""
    return "01" + os.urandom(16).hex().upper()


# -- small conversions ----------------------------------------------------------------------


def resource(name: str) -> d.Resource:
    return d.Resource(name=name)


def duration_ms(ms: int) -> Duration:
    value = Duration()
    value.FromMilliseconds(int(ms))
    return value


def timestamp_ms(ms: int) -> Timestamp:
    value = Timestamp()
    value.FromMilliseconds(int(ms))
    return value


def endpoints_of(endpoint: str) -> d.Endpoints:
    host, port = parse_endpoint(endpoint)
    scheme = d.IPv4 if host.replace(".", "").isdigit() else d.DOMAIN_NAME
    return d.Endpoints(scheme=scheme, addresses=[d.Address(host=host, port=port)])


def queue_to_pb(queue: QueueRef) -> d.MessageQueue:
    broker = d.Broker(name=queue.broker, id=0)
    if queue.endpoint:
        broker.endpoints.CopyFrom(endpoints_of(queue.endpoint))
    permission = {
        (True, True): d.READ_WRITE,
        (True, False): d.READ,
        (False, True): d.WRITE,
    }.get((queue.readable, queue.writable), d.NONE)
    return d.MessageQueue(
        topic=resource(queue.topic), id=queue.queue_id, permission=permission, broker=broker
    )


def queue_from_pb(queue: d.MessageQueue) -> QueueRef:
    endpoint = ""
    if queue.broker.endpoints.addresses:
        address = queue.broker.endpoints.addresses[0]
        endpoint = f"{address.host}:{address.port}"
    return QueueRef(
        topic=queue.topic.name,
        broker=queue.broker.name,
        queue_id=queue.id,
        endpoint=endpoint,
        readable=queue.permission in _READABLE,
        writable=queue.permission in _WRITABLE,
    )


def filter_pb(expression: str) -> d.FilterExpression:
    return d.FilterExpression(type=d.TAG, expression=expression or "*")


def check_status(status: d.Status, rpc: str, ok: Iterable[int] = (Code.OK,)) -> None:
    if status.code not in tuple(ok):
        raise ProxyError(status.code, status.message or Code(status.code).name, rpc)


# -- requests -------------------------------------------------------------------------------


def route_request(topic: str, endpoint: str) -> s.QueryRouteRequest:
    return s.QueryRouteRequest(topic=resource(topic), endpoints=endpoints_of(endpoint))


def message_to_pb(message: Message, transactional: bool = False) -> d.Message:
    """A message to send. The client makes the id when the caller left it empty. A
    transactional one is stored as a half message until EndTransaction decides it."""
    system = d.SystemProperties(
        keys=message.keys,
        message_id=message.message_id or new_message_id(),
        body_encoding=d.IDENTITY,
        message_type=d.NORMAL,
        born_host=message.born_host or _HOST,
    )
    system.body_digest.type = d.CRC32
    system.body_digest.checksum = f"{zlib.crc32(message.body):08X}"
    system.born_timestamp.FromMilliseconds(message.born_timestamp_ms or _now_ms())
    if message.tag:
        system.tag = message.tag
    if message.message_group:
        system.message_group = message.message_group
        system.message_type = d.FIFO
    if message.delivery_timestamp_ms:
        system.delivery_timestamp.FromMilliseconds(message.delivery_timestamp_ms)
        if not message.message_group:
            system.message_type = d.DELAY
    if transactional:
        system.message_type = d.TRANSACTION
    out = d.Message(
        user_properties=message.properties, system_properties=system, body=bytes(message.body)
    )
    out.topic.name = message.topic
    return out


def send_request(messages: Sequence[Message], transactional: bool = False) -> s.SendMessageRequest:
    if not messages:
        raise ValueError("send needs at least one message")
    return s.SendMessageRequest(messages=[message_to_pb(m, transactional) for m in messages])


def end_transaction_request(
    topic: str, message_id: str, transaction_id: str, commit: bool, from_check: bool
) -> s.EndTransactionRequest:
    request = s.EndTransactionRequest(
        message_id=message_id,
        transaction_id=transaction_id,
        resolution=d.COMMIT if commit else d.ROLLBACK,
        source=d.SOURCE_SERVER_CHECK if from_check else d.SOURCE_CLIENT,
    )
    request.topic.name = topic
    return request


def pull_request(
    queue: QueueRef,
    offset: int,
    batch_size: int,
    long_polling_ms: int,
    filter_expression: str,
    group: str,
) -> s.PullMessageRequest:
    return s.PullMessageRequest(
        group=resource(group),
        message_queue=queue_to_pb(queue),
        offset=offset,
        batch_size=batch_size,
        filter_expression=filter_pb(filter_expression),
        long_polling_timeout=duration_ms(long_polling_ms),
    )


def query_offset_request(
    queue: QueueRef, policy: OffsetPolicy, timestamp: int | None
) -> s.QueryOffsetRequest:
    request = s.QueryOffsetRequest(
        message_queue=queue_to_pb(queue),
        query_offset_policy=cast("d.QueryOffsetPolicy", d.QueryOffsetPolicy.Value(policy.value)),
    )
    if policy is OffsetPolicy.TIMESTAMP:
        if timestamp is None:
            raise ValueError("the TIMESTAMP policy needs timestamp_ms")
        request.timestamp.CopyFrom(timestamp_ms(timestamp))
    return request


def receive_request(
    group: str,
    queue: QueueRef,
    batch_size: int,
    invisible_ms: int,
    long_polling_ms: int,
    filter_expression: str,
) -> s.ReceiveMessageRequest:
    return s.ReceiveMessageRequest(
        group=resource(group),
        message_queue=queue_to_pb(queue),
        filter_expression=filter_pb(filter_expression),
        batch_size=batch_size,
        invisible_duration=duration_ms(invisible_ms),
        auto_renew=False,
        long_polling_timeout=duration_ms(long_polling_ms),
    )


def ack_request(group: str, topic: str, entries: Sequence[tuple[str, str]]) -> s.AckMessageRequest:
    return s.AckMessageRequest(
        group=resource(group),
        topic=resource(topic),
        entries=[
            s.AckMessageEntry(message_id=mid, receipt_handle=handle) for mid, handle in entries
        ],
    )


def change_invisible_request(
    group: str, topic: str, message_id: str, handle: str, invisible_ms: int
) -> s.ChangeInvisibleDurationRequest:
    return s.ChangeInvisibleDurationRequest(
        group=resource(group),
        topic=resource(topic),
        receipt_handle=handle,
        invisible_duration=duration_ms(invisible_ms),
        message_id=message_id,
    )


# -- responses ------------------------------------------------------------------------------


def route_from_pb(response: s.QueryRouteResponse, topic: str) -> list[QueueRef]:
    check_status(response.status, f"QueryRoute({topic})")
    queues = [queue_from_pb(q) for q in response.message_queues]
    # A route may list a queue once per permission; keep one entry per (broker, id).
    unique: dict[tuple[str, int], QueueRef] = {}
    for queue in queues:
        unique.setdefault(queue.key, queue)
    return sorted(unique.values(), key=lambda q: q.key)


def message_from_pb(message: d.Message, queue: QueueRef | None = None) -> ReceivedMessage:
    system = message.system_properties
    body = message.body
    if system.body_encoding == d.GZIP:
        body = zlib.decompress(body, wbits=31)
    return ReceivedMessage(
        topic=message.topic.name,
        broker=queue.broker if queue is not None else system.store_host,
        queue_id=system.queue_id,
        offset=system.queue_offset,
        message_id=system.message_id,
        body=body,
        tag=system.tag,
        keys=list(system.keys),
        properties=dict(message.user_properties),
        message_group=system.message_group,
        born_timestamp_ms=system.born_timestamp.ToMilliseconds(),
        store_timestamp_ms=system.store_timestamp.ToMilliseconds(),
        delivery_timestamp_ms=system.delivery_timestamp.ToMilliseconds(),
        delivery_attempt=system.delivery_attempt if system.HasField("delivery_attempt") else 1,
        receipt_handle=system.receipt_handle,
    )


class PullCollector:
    """Folds a PullMessage response stream into one PullResult.

    MESSAGE_NOT_FOUND is an empty result (the queue has nothing past the offset yet); any
    other non-OK status raises ProxyError (ILLEGAL_OFFSET for a purged or future offset).
    """

    def __init__(self, queue: QueueRef, offset: int) -> None:
        self.queue = queue
        self.messages: list[ReceivedMessage] = []
        self.next_offset = offset
        self._rpc = f"PullMessage({queue.topic} {queue.broker}/{queue.queue_id} @{offset})"

    def add(self, response: s.PullMessageResponse) -> None:
        kind = response.WhichOneof("content")
        if kind == "status":
            check_status(response.status, self._rpc, ok=(Code.OK, Code.MESSAGE_NOT_FOUND))
        elif kind == "message":
            self.messages.append(message_from_pb(response.message, self.queue))
        elif kind == "next_offset":
            self.next_offset = response.next_offset

    def result(self) -> PullResult:
        if self.messages:
            # Some servers leave next_offset out of a full answer: it follows the last message.
            self.next_offset = max(self.next_offset, self.messages[-1].offset + 1)
        return PullResult(self.messages, self.next_offset)


class ReceiveCollector:
    """Folds a ReceiveMessage stream: status, messages, delivery_timestamp."""

    def __init__(self, queue: QueueRef) -> None:
        self.queue = queue
        self.messages: list[ReceivedMessage] = []
        self._rpc = f"ReceiveMessage({queue.topic})"

    def add(self, response: s.ReceiveMessageResponse) -> None:
        if response.WhichOneof("content") == "status":
            check_status(response.status, self._rpc, ok=(Code.OK, Code.MESSAGE_NOT_FOUND))
        elif response.WhichOneof("content") == "message":
            message = message_from_pb(response.message)
            if not message.broker:
                message.broker = self.queue.broker
            self.messages.append(message)


def send_receipts(response: s.SendMessageResponse, count: int) -> list[SendReceipt]:
    check_status(response.status, "SendMessage", ok=(Code.OK, Code.MULTIPLE_RESULTS))
    receipts = [
        SendReceipt(
            e.message_id, e.offset, e.status.code or Code.OK, e.status.message, e.transaction_id
        )
        for e in response.entries
    ]
    if len(receipts) != count:
        raise ProxyError(
            Code.INTERNAL_ERROR, f"expected {count} send results, got {len(receipts)}", "Send"
        )
    failed = [r for r in receipts if r.code != Code.OK]
    if failed:
        first = failed[0]
        raise ProxyError(first.code, f"{len(failed)} of {count} failed: {first.detail}", "Send")
    return receipts


def ack_outcomes(response: s.AckMessageResponse) -> list[AckOutcome]:
    # With entries, the top status only sums them up (every entry failed alike: their code), so
    # each entry says how it went: a batch whose handles all expired is not an error of the call.
    if not response.entries:
        check_status(response.status, "AckMessage", ok=(Code.OK, Code.MULTIPLE_RESULTS))
    return [
        AckOutcome(e.message_id, e.receipt_handle, e.status.code or Code.OK, e.status.message)
        for e in response.entries
    ]


def offset_from(response: s.QueryOffsetResponse | s.GetOffsetResponse, rpc: str) -> int:
    check_status(response.status, rpc)
    return int(response.offset)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000
