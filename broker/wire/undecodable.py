"""Request bodies that do not decode: INVALID_ARGUMENT, one rate-limited log line, a metric.

grpcio answers a request its deserializer cannot parse with UNKNOWN and logs a full traceback
for each, so any client could flood the log. Here each method's deserializer is made tolerant:
a body that does not parse becomes an ``Undecodable`` marker, and the method answers
INVALID_ARGUMENT (the request never reaches the activities, which expect a parsed message).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc

from popmq.allocator import Trimmer
from popmq.clock import SYSTEM, Clock
from popmq.handing import called, hands_over

log = logging.getLogger(__name__)

LOG_INTERVAL_S = 10.0


@dataclass(slots=True, frozen=True)
class Undecodable:
    method: str
    error: str


@dataclass(slots=True, frozen=True)
class TooLarge(Undecodable):
    """A request of a method that takes only small ones, larger than their bound: refused
    RESOURCE_EXHAUSTED (as grpc refuses one over its receive limit) without decoding it. An
    ack of 1,024 entries of 64 KB handles decoded into 64 MB of strings, 8 at once grew a
    proxy by a gigabyte (issue 20, defect 10)."""


# Hands back what grpc's receive of a refused large request used (its buffers are freed when
# the call ends, just after the refusal): nothing else drains a budget for these requests.
_TRIMMER = Trimmer()


class _Reporter:
    """Counts refused bodies (``count(method, code name)``: undecodable INVALID_ARGUMENT,
    oversized RESOURCE_EXHAUSTED) and logs at most one WARNING line per interval."""

    def __init__(self, count: Callable[[str, str], None] | None, clock: Clock = SYSTEM) -> None:
        self._count = count
        self._time = clock
        self._next_log = 0.0
        self._suppressed = 0

    def __call__(self, bad: Undecodable) -> None:
        if self._count is not None:
            self._count(bad.method, _code(bad).name)
        now = self._time.monotonic()
        if now < self._next_log:
            self._suppressed += 1
            return
        log.warning(
            "%s %s request answered %s (%s); %d more since the last such line",
            "oversized" if isinstance(bad, TooLarge) else "undecodable", bad.method,
            _code(bad).name, bad.error, self._suppressed,
        )  # fmt: skip
        self._next_log = now + LOG_INTERVAL_S
        self._suppressed = 0


def _message(bad: Undecodable) -> str:
    if isinstance(bad, TooLarge):
        return f"the {bad.method} request is too large: {bad.error}"
    return f"the {bad.method} request body is not a valid protobuf message: {bad.error}"


def _code(bad: Undecodable) -> grpc.StatusCode:
    if isinstance(bad, TooLarge):
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    return grpc.StatusCode.INVALID_ARGUMENT


def _tolerant(
    method: str, parse: Callable[[bytes], Any] | None, most_bytes: int | None = None
) -> Callable[[bytes], Any]:
    def deserialize(data: bytes) -> Any:
        if most_bytes is not None and len(data) > most_bytes:
            _TRIMMER.released(len(data), drained=True)
            return TooLarge(method, f"{len(data)} bytes; this method takes at most {most_bytes}")
        try:
            return parse(data) if parse is not None else data
        except Exception as exc:
            return Undecodable(method, f"{type(exc).__name__}: {exc}"[:200])

    return deserialize


def _guard_unary_request(behavior: Callable[..., Any], report: _Reporter) -> Callable[..., Any]:
    if inspect.isasyncgenfunction(behavior):

        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            if isinstance(request, Undecodable):
                report(request)
                await context.abort(_code(request), _message(request))
            async for item in behavior(request, context):
                yield item

        return stream

    async def refuse(request: Undecodable, context: grpc.aio.ServicerContext) -> Any:
        report(request)
        await context.abort(_code(request), _message(request))

    behavior = called(behavior)

    # Hands the call over (popmq.handing): no frame of this check's is kept while the
    # behavior runs (a held long poll's).
    @hands_over
    def unary(request: Any, context: grpc.aio.ServicerContext) -> Awaitable[Any]:
        if isinstance(request, Undecodable):
            return refuse(request, context)
        return behavior(request, context)

    return unary


def _guard_request_stream(behavior: Callable[..., Any], report: _Reporter) -> Callable[..., Any]:
    async def checked(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
        async for request in requests:
            if isinstance(request, Undecodable):
                report(request)
                await context.abort(_code(request), _message(request))
            yield request

    if inspect.isasyncgenfunction(behavior):

        async def stream(requests: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            async for item in behavior(checked(requests, context), context):
                yield item

        return stream

    async def unary(requests: Any, context: grpc.aio.ServicerContext) -> Any:
        return await behavior(checked(requests, context), context)

    return unary


def tolerant_handlers(
    service: str,
    handlers: dict[str, grpc.RpcMethodHandler],
    report: _Reporter,
    small_request_bytes: int | None = None,
    large_methods: frozenset[str] = frozenset(),
) -> dict[str, grpc.RpcMethodHandler]:
    guarded: dict[str, grpc.RpcMethodHandler] = {}
    for name, handler in handlers.items():
        method = name
        most = None if name in large_methods else small_request_bytes
        parse = _tolerant(method, handler.request_deserializer, most)
        field = (
            ("stream_stream" if handler.response_streaming else "stream_unary")
            if handler.request_streaming
            else ("unary_stream" if handler.response_streaming else "unary_unary")
        )
        behavior = getattr(handler, field)
        wrap = _guard_request_stream if handler.request_streaming else _guard_unary_request
        guarded[name] = handler._replace(
            request_deserializer=parse, **{field: wrap(behavior, report)}
        )
    return guarded


class _Capture:
    """Stands in for the server while generated ``add_*_to_server`` code registers handlers."""

    def __init__(self) -> None:
        self.services: dict[str, dict[str, grpc.RpcMethodHandler]] = {}

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        pass  # rebuilt from the registered method handlers below

    def add_registered_method_handlers(
        self, service: str, handlers: dict[str, grpc.RpcMethodHandler]
    ) -> None:
        self.services[service] = handlers


def add_tolerant(
    add_to_server: Callable[[Any, Any], None],
    servicer: Any,
    server: grpc.aio.Server,
    count: Callable[[str, str], None] | None = None,
    decoders: dict[str, Callable[[bytes], Any]] | None = None,
    small_request_bytes: int | None = None,
    large_methods: frozenset[str] = frozenset(),
    *,
    registered: bool = True,
) -> None:
    """``add_XServicer_to_server(servicer, server)`` with tolerant request decoding;
    ``count(method, code name)`` is called for every refused body (a metric). ``decoders``: a
    method's own request deserializer in place of the generated one, by method name.
    ``small_request_bytes``: the bound of a request (a stream's each) of every method not in
    ``large_methods``; a larger one is refused RESOURCE_EXHAUSTED without being decoded.
    ``registered=False``: served by the generic handler only, for services rarely called
    (admin, health) and every service of the proxy (its edge finds each call's handler
    itself: popmq.proxy.grpc.edge). grpc.aio's server keeps one pending "next call" future
    per registered method and, for every call it accepts, runs asyncio.wait over all of them
    (a done callback added to and removed from each): the proxy's 50 registered methods cost
    each receive about 55 us more than one would; unregistered ones answer the same."""
    capture = _Capture()
    add_to_server(servicer, capture)
    report = _Reporter(count)
    for service, handlers in capture.services.items():
        for name, decode in (decoders or {}).items():
            if name in handlers:
                handlers[name] = handlers[name]._replace(request_deserializer=decode)
        guarded = tolerant_handlers(service, handlers, report, small_request_bytes,
                                    large_methods)  # fmt: skip
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, guarded),))
        if registered:
            server.add_registered_method_handlers(service, guarded)
