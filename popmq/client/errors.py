"""Errors the client raises, under popmq's one tree (popmq.errors).

A proxy's non-OK status is a ProxyError (a refusal: RefusedError). A gRPC transport failure is a
ProxyUnavailable (a TransportError, not a refusal), or ProxyTimeout when the deadline passed.
map_rpc_errors is the one place that turns grpc's errors (async or blocking) into these.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import grpc

from popmq.errors import Code, DeadlineError, RefusedError, TransportError


class ProxyError(RefusedError):
    """A request the proxy answered with a non-OK status (code is the RocketMQ Code)."""

    def __init__(self, code: Code | int, message: str, rpc: str = "") -> None:
        raw_code = int(code)
        try:
            known = Code(raw_code)
        except ValueError:  # a code this popmq does not name: keep the number in the text
            known, message = Code.INTERNAL_ERROR, f"[code {raw_code}] {message}"
        prefix = f"{rpc}: " if rpc else ""
        super().__init__(known, f"{prefix}{message}")
        self.rpc = rpc
        self.raw_code = raw_code


class ProxyUnavailable(TransportError):
    """The proxy could not be reached or did not answer in time (a gRPC transport error)."""

    code = Code.INTERNAL_ERROR

    def __init__(self, endpoint: str, rpc: str, detail: str, timed_out: bool = False) -> None:
        what = "timed out" if timed_out else "failed"
        message = f"{rpc}: call to popmq proxy at {endpoint} {what}: {detail}"
        super().__init__(endpoint, message)
        self.endpoint = endpoint
        self.rpc = rpc
        self.timed_out = timed_out


class ProxyTimeout(ProxyUnavailable, DeadlineError):
    """The proxy did not answer before the call's deadline."""

    code = Code.PROXY_TIMEOUT

    def __init__(self, endpoint: str, rpc: str, detail: str) -> None:
        super().__init__(endpoint, rpc, detail, timed_out=True)


def transport_error(endpoint: str, rpc: str, error: grpc.RpcError) -> ProxyUnavailable:
    """The popmq error for a failed gRPC call (grpc.aio's or the blocking API's)."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    details = error.details() if hasattr(error, "details") else str(error)
    detail = f"{code.name} {details or ''}".strip()
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return ProxyTimeout(endpoint, rpc, detail)
    return ProxyUnavailable(endpoint, rpc, detail)


@contextmanager
def map_rpc_errors(endpoint: str, rpc: str) -> Iterator[None]:
    """Raise a failed gRPC call as ProxyUnavailable / ProxyTimeout."""
    try:
        yield
    except grpc.RpcError as error:
        raise transport_error(endpoint, rpc, error) from error
