"""Helpers shared by the long-poll tests."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from popmq.broker.contract.types import PopRequest
from popmq.broker.local import LocalBrokerPort
from popmq.broker.testing import fast_broker_config, running_broker
from popmq.proxy.longpoll.base import LongPollRequest
from popmq.proxy.metrics import ProxyMetrics

from popmq.clock import LoopClock


def make_request(
    poll_ms: int, preferred: str | None = None, max_messages: int = 32
) -> LongPollRequest:
    pop = PopRequest(group="g", topic="t", max_messages=max_messages, invisible_time_ms=60_000)
    return LongPollRequest(pop=pop, poll_ms=poll_ms, preferred_broker=preferred)


def sample(metrics: ProxyMetrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


async def wait_until(predicate: Callable[[], bool], limit_s: float = 10.0) -> None:
    """Poll a condition that no event signals (a broker's hold count, say). The limit only
    bounds a failure: generous, for the real-time tests on a loaded CI machine."""
    async with asyncio.timeout(limit_s):
        while not predicate():  # noqa: ASYNC110
            await asyncio.sleep(0.001)


@contextlib.asynccontextmanager
async def local_brokers(
    root: Path, count: int = 3, topic: str = "t"
) -> AsyncIterator[list[LocalBrokerPort]]:
    """``count`` running in-process brokers on a LoopClock (virtual time under looptime), each
    with ``topic`` in 2 queues."""
    async with contextlib.AsyncExitStack() as stack:
        ports = []
        for index in range(count):
            config = fast_broker_config(root / f"b{index}", name=f"b{index}")
            broker = await stack.enter_async_context(running_broker(config, LoopClock()))
            port = LocalBrokerPort(broker)
            await port.create_topic(topic, 2)
            ports.append(port)
        yield ports
