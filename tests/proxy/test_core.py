"""The proxy core on its own: domain objects in and out, no protobuf and no gRPC call, as a
second edge (a console, another protocol) would use it."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.types import AckEntry
from popmq.proxy.core.address import HostPort, ProxyAddress
from popmq.proxy.core.context import RequestContext
from popmq.proxy.core.offsets import QueueAddress
from popmq.proxy.core.receive import ReceiveRequest
from popmq.proxy.core.send import OutgoingMessage
from proxy_support import Cluster, unique

from popmq.config import ProxyConfig


@dataclass(frozen=True)
class Span:
    """A time as seconds and nanos (the shape the core reads client times in)."""

    seconds: int
    nanos: int = 0


async def test_send_receive_ack_and_admin_through_the_core_alone(cluster: Cluster) -> None:
    core = cluster.server.core
    ctx = RequestContext(client_id="core@1")
    topic, group = unique("t"), unique("g")

    outcomes = await core.sender.send([OutgoingMessage(topic, b"hello", tag="a")], ctx)
    assert [o.error for o in outcomes] == [None]
    sent = outcomes[0].result
    assert sent is not None and sent.message_id == outcomes[0].message_id

    request = ReceiveRequest(group, topic, batch_size=4, invisible_time=Span(30), poll_time=Span(2))
    plan = await core.receiver.plan(request, ctx)
    assert plan.long_poll.pop.group == group and plan.renew_for is None
    popped = await core.receiver.receive(plan)
    assert [(m.message.body, m.message.tag) for m in popped] == [(b"hello", "a")]

    acked = await core.handles.ack(group, topic, [AckEntry(popped[0].receipt_handle)])
    assert [r.code for r in acked] == [Code.OK]

    names = [name for name, _ in await core.admin.list_topics(include_system=False)]
    assert topic in names
    end = await core.offsets.query_offset(
        QueueAddress(topic, sent.broker_name, sent.queue_id), "END", None
    )
    assert end == sent.queue_offset + 1


async def test_the_core_refuses_with_rocketmq_codes(cluster: Cluster) -> None:
    core = cluster.server.core
    ctx = RequestContext(client_id="core@1")
    topic = unique("t")
    with pytest.raises(RefusedError) as empty:
        await core.sender.send([OutgoingMessage(topic, b"")], ctx)
    assert empty.value.code == Code.MESSAGE_BODY_EMPTY
    with pytest.raises(RefusedError) as both:
        fifo_and_delay = OutgoingMessage(topic, b"x", message_group="g", delivery_time=Span(1))
        await core.sender.send([fifo_and_delay], ctx)
    assert both.value.code == Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE
    with pytest.raises(RefusedError) as bad_filter:
        bad = ReceiveRequest(
            unique("g"), topic, batch_size=1, invisible_time=Span(30), filter_expression="||"
        )
        await core.receiver.plan(bad, ctx)
    assert bad_filter.value.code == Code.ILLEGAL_FILTER_EXPRESSION
    with pytest.raises(RefusedError) as anonymous:
        await core.routes.assignment(topic, unique("g"), RequestContext())
    assert anonymous.value.code == Code.CLIENT_ID_REQUIRED


def test_the_address_clients_are_told_advertised_then_theirs_then_bound() -> None:
    bound = ProxyAddress(ProxyConfig())
    bound.bind("0.0.0.0", 8081)  # a wildcard bind is reached on loopback
    assert bound.for_client(client_used_one=False) == HostPort("127.0.0.1", 8081)
    assert bound.for_client(client_used_one=True) is None  # echo the client's own
    advertised = ProxyAddress(ProxyConfig(advertise_host="mq.example.com"))
    advertised.bind("127.0.0.1", 8081)
    assert advertised.for_client(client_used_one=True) == HostPort("mq.example.com", 8081)
