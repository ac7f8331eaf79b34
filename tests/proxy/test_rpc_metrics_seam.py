"""The proxy's RPC metrics are recorded at one seam: every MessagingService method is wrapped
once at start-up and each call counts once in all three (RPC_METRICS), under the code its
client was answered with; a stream that ends by an exception counts as CLIENT_GONE. Virtual
time, in process."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from popmq.broker.contract.types import Message
from popmq.broker.local import LocalBrokerPort
from popmq.broker.testing import fast_broker_config, running_broker
from popmq.proxy.grpc.servicer import MessagingServicer
from popmq.proxy.metrics import RPC_METRICS, ProxyMetrics
from popmq.proxy.server import ProxyServer
from proxy_support import StubContext, make_config, served_servicer

from popmq.clock import LoopClock
from popmq.pb.rocketmq.v2 import definition_pb2 as pb
from popmq.pb.rocketmq.v2 import service_pb2 as s
from popmq.pb.rocketmq.v2 import service_pb2_grpc

pytestmark = pytest.mark.looptime


def _counts(metrics: ProxyMetrics, method: str) -> dict[str, float]:
    """This method's calls counted in each RPC metric, by code ("" where there is none)."""
    found: dict[str, float] = {}
    for family in metrics.registry.collect():
        for sample in family.samples:
            labels = sample.labels
            if labels.get("method", labels.get("request_code")) != method or not sample.value:
                continue
            if not sample.name.startswith(tuple(spec.name for spec in RPC_METRICS)):
                continue
            if sample.name.endswith(("_total", "_count")):
                code = labels.get("code", labels.get("response_code", ""))
                found[f"{sample.name}:{code}"] = sample.value
    return found


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[ProxyServer, MessagingServicer]]:
    async with served_servicer(tmp_path, "pop") as served:
        yield served


def test_the_rpc_metrics_are_declared_with_their_stable_names() -> None:
    assert [spec.name for spec in RPC_METRICS] == [
        "popmq_proxy_rpc_requests", "popmq_proxy_rpc_duration_seconds", "rocketmq_rpc_latency",
    ]  # fmt: skip


async def test_every_method_of_the_service_is_metered(served: Any) -> None:
    _, servicer = served
    methods = [name for name in dir(service_pb2_grpc.MessagingServiceServicer) if name[0].isupper()]
    assert len(methods) >= 17
    for name in methods:
        handler = getattr(servicer, name)
        # Wrapped per instance at start-up (Telemetry, one stream of many answers, records
        # each answer itself).
        assert name == "Telemetry" or name in vars(servicer), name
        assert handler is not getattr(service_pb2_grpc.MessagingServiceServicer, name)


async def test_a_unary_call_counts_once_in_each_metric_under_its_answer(served: Any) -> None:
    server, servicer = served
    answer = await servicer.SyncLiteSubscription(s.SyncLiteSubscriptionRequest(), StubContext())
    assert answer.status.code == pb.NOT_IMPLEMENTED
    assert answer.status.message == "popmq does not support lite topics"
    heartbeat = s.HeartbeatRequest(group=pb.Resource(name="g"), client_type=pb.SIMPLE_CONSUMER)
    for _ in range(2):
        assert (await servicer.Heartbeat(heartbeat, StubContext())).status.code == pb.OK
    assert _counts(server.metrics, "SyncLiteSubscription") == {
        "popmq_proxy_rpc_requests_total:NOT_IMPLEMENTED": 1,
        "popmq_proxy_rpc_duration_seconds_count:": 1,
        "rocketmq_rpc_latency_count:NOT_IMPLEMENTED": 1,
    }
    assert _counts(server.metrics, "Heartbeat") == {
        "popmq_proxy_rpc_requests_total:OK": 2,
        "popmq_proxy_rpc_duration_seconds_count:": 2,
        "rocketmq_rpc_latency_count:OK": 2,
    }


async def test_a_receive_whose_client_left_while_held_counts_as_client_gone(
    served: Any,
) -> None:
    server, servicer = served
    request = s.ReceiveMessageRequest(
        group=pb.Resource(name="g"),
        message_queue=pb.MessageQueue(topic=pb.Resource(name="t")),
        filter_expression=pb.FilterExpression(type=pb.TAG, expression="nothing-has-this-tag"),
        batch_size=8,
    )
    request.invisible_duration.FromMilliseconds(30_000)
    request.long_polling_timeout.FromMilliseconds(20_000)
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(servicer.ReceiveMessage, request, StubContext())
        await anyio.sleep(2)  # held: no message matches
        assert _counts(server.metrics, "ReceiveMessage") == {}
        tasks.cancel_scope.cancel()  # the client went away
    assert _counts(server.metrics, "ReceiveMessage") == {
        "popmq_proxy_rpc_requests_total:CLIENT_GONE": 1,
        "popmq_proxy_rpc_duration_seconds_count:": 1,
        "rocketmq_rpc_latency_count:CLIENT_GONE": 1,
    }


