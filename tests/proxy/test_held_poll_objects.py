"""What a held long poll keeps: `bench idle` holds 10,000 of them, so every object one keeps
for its whole wait is memory of the proxy's (issue 18; docs/benchmarks.md, "Idle proxy, wave
8"). Virtual time, in process."""

from __future__ import annotations

import gc
import inspect
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from popmq.broker.contract.types import FilterExpression
from popmq.proxy.core.receive import filter_of
from popmq.proxy.grpc import access
from popmq.proxy.grpc.headers import request_context
from popmq.proxy.grpc.servicer import MessagingServicer
from popmq.proxy.longpoll import base as longpoll_base
from popmq.proxy.longpoll import notify as longpoll_notify
from popmq.proxy.longpoll.custody import Custody
from popmq.proxy.server import ProxyServer
from proxy_support import StubContext, served_servicer

from popmq.pb.rocketmq.v2 import definition_pb2 as pb
from popmq.pb.rocketmq.v2 import service_pb2 as s
from popmq.security.acl import User

pytestmark = pytest.mark.looptime

HELD = 60
# Per held notify poll, measured after the cuts of wave 8: 1 function, 3 cells and 5 bound
# methods, of which this test's task group holds 1, 3 and 1 (anyio's task_done closure and
# its scope's __exit__); before them: 2, 7 and 7 (the custody's release closure, the
# subscriptions' comprehension cells, the hub's subscribe and the span's __exit__ kept by
# the waiting frame). A new closure or bound method kept for the whole wait shows here first;
# the margins absorb objects the broker's own tasks make meanwhile. Wave 9: the polls'
# deadlines share one timer (proxy.longpoll.deadlines; before, a TimerHandle each), and a held
# poll keeps 5 coroutines (the test's task, the seam, the servicer's receive, the strategy's
# receive and the notify wait; before, 8: the core's receive, the outage loop and notify's
# _poll too). Wave 10: the long poll is the hub's one subscriber in every broker's channel
# (before, a Subscription per broker, and the poll's bound on_signal): 3 bound methods (main:
# 4) and no Subscription (main: one per broker, 1 here).
MAX_PER_POLL = {
    "function": 1.5, "cell": 5.0, "method": 3.5, "TimerHandle": 0.25, "coroutine": 5.5,
    "Subscription": 0.25,
}  # fmt: skip


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[ProxyServer, MessagingServicer]]:
    async with served_servicer(tmp_path, "notify") as served:  # its tag matches nothing
        yield served


def _request() -> s.ReceiveMessageRequest:
    queue = pb.MessageQueue(topic=pb.Resource(name="t"), id=0)
    expression = pb.FilterExpression(type=pb.TAG, expression="nothing-has-this-tag")
    request = s.ReceiveMessageRequest(
        group=pb.Resource(name="g"), message_queue=queue, filter_expression=expression,
        batch_size=8,
    )  # fmt: skip
    request.invisible_duration.FromMilliseconds(30_000)
    request.long_polling_timeout.FromMilliseconds(20_000)
    return request


def _kinds() -> Counter[str]:
    gc.collect()
    return Counter(type(o).__name__ for o in gc.get_objects())


