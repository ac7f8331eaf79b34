"""The wrappers around a held receive keep nothing of theirs while it waits (docs/
benchmarks.md, "Idle polls, wave 10"): the namespace interceptor, the access guard and the
undecodable-body check only check a call and hand it over (popmq.handing), so `bench idle`'s
10,000 held polls keep none of their coroutine frames. Through a real grpc.aio server, which
awaits a handler only if it takes it for a coroutine function."""

from __future__ import annotations

import asyncio
import functools
import gc
import inspect
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from popmq.broker.contract.errors import Code
from popmq.proxy.core.context import RequestContext
from proxy_support import eventually, unique

from popmq.handing import hands_over

pytestmark = pytest.mark.slow

USER = ("held", "held-secret-0001")
HELD = 12
# Coroutines of these files are the edge's wrappers (main kept three a held receive).
WRAPPERS = ("proxy/grpc/namespace.py", "proxy/grpc/access.py", "broker/wire/undecodable.py")


def _servicer_frames() -> list[tuple[str, int]]:
    """(name, size) of the servicer's coroutines alive now (gc.collect() first)."""
    return [
        (o.cr_code.co_qualname, sys.getsizeof(o))
        for o in gc.get_objects()
        if inspect.iscoroutine(o) and o.cr_code.co_filename.endswith("proxy/grpc/servicer.py")
    ]


def _held_groups() -> set[int]:
    """Identities of the group names the servicer's held receive frames keep."""
    return {
        id(o.cr_frame.f_locals["group"])
        for o in gc.get_objects()
        if inspect.iscoroutine(o)
        and o.cr_code.co_filename.endswith("proxy/grpc/servicer.py")
        and o.cr_frame is not None
        and "group" in o.cr_frame.f_locals
    }


def _request_contexts() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, RequestContext))


def _done_partials() -> int:
    """The access guard's done callbacks wrapped per call (grpc.aio's add_done_callback makes
    a partial of each, kept in the call's list until it ends)."""
    return sum(
        1
        for o in gc.get_objects()
        if isinstance(o, functools.partial)
        and getattr(o.func, "__name__", "") == "_close_on_done"
        and len(o.args) == 3
    )


def _wrapper_frames() -> int:
    gc.collect()
    return sum(
        1
        for o in gc.get_objects()
        if inspect.iscoroutine(o) and o.cr_code.co_filename.endswith(WRAPPERS)
    )


async def test_held_receives_keep_no_frame_of_the_wrappers(
    make_cluster: Any, tmp_path: Path
) -> None:
    acl = tmp_path / "acl.yaml"
    acl.write_text(
        yaml.safe_dump(
            {"users": [{"access_key": USER[0], "secret_key": USER[1],
                        "allow": [{"publish": "t-*"}, {"subscribe": "g-*"}]}]}
        )
    )  # fmt: skip
    cluster = await make_cluster(brokers=2, **{"proxy.acl": str(acl)})
    cluster.signing = USER
    topic, group = unique("t"), unique("g")
    assert (await cluster.route(topic)).status.code == Code.OK
    admission = cluster.server.admission
    contexts_before = _request_contexts()  # any other test's left in this process
    polls = [
        asyncio.create_task(cluster.receive(group, topic, poll_ms=3_000, client_id=f"c{i}"))
        for i in range(HELD)
    ]
    await eventually(lambda: admission.active == HELD, within_s=10)
    assert _wrapper_frames() == 0
    # Wave 11: the metrics seam's frame is gone (the receive records its own metrics) and the
    # receive's waiting frame is smaller (the delivery of messages has a frame of its own,
    # made only when there are some): main kept `stream` (280 B) and `_receive` (416 B).
    frames = _servicer_frames()
    assert sorted({name for name, _ in frames}) == ["MessagingServicer._receive"], frames
    assert len(frames) == HELD and all(size <= 336 for _, size in frames), frames
    # ...and the guard's done callback is the call task's, not a partial per call (main: 12).
    assert _done_partials() == 0
    # ...and the held frames of one group share its name (main: a string each, as protobuf
    # makes one per read).
    assert len(_held_groups()) == 1
    # ...and no held receive keeps its request context (main: one each, with its request id).
    assert _request_contexts() <= contexts_before
    for poll in polls:  # each was answered as before: an empty receive's status and trailer
        status, messages, kinds = await poll
        assert status.code == Code.MESSAGE_NOT_FOUND and not messages
        assert kinds == ["status", "delivery_timestamp"]


def test_a_handing_function_is_awaited_as_a_coroutine_function() -> None:
    async def inner(request: int, context: object) -> int:
        return request + 1

    handing = hands_over(lambda request, context: inner(request, context))
    assert inspect.iscoroutinefunction(handing) and not inspect.isasyncgenfunction(handing)
    assert asyncio.run(handing(1, None)) == 2  # type: ignore[arg-type]


def _markcoroutinefunction_312(func: Any) -> Any:
    """Python 3.12's ``inspect.markcoroutinefunction``, as the standard library has it: a
    bound method's function (``__func__``) is marked, and returned."""
    if hasattr(func, "__func__"):
        func = func.__func__
    func._is_coroutine_marker = object()
    return func


def test_a_handing_bound_method_keeps_its_instance_on_python_3_12(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The servicer hands over its bound ``_receive_message`` (servicer.py). On Python 3.12+
    ``hands_over`` marks it with ``inspect.markcoroutinefunction``, which returns the class's
    plain function: every ReceiveMessage then failed with TypeError (``missing 1 required
    positional argument: 'context'``, answered UNKNOWN); seen with a 3.12 venv (review-edge)."""
    monkeypatch.setattr(inspect, "markcoroutinefunction", _markcoroutinefunction_312, raising=False)

    class Servicer:
        async def _answer(self, request: int) -> int:
            return request + 1

        def receive(self, request: int, context: object) -> Any:
            return self._answer(request)

    handing = hands_over(Servicer().receive)
    assert asyncio.run(handing(1, None)) == 2  # type: ignore[arg-type]
