"""Client: the same protocol over grpc's blocking API.

For code without an event loop: Spark tasks and the Spark driver run it. Read-only calls are
retried on a transport failure (they are idempotent); sends are not, so a failed send raises
and the caller (a Spark task) decides.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import grpc
import grpc.experimental

from popmq.broker.api.types import Message
from popmq.client import codec
from popmq.client.aio import CHANNEL_OPTIONS
from popmq.client.errors import ProxyUnavailable, transport_error
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
from popmq.pb.rocketmq.v2 import service_pb2_grpc

# Server streams (PullMessage, ReceiveMessage) are read on the calling thread instead of a
# helper thread: far less per-message overhead for streams of many small frames.
SYNC_CHANNEL_OPTIONS = (
    *CHANNEL_OPTIONS,
    (grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1),
)

# Transport failures worth another try for an idempotent read.
_RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


class PendingSend:
    """A SendMessage in flight; result() waits for its receipts (or raises)."""

    def __init__(self, future: grpc.Future, count: int, on_error: Callable[[Any], Exception]):
        self._future = future
        self._count = count
        self._on_error = on_error

    def result(self) -> list[SendReceipt]:
        try:
            response = self._future.result()
        except grpc.RpcError as error:
            raise self._on_error(error) from error
        return codec.send_receipts(response, self._count)


class Client:
    def __init__(
        self,
        endpoint: str,
        timeout_s: float = 10.0,
        read_attempts: int = 3,
        *,
        security: ClientSecurity | None = None,
    ) -> None:
        host, port = codec.parse_endpoint(endpoint)
        self.security = security or ClientSecurity()
        self.endpoint = f"{host}:{port}"
        self.timeout_s = timeout_s
        self.read_attempts = max(1, read_attempts)
        self.client_id = codec.new_client_id()
        credentials = self.security.credentials()
        self._channel = (
            grpc.secure_channel(self.endpoint, credentials, options=SYNC_CHANNEL_OPTIONS)
            if credentials is not None
            else grpc.insecure_channel(self.endpoint, options=SYNC_CHANNEL_OPTIONS)
        )
        self._stub = service_pb2_grpc.MessagingServiceStub(self._channel)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    def _meta(self) -> tuple[tuple[str, str], ...]:
        return codec.call_metadata(self.client_id) + self.security.signature()

    def _unavailable(self, rpc: str, error: grpc.RpcError) -> ProxyUnavailable:
        return transport_error(self.endpoint, rpc, error)

    def _call(self, rpc: str, invoke: Callable[[], Any], idempotent: bool) -> Any:
        attempts = self.read_attempts if idempotent else 1
        for attempt in range(1, attempts + 1):
            try:
                return invoke()
            except grpc.RpcError as error:
                if attempt == attempts or error.code() not in _RETRYABLE:
                    raise self._unavailable(rpc, error) from error
                time.sleep(0.1 * 2**attempt)  # brief backoff: a proxy restarting
        raise AssertionError("unreachable")

    def _unary(self, rpc: str, request: object, idempotent: bool = True) -> Any:
        method = getattr(self._stub, rpc)
        return self._call(
            rpc,
            lambda: method(request, timeout=self.timeout_s, metadata=self._meta()),
            idempotent,
        )

    # -- route and offsets ----------------------------------------------------------------

    def query_route(self, topic: str) -> list[QueueRef]:
        response = self._unary("QueryRoute", codec.route_request(topic, self.endpoint))
        return codec.route_from_pb(response, topic)

    def query_offset(
        self, queue: QueueRef, policy: OffsetPolicy, timestamp_ms: int | None = None
    ) -> int:
        request = codec.query_offset_request(queue, policy, timestamp_ms)
        return codec.offset_from(
            self._unary("QueryOffset", request), f"QueryOffset({policy.value})"
        )

    def query_offsets(
        self, queues: Sequence[QueueRef], policy: OffsetPolicy, timestamp_ms: int | None = None
    ) -> dict[tuple[str, int], int]:
        """QueryOffset for many queues at once (concurrent calls): {(broker, id): offset}."""
        futures = []
        for queue in queues:
            request = codec.query_offset_request(queue, policy, timestamp_ms)
            futures.append(
                self._stub.QueryOffset.future(
                    request, timeout=self.timeout_s, metadata=self._meta()
                )
            )
        result: dict[tuple[str, int], int] = {}
        for queue, future in zip(queues, futures, strict=True):
            try:
                response = future.result()
            except grpc.RpcError:
                # One retry path for everyone: redo this queue with the retrying single call.
                result[queue.key] = self.query_offset(queue, policy, timestamp_ms)
                continue
            result[queue.key] = codec.offset_from(response, f"QueryOffset({policy.value})")
        return result

    def get_offset(self, group: str, queue: QueueRef) -> int:
        request = s.GetOffsetRequest(
            group=codec.resource(group), message_queue=codec.queue_to_pb(queue)
        )
        return codec.offset_from(self._unary("GetOffset", request), "GetOffset")

    def update_offset(self, group: str, queue: QueueRef, offset: int) -> None:
        request = s.UpdateOffsetRequest(
            group=codec.resource(group), message_queue=codec.queue_to_pb(queue), offset=offset
        )
        codec.check_status(self._unary("UpdateOffset", request).status, "UpdateOffset")

    # -- produce ----------------------------------------------------------------------------

    def send(self, messages: Sequence[Message]) -> list[SendReceipt]:
        return self.send_async(messages).result()

    def send_async(self, messages: Sequence[Message]) -> PendingSend:
        """Start one SendMessage (messages of one topic); keep several in flight to pipeline."""
        future = self._stub.SendMessage.future(
            codec.send_request(messages), timeout=self.timeout_s, metadata=self._meta()
        )
        return PendingSend(future, len(messages), lambda e: self._unavailable("SendMessage", e))

    # -- offset-based consumption --------------------------------------------------------

    def pull(
        self,
        queue: QueueRef,
        offset: int,
        batch_size: int = 32,
        long_polling_ms: int = 0,
        filter_expression: str = "*",
        group: str = "",
    ) -> PullResult:
        request = codec.pull_request(
            queue, offset, batch_size, long_polling_ms, filter_expression, group
        )
        timeout = self.timeout_s + long_polling_ms / 1000

        def invoke() -> PullResult:
            collector = codec.PullCollector(queue, offset)
            for response in self._stub.PullMessage(request, timeout=timeout, metadata=self._meta()):
                collector.add(response)
            return collector.result()

        return self._call("PullMessage", invoke, idempotent=True)

    # -- POP consumption --------------------------------------------------------------------

    def receive(
        self,
        group: str,
        queue: QueueRef,
        batch_size: int = 32,
        invisible_ms: int = 60_000,
        long_polling_ms: int = 5_000,
        filter_expression: str = "*",
    ) -> list[ReceivedMessage]:
        request = codec.receive_request(
            group, queue, batch_size, invisible_ms, long_polling_ms, filter_expression
        )
        timeout = self.timeout_s + long_polling_ms / 1000

        def invoke() -> list[ReceivedMessage]:
            collector = codec.ReceiveCollector(queue)
            for response in self._stub.ReceiveMessage(
                request, timeout=timeout, metadata=self._meta()
            ):
                collector.add(response)
            return collector.messages

        # Not retried: a receive that failed midway may have popped messages (they come back
        # after their invisible time), and the caller should know.
        return self._call("ReceiveMessage", invoke, idempotent=False)

    def ack(self, group: str, topic: str, entries: Sequence[tuple[str, str]]) -> list[AckOutcome]:
        response = self._unary("AckMessage", codec.ack_request(group, topic, entries))
        return codec.ack_outcomes(response)

    def change_invisible_duration(
        self, group: str, topic: str, message_id: str, receipt_handle: str, invisible_ms: int
    ) -> str:
        request = codec.change_invisible_request(
            group, topic, message_id, receipt_handle, invisible_ms
        )
        response = self._unary("ChangeInvisibleDuration", request, idempotent=False)
        codec.check_status(response.status, "ChangeInvisibleDuration")
        return response.receipt_handle
