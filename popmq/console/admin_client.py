"""Calls to a proxy's AdminService, signed with the console user's keys.

Refusals come back as ConsoleError with the RocketMQ Code's name and an HTTP status, so the
JSON API and the pages answer them the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from popmq.errors import Code
from popmq.pb.admin.v1 import admin_pb2_grpc
from popmq.security.signature import signed_metadata

TIMEOUT_S = 10.0

# RocketMQ codes -> HTTP statuses (the Code values are HTTP-like: 40000 BAD_REQUEST, ...).
_HTTP: dict[int, int] = {
    Code.UNAUTHORIZED: 401,
    Code.FORBIDDEN: 403,
}


@dataclass(frozen=True)
class Credentials:
    access_key: str
    secret_key: str

    def __repr__(self) -> str:  # never in a log or a traceback
        return f"Credentials({self.access_key!r}, ***)"


@dataclass(frozen=True)
class AdminTarget:
    """Where the proxy's admin API is, and how to reach it."""

    endpoint: str
    tls: bool = False
    tls_ca: str | None = None


class ConsoleError(Exception):
    def __init__(
        self, http_status: int, code: str, message: str, retry_after: int | None = None
    ) -> None:
        super().__init__(message)
        self.http_status = http_status
        self.code = code
        self.message = message
        self.retry_after = retry_after  # seconds, for a 429's Retry-After


def http_status_of(code: int) -> int:
    if code in _HTTP:
        return _HTTP[code]
    if code in (Code.TOPIC_NOT_FOUND, Code.CONSUMER_GROUP_NOT_FOUND, Code.MESSAGE_NOT_FOUND):
        return 404
    if 40000 <= code < 50000:
        return 400
    return 502  # the proxy or a broker failed: not the console's user's mistake


class AdminClient:
    """One gRPC channel to the proxy for the console's lifetime."""

    def __init__(self, target: AdminTarget) -> None:
        self.target = target
        if target.tls or target.tls_ca:
            ca = Path(target.tls_ca).read_bytes() if target.tls_ca else None
            credentials = grpc.ssl_channel_credentials(root_certificates=ca)
            self._channel = grpc.aio.secure_channel(target.endpoint, credentials)
        else:
            self._channel = grpc.aio.insecure_channel(target.endpoint)
        self._stub = admin_pb2_grpc.AdminServiceStub(self._channel)  # type: ignore[no-untyped-call]

    async def close(self) -> None:
        await self._channel.close()

    async def call(self, method: str, request: Any, credentials: Credentials | None) -> Any:
        """The response, or ConsoleError for a refusal or an unreachable proxy."""
        metadata = None
        if credentials is not None:
            metadata = signed_metadata(credentials.access_key, credentials.secret_key)
        try:
            response = await getattr(self._stub, method)(
                request, timeout=TIMEOUT_S, metadata=metadata
            )
        except grpc.aio.AioRpcError as exc:
            raise ConsoleError(
                503, "UNAVAILABLE", f"cannot reach {self.target.endpoint}: {exc.code().name}"
            ) from None
        code = response.status.code
        if code != Code.OK:
            try:
                name = Code(code).name
            except ValueError:
                name = str(code)
            raise ConsoleError(http_status_of(code), name, response.status.message)
        return response
