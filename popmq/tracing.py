"""OpenTelemetry tracing for popmq processes.

Spans are always created through the OpenTelemetry API (no-ops until a tracer provider is
installed, so they cost next to nothing when tracing is off). ``start_tracing`` installs one
that exports over OTLP (the ``popmq[otel]`` extra) and instruments gRPC servers and clients, so a
client's ``traceparent`` continues through the proxy into the broker.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractContextManager
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import grpc
from opentelemetry import propagate, trace

log = logging.getLogger(__name__)

# The standard variables that switch the OTLP exporter on without --otlp-endpoint.
OTEL_ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
_HEALTH = "grpc.health.v1.Health"
EXPORT_TIMEOUT_S = 2.0


class TracingUnavailable(RuntimeError):
    """Tracing is configured but the otel extra is not installed."""


@functools.cache  # importlib.metadata scans every installed distribution: 18% of a busy
def _version() -> str:  # proxy's CPU when looked up per span (py-spy, bench e2e cluster)
    try:
        return version("popmq")
    except PackageNotFoundError:
        return "unknown"


def tracer() -> trace.Tracer:
    """popmq's tracer (looked up per call: the provider may be installed after import)."""
    return trace.get_tracer("popmq", _version())


_provider_installed = False
# What ``start_span`` gives while no provider is installed: reusable, no context attached.
_NO_SPAN = contextlib.nullcontext(trace.INVALID_SPAN)


# Until a provider is set, OpenTelemetry's global for it stays None; get_tracer_provider()
# then looks the environment up for a provider to load (about 1.3 us, asked twice a receive).
# tracing_on() reads the global instead, and asks only once it is set, or if the environment
# named a provider when this module was imported (the API loads that one on first ask).
_GLOBAL_READABLE = hasattr(trace, "_TRACER_PROVIDER")
_PROVIDER_FROM_ENV = "OTEL_PYTHON_TRACER_PROVIDER" in os.environ


def tracing_on() -> bool:
    """Has a tracer provider been installed (start_tracing, or anyone's set_tracer_provider)?
    OpenTelemetry installs one at most once per process, so once True this stays True."""
    global _provider_installed
    if not _provider_installed:
        if _GLOBAL_READABLE and not _PROVIDER_FROM_ENV and trace._TRACER_PROVIDER is None:
            return False  # none set yet: no environment lookup per call
        provider = trace.get_tracer_provider()
        _provider_installed = not isinstance(provider, trace.ProxyTracerProvider)
    return _provider_installed


def start_span(
    name: str, attributes: dict[str, str | int] | None = None
) -> AbstractContextManager[trace.Span]:
    """``tracer().start_as_current_span(name, attributes=...)``, or, while no provider is
    installed, a shared no-op that yields the invalid span. The API's own no-op span still
    made a tracer, a generator context manager and a context attach per span: about 4 KiB
    held by each of 10,000 idle long polls (tracemalloc) and ~2% of a busy proxy's CPU."""
    if not tracing_on():
        return _NO_SPAN
    return tracer().start_as_current_span(name, attributes=attributes)


_servers_traced = False


def server_interceptors() -> list[grpc.aio.ServerInterceptor]:
    """Interceptors for a grpc.aio server: SERVER spans while tracing is on, else none (no
    cost per call)."""
    return [ServerSpans()] if _servers_traced else []


class ServerSpans(grpc.aio.ServerInterceptor):
    """A SERVER span per call, continuing the caller's traceparent.

    Written here because OpenTelemetry's aio server interceptor only handles streaming
    handlers that are async generators; popmq's ReceiveMessage streams with context.write().
    """

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        method = details.method or ""
        if handler is None or method.startswith(f"/{_HEALTH}/"):
            return handler
        for kind in ("unary_unary", "unary_stream", "stream_unary", "stream_stream"):
            behavior = getattr(handler, kind)
            if behavior is not None:
                return handler._replace(**{kind: _traced(behavior, method)})
        return handler


