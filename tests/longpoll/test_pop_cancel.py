"""A pop without hold whose caller is cancelled mid-flight must not lose its messages.

Over gRPC the broker pops as soon as the request arrives; cancelling the call then drops the
answer, and the popped messages stayed invisible for their whole invisible time (60 s in
`popmq bench e2e`, which showed as a p99 of 61 s and hundreds of empty receives). The pop now
finishes in the background and custody releases what it brought."""

from __future__ import annotations

import asyncio

import pytest
from popmq.broker.contract.types import (
    ChangeInvisibleResult,
    PoppedMessage,
    PopRequest,
    PopResult,
    PopStatus,
    StoredMessage,
)
from popmq.proxy.longpoll.calls import BrokerCalls
from popmq.proxy.longpoll.custody import Custody
from popmq.proxy.metrics import ProxyMetrics

# Virtual time (looptime): sleeps and deadlines take no real time, timing asserts are exact.
pytestmark = pytest.mark.looptime


class _SlowAnswerBroker:
    """Pops at once (as the remote broker does on receipt), answers after a delay."""

    name = "slow"

    def __init__(self) -> None:
        self.popped: list[str] = []
        self.released: list[str] = []

    async def pop(self, request: PopRequest) -> PopResult:
        handle = f"h{len(self.popped)}"
        self.popped.append(handle)
        await asyncio.sleep(0.05)  # the answer on its way back
        message = StoredMessage(
            topic="t", queue_id=0, queue_offset=0, body=b"x", tag="", keys=[], properties={},
            message_id="m", message_group="", delivery_timestamp_ms=0, born_timestamp_ms=0,
            born_host="", store_timestamp_ms=0, store_host=self.name, reconsume_times=0,
        )  # fmt: skip
        return PopResult(PopStatus.FOUND, [PoppedMessage(message, handle, 0)], rest_num=0)

    async def change_invisible_time(
        self, group: str, topic: str, receipt_handle: str, invisible_time_ms: int
    ) -> ChangeInvisibleResult:
        self.released.append(receipt_handle)
        return ChangeInvisibleResult(receipt_handle, 0)

    async def hand_back(self, group: str, topic: str, receipt_handles: list[str]) -> int:
        self.released.extend(receipt_handles)
        return len(receipt_handles)


async def test_a_cancelled_pop_releases_what_the_broker_popped() -> None:
    broker = _SlowAnswerBroker()
    calls = BrokerCalls(ProxyMetrics())
    request = PopRequest(group="g", topic="t", max_messages=1, invisible_time_ms=60_000)
    custody = Custody(lambda port, msgs: calls.release(port, request, msgs))
    caller = asyncio.create_task(calls.pop(broker, request, custody))  # type: ignore[arg-type]
    await asyncio.sleep(0.01)
    assert broker.popped == ["h0"]
    caller.cancel()  # the long poll ends (deadline, client gone) while the answer travels
    await asyncio.gather(caller, return_exceptions=True)
    custody.abandon()
    await calls.aclose()  # waits for the pop and the release it causes
    assert broker.released == ["h0"]
