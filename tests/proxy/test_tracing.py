"""OpenTelemetry: one client receive is one trace, from the client's traceparent through the
proxy (receive and long-poll phase spans, broker calls) into the broker's gRPC server.

A real proxy over gRPC to a real broker server, all traced by the gRPC instrumentation (the
otel extra) into an in-memory exporter."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import grpc
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from popmq.broker.contract.errors import Code
from popmq.broker.core import Broker
from popmq.broker.local import LocalBrokerPort
from popmq.broker.wire.remote import RemoteBrokerPort
from popmq.broker.wire.server import BrokerGrpcServer
from popmq.proxy.server import ProxyServer
from proxy_support import Cluster, make_config, unique

from popmq.pb.admin.v1 import admin_pb2 as a
from popmq.pb.admin.v1 import admin_pb2_grpc
from popmq.pb.rocketmq.v2 import service_pb2_grpc
from popmq.tracing import instrument_grpc

EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module")
def provider() -> Iterator[TracerProvider]:
    current = trace.get_tracer_provider()
    if isinstance(current, TracerProvider):  # set by an earlier module: add our exporter
        provider = current
    else:
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
    undo = instrument_grpc(provider)
    yield provider
    undo()


@pytest.fixture
async def remote_cluster(provider: TracerProvider, tmp_path: Path) -> AsyncIterator[Cluster]:
    """A proxy that reaches its broker over gRPC (both servers traced)."""
    config = make_config(tmp_path, **{"proxy.strategy": "notify"})
    broker = Broker(config.broker.model_copy(update={"name": "broker-0",
                                                     "data_dir": tmp_path / "b0"}))  # fmt: skip
    await broker.start()
    broker_server = BrokerGrpcServer(LocalBrokerPort(broker), "127.0.0.1", 0)
    await broker_server.start()
    port = RemoteBrokerPort("broker-0", f"127.0.0.1:{broker_server.bound_port}")
    await _connected(port)
    config.proxy.port = 0
    proxy = ProxyServer(config, [port])
    await proxy.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{proxy.port}")
    cluster = Cluster(config, [broker], proxy, channel,
                      service_pb2_grpc.MessagingServiceStub(channel),
                      client_id=f"trace@{uuid.uuid4().hex[:8]}")  # fmt: skip
    try:
        yield cluster
    finally:
        await channel.close()
        await proxy.aclose(0.2)
        await port.aclose()
        await broker_server.aclose(0.2)
        await broker.aclose()


async def _connected(port: RemoteBrokerPort) -> None:
    """Until the proxy's channel to the broker is up. Each connect attempt of the broker
    link gives up after about 250 ms (grpc.min_reconnect_backoff_ms in
    popmq.broker.wire.remote.CHANNEL_OPTIONS: fail fast, re-dial every second); on a loaded
    host the in-process broker's handshake took longer, the first call failed UNAVAILABLE
    ("tcp handshaker shutdown") and a test found no broker span in its trace. What these
    tests check starts once the link is up."""
    port._get_stub()
    assert port._channel is not None
    with anyio.fail_after(60):  # a failure bound only: attempts are re-dialled every second
        await port._channel.channel_ready()


def _trace_of(root: Any) -> list[ReadableSpan]:
    trace_id = root.get_span_context().trace_id
    return [s for s in EXPORTER.get_finished_spans() if s.context.trace_id == trace_id]


def _names(spans: list[ReadableSpan], kind: SpanKind | None = None) -> set[str]:
    return {s.name for s in spans if kind is None or s.kind == kind}


async def test_a_receive_is_one_trace_across_proxy_and_broker(remote_cluster: Cluster) -> None:
    cluster = remote_cluster
    topic, group = unique("traced"), unique("traced-group")
    await cluster.send(topic, b"hello")
    EXPORTER.clear()
    client_tracer = trace.get_tracer("the-client")
    # The client's own span: its traceparent travels in the gRPC metadata.
    with client_tracer.start_as_current_span("client receive") as root:  # ends at the message
        _, messages, _ = await cluster.receive(group, topic, poll_ms=4_000)  # (1 s: too short
    assert [m.body for m in messages] == [b"hello"]  # for a loaded host's first pop)
    spans = _trace_of(root)
    receive = "/apache.rocketmq.v2.MessagingService/ReceiveMessage"
    broker_pop = "/popmq.broker.v1.BrokerService/Pop"
    assert receive in _names(spans, SpanKind.SERVER)  # the proxy continued the client's trace
    assert {"popmq.receive", "popmq.broker.pop"} <= _names(spans)
    # The pop that found the message ran as the first pop or, when the broker's watch promised
    # an event first (the broker link), as the consume phase after it.
    phases = {"popmq.long_poll.first_pop", "popmq.long_poll.consume"}
    assert phases & _names(spans)
    assert broker_pop in _names(spans, SpanKind.CLIENT)  # the proxy -> broker hop
    assert broker_pop in _names(spans, SpanKind.SERVER)  # ... continued inside the broker
    by_id = {s.context.span_id: s for s in spans}

    def ancestors(span: ReadableSpan) -> list[str]:
        chain = []
        while span.parent is not None and span.parent.span_id in by_id:
            span = by_id[span.parent.span_id]
            chain.append(span.name)
        return chain

    server_pop = next(s for s in spans if s.name == broker_pop and s.kind == SpanKind.SERVER)
    chain = ancestors(server_pop)
    assert chain[:2] == [broker_pop, "popmq.broker.pop"]
    assert chain[2] in phases
    assert chain[-2:] == [receive, "client receive"]
    # the health checks stay out of traces
    assert not [s for s in EXPORTER.get_finished_spans() if "Health" in s.name]


async def test_an_empty_long_poll_shows_its_notify_wait(remote_cluster: Cluster) -> None:
    cluster = remote_cluster
    topic, group = unique("traced-empty"), unique("traced-group")
    await cluster.send(topic, b"x")
    # A poll long enough for a loaded host (it ends at the message): with 300 ms the first
    # pop could come too late, the message stayed, and the empty receive below got it.
    _, got, _ = await cluster.receive(group, topic, poll_ms=4_000)
    assert len(got) == 1
    await cluster.ack(group, topic, *got)
    EXPORTER.clear()
    with trace.get_tracer("the-client").start_as_current_span("client receive") as root:
        _, messages, _ = await cluster.receive(group, topic, poll_ms=300)
    assert messages == []
    names = _names(_trace_of(root))
    # The wait for a broker's event is its own span; over the broker link an idle group
    # costs the brokers no call (the watch stream tells the proxy when something arrives).
    assert {"popmq.receive", "popmq.long_poll.notify_wait"} <= names


async def test_message_trace_context_links_producer_and_consumer(remote_cluster: Cluster) -> None:
    """A message's trace_context (the producer's span) is kept with the message, handed to the
    consumer, and linked from the proxy's send and receive spans."""
    from proxy_support import message

    from popmq.pb.rocketmq.v2 import service_pb2 as s

    cluster = remote_cluster
    topic, group = unique("traced-msg"), unique("traced-group")
    with trace.get_tracer("the-producer").start_as_current_span("produce") as produce:
        ctx = produce.get_span_context()
        traceparent = f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-01"
    sent = message(topic, b"traced")
    sent.system_properties.trace_context = traceparent
    EXPORTER.clear()
    response = await cluster.stub.SendMessage(
        s.SendMessageRequest(messages=[sent]), metadata=cluster.metadata(), timeout=5
    )
    assert response.status.code == 20000
    # Receive until the message comes: one short poll may end empty on a loaded machine (the
    # bound only limits a failure).
    received: list[Any] = []
    async with asyncio.timeout(30):
        while not received:
            _, received, _ = await cluster.receive(group, topic, poll_ms=2_000)
    assert [m.system_properties.trace_context for m in received] == [traceparent]
    linked = {
        span.name
        for span in EXPORTER.get_finished_spans()
        for link in span.links
        if (link.context.trace_id, link.context.span_id) == (ctx.trace_id, ctx.span_id)
    }
    assert linked == {"popmq.send", "popmq.receive"}


