"""AsyncClient: the proxy's apache.rocketmq.v2 protocol over grpc.aio.

For tools that live on an event loop (the CLI, benchmarks). One channel per client; close it
with ``await client.close()`` or ``async with AsyncClient(...)``.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from popmq.broker.api.types import Message
from popmq.client import codec
from popmq.client.errors import map_rpc_errors
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

CHANNEL_OPTIONS = (
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.max_send_message_length", 64 << 20),
)


class AsyncClient:
    def __init__(
        self, endpoint: str, timeout_s: float = 10.0, *, security: ClientSecurity | None = None
    ) -> None:
        host, port = codec.parse_endpoint(endpoint)
        self.security = security or ClientSecurity()
        self.endpoint = f"{host}:{port}"
        self.timeout_s = timeout_s
        self.client_id = codec.new_client_id()
        credentials = self.security.credentials()
        self._channel = (
            grpc.aio.secure_channel(self.endpoint, credentials, options=CHANNEL_OPTIONS)
            if credentials is not None
            else grpc.aio.insecure_channel(self.endpoint, options=CHANNEL_OPTIONS)
        )
        self._stub = service_pb2_grpc.MessagingServiceStub(self._channel)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    def _meta(self) -> tuple[tuple[str, str], ...]:
        return codec.call_metadata(self.client_id) + self.security.signature()

    async def _unary(self, rpc: str, request: object, timeout_s: float | None = None) -> object:
        method = getattr(self._stub, rpc)
        with map_rpc_errors(self.endpoint, rpc):
            return await method(request, timeout=timeout_s or self.timeout_s, metadata=self._meta())

    # -- route and offsets ----------------------------------------------------------------

    async def query_route(self, topic: str) -> list[QueueRef]:
        response = await self._unary("QueryRoute", codec.route_request(topic, self.endpoint))
        return codec.route_from_pb(response, topic)  # type: ignore[arg-type]

    async def query_offset(
        self, queue: QueueRef, policy: OffsetPolicy, timestamp_ms: int | None = None
    ) -> int:
        request = codec.query_offset_request(queue, policy, timestamp_ms)
        response = await self._unary("QueryOffset", request)
        return codec.offset_from(response, f"QueryOffset({policy.value})")  # type: ignore[arg-type]

    async def get_offset(self, group: str, queue: QueueRef) -> int:
        request = s.GetOffsetRequest(
            group=codec.resource(group), message_queue=codec.queue_to_pb(queue)
        )
        response = await self._unary("GetOffset", request)
        return codec.offset_from(response, "GetOffset")  # type: ignore[arg-type]

    async def update_offset(self, group: str, queue: QueueRef, offset: int) -> None:
        request = s.UpdateOffsetRequest(
            group=codec.resource(group), message_queue=codec.queue_to_pb(queue), offset=offset
        )
        response = await self._unary("UpdateOffset", request)
        codec.check_status(response.status, "UpdateOffset")  # type: ignore[attr-defined]

    # -- produce ----------------------------------------------------------------------------

    async def send(self, messages: Sequence[Message]) -> list[SendReceipt]:
        """Send messages of one topic in one request; one receipt per message."""
        response = await self._unary("SendMessage", codec.send_request(messages))
        return codec.send_receipts(response, len(messages))  # type: ignore[arg-type]

    # -- offset-based consumption --------------------------------------------------------

    async def pull(
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
        collector = codec.PullCollector(queue, offset)
        timeout = self.timeout_s + long_polling_ms / 1000
        with map_rpc_errors(self.endpoint, "PullMessage"):
            async for response in self._stub.PullMessage(
                request, timeout=timeout, metadata=self._meta()
            ):
                collector.add(response)
        return collector.result()

    # -- POP consumption --------------------------------------------------------------------

    async def receive(
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
        collector = codec.ReceiveCollector(queue)
        timeout = self.timeout_s + long_polling_ms / 1000
        with map_rpc_errors(self.endpoint, "ReceiveMessage"):
            async for response in self._stub.ReceiveMessage(
                request, timeout=timeout, metadata=self._meta()
            ):
                collector.add(response)
        return collector.messages

    async def ack(
        self, group: str, topic: str, entries: Sequence[tuple[str, str]]
    ) -> list[AckOutcome]:
        """Ack (message_id, receipt_handle) pairs; one outcome per entry."""
        response = await self._unary("AckMessage", codec.ack_request(group, topic, entries))
        return codec.ack_outcomes(response)  # type: ignore[arg-type]

    async def change_invisible_duration(
        self, group: str, topic: str, message_id: str, receipt_handle: str, invisible_ms: int
    ) -> str:
        """Moves the message's next-visible time; returns the new receipt handle."""
        request = codec.change_invisible_request(
            group, topic, message_id, receipt_handle, invisible_ms
        )
        response = await self._unary("ChangeInvisibleDuration", request)
        codec.check_status(response.status, "ChangeInvisibleDuration")  # type: ignore[attr-defined]
        return response.receipt_handle  # type: ignore[attr-defined]