def link_span(method: str, carrier: dict[str, str]) -> Any:
    """The broker's SERVER span for one request that came on the request link (Call stream),
    continuing the proxy's CLIENT span as a unary call's metadata would."""
    service = "popmq.broker.v1.BrokerService"
    return tracer().start_as_current_span(
        f"/{service}/{method}", context=propagate.extract(carrier), kind=trace.SpanKind.SERVER,
        attributes={"rpc.system": "grpc", "rpc.service": service, "rpc.method": method},
    )  # fmt: skip


def _traced(behavior: Callable[..., Any], method: str) -> Callable[..., Any]:
    service, _, name = method.lstrip("/").rpartition("/")
    attributes = {"rpc.system": "grpc", "rpc.service": service, "rpc.method": name}

    def span(context: grpc.aio.ServicerContext) -> Any:
        carrier = {k: v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)}
        return tracer().start_as_current_span(
            method, context=propagate.extract(carrier), kind=trace.SpanKind.SERVER,
            attributes=attributes,
        )  # fmt: skip

    if inspect.isasyncgenfunction(behavior):

        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            with span(context):
                async for response in behavior(request, context):
                    yield response

        return stream

    async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
        with span(context):
            return await behavior(request, context)

    return call


_W3C = None


def link_to(trace_context: str) -> trace.Link | None:
    """A span link to the producer's span named by a message's W3C ``trace_context``."""
    global _W3C
    if not trace_context:
        return None
    if _W3C is None:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        _W3C = TraceContextTextMapPropagator()
    span = trace.get_current_span(_W3C.extract({"traceparent": trace_context}))
    context = span.get_span_context()
    return trace.Link(context) if context.is_valid else None


def current_traceparent() -> str:
    """The current span's W3C traceparent, or '' when no span is recording (tracing off)."""
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return ""
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def continue_from(trace_context: str) -> Any:
    """A context whose parent is the span a W3C ``trace_context`` names (None if it names
    none): a span started in it joins that span's trace."""
    link = link_to(trace_context)
    if link is None:
        return None
    return trace.set_span_in_context(trace.NonRecordingSpan(link.context))


def instrument_grpc(provider: trace.TracerProvider | None = None) -> Callable[[], None]:
    """Trace gRPC from now on: SERVER spans on servers created later (server_interceptors)
    and CLIENT spans, carrying the trace on, on every grpc.aio channel (health checks left
    out); returns the undo."""
    from opentelemetry.instrumentation.grpc import GrpcAioInstrumentorClient, filters

    global _servers_traced
    _servers_traced = True
    client = GrpcAioInstrumentorClient()
    client.instrument(
        tracer_provider=provider, filter_=filters.negate(filters.service_name(_HEALTH))
    )

    def undo() -> None:
        global _servers_traced
        _servers_traced = False
        client.uninstrument()

    return undo


def otlp_endpoint(configured: str | None) -> str | None:
    """The configured endpoint, else the standard OTEL_* variable's (None: tracing off)."""
    if configured:
        return configured
    return next((os.environ[v] for v in OTEL_ENDPOINT_VARS if os.environ.get(v)), None)


def start_tracing(endpoint: str | None, service_name: str) -> Callable[[], None] | None:
    """Export spans to the OTLP endpoint (gRPC) if one is configured; returns the shutdown
    (flushes what is buffered), or None when tracing stays off."""
    endpoint = otlp_endpoint(endpoint)
    if endpoint is None:
        return None
    try:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise TracingUnavailable(
            f"tracing to {endpoint} needs the otel extra: pip install 'popmq[otel]' ({exc.name})"
        ) from None
    # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES still win, as the spec says.
    resource = Resource.create({SERVICE_NAME: service_name, "service.version": _version()})
    provider = TracerProvider(resource=resource)
    # A collector that is down must not hold up a stop for long (spans are then lost).
    exporter = OTLPSpanExporter(endpoint=endpoint, timeout=EXPORT_TIMEOUT_S)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    undo = instrument_grpc(provider)
    log.info("tracing: spans of %s go to %s over OTLP", service_name, endpoint)

    def shutdown() -> None:
        undo()
        provider.shutdown()

    return shutdown
