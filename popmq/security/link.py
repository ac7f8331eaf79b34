"""The proxy-to-broker link: only proxies may use a broker port.

A broker admits a call when the connection passed mutual TLS (``broker.tls.client_ca``) and/or
when the call carries the cluster token (``x-popmq-cluster-token``, read from
``broker.cluster_token_file``); a broker with neither is open and says so at start. The health
service stays open so that probes need no secret. The proxy side adds the token to every call
(a client interceptor) and uses TLS when ``proxy.broker_link.tls`` is on.

Used by broker/wire/server.py (``server_interceptors``, ``add_port``) and broker/wire/remote.py
(``broker_channel``): one call each, so the transport code stays the link's business.
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc

from popmq.config import BrokerConfig, BrokerLinkConfig
from popmq.security.files import warn_if_exposed
from popmq.security.tls import channel_credentials, server_credentials

log = logging.getLogger(__name__)

TOKEN_HEADER = "x-popmq-cluster-token"
_OPEN_PREFIXES = ("/grpc.health.v1.Health/",)
_LOG_EVERY_S = 60.0


def read_token(path: Path) -> str:
    """The cluster token in a file (surrounding whitespace ignored); at least 16 characters."""
    try:
        token = Path(path).read_text().strip()
    except OSError as exc:
        raise ValueError(f"cannot read the cluster token file {path}: {exc.strerror}") from None
    if len(token) < 16:
        raise ValueError(f"the cluster token in {path} is too short (at least 16 characters)")
    warn_if_exposed(path, "cluster token file")
    return token


# -- broker side ------------------------------------------------------------------------------


class ClusterTokenGuard(grpc.aio.ServerInterceptor):
    """Refuses (UNAUTHENTICATED) every call but health checks that lacks the cluster token."""

    def __init__(self, token: str) -> None:
        self._token = token.encode()
        self.refused = 0
        self._logged_at = -_LOG_EVERY_S
        self._logged_count = 0

    def _admitted(self, metadata: Sequence[Any] | None) -> bool:
        for key, value in metadata or ():
            if key == TOKEN_HEADER:
                given = value if isinstance(value, bytes) else str(value).encode()
                return hmac.compare_digest(given, self._token)
        return False

    async def intercept_service(self, continuation: Any, details: Any) -> Any:
        handler = await continuation(details)
        if handler is None or details.method.startswith(_OPEN_PREFIXES):
            return handler
        if self._admitted(details.invocation_metadata):
            return handler
        self.refused += 1
        now = time.monotonic()
        if now - self._logged_at >= _LOG_EVERY_S:  # someone probes the port: say so, rarely
            log.warning(
                "refused %d call(s) without the cluster token on the broker port (latest: %s); "
                "only proxies may call it",
                self.refused - self._logged_count,
                details.method,
            )
            self._logged_at, self._logged_count = now, self.refused
        return _refusing(handler)


def _refusing(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """A handler that refuses without reading the request.

    grpc.aio receives (buffers whole) and decodes a unary request before calling the handler,
    so a refusal registered as unary would still take in whatever a stranger sends, up to the
    port's receive limit. Registered as request-streaming with no deserializer, nothing is
    read: the status goes out and grpc resets the stream, whatever the method's real kind."""

    async def refuse(_requests: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(
            grpc.StatusCode.UNAUTHENTICATED, "this port accepts only popmq proxies (cluster token)"
        )

    # A unary-response method answers once; a stream-response one may end with no answer.
    make = (
        grpc.stream_stream_rpc_method_handler
        if handler.response_streaming
        else grpc.stream_unary_rpc_method_handler
    )
    return make(refuse, request_deserializer=None, response_serializer=handler.response_serializer)


def server_interceptors(config: BrokerConfig) -> list[grpc.aio.ServerInterceptor]:
    if config.cluster_token_file is None:
        return []
    return [ClusterTokenGuard(read_token(config.cluster_token_file))]


def add_port(server: grpc.aio.Server, address: str, config: BrokerConfig) -> int:
    """Bind the broker port: TLS when configured, else plaintext. Warns once if open."""
    tls = config.tls
    if config.cluster_token_file is None and tls.client_ca is None:
        log.warning(
            "broker %s: the broker port %s is OPEN to anyone who can reach it (no cluster "
            "token, no mutual TLS); set broker.cluster_token_file or broker.tls.client_ca",
            config.name,
            address,
        )
    credentials = server_credentials(tls.cert, tls.key, tls.client_ca)
    if credentials is None:
        return int(server.add_insecure_port(address))
    return int(server.add_secure_port(address, credentials))


# -- proxy side -------------------------------------------------------------------------------


class _TokenInterceptor:
    """Adds the cluster token to every call of a channel (one subclass per call kind below:
    grpc.aio files an interceptor under the FIRST kind it implements only, so one class
    implementing all four would leave streaming calls -- Watch, Call -- without the token)."""

    def __init__(self, token: str) -> None:
        self._token = token

    def _with_token(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*(details.metadata or ()))
        metadata.add(TOKEN_HEADER, self._token)
        return grpc.aio.ClientCallDetails(
            details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
        )


class _UnaryUnaryToken(_TokenInterceptor, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._with_token(details), request)


class _UnaryStreamToken(_TokenInterceptor, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._with_token(details), request)


class _StreamUnaryToken(_TokenInterceptor, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(self._with_token(details), requests)


class _StreamStreamToken(_TokenInterceptor, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(self._with_token(details), requests)


def token_interceptors(token: str) -> list[grpc.aio.ClientInterceptor]:
    """The cluster token on every kind of call."""
    kinds = (_UnaryUnaryToken, _UnaryStreamToken, _StreamUnaryToken, _StreamStreamToken)
    return [kind(token) for kind in kinds]


def broker_channel(
    address: str, options: Sequence[tuple[str, Any]], link: BrokerLinkConfig | None
) -> grpc.aio.Channel:
    """A channel to a broker port, with TLS and the cluster token as configured."""
    if link is None:
        return grpc.aio.insecure_channel(address, options=list(options))
    interceptors = (
        token_interceptors(read_token(link.cluster_token_file))
        if link.cluster_token_file is not None
        else None
    )
    opts = list(options)
    if not link.tls:
        return grpc.aio.insecure_channel(address, options=opts, interceptors=interceptors)
    if link.server_name:
        opts.append(("grpc.ssl_target_name_override", link.server_name))
    credentials = channel_credentials(link.ca, link.cert, link.key)
    return grpc.aio.secure_channel(address, credentials, options=opts, interceptors=interceptors)