async def test_the_separate_admin_port_is_traced(provider: TracerProvider, tmp_path: Path) -> None:
    """proxy.admin_port: the admin API's own server continues the caller's trace too."""
    config = make_config(tmp_path, **{"proxy.admin_port": 0})
    broker = Broker(config.broker.model_copy(update={"name": "broker-0",
                                                     "data_dir": tmp_path / "b0"}))  # fmt: skip
    await broker.start()
    config.proxy.port = 0
    proxy = ProxyServer(config, [LocalBrokerPort(broker)])
    await proxy.start()
    try:
        assert proxy.admin_port and proxy.admin_port != proxy.port
        EXPORTER.clear()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{proxy.admin_port}") as channel:
            admin = admin_pb2_grpc.AdminServiceStub(channel)
            with trace.get_tracer("the-operator").start_as_current_span("admin call") as root:
                listed = await admin.ListTopics(a.ListTopicsRequest())
        assert listed.status.code == 20000
        method = "/popmq.admin.v1.AdminService/ListTopics"
        assert method in _names(_trace_of(root), SpanKind.SERVER)
    finally:
        await proxy.aclose(0.2)
        await broker.aclose()


def test_the_tracer_does_not_scan_installed_packages_per_span(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Regression: tracer() looked the package version up per span (importlib.metadata scans
    every installed distribution), 18% of a busy cluster proxy's CPU under py-spy."""
    import popmq.tracing as tracing

    lookups: list[str] = []

    def counting(name: str) -> str:
        lookups.append(name)
        return "1.0"

    monkeypatch.setattr(tracing, "version", counting)
    tracing._version.cache_clear()
    try:
        for _ in range(3):
            tracing.tracer()
        assert lookups == ["popmq"]
    finally:
        tracing._version.cache_clear()


async def test_the_request_link_carries_the_trace_per_request(remote_cluster: Cluster) -> None:
    """Requests multiplexed on the broker link (one Call stream) still continue the caller's
    trace: a CLIENT span on the proxy, a SERVER span inside the broker, parent and child."""
    topic = unique("traced-send")
    for attempt in range(2):  # the second request rides the stream the first one opened
        EXPORTER.clear()
        with trace.get_tracer("the-client").start_as_current_span(f"send {attempt}") as root:
            sent = await remote_cluster.send(topic, b"x")
        assert sent.status.code == Code.OK, sent.status  # else the spans below are not there
        spans = _trace_of(root)
        send = "/popmq.broker.v1.BrokerService/Send"
        client = next(s for s in spans if s.name == send and s.kind == SpanKind.CLIENT)
        server = next(s for s in spans if s.name == send and s.kind == SpanKind.SERVER)
        assert server.parent is not None and server.parent.span_id == client.context.span_id
