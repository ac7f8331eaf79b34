"""The broker's memory budget on the request link: a pop answer holds its bytes until its
frame is written, and gives them back on every other way out (a failed write, a stream the
proxy dropped, a cancelled call), or the budget would stay full and refuse every later send
and pop of the broker (TOO_MANY_REQUESTS) for the rest of its life."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from popmq.broker.contract.errors import Code
from popmq.broker.contract.types import Message
from popmq.broker.local import LocalBrokerPort
from popmq.broker.testing import fast_broker_config, running_broker
from popmq.broker.wire.server import BrokerGrpcServer, BrokerServicer

from popmq.pb.broker.v1 import broker_pb2 as pb
from popmq.pb.broker.v1 import broker_pb2_grpc

BODY = 1000


@contextlib.asynccontextmanager
async def _servicer(tmp_path: Path, limit: int) -> AsyncIterator[BrokerServicer]:
    async with running_broker(fast_broker_config(tmp_path / "b", name="b")) as broker:
        port = LocalBrokerPort(broker)
        await port.create_topic("t", 1)
        await port.send([Message(topic="t", body=b"x" * BODY) for _ in range(3)])
        yield BrokerServicer(port, max_inflight_bytes=limit, inflight_wait_ms=50)


def _pop(request_id: int) -> pb.LinkRequest:
    return pb.LinkRequest(id=request_id, pop=pb.PopRequest(
        group="g", topic="t", queue_id=-1, max_messages=3, invisible_time_ms=60_000))  # fmt: skip


async def _requests(*batch: pb.LinkRequest) -> AsyncIterator[pb.LinkRequests]:
    yield pb.LinkRequests(requests=list(batch))
    await asyncio.Event().wait()  # the proxy keeps its side open


class _Writes:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.open = asyncio.Event()
        self.frames: list[bytes] = []

    async def write(self, data: bytes) -> None:
        if self.fail:
            raise ConnectionError("the proxy went away")
        await self.open.wait()
        self.frames.append(data)


async def _until(check: Any) -> None:
    for _ in range(2000):
        if check():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("not reached in 10 s")


async def test_a_failed_write_gives_the_answer_s_budget_back(tmp_path: Path) -> None:
    async with _servicer(tmp_path, limit=10 * BODY) as servicer:
        with pytest.raises(BaseException):  # noqa: B017 (the stream ends with the write's error)
            async with asyncio.timeout(10):
                await servicer.Call(_requests(_pop(1)), _Writes(fail=True))
        assert servicer._budget.held == 0


async def test_a_dropped_stream_gives_unwritten_answers_budget_back(tmp_path: Path) -> None:
    async with _servicer(tmp_path, limit=10 * BODY) as servicer:
        writes = _Writes()
        call = asyncio.ensure_future(servicer.Call(_requests(_pop(1)), writes))
        await _until(lambda: servicer._budget.held == 3 * BODY)  # answered, not written
        call.cancel()  # the proxy's stream is gone
        with contextlib.suppress(asyncio.CancelledError):
            await call
        assert servicer._budget.held == 0


async def test_an_answer_larger_than_the_budget_passes_and_then_frees_it(
    tmp_path: Path,
) -> None:
    async with _servicer(tmp_path, limit=BODY) as servicer:
        writes = _Writes()
        call = asyncio.ensure_future(servicer.Call(_requests(_pop(1)), writes))
        try:
            await _until(lambda: servicer._budget.held == 3 * BODY)
            send = pb.SendRequest(queue_id=0)
            send.messages.add(topic="t", body=b"y")
            refused = await servicer.Send(send, None)  # the budget is full meanwhile
            assert refused.status.code == Code.TOO_MANY_REQUESTS
            writes.open.set()
            await _until(lambda: servicer._budget.held == 0)
            stored = await servicer.Send(send, None)
            assert stored.status.code == Code.OK and len(stored.results) == 1
            assert pb.LinkResponses.FromString(writes.frames[0]).responses[0].pop.messages
        finally:
            call.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await call
        assert servicer._budget.held == 0


class _UnaryContext:
    """A unary call's context: its done callbacks run once grpc has sent the answer."""

    def __init__(self) -> None:
        self.callbacks: list[Any] = []

    def add_done_callback(self, callback: Any) -> None:
        self.callbacks.append(callback)

    def done(self) -> None:
        for callback in self.callbacks:
            callback(self)


@pytest.mark.parametrize("method", ["Pop", "Pull"])
async def test_a_unary_answer_holds_its_budget_until_grpc_sent_it(
    tmp_path: Path, method: str
) -> None:
    """Returned from the handler, a unary pop or pull answer is not written yet (grpc encodes
    and sends it after): its bytes stay taken until the call is done."""
    async with _servicer(tmp_path, limit=10 * BODY) as servicer:
        context = _UnaryContext()
        if method == "Pop":
            answer: Any = await servicer.Pop(_pop(1).pop, context)
        else:
            request = pb.PullRequest(topic="t", queue_id=0, offset=0, max_messages=3)
            answer = await servicer.Pull(request, context)
        assert answer.status.code == Code.OK and len(answer.messages) == 3
        assert servicer._budget.held == 3 * BODY
        context.done()
        assert servicer._budget.held == 0


async def test_a_unary_pop_over_grpc_gives_its_budget_back_once_sent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through a real grpc server: the budget is still taken when the handler has returned,
    and given back once the call is done."""
    at_return: list[int] = []
    real_pop = BrokerServicer.Pop

    async def recording_pop(self: BrokerServicer, request: Any, context: Any) -> Any:
        answer = await real_pop(self, request, context)
        at_return.append(self._budget.held)
        servicers.append(self)
        return answer

    servicers: list[BrokerServicer] = []
    monkeypatch.setattr(BrokerServicer, "Pop", recording_pop)
    async with running_broker(fast_broker_config(tmp_path / "b", name="b")) as broker:
        port = LocalBrokerPort(broker)
        await port.create_topic("t", 1)
        await port.send([Message(topic="t", body=b"x" * BODY) for _ in range(3)])
        server = BrokerGrpcServer(port, "127.0.0.1", 0)
        await server.start()
        try:
            async with grpc.aio.insecure_channel(server.address) as channel:
                stub = broker_pb2_grpc.BrokerServiceStub(channel)
                answer = await stub.Pop(_pop(1).pop, timeout=10)
            assert len(answer.messages) == 3
            assert at_return == [3 * BODY]
            await _until(lambda: servicers[0]._budget.held == 0)
        finally:
            await server.aclose(0)
