"""The per-receive cuts of issue 18 (docs/benchmarks.md, "Receive cost"): each keeps
the behaviour it replaces. In process; virtual time."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from google.protobuf.duration_pb2 import Duration
from popmq.broker.contract.types import FILTER_SQL92, FilterExpression, PopRequest
from popmq.proxy.admission import LongPollAdmission
from popmq.proxy.core.caller import Caller
from popmq.proxy.core.context import RequestContext
from popmq.proxy.core.receive import ReceiveRequest
from popmq.proxy.grpc import servicer as servicer_module
from popmq.proxy.grpc.headers import CALL_HEADERS, text_headers
from popmq.proxy.grpc.namespace import NamespaceInterceptor, _Context, _resources
from popmq.proxy.longpoll.watches import WatchRegistry
from popmq.proxy.metrics import ProxyMetrics
from popmq.proxy.server import ProxyServer
from proxy_support import StubContext, served_servicer

from popmq.config import ProxyConfig
from popmq.pb.rocketmq.v2 import definition_pb2 as pb
from popmq.pb.rocketmq.v2 import service_pb2 as s

pytestmark = pytest.mark.looptime
_THIRTY_S = Duration(seconds=30)


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[ProxyServer]:
    async with served_servicer(tmp_path, "notify") as (server, _):
        yield server


async def test_a_receive_on_a_cached_route_asks_the_acl_nothing(server: ProxyServer) -> None:
    # Whether the caller may create the topic matters only to a route lookup that misses the
    # cache; it was asked (an ACL walk) on every receive.
    asked: list[str] = []

    def may_create(topic: str) -> bool:
        asked.append(topic)
        return True

    ctx = RequestContext(client_id="c@1", caller=Caller("k", may_create_topic=may_create))
    request = ReceiveRequest(group="g", topic="t", batch_size=8, invisible_time=_THIRTY_S)
    first = await server.core.receiver.plan(request, ctx)
    assert asked == ["t"]  # the first lookup asks the brokers, on the caller's terms
    again = await server.core.receiver.plan(request, ctx)
    assert asked == ["t"]  # cached: not asked again
    assert [p.name for p in again.brokers] == [p.name for p in first.brokers]


async def test_a_refused_creator_still_creates_no_topic(server: ProxyServer) -> None:
    ctx = RequestContext(caller=Caller("k", may_create_topic=lambda topic: False))
    request = ReceiveRequest(group="g", topic="never-made", batch_size=8, invisible_time=_THIRTY_S)
    with pytest.raises(Exception) as refused:
        await server.core.receiver.plan(request, ctx)
    assert "never-made" in str(refused.value)
    assert server.cluster.cached_route("never-made") is None


def test_the_held_polls_gauge_is_read_when_scraped() -> None:
    metrics = ProxyMetrics()
    admission = LongPollAdmission(ProxyConfig(), metrics)
    admission.enter("c", "g")
    admission.enter("c", "g")
    admission.leave("c", "g")
    assert metrics.registry.get_sample_value("popmq_proxy_active_long_polls") == 1


def _with_namespaces(request: object, spots: dict[int, str]) -> None:
    for index, (resource, _) in enumerate(_resources(request)):  # type: ignore[arg-type]
        resource.resource_namespace = spots.get(index, "")


@pytest.mark.parametrize(
    "request_type",
    [s.ReceiveMessageRequest, s.AckMessageRequest, s.QueryRouteRequest, s.PullMessageRequest],
)
@pytest.mark.parametrize("spots", [{}, {0: "a"}, {1: "b"}, {0: "a", 1: "b"}])
def test_the_namespace_read_along_fixed_paths_is_the_walks(
    request_type: type, spots: dict[int, str]
) -> None:
    request = request_type()
    # Every Resource present (the walk visits only set fields), then some namespaced.
    for field in ("group", "topic"):
        if field in request.DESCRIPTOR.fields_by_name:
            getattr(request, field).name = "x"
    if "message_queue" in request.DESCRIPTOR.fields_by_name:
        request.message_queue.topic.name = "x"
    _with_namespaces(request, spots)
    walked = next(
        (r.resource_namespace for r, _ in _resources(request) if r.resource_namespace), ""
    )
    assert NamespaceInterceptor._namespace_of(request, "header") == (walked or "header")


def test_reading_the_namespace_sets_no_field() -> None:
    request = s.ReceiveMessageRequest(group=pb.Resource(name="g"))
    assert NamespaceInterceptor._namespace_of(request, "h") == "h"
    assert not request.HasField("message_queue")  # read as a default, not created


def test_the_handler_takes_the_guards_headers_once() -> None:
    read = {"x-mq-client-id": "guard-read"}
    token = CALL_HEADERS.set(read)
    try:
        assert text_headers(StubContext()) is read  # grpc not asked to build them again
        assert text_headers(StubContext())["x-mq-client-id"] == "c@1"  # then the call's own
    finally:
        CALL_HEADERS.reset(token)


async def test_the_shared_empty_frame_is_never_changed_by_a_namespaced_write() -> None:
    frame = servicer_module._NO_NEW_MESSAGE
    before = frame.SerializeToString()
    await _Context(StubContext(), "ns").write(frame)  # type: ignore[arg-type]
    assert frame.SerializeToString() == before
    assert frame.status.code == pb.MESSAGE_NOT_FOUND


class _Backend:
    def send_arm(self, watch: object) -> bool:
        return True

    def send_cancel(self, watch: object) -> None:
        pass


class _Port:
    name = "b0"

    def __init__(self) -> None:
        self.watch_backend = _Backend()


async def test_a_tag_and_a_sql_filter_of_the_same_text_get_their_own_watches() -> None:
    registry = WatchRegistry()
    port = _Port()
    tag = PopRequest(group="g", topic="t", max_messages=1, filter=FilterExpression("a"))
    sql = PopRequest(
        group="g", topic="t", max_messages=1, filter=FilterExpression("a", FILTER_SQL92)
    )
    assert registry.get(port, tag) is registry.get(port, tag)  # type: ignore[arg-type]
    assert registry.get(port, tag) is not registry.get(port, sql)  # type: ignore[arg-type]
    assert len(registry) == 2
    # An armed, silent watch keeps its broker out of the candidates; the other filter's not.
    assert registry.candidates([port], tag) == []  # type: ignore[list-item]
