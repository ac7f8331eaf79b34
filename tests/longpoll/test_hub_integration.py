"""The notification hub against real brokers: many long polls of one group share one held
notification per broker, and a burst of messages reaches all of them promptly."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from popmq.broker.contract.port import BrokerPort
from popmq.broker.contract.types import Message
from popmq.proxy.longpoll.calls import BrokerCalls
from popmq.proxy.longpoll.notify import NotifyStrategy
from popmq.proxy.metrics import ProxyMetrics

from .helpers import make_request, sample, wait_until
from .test_integration import TOPIC, _cluster, _held, _strategy_tasks

POLLS = 20


def _link_restarts(ports: list[BrokerPort]) -> int:
    """Watch streams that ended and were opened again (0 in process). A restart legitimately
    fires every armed watch once (UNKNOWN: an event may be lost), so long polls pop then; the
    re-sent arms are the same pending arms and are not counted again."""
    links = [getattr(port, "watch_backend", None) for port in ports]
    return sum(max(0, link.connects - 1) for link in links if hasattr(link, "connects"))


def _links_up(ports: list[BrokerPort]) -> bool:
    links = [getattr(port, "watch_backend", None) for port in ports]
    return all(getattr(link, "up", True) for link in links)


@pytest.mark.parametrize("remote", [False, True], ids=["local", "grpc"])
async def test_twenty_long_polls_hold_four_notifications_and_all_get_a_message(
    tmp_path: Path, remote: bool
) -> None:
    metrics = ProxyMetrics()
    strategy = NotifyStrategy(BrokerCalls(metrics), metrics, probe_false_empty=False)
    rpcs = lambda kind: sample(metrics, "popmq_proxy_broker_rpcs_total", kind=kind)  # noqa: E731
    async with _cluster(tmp_path, 4, remote) as (ports, brokers):
        # Polls of 60 s: their deadline must not pass on a loaded machine before the sends.
        polls = [
            asyncio.create_task(strategy.receive(ports, make_request(60_000, max_messages=1)))
            for _ in range(POLLS)
        ]
        # Settled: every watch link up, one wait held per broker, one hub task per broker.
        await wait_until(
            lambda: (
                _links_up(ports)
                and _held(brokers) == [1, 1, 1, 1]
                and sample(metrics, "popmq_proxy_held_notification_tasks") == 4
            )
        )
        # One watch per broker for the whole group, not one per long poll (80): a link that
        # restarted re-sends its pending arm, which is not another arm.
        assert rpcs("watch_arm") == 4
        # Every broker's watch is armed and silent, so no long poll pops at all -- unless a
        # watch stream restarted (an event may have been lost there, so pops are right then).
        restarts = _link_restarts(ports)
        if restarts == 0:
            assert rpcs("pop") == 0
        else:
            print(f"watch links restarted {restarts} times; pops {rpcs('pop')}")
        pops, arms = rpcs("pop"), rpcs("watch_arm")
        for index in range(POLLS):
            await ports[index % 4].send([Message(topic=TOPIC, body=b"m%d" % index)])
        async with asyncio.timeout(10):  # at once in practice; a deadline for a failure only
            results = await asyncio.gather(*polls)
        bodies = sorted(m.message.body for got in results for m in got)
        assert bodies == sorted(b"m%d" % i for i in range(POLLS))  # each got one, none lost
        # Pops after the first ones: one per message, give or take a race among signals
        # handed out in parallel. (Each long poll holding its own notifications, this took
        # 50-100 pops and 110-160 notifications, and held 80 notifications.)
        if _link_restarts(ports) == restarts:  # (a restart meanwhile adds pops, rightly)
            assert rpcs("pop") - pops <= POLLS + 4
            assert rpcs("watch_arm") - arms <= 2 * POLLS + 4
        await strategy.aclose()
        await wait_until(lambda: _held(brokers) == [0, 0, 0, 0])
        assert _strategy_tasks() == set()
        assert strategy.hub.channels == 0
    assert sample(metrics, "popmq_proxy_held_notification_tasks") == 0
