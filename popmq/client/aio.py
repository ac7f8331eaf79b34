"""AsyncClient: the proxy's apache.rocketmq.v2 protocol over grpc.aio.

For tools that live on an event loop (the CLI, benchmarks). One channel per client; close it
with ``await client.close()`` or ``async with AsyncClient(...)``. Requests and decoding are
ClientCore's (shared with the blocking Client); this module only waits on grpc.aio.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import grpc

from popmq.broker.contract.types import Message
from popmq.client.core import CHANNEL_OPTIONS, Call, ClientCore, StreamCall
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
from popmq.pb.rocketmq.v2 import service_pb2_grpc

T = TypeVar("T")

__all__ = ["CHANNEL_OPTIONS", "AsyncClient"]


class AsyncClient(ClientCore):
    def __init__(
        self, endpoint: str, timeout_s: float = 10.0, *, security: ClientSecurity | None = None
    ) -> None:
        super().__init__(endpoint, timeout_s, security=security)
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

    async def _run(self, call: Call[T]) -> T:
        method = getattr(self._stub, call.rpc)
        with map_rpc_errors(self.endpoint, call.rpc):
            response = await method(call.request, timeout=self.timeout_s, metadata=self._meta())
        return call.decode(response)

    async def _stream(self, call: StreamCall[Any, T]) -> T:
        collector = call.collector()
        method = getattr(self._stub, call.rpc)
        with map_rpc_errors(self.endpoint, call.rpc):
            async for response in method(
                call.request, timeout=call.timeout_s, metadata=self._meta()
            ):
                collector.add(response)
        return call.result(collector)

    # -- route and offsets ----------------------------------------------------------------

    async def query_route(self, topic: str) -> list[QueueRef]:
        return await self._run(self._query_route(topic))

    async def query_offset(
        self, queue: QueueRef, policy: OffsetPolicy, timestamp_ms: int | None = None
    ) -> int:
        return await self._run(self._query_offset(queue, policy, timestamp_ms))

    async def get_offset(self, group: str, queue: QueueRef) -> int:
        return await self._run(self._get_offset(group, queue))

    async def update_offset(self, group: str, queue: QueueRef, offset: int) -> None:
        await self._run(self._update_offset(group, queue, offset))

    # -- produce ----------------------------------------------------------------------------

    async def send(self, messages: Sequence[Message]) -> list[SendReceipt]:
        """Send messages of one topic in one request; one receipt per message."""
        return await self._run(self._send(messages))

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
        call = self._pull(queue, offset, batch_size, long_polling_ms, filter_expression, group)
        return await self._stream(call)

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
        call = self._receive(
            group, queue, batch_size, invisible_ms, long_polling_ms, filter_expression
        )
        return await self._stream(call)

    async def ack(
        self, group: str, topic: str, entries: Sequence[tuple[str, str]]
    ) -> list[AckOutcome]:
        """Ack (message_id, receipt_handle) pairs; one outcome per entry."""
        return await self._run(self._ack(group, topic, entries))

    async def change_invisible_duration(
        self, group: str, topic: str, message_id: str, receipt_handle: str, invisible_ms: int
    ) -> str:
        """Moves the message's next-visible time; returns the new receipt handle."""
        call = self._change_invisible_duration(
            group, topic, message_id, receipt_handle, invisible_ms
        )
        return await self._run(call)
