"""What AsyncClient and Client share, as httpcore shares one core between its async and sync
halves: the connection settings, the call metadata, and every RPC written once as a request plus
a decoder (a Call, or a StreamCall for server streams). The two clients only differ in how they
wait for the answer (grpc.aio or grpc's blocking API) and what they add on top (the blocking
client retries reads, pipelines sends and queries many offsets at once).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from google.protobuf.message import Message as ProtoMessage

from popmq.broker.contract.types import Message
from popmq.client import codec
from popmq.client.model import (
    AckOutcome,
    OffsetPolicy,
    PullResult,
    QueueRef,
    ReceivedMessage,
    SendReceipt,
)
from popmq.client.security import ClientSecurity
from popmq.pb.rocketmq.v2 import service_pb2 as s

T = TypeVar("T")
# A stream's frames are gathered by a collector, then turned into the call's result.
C = TypeVar("C", bound="Collector")

CHANNEL_OPTIONS = (
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.max_send_message_length", 64 << 20),
)


class Collector(Protocol):
    def add(self, response: Any) -> None: ...


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One unary RPC: what to send, and how to read the answer."""

    rpc: str
    request: ProtoMessage
    decode: Callable[[Any], T]
    # A read, safe to repeat after a transport failure (the blocking client retries those).
    idempotent: bool = True


@dataclass(frozen=True, slots=True)
class StreamCall(Generic[C, T]):
    """One server-streaming RPC: the frames go into a fresh collector, then ``result``."""

    rpc: str
    request: ProtoMessage
    timeout_s: float
    collector: Callable[[], C]
    result: Callable[[C], T]
    idempotent: bool = True


class ClientCore:
    """Settings and calls of a popmq client; subclasses add the transport."""

    def __init__(
        self, endpoint: str, timeout_s: float = 10.0, *, security: ClientSecurity | None = None
    ) -> None:
        host, port = codec.parse_endpoint(endpoint)
        self.security = security or ClientSecurity()
        self.endpoint = f"{host}:{port}"
        self.timeout_s = timeout_s
        self.client_id = codec.new_client_id()

    def _meta(self) -> tuple[tuple[str, str], ...]:
        return codec.call_metadata(self.client_id) + self.security.signature()

    # -- route and offsets ----------------------------------------------------------------

    def _query_route(self, topic: str) -> Call[list[QueueRef]]:
        return Call(
            "QueryRoute",
            codec.route_request(topic, self.endpoint),
            lambda response: codec.route_from_pb(response, topic),
        )

    def _query_offset(
        self, queue: QueueRef, policy: OffsetPolicy, timestamp_ms: int | None
    ) -> Call[int]:
        return Call(
            "QueryOffset",
            codec.query_offset_request(queue, policy, timestamp_ms),
            lambda response: codec.offset_from(response, f"QueryOffset({policy.value})"),
        )

    def _get_offset(self, group: str, queue: QueueRef) -> Call[int]:
        request = s.GetOffsetRequest(
            group=codec.resource(group), message_queue=codec.queue_to_pb(queue)
        )
        return Call("GetOffset", request, lambda response: codec.offset_from(response, "GetOffset"))

    def _update_offset(self, group: str, queue: QueueRef, offset: int) -> Call[None]:
        request = s.UpdateOffsetRequest(
            group=codec.resource(group), message_queue=codec.queue_to_pb(queue), offset=offset
        )
        return Call(
            "UpdateOffset",
            request,
            lambda response: codec.check_status(response.status, "UpdateOffset"),
        )

    # -- produce ----------------------------------------------------------------------------

    def _send(
        self, messages: Sequence[Message], transactional: bool = False
    ) -> Call[list[SendReceipt]]:
        """Messages of one topic in one request; one receipt per message. Never retried."""
        count = len(messages)
        return Call(
            "SendMessage",
            codec.send_request(messages, transactional),
            lambda response: codec.send_receipts(response, count),
            idempotent=False,
        )

    def _end_transaction(
        self, topic: str, message_id: str, transaction_id: str, commit: bool, from_check: bool
    ) -> Call[None]:
        """COMMIT or ROLLBACK a half message. Idempotent at the broker (a repeat of the
        decision taken answers OK), so the blocking client may retry it."""
        return Call(
            "EndTransaction",
            codec.end_transaction_request(topic, message_id, transaction_id, commit, from_check),
            lambda response: codec.check_status(response.status, "EndTransaction"),
        )

    # -- offset-based consumption --------------------------------------------------------

    def _pull(
        self,
        queue: QueueRef,
        offset: int,
        batch_size: int,
        long_polling_ms: int,
        filter_expression: str,
        group: str,
    ) -> StreamCall[codec.PullCollector, PullResult]:
        request = codec.pull_request(
            queue, offset, batch_size, long_polling_ms, filter_expression, group
        )
        return StreamCall(
            "PullMessage",
            request,
            self.timeout_s + long_polling_ms / 1000,
            lambda: codec.PullCollector(queue, offset),
            codec.PullCollector.result,
        )

    # -- POP consumption --------------------------------------------------------------------

    def _receive(
        self,
        group: str,
        queue: QueueRef,
        batch_size: int,
        invisible_ms: int,
        long_polling_ms: int,
        filter_expression: str,
    ) -> StreamCall[codec.ReceiveCollector, list[ReceivedMessage]]:
        request = codec.receive_request(
            group, queue, batch_size, invisible_ms, long_polling_ms, filter_expression
        )
        # Not retried: a receive that failed midway may have popped messages (they come back
        # after their invisible time), and the caller should know.
        return StreamCall(
            "ReceiveMessage",
            request,
            self.timeout_s + long_polling_ms / 1000,
            lambda: codec.ReceiveCollector(queue),
            lambda collector: collector.messages,
            idempotent=False,
        )

    def _ack(
        self, group: str, topic: str, entries: Sequence[tuple[str, str]]
    ) -> Call[list[AckOutcome]]:
        """Ack (message_id, receipt_handle) pairs; one outcome per entry."""
        return Call("AckMessage", codec.ack_request(group, topic, entries), codec.ack_outcomes)

    def _change_invisible_duration(
        self, group: str, topic: str, message_id: str, receipt_handle: str, invisible_ms: int
    ) -> Call[str]:
        """Moves the message's next-visible time; decodes to the new receipt handle."""

        def decode(response: s.ChangeInvisibleDurationResponse) -> str:
            codec.check_status(response.status, "ChangeInvisibleDuration")
            return response.receipt_handle

        request = codec.change_invisible_request(
            group, topic, message_id, receipt_handle, invisible_ms
        )
        return Call("ChangeInvisibleDuration", request, decode, idempotent=False)
