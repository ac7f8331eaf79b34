"""A receive that finds fewer messages than its batch takes more from the other brokers at
once (StrategyBase._fill, notify's targets): in-process brokers on virtual time."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest
from popmq.broker.contract.types import Message
from popmq.broker.local import LocalBrokerPort
from popmq.proxy.longpoll.calls import BrokerCalls
from popmq.proxy.longpoll.notify import NotifyStrategy
from popmq.proxy.longpoll.pop import PopStrategy
from popmq.proxy.metrics import ProxyMetrics

from .helpers import local_brokers, make_request, sample

# Virtual time (looptime, the brokers on a LoopClock): holds and deadlines are exact.
pytestmark = pytest.mark.looptime

TOPIC = "t"


def _pops(metrics: ProxyMetrics) -> float:
    return sample(metrics, "popmq_proxy_broker_rpcs_total", kind="pop")


def _fills(metrics: ProxyMetrics, result: str) -> float:
    return sample(metrics, "popmq_proxy_fill_pops_total", strategy="notify", result=result)


async def _arm_watches(strategy: NotifyStrategy, ports: list[LocalBrokerPort]) -> None:
    """An idle group's receive: it arms every broker's watch and ends empty; the watches
    stay armed (they linger) for the receives after it."""
    assert await strategy.receive(ports, make_request(1_000)) == []


async def test_a_receive_that_finds_part_of_its_batch_pops_the_brokers_with_a_backlog(
    tmp_path: Path,
) -> None:
    metrics = ProxyMetrics()
    strategy = NotifyStrategy(BrokerCalls(metrics), metrics, probe_false_empty=False)
    async with local_brokers(tmp_path) as ports:
        await _arm_watches(strategy, ports)
        pops = _pops(metrics)
        # A backlog on b0 and b1 that no long poll was waiting for; b2 stays empty.
        await ports[0].send([Message(topic=TOPIC, body=b"a%d" % i) for i in range(5)])
        await ports[1].send([Message(topic=TOPIC, body=b"b%d" % i) for i in range(7)])
        await asyncio.sleep(0)  # the watches' events
        got = await strategy.receive(ports, make_request(1_000, "b0", max_messages=32))
        # One receive brings both backlogs (before: b0's 5, and b1's 7 in a second receive).
        assert sorted(m.message.body for m in got) == sorted(
            [b"a%d" % i for i in range(5)] + [b"b%d" % i for i in range(7)]
        )
        # b0 first (the client's broker), then b1; b2's watch is armed and silent: no pop.
        assert _pops(metrics) - pops == 2
        assert (_fills(metrics, "found"), _fills(metrics, "empty")) == (1, 0)
        await strategy.aclose()


async def test_a_fill_takes_no_more_than_the_rest_of_the_batch(tmp_path: Path) -> None:
    metrics = ProxyMetrics()
    strategy = NotifyStrategy(BrokerCalls(metrics), metrics, probe_false_empty=False)
    async with local_brokers(tmp_path) as ports:
        await _arm_watches(strategy, ports)
        for port in ports:
            await port.send([Message(topic=TOPIC, body=port.name.encode())] * 3)
        await asyncio.sleep(0)
        got = await strategy.receive(ports, make_request(1_000, "b0", max_messages=5))
        assert len(got) == 5  # 3 from b0, 2 from the next broker: never past the batch
        assert [m.message.body for m in got][:3] == [b"b0"] * 3
        # What the batch left behind is there for the next receive at once.
        rest = await strategy.receive(ports, make_request(1_000, max_messages=32))
        assert len(rest) == 4
        await strategy.aclose()


async def test_a_receive_that_has_messages_waits_for_no_other_broker(tmp_path: Path) -> None:
    """The fill pops without hold: a receive with part of its batch is answered at once,
    not at its deadline, even though the other brokers had nothing."""
    metrics = ProxyMetrics()
    strategy = NotifyStrategy(BrokerCalls(metrics), metrics, probe_false_empty=False)
    async with local_brokers(tmp_path) as ports:
        loop = asyncio.get_running_loop()
        await ports[1].send([Message(topic=TOPIC, body=b"x")])
        started = loop.time()
        # Fresh watches (never armed: a pop may find something on every broker).
        got = await strategy.receive(ports, make_request(5_000, "b1", max_messages=32))
        assert [m.message.body for m in got] == [b"x"]
        assert loop.time() - started == 0  # virtual time: no hold at all
        await strategy.aclose()


async def test_a_filled_fifo_receive_keeps_each_message_group_in_order(tmp_path: Path) -> None:
    """FIFO: each message group sits in one queue of one broker; a receive filled from two
    brokers brings each group's messages in order, and a group with messages in flight gets
    nothing more until they are acked."""
    metrics = ProxyMetrics()
    strategy = NotifyStrategy(BrokerCalls(metrics), metrics, probe_false_empty=False)
    async with local_brokers(tmp_path) as ports:
        await _arm_watches(strategy, ports)
        for port, group in ((ports[0], "ga"), (ports[1], "gb")):
            await port.send(
                [Message(topic=TOPIC, body=b"%s-%d" % (group.encode(), i), message_group=group)
                 for i in range(4)],
                queue_id=0,
            )  # fmt: skip
        await asyncio.sleep(0)
        fifo = make_request(1_000, "b0", max_messages=32)
        fifo = replace(fifo, pop=replace(fifo.pop, fifo=True))
        got = [m.message.body for m in await strategy.receive(ports, fifo)]
        assert [b for b in got if b.startswith(b"ga")] == [b"ga-%d" % i for i in range(4)]
        assert [b for b in got if b.startswith(b"gb")] == [b"gb-%d" % i for i in range(4)]
        # Both groups are in flight: nothing more for them (no second fill hands them out).
        assert await strategy.receive(ports, replace(fifo, poll_ms=0)) == []
        await strategy.aclose()


async def test_the_pop_strategy_does_not_fill(tmp_path: Path) -> None:
    """Its other brokers' arrivals go to their own held pops: blind pops there come back
    empty, so a pop receive brings one broker's messages, as RocketMQ's proxy does."""
    metrics = ProxyMetrics()
    strategy = PopStrategy(BrokerCalls(metrics), metrics, probe_false_empty=False)
    async with local_brokers(tmp_path) as ports:
        await ports[0].send([Message(topic=TOPIC, body=b"a")])
        await ports[1].send([Message(topic=TOPIC, body=b"b")])
        got = await strategy.receive(ports, make_request(1_000, "b0"))
        assert [m.message.body for m in got] == [b"a"]
        assert _pops(metrics) == 1
        await strategy.aclose()
