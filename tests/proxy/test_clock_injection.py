"""The proxy core reads time through its injected Clock (popmq.clock): deadlines and delivery
times follow a virtual clock in tests, without waiting for real."""

from __future__ import annotations

from dataclasses import dataclass

import anyio
import pytest
from popmq.broker.contract.errors import Code, RefusedError
from popmq.proxy.core.context import RequestContext
from popmq.proxy.core.send import OutgoingMessage, Sender
from popmq.proxy.metrics import ProxyMetrics

from popmq.clock import LoopClock
from popmq.config import ProxyConfig


@dataclass(frozen=True)
class Span:
    seconds: int
    nanos: int = 0


@pytest.mark.looptime
async def test_a_request_deadline_passes_on_the_contexts_clock() -> None:
    clock = LoopClock()
    ctx = RequestContext(deadline=clock.monotonic() + 2, clock=clock)
    assert ctx.remaining_ms() == 2000 and not ctx.past_deadline()
    await anyio.sleep(3)  # virtual: no real wait
    assert ctx.remaining_ms() == -1000 and ctx.past_deadline()
    assert not RequestContext(clock=clock).past_deadline()  # no deadline set: never past


class _Reached(Exception):
    """The send passed validation and asked for its route."""


class _Cluster:
    async def route(self, topic: str) -> None:
        raise _Reached(topic)


@pytest.mark.looptime
async def test_how_far_ahead_a_delivery_time_is_is_read_on_the_senders_clock() -> None:
    """At most three days ahead (MAX_DELAY_MS), measured from the sender's clock's now: here 2001,
    from which a delivery time 73 h ahead is refused (read against real time it is long past
    and would be accepted); 2 virtual hours later it is 71 h ahead and goes on to its route."""
    start_s = 1_000_000_000
    sender = Sender(ProxyConfig(), _Cluster(), ProxyMetrics(), LoopClock(start_s * 1000))  # type: ignore[arg-type]
    due = OutgoingMessage("T", b"x", delivery_time=Span(start_s + 73 * 3600))
    with pytest.raises(RefusedError) as refused:
        await sender.send([due], RequestContext())
    assert refused.value.code == Code.ILLEGAL_DELIVERY_TIME
    await anyio.sleep(2 * 3600)  # virtual
    with pytest.raises(_Reached):
        await sender.send([due], RequestContext())
