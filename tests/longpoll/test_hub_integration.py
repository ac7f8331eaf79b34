"""The notification hub against real brokers: many long polls of one group share one held
notification per broker, and a burst of messages reaches all of them promptly."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from popmq.broker.contract.types import Message
from popmq.proxy.longpoll.calls import BrokerCalls
from popmq.proxy.longpoll.notify import NotifyStrategy
from popmq.proxy.metrics import ProxyMetrics

from .helpers import make_request, sample, wait_until
from .test_integration import TOPIC, _cluster, _held, _strategy_tasks

POLLS = 20


@pytest.mark.parametrize("remote", [False, True], ids=["local", "grpc"])
async def test_twenty_long_polls_hold_four_notifications_and_all_get_a_message(
    tmp_path: Path, remote: bool
) -> None:
    metrics = ProxyMetrics()
    strategy = NotifyStrategy(BrokerCalls(metrics), metrics, probe_false_empty=False)
    rpcs = lambda kind: sample(metrics, "popmq_proxy_broker_rpcs_total", kind=kind)  # noqa: E731
    async with _cluster(tmp_path, 4, remote) as (ports, brokers):
        polls = [
            asyncio.create_task(strategy.receive(ports, make_request(10_000, max_messages=1)))
            for _ in range(POLLS)
        ]
        await wait_until(lambda: _held(brokers) == [1, 1, 1, 1], 5)
        await wait_until(lambda: sample(metrics, "popmq_proxy_held_notification_tasks") == 4)
        # One watch per broker for the whole group, not one per long poll (80); every
        # broker's watch is armed and silent, so no long poll pops at all.
        assert rpcs("watch_arm") == 4
        assert rpcs("pop") == 0
        for index in range(POLLS):
            await ports[index % 4].send([Message(topic=TOPIC, body=b"m%d" % index)])
        async with asyncio.timeout(10):  # at once in practice; a deadline for a failure only
            results = await asyncio.gather(*polls)
        bodies = sorted(m.message.body for got in results for m in got)
        assert bodies == sorted(b"m%d" % i for i in range(POLLS))  # each got one, none lost
        # Pops after the first ones: one per message, give or take a race among signals
        # handed out in parallel. (Each long poll holding its own notifications, this took
        # 50-100 pops and 110-160 notifications, and held 80 notifications.)
        assert rpcs("pop") <= POLLS + 4
        assert rpcs("watch_arm") <= 2 * POLLS + 4
        await strategy.aclose()
        await wait_until(lambda: _held(brokers) == [0, 0, 0, 0])
        assert _strategy_tasks() == set()
        assert strategy.hub.channels == 0
    assert sample(metrics, "popmq_proxy_held_notification_tasks") == 0