async def test_a_held_notify_poll_keeps_no_closure_of_its_own(
    served: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Untraced, as `bench idle` runs (no exporter), whatever another test installed before.
    monkeypatch.setattr(longpoll_base, "tracing_on", lambda: False)
    monkeypatch.setattr(longpoll_notify, "tracing_on", lambda: False, raising=False)
    server, servicer = served
    request = _request()

    async def hold(n: int) -> Counter[str]:
        async with anyio.create_task_group() as tasks:
            for _ in range(n):
                tasks.start_soon(servicer.ReceiveMessage, request, StubContext())
            await anyio.sleep(2)  # every poll is held: nothing matches
            assert server.core.receiver.admission.active == n
            kinds = _kinds()
            tasks.cancel_scope.cancel()
        return kinds

    await hold(2)  # warm up: caches, the hub's channel, first-use imports
    base = await hold(2)
    held = await hold(2 + HELD)
    per_poll = {kind: (held[kind] - base[kind]) / HELD for kind in MAX_PER_POLL}
    assert all(per_poll[k] <= MAX_PER_POLL[k] for k in MAX_PER_POLL), str(per_poll)
    assert server.core.receiver.admission.active == 0


def test_calls_of_one_user_share_one_caller_until_the_acl_changes() -> None:
    user = User(access_key="ak-held", secret_key="sk")
    first = access._caller(user)
    assert access._caller(user) is first
    reloaded = User(access_key="ak-held", secret_key="sk2")  # an ACL reload makes new users
    again = access._caller(reloaded)
    assert again is not first and again.user is reloaded


class _Headers(StubContext):
    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        # Made at run time, as grpc makes them per call (literals would be shared anyway).
        return tuple((k, "".join(["c", v])) for k, v in (("x-mq-client-id", "@1"),))


def test_request_contexts_of_one_client_share_their_header_strings() -> None:
    one, two = request_context(_Headers()), request_context(_Headers())  # type: ignore[arg-type]
    assert one.client_id == "c@1" and one.client_id is two.client_id


HELD_SHARED = 20


def _poll_listeners(server: ProxyServer) -> list[Any]:
    """The cluster's change listeners that are long polls or their bound methods."""
    return [
        listener
        for listener in server.cluster._change_listeners
        if isinstance(getattr(listener, "__self__", listener), longpoll_notify._LongPoll)
    ]


async def test_held_polls_share_their_owner_key_brokers_and_release(
    served: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Wave 12: what every held poll of one client (or every poll) has alike is one object,
    not one each (docs/benchmarks.md, "Idle memory, wave 12"): the admission key, the tuple
    of brokers the plan asks, the custody's release method, and the cluster's change
    listener (the long poll itself). Main kept a string, a list and two bound methods each."""
    monkeypatch.setattr(longpoll_base, "tracing_on", lambda: False)
    monkeypatch.setattr(longpoll_notify, "tracing_on", lambda: False, raising=False)
    server, servicer = served
    request = _request()
    gc.collect()
    # Other tests in this worker may leave Custody objects alive: count only this test's.
    older = [o for o in gc.get_objects() if isinstance(o, Custody)]  # kept: ids stay theirs
    before = {id(o) for o in older}
    async with anyio.create_task_group() as tasks:
        for _ in range(HELD_SHARED):
            tasks.start_soon(servicer.ReceiveMessage, request, StubContext())
        await anyio.sleep(2)  # every poll is held: nothing matches
        assert server.core.receiver.admission.active == HELD_SHARED
        gc.collect()
        frames = [
            o.cr_frame.f_locals
            for o in gc.get_objects()
            if inspect.iscoroutine(o)
            and o.cr_code.co_qualname == "MessagingServicer._receive"
            and o.cr_frame is not None
        ]
        assert len(frames) == HELD_SHARED
        assert len({id(f["client"]) for f in frames}) == 1  # main: a key string each
        assert len({id(f["plan"].brokers) for f in frames}) == 1  # main: a list each
        custodies = [o for o in gc.get_objects() if isinstance(o, Custody) and id(o) not in before]
        assert len(custodies) == HELD_SHARED
        assert len({id(c._release) for c in custodies}) == 1  # main: a bound method each
        polls = _poll_listeners(server)
        assert len(polls) == HELD_SHARED
        assert all(isinstance(p, longpoll_notify._LongPoll) for p in polls)  # main: bound methods
        tasks.cancel_scope.cancel()
    assert server.core.receiver.admission.active == 0
    assert not _poll_listeners(server)


def test_receives_without_a_filter_share_one_filter_expression() -> None:
    assert filter_of("TAG", "*") is filter_of("", "") is filter_of("TAG", " * ")
    assert filter_of("TAG", "a || b") == FilterExpression("a || b")


async def test_the_shared_broker_tuples_are_forgotten_when_the_ports_change(served: Any) -> None:
    """A replaced port (a group's former leader) is not kept alive by the shared tuples."""
    server, _ = served
    receiver = server.core.receiver
    port = server.cluster.ports[0]
    first = receiver._shared_ports([port])
    assert receiver._shared_ports([port]) is first and receiver._port_sets
    server.cluster.put_port(port)  # a change of ports (here the same one put back)
    assert not receiver._port_sets
    assert receiver._shared_ports([port]) is not first
