"""The namespace mapping at the proxy edge (proxy/grpc/namespace.py)."""

from __future__ import annotations

import pytest
from popmq.broker.contract.errors import Code, RefusedError
from popmq.proxy.grpc.namespace import qualify, unqualify

from popmq.pb.rocketmq.v2 import definition_pb2 as pb
from popmq.pb.rocketmq.v2 import service_pb2 as s


def test_names_map_into_and_out_of_a_namespace() -> None:
    assert qualify("", "orders") == "orders"
    assert qualify("ns", "orders") == "ns%orders"
    assert qualify("ns", "%DLQ%billing", group=True) == "%DLQ%ns%billing"
    assert unqualify("ns", "ns%orders") == "orders"
    assert unqualify("ns", "%DLQ%ns%billing") == "%DLQ%billing"
    assert unqualify("ns", "other%orders") == "other%orders"  # never another namespace's
    assert unqualify("", "ns%orders") == "ns%orders"
    with pytest.raises(RefusedError) as topic_error:
        qualify("ns", "other%orders")
    assert topic_error.value.code == Code.ILLEGAL_TOPIC
    with pytest.raises(RefusedError) as group_error:
        qualify("ns", "x%g", group=True)
    assert group_error.value.code == Code.ILLEGAL_CONSUMER_GROUP


def _metadata(cluster, namespace: str) -> tuple[tuple[str, str], ...]:  # type: ignore[no-untyped-def]
    return tuple((k, namespace if k == "x-mq-namespace" else v) for k, v in cluster.metadata())


async def test_route_answers_in_the_clients_namespace(cluster) -> None:  # type: ignore[no-untyped-def]
    request = s.QueryRouteRequest(topic=pb.Resource(name="orders", resource_namespace="ns1"))
    response = await cluster.stub.QueryRoute(request, metadata=_metadata(cluster, "ns1"))
    assert response.status.code == Code.OK
    assert {(q.topic.name, q.topic.resource_namespace) for q in response.message_queues} == {
        ("orders", "ns1")
    }
    plain = await cluster.stub.QueryRoute(
        s.QueryRouteRequest(topic=pb.Resource(name="ns1%orders")), metadata=cluster.metadata()
    )
    assert {q.topic.name for q in plain.message_queues} == {"ns1%orders"}  # the inside name


async def test_bad_namespaced_names_are_refused_with_rocketmq_codes(cluster) -> None:  # type: ignore[no-untyped-def]
    bad_space = await cluster.stub.QueryRoute(
        s.QueryRouteRequest(topic=pb.Resource(name="orders")),
        metadata=_metadata(cluster, "no%pe"),
    )
    assert bad_space.status.code == Code.BAD_REQUEST
    sneaky = await cluster.stub.QueryRoute(
        s.QueryRouteRequest(topic=pb.Resource(name="other%orders", resource_namespace="ns1")),
        metadata=_metadata(cluster, "ns1"),
    )
    assert sneaky.status.code == Code.ILLEGAL_TOPIC
    receive = s.ReceiveMessageRequest(
        group=pb.Resource(name="x%g", resource_namespace="ns1"),
        message_queue=pb.MessageQueue(topic=pb.Resource(name="t", resource_namespace="ns1")),
        batch_size=1,
    )
    frames = [f async for f in cluster.stub.ReceiveMessage(
        receive, metadata=_metadata(cluster, "ns1"))]  # fmt: skip
    assert [f.status.code for f in frames] == [Code.ILLEGAL_CONSUMER_GROUP]


async def test_yielding_stream_servicers_are_mapped_too() -> None:
    import grpc
    from popmq.proxy.grpc.namespace import _HEADER, NamespaceInterceptor

    async def behavior(request, context):  # type: ignore[no-untyped-def]
        frame = s.ReceiveMessageResponse()
        frame.message.topic.name = request.message_queue.topic.name
        yield frame

    handler = grpc.unary_stream_rpc_method_handler(behavior)
    method = "/apache.rocketmq.v2.MessagingService/ReceiveMessage"
    wrapped = NamespaceInterceptor()._unary_stream(handler, method)
    _HEADER.set("ns1")  # the call's x-mq-namespace, as intercept_service sets it
    request = s.ReceiveMessageRequest(message_queue=pb.MessageQueue(topic=pb.Resource(name="t")))
    frames = [frame async for frame in wrapped(request, None)]
    assert request.message_queue.topic.name == "ns1%t"  # the servicer saw the inside name
    assert [(f.message.topic.name, f.message.topic.resource_namespace) for f in frames] == [
        ("t", "ns1")
    ]


async def test_one_wrapped_handler_serves_each_call_with_its_own_namespace() -> None:
    """The interceptor wraps a method's handler once and reads each call's x-mq-namespace
    header in the call's task: consecutive calls of the same method keep their namespaces."""
    from types import SimpleNamespace

    import grpc
    from popmq.proxy.grpc.namespace import NamespaceInterceptor

    seen: list[str] = []

    async def behavior(request, context):  # type: ignore[no-untyped-def]
        seen.append(request.topic.name)
        return s.QueryRouteResponse()

    handler = grpc.unary_unary_rpc_method_handler(behavior)
    method = "/apache.rocketmq.v2.MessagingService/QueryRoute"
    interceptor = NamespaceInterceptor()

    async def continuation(details):  # type: ignore[no-untyped-def]
        return handler

    wrapped = []
    for namespace in ("ns1", "ns2", ""):
        metadata = (("x-mq-namespace", namespace),) if namespace else ()
        details = SimpleNamespace(method=method, invocation_metadata=metadata)
        served = await interceptor.intercept_service(continuation, details)
        wrapped.append(served.unary_unary)
        await served.unary_unary(s.QueryRouteRequest(topic=pb.Resource(name="t")), None)
    assert seen == ["ns1%t", "ns2%t", "t"]
    assert wrapped[0] is wrapped[1] is wrapped[2]  # wrapped once, not per call


