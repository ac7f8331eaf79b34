"""A unary held pop whose caller gives up (``broker_link.requests=unary``), virtual time.

grpc.aio drops the answer of a cancelled call, and awaiting a call cancels it with the
awaiting task. ``RemoteBrokerPort._held_call`` awaits the call through its done callback
instead: an answer already there when the caller goes is handed back; a call whose poll time
is about over runs on and its answer is handed back; one with more poll time left (the client
gone) is cancelled, which releases the broker's hold. A fake call stands for grpc's, so each
order is forced exactly.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from popmq.broker.contract.errors import BrokerUnavailableError
from popmq.broker.contract.types import PopRequest
from popmq.broker.wire.remote import UNARY_DETACH_S, RemoteBrokerPort

from popmq.config import BrokerLinkConfig
from popmq.lifecycle import TaskOwner
from popmq.pb.broker.v1 import broker_pb2 as pb

pytestmark = pytest.mark.looptime


class _Call:
    """What a grpc.aio unary call offers: done callbacks, done(), cancel(), await."""

    def __init__(self) -> None:
        self._future: asyncio.Future[pb.PopResponse] = asyncio.get_running_loop().create_future()
        self.cancelled = False

    def add_done_callback(self, callback: Any) -> None:
        self._future.add_done_callback(lambda _future: callback(self))

    def done(self) -> bool:
        return self._future.done()

    def cancel(self) -> bool:
        self.cancelled = True
        return self._future.cancel()

    def answer(self, *handles: str) -> None:
        response = pb.PopResponse()
        for handle in handles:
            response.messages.add(receipt_handle=handle)
        self._future.set_result(response)

    def __await__(self) -> Any:
        return self._future.__await__()


class _Stub:
    def __init__(self) -> None:
        self.calls: list[_Call] = []

    def Pop(self, request: pb.PopRequest, timeout: float) -> _Call:
        call = _Call()
        self.calls.append(call)
        return call


def _port() -> tuple[RemoteBrokerPort, _Stub, list[str]]:
    port = RemoteBrokerPort("b0", "127.0.0.1:1", link=BrokerLinkConfig(requests="unary"))
    stub = _Stub()
    port._stub = stub  # type: ignore[assignment]
    handed: list[str] = []

    async def hand_back(group: str, topic: str, receipt_handles: list[str]) -> int:
        handed.extend(receipt_handles)
        return len(receipt_handles)

    port.hand_back = hand_back  # type: ignore[method-assign]
    return port, stub, handed


def _held(poll_ms: int) -> PopRequest:
    return PopRequest(
        group="g", topic="t", max_messages=8, invisible_time_ms=60_000, poll_time_ms=poll_ms
    )


async def _gone(caller: asyncio.Task[Any]) -> None:
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller


async def test_an_answer_there_as_the_caller_goes_is_handed_back() -> None:
    """The client gone (20 s of poll time left) in the turn its answer came: the answer
    was lost with the cancelled call."""
    port, stub, handed = _port()
    caller = asyncio.create_task(port.pop(_held(20_000)))
    await asyncio.sleep(0)
    stub.calls[0].answer("h1", "h2")
    await _gone(caller)
    await asyncio.sleep(0.1)
    assert handed == ["h1", "h2"]
    assert port.late_popped == 2
    await port.aclose()


async def test_a_call_at_the_end_of_its_poll_runs_on_and_its_answer_is_handed_back() -> None:
    """The caller's deadline passed (the broker's poll ends with it) while the broker's
    answer was on its way: the call is not cancelled (that dropped the answer)."""
    port, stub, handed = _port()
    caller = asyncio.create_task(port.pop(_held(5_000)))
    await asyncio.sleep(5 - UNARY_DETACH_S / 2)
    await _gone(caller)
    call = stub.calls[0]
    assert not call.cancelled
    call.answer("h1")
    await asyncio.sleep(0.1)
    assert handed == ["h1"]
    await port.aclose()


async def test_a_call_with_poll_time_left_is_cancelled_when_its_client_goes() -> None:
    """The broker's hold is released at once (no answer yet: nothing was taken)."""
    port, stub, handed = _port()
    caller = asyncio.create_task(port.pop(_held(20_000)))
    await asyncio.sleep(1)
    await _gone(caller)
    assert stub.calls[0].cancelled
    assert handed == []
    await port.aclose()


async def test_a_late_call_still_running_when_the_port_closes_is_cancelled() -> None:
    port, stub, _ = _port()
    caller = asyncio.create_task(port.pop(_held(1_000)))
    await asyncio.sleep(0.5)
    await _gone(caller)
    assert not stub.calls[0].cancelled
    await port.aclose()
    assert stub.calls[0].cancelled


class _SlowChannel:
    """A channel whose close takes a while (grpc's waits for its calls' tasks)."""

    def __init__(self) -> None:
        self.closing = asyncio.Event()
        self.release = asyncio.Event()

    async def close(self) -> None:
        self.closing.set()
        await self.release.wait()


async def test_a_caller_gone_while_the_port_closes_leaves_nothing_running() -> None:
    """Regression (review-cancel): a held pop given up at its deadline while the port was
    closing (a retired port is closed 5 s after a leader change, its long polls still held)
    was detached into a new late-call owner made after close, which nothing closes: its call
    ran on, and its answer's hand-back re-opened a channel on the closed port (kept open)."""
    port, stub, _ = _port()
    del port.hand_back  # the port's own: it dials the broker
    slow = _SlowChannel()
    port._channel = slow  # type: ignore[assignment]
    caller = asyncio.create_task(port.pop(_held(1_000)))
    await asyncio.sleep(0.5)  # half a second of poll time left: detached if given up
    closing = asyncio.create_task(port.aclose())
    await slow.closing.wait()
    await _gone(caller)
    call = stub.calls[0]
    if not call.done():
        call.answer("h1")
    await asyncio.sleep(0.1)  # a late answer is handed back, if the call ran on
    slow.release.set()
    await closing
    late_owner, reopened = port._late_tasks, port._channel
    if reopened is not None:
        await reopened.close()
    if late_owner is not None:
        await late_owner.aclose()
    assert call.cancelled
    assert late_owner is None
    assert reopened is None


async def test_a_held_pop_cancelled_under_its_caller_is_unavailable_not_a_stray_cancel() -> None:
    """Regression (review-cancel): closing a port's channel cancels its calls, and awaiting a
    call cancelled so raises a bare CancelledError in a task nobody cancelled. In a task
    group (BrokerCalls' owner runs every remote pop of the proxy) that reads as a cancelled
    sibling: every other pop of the proxy was cancelled with it. Shown on real gRPC in
    test_request_link.py."""
    port, stub, _ = _port()
    owner = TaskOwner("calls", grace_s=0)
    sibling = owner.spawn(asyncio.sleep(30), "sibling")
    pop = owner.spawn(port.pop(_held(20_000)), "pop", log_errors=False)
    assert sibling is not None and pop is not None
    await asyncio.sleep(1)
    stub.calls[0].cancel()  # as grpc's channel close does
    outcome: BaseException | None = None
    try:
        await pop.result()
    except BaseException as exc:  # a CancelledError is the defect
        outcome = exc
    await asyncio.sleep(0.1)
    sibling_ended = sibling.done()
    await owner.aclose()
    await port.aclose()
    assert isinstance(outcome, BrokerUnavailableError)
    assert not sibling_ended
