"""Client: the same protocol over grpc's blocking API.

For code without an event loop: Spark tasks and the Spark driver run it. Requests and decoding
are ClientCore's (shared with AsyncClient). On top, this client retries reads on a transport
failure (they are idempotent; sends and receives are not, so those raise and the caller, a
Spark task, decides), pipelines sends (send_async) and queries many offsets at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import grpc
import grpc.experimental

from popmq.broker.contract.types import Message
from popmq.client.core import CHANNEL_OPTIONS, Call, ClientCore, StreamCall
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
from popmq.pb.rocketmq.v2 import service_pb2_grpc

T = TypeVar("T")

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

    def __init__(
        self,
        future: grpc.Future,
        decode: Callable[[Any], list[SendReceipt]],
        on_error: Callable[[Any], Exception],
    ) -> None:
        self._future = future
        self._decode = decode
        self._on_error = on_error

    def result(self) -> list[SendReceipt]:
        try:
            response = self._future.result()
        except grpc.RpcError as error:
            raise self._on_error(error) from error
        return self._decode(response)


class Client(ClientCore):
    def __init__(
        self,
        endpoint: str,
        timeout_s: float = 10.0,
        read_attempts: int = 3,
        *,
        security: ClientSecurity | None = None,
    ) -> None:
        super().__init__(endpoint, timeout_s, security=security)
        self.read_attempts = max(1, read_attempts)
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

    def _unavailable(self, rpc: str, error: grpc.RpcError) -> ProxyUnavailable:
        return transport_error(self.endpoint, rpc, error)

    def _retrying(self, rpc: str, invoke: Callable[[], T], idempotent: bool) -> T:
        attempts = self.read_attempts if idempotent else 1
        for attempt in range(1, attempts + 1):
            try:
                return invoke()
            except grpc.RpcError as error:
                if attempt == attempts or error.code() not in _RETRYABLE:
                    raise self._unavailable(rpc, error) from error
                time.sleep(0.1 * 2**attempt)  # brief backoff: a proxy restarting
        raise AssertionError("unreachable")

    def _run(self, call: Call[T]) -> T:
        method = getattr(self._stub, call.rpc)
        response = self._retrying(
            call.rpc,
            lambda: method(call.request, timeout=self.timeout_s, metadata=self._meta()),
            call.idempotent,
        )
        return call.decode(response)

    def _stream(self, call: StreamCall[Any, T]) -> T:
        method = getattr(self._stub, call.rpc)

        def invoke() -> T:
            collector = call.collector()  # a retry starts over
            for response in method(call.request, timeout=call.timeout_s, metadata=self._meta()):
                collector.add(response)
            return call.result(collector)

        return self._retrying(call.rpc, invoke, call.idempotent)

    # -- route and offsets ----------------------------------------------------------------

    def query_route(self, topic: str) -> list[QueueRef]:
        return self._run(self._query_route(topic))

    def query_offset(
        self, queue: QueueRef, policy: OffsetPolicy, timestamp_ms: int | None = None
    ) -> int:
        return self._run(self._query_offset(queue, policy, timestamp_ms))

    def query_offsets(
        self, queues: Sequence[QueueRef], policy: OffsetPolicy, timestamp_ms: int | None = None
    ) -> dict[tuple[str, int], int]:
        """QueryOffset for many queues at once (concurrent calls): {(broker, id): offset}."""
        calls = [self._query_offset(queue, policy, timestamp_ms) for queue in queues]
        futures = [
            self._stub.QueryOffset.future(
                call.request, timeout=self.timeout_s, metadata=self._meta()
            )
            for call in calls
        ]
        result: dict[tuple[str, int], int] = {}
        for queue, call, future in zip(queues, calls, futures, strict=True):
            try:
                response = future.result()
            except grpc.RpcError:
                # One retry path for everyone: redo this queue with the retrying single call.
                result[queue.key] = self._run(call)
                continue
            result[queue.key] = call.decode(response)
        return result

    def get_offset(self, group: str, queue: QueueRef) -> int:
        return self._run(self._get_offset(group, queue))

    def update_offset(self, group: str, queue: QueueRef, offset: int) -> None:
        self._run(self._update_offset(group, queue, offset))

    # -- produce ----------------------------------------------------------------------------

    def send(self, messages: Sequence[Message], transactional: bool = False) -> list[SendReceipt]:
        return self.send_async(messages, transactional).result()

    def send_async(self, messages: Sequence[Message], transactional: bool = False) -> PendingSend:
        """Start one SendMessage (messages of one topic); keep several in flight to pipeline.
        Transactional messages stay half messages until end_transaction decides each."""
        call = self._send(messages, transactional)
        future = self._stub.SendMessage.future(
            call.request, timeout=self.timeout_s, metadata=self._meta()
        )
        return PendingSend(future, call.decode, lambda e: self._unavailable(call.rpc, e))

    def end_transaction(
        self,
        topic: str,
        message_id: str,
        transaction_id: str,
        commit: bool,
        from_check: bool = False,
    ) -> None:
        """EndTransaction COMMIT (commit=True) or ROLLBACK of one half message."""
        self._run(self._end_transaction(topic, message_id, transaction_id, commit, from_check))

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
        call = self._pull(queue, offset, batch_size, long_polling_ms, filter_expression, group)
        return self._stream(call)

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
        call = self._receive(
            group, queue, batch_size, invisible_ms, long_polling_ms, filter_expression
        )
        return self._stream(call)

    def ack(self, group: str, topic: str, entries: Sequence[tuple[str, str]]) -> list[AckOutcome]:
        return self._run(self._ack(group, topic, entries))

    def change_invisible_duration(
        self, group: str, topic: str, message_id: str, receipt_handle: str, invisible_ms: int
    ) -> str:
        call = self._change_invisible_duration(
            group, topic, message_id, receipt_handle, invisible_ms
        )
        return self._run(call)