async def test_received_messages_leave_in_the_clients_namespace_without_a_walk_per_frame(
    cluster, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """Delivered messages name their topic as the client does (``orders`` in ``ns1``), for a
    namespace given by header or by Resource; their frames are built that way once (no
    interceptor walk of each written frame: ``unqualify_response`` is not called for them)."""
    from popmq.proxy.grpc import namespace
    from proxy_support import message

    metadata = _metadata(cluster, "ns1")
    sent = await cluster.stub.SendMessage(
        s.SendMessageRequest(messages=[message("orders", b"a"), message("orders", b"b")]),
        metadata=metadata,
        timeout=5,
    )
    assert [e.status.code for e in sent.entries] == [Code.OK, Code.OK]
    walked: list[object] = []
    real = namespace.unqualify_response
    monkeypatch.setattr(
        namespace, "unqualify_response", lambda m, ns: (walked.append(m), real(m, ns))[1]
    )
    topics = []
    for resource_namespace in ("", "ns1"):  # the header alone, then the Resource too
        request = s.ReceiveMessageRequest(
            group=pb.Resource(name="g", resource_namespace=resource_namespace),
            message_queue=pb.MessageQueue(
                topic=pb.Resource(name="orders", resource_namespace=resource_namespace)
            ),
            filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"),
            batch_size=1,
        )
        request.invisible_duration.FromMilliseconds(5_000)
        request.long_polling_timeout.FromMilliseconds(1_000)
        call = cluster.stub.ReceiveMessage(request, metadata=metadata, timeout=5)
        frames = [frame async for frame in call]
        topics += [
            (f.message.topic.name, f.message.topic.resource_namespace)
            for f in frames
            if f.WhichOneof("content") == "message"
        ]
    assert topics == [("orders", "ns1"), ("orders", "ns1")]
    assert not [m for m in walked if isinstance(m, s.ReceiveMessageResponse) and m.message.body]


async def test_pulled_messages_leave_in_the_clients_namespace_without_a_walk_per_frame(
    cluster, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """PullMessage's frames too are built with the client's names, not walked one by one."""
    from popmq.proxy.grpc import namespace
    from proxy_support import message

    metadata = _metadata(cluster, "ns1")
    sent = await cluster.stub.SendMessage(
        s.SendMessageRequest(messages=[message("orders", b"a")]), metadata=metadata, timeout=5
    )
    entry = sent.entries[0]
    assert entry.status.code == Code.OK
    walked: list[object] = []
    real = namespace.unqualify_response
    monkeypatch.setattr(
        namespace, "unqualify_response", lambda m, ns: (walked.append(m), real(m, ns))[1]
    )
    routes = await cluster.stub.QueryRoute(
        s.QueryRouteRequest(topic=pb.Resource(name="orders")), metadata=metadata
    )
    pulled = []
    for queue in routes.message_queues:
        request = s.PullMessageRequest(
            group=pb.Resource(name="reader"), message_queue=queue, offset=0, batch_size=8
        )
        call = cluster.stub.PullMessage(request, metadata=metadata, timeout=5)
        pulled += [f.message async for f in call if f.WhichOneof("content") == "message"]
    assert [(m.topic.name, m.topic.resource_namespace, m.body) for m in pulled] == [
        ("orders", "ns1", b"a")
    ]
    assert not [m for m in walked if isinstance(m, s.PullMessageResponse) and m.message.body]


def _every_resource(message, found):  # type: ignore[no-untyped-def]
    """What the interceptor's walk must find, read the plain way: each set Resource field,
    in field order, depth first, with whether it is a group."""
    for field, value in sorted(message.ListFields(), key=lambda fv: fv[0].number):
        if field.message_type is None or field.message_type.GetOptions().map_entry:
            continue
        values = value if field.is_repeated else [value]
        for item in values:
            if field.message_type.full_name == "apache.rocketmq.v2.Resource":
                found.append((item.name, field.name == "group"))
            else:
                _every_resource(item, found)
    return found


def test_the_resource_walk_finds_every_resource_of_each_request_in_order() -> None:
    """The walk (a plan per message type, looked up once per repeated field, a shortcut for
    elements holding one Resource) finds what a plain walk finds, in the same order."""
    from popmq.proxy.grpc.namespace import _resources

    send = s.SendMessageRequest()
    for topic in ("a", "b", ""):
        message = send.messages.add(body=b"x")
        if topic:
            message.topic.name = topic  # the last message has no topic at all
    telemetry = s.TelemetryCommand()
    subscription = telemetry.settings.subscription
    subscription.group.name = "g"
    for topic in ("t1", "t2"):
        subscription.subscriptions.add().topic.name = topic
    g, t = pb.Resource(name="g"), pb.Resource(name="t")
    requests = [
        send,
        s.SendMessageRequest(),
        s.AckMessageRequest(group=g, topic=t, entries=[s.AckMessageEntry(receipt_handle="h")]),
        s.ReceiveMessageRequest(group=g, message_queue=pb.MessageQueue(topic=t)),
        telemetry,
    ]
    for request in requests:
        walked = [(resource.name, is_group) for resource, is_group in _resources(request)]
        assert walked == _every_resource(request, []), type(request).__name__
    assert [name for name, _ in _every_resource(send, [])] == ["a", "b"]
    assert _every_resource(telemetry, []) == [("g", True), ("t1", False), ("t2", False)]
