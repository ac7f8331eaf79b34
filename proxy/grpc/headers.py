"""What a client tells us in gRPC metadata (x-mq-* headers) and the call's deadline, read into
the core's RequestContext."""

from __future__ import annotations

from contextvars import ContextVar

import grpc
from popmq.proxy.core.caller import CALLER
from popmq.proxy.core.context import RequestContext
from popmq.proxy.grpc.shared_names import shared_name

from popmq.clock import SYSTEM, Clock

__all__ = ["CALL_HEADERS", "RequestContext", "request_context", "text_headers"]


# The call's text headers as the access guard read them to authenticate it, in the call's own
# task (grpc.aio runs a call's interceptors and its handler in one task, each call in its
# own): the handler takes them once instead of having grpc build the metadata again.
CALL_HEADERS: ContextVar[dict[str, str] | None] = ContextVar("popmq_call_headers", default=None)


def text_headers(context: grpc.aio.ServicerContext) -> dict[str, str]:
    """The call's text headers by lower-case name (grpc.aio builds the metadata anew at each
    invocation_metadata(): read it once per call)."""
    read = CALL_HEADERS.get()
    if read is not None:
        CALL_HEADERS.set(None)  # taken once: nothing else of the call reads them later
        return read
    headers: dict[str, str] = {}
    for key, value in context.invocation_metadata() or ():
        if isinstance(value, bytes):  # binary (-bin) headers: not ours
            continue
        headers[key.lower()] = value
    return headers


def request_context(
    context: grpc.aio.ServicerContext,
    headers: dict[str, str] | None = None,
    clock: Clock = SYSTEM,
) -> RequestContext:
    if headers is None:
        headers = text_headers(context)
    remaining = context.time_remaining()
    # A client sends the same id, language, version, protocol and namespace on every call,
    # and a held long poll keeps its context for the whole poll: one shared string each
    # instead of a copy per held poll (shared_names.py).
    intern = shared_name
    return RequestContext(
        client_id=intern(headers.get("x-mq-client-id", "")),
        language=intern(headers.get("x-mq-language", "")),
        client_version=intern(headers.get("x-mq-client-version", "")),
        protocol=intern(headers.get("x-mq-protocol", "")),
        namespace=intern(headers.get("x-mq-namespace", "")),
        request_id=headers.get("x-mq-request-id", ""),
        peer=intern(context.peer() or ""),
        deadline=None if remaining is None else clock.monotonic() + remaining,
        caller=CALLER.get(),
        clock=clock,
    )