def _servicer_frames(coro: Any) -> list[str]:
    """The frames of servicer.py in a task's await chain (outermost first)."""
    frames = []
    while coro is not None:
        code = getattr(coro, "cr_code", None)
        if code is not None and code.co_filename.endswith("servicer.py"):
            frames.append(code.co_qualname)
        coro = getattr(coro, "cr_await", None)
    return frames


def _held_request(server: ProxyServer, method: str) -> Any:
    """A receive or a pull that waits 20 s (nothing new matches)."""
    queue = pb.MessageQueue(topic=pb.Resource(name="t"), id=0)
    queue.broker.name = server.cluster.ports[0].name
    expression = pb.FilterExpression(type=pb.TAG, expression="nothing-has-this-tag")
    if method == "ReceiveMessage":
        request: Any = s.ReceiveMessageRequest(
            group=pb.Resource(name="g"), message_queue=queue, filter_expression=expression,
            batch_size=8,
        )  # fmt: skip
        request.invisible_duration.FromMilliseconds(30_000)
    else:
        request = s.PullMessageRequest(
            group=pb.Resource(name="g"), message_queue=queue, offset=1, batch_size=8,
            filter_expression=expression,
        )  # fmt: skip
    request.long_polling_timeout.FromMilliseconds(20_000)
    return request


@pytest.mark.parametrize("method", ["ReceiveMessage", "PullMessage"])
async def test_a_held_stream_keeps_the_seam_and_one_frame_of_the_servicer(
    served: Any, method: str
) -> None:
    """The seam's wrapper is one coroutine frame per call; with it a held pull keeps two
    frames of the servicer, as before the seam (a frame per held poll is memory per poll). A
    held receive keeps one: it records its metrics in its own frame (wave 11; the same
    counts)."""
    server, servicer = served
    request = _held_request(server, method)
    held: list[list[str]] = []

    async def call() -> None:
        task = asyncio.current_task()
        assert task is not None
        tasks.start_soon(look, task)
        await getattr(servicer, method)(request, StubContext())

    async def look(task: asyncio.Task[Any]) -> None:
        await anyio.sleep(2)  # held: nothing matches
        held.append(_servicer_frames(task.get_coro()))
        tasks.cancel_scope.cancel()

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(call)
    if method == "ReceiveMessage":
        assert held == [["MessagingServicer._receive"]], held
    else:
        assert len(held) == 1 and len(held[0]) == 2, held  # the seam's wrapper and the handler
    assert _counts(server.metrics, method) == {
        "popmq_proxy_rpc_requests_total:CLIENT_GONE": 1,
        "popmq_proxy_rpc_duration_seconds_count:": 1,
        "rocketmq_rpc_latency_count:CLIENT_GONE": 1,
    }
    assert server.core.receiver.admission.active == 0  # the long poll left its slot


class _BootClock:
    """The broker's wall clock, with monotonic seconds of its own (ManualClock's two readings
    agree, so a test on it cannot tell which one a value was read from)."""

    def __init__(self, wall: LoopClock) -> None:
        self._wall = wall

    def now_ms(self) -> int:
        return self._wall.now_ms()

    def monotonic(self) -> float:
        return self._wall.monotonic() + 12_345.0

    async def sleep(self, seconds: float) -> None:
        await self._wall.sleep(seconds)


class _Recorder(StubContext):
    def __init__(self) -> None:
        self.frames: list[Any] = []

    async def write(self, frame: Any) -> None:
        self.frames.append(frame)


async def test_what_a_receive_sends_is_read_from_the_wall_clock(tmp_path: Path) -> None:
    """The delivery timestamp and the invisible duration (against the broker's invisible-until)
    are wall-clock values; the RPC latency is measured on the monotonic clock."""
    config = make_config(tmp_path, **{"proxy.strategy": "pop"})
    wall = LoopClock()
    async with running_broker(fast_broker_config(tmp_path / "b"), wall) as broker:
        port = LocalBrokerPort(broker)
        await port.send([Message("t", b"m")], 0)
        server = ProxyServer(config, [port])
        clock = _BootClock(wall)
        servicer = MessagingServicer(server.core, server.metrics, config.proxy, clock=clock)
        try:
            request = _held_request(server, "ReceiveMessage")
            request.filter_expression.expression = "*"
            context = _Recorder()
            await servicer.ReceiveMessage(request, context)
        finally:
            await server.tasks.aclose()
            await server.strategy.aclose()
            await server.cluster.aclose()
    message = next(f.message for f in context.frames if f.WhichOneof("content") == "message")
    assert 29_000 <= message.system_properties.invisible_duration.ToMilliseconds() <= 30_000
    stamp = context.frames[-1].delivery_timestamp.ToMilliseconds()
    assert abs(stamp - wall.now_ms()) < 1_000
    assert _counts(server.metrics, "ReceiveMessage") == {
        "popmq_proxy_rpc_requests_total:OK": 1,
        "popmq_proxy_rpc_duration_seconds_count:": 1,
        "rocketmq_rpc_latency_count:OK": 1,
    }
