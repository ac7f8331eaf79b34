"""The broker link's event stream under loss: a message whose event was lost is still
delivered, and no long poll hangs while a link is down (docs/longpolling.md, "lost events")."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from popmq.broker.contract.types import Message
from popmq.broker.contract.watch import WatchState
from popmq.broker.local import LocalBrokerPort
from popmq.broker.testing import fast_broker_config, running_broker
from popmq.broker.wire.remote import RemoteBrokerPort
from popmq.broker.wire.server import BrokerGrpcServer
from popmq.proxy.longpoll.calls import BrokerCalls
from popmq.proxy.longpoll.notify import NotifyStrategy
from popmq.proxy.metrics import ProxyMetrics

from .helpers import make_request, sample, wait_until

TOPIC = "t"


@contextlib.asynccontextmanager
async def _remote_pair(root: Path) -> AsyncIterator[tuple[list[RemoteBrokerPort], list[Any]]]:
    """Two brokers, each behind its own gRPC server; yields (remote ports, [(local, server)])."""
    async with contextlib.AsyncExitStack() as stack:
        ports, sides = [], []
        for index in range(2):
            broker = await stack.enter_async_context(
                running_broker(fast_broker_config(root / f"b{index}", name=f"b{index}"))
            )
            local = LocalBrokerPort(broker)
            await local.create_topic(TOPIC, 2)
            server = BrokerGrpcServer(local)
            await server.start()
            sides.append([local, server])
            port = RemoteBrokerPort(f"b{index}", server.address)
            stack.push_async_callback(port.aclose)
            ports.append(port)
        try:
            yield ports, sides
        finally:
            for _, server in sides:
                await server.aclose(0)


def _watch_state(strategy: NotifyStrategy, port: RemoteBrokerPort) -> WatchState:
    watch = strategy.hub.watches.get(port, make_request(0).pop)
    assert watch is not None
    return watch.state


async def test_a_cut_stream_loses_no_message(tmp_path: Path) -> None:
    """The stream is cut and the message is stored before the link is back: its event can
    not have been sent, yet the waiting long poll gets it (pop once on UNKNOWN, then the
    re-sent arm's level check)."""
    metrics = ProxyMetrics()
    strategy = NotifyStrategy(BrokerCalls(metrics), metrics, probe_false_empty=False)
    async with _remote_pair(tmp_path) as (ports, sides):
        receive = asyncio.create_task(strategy.receive(ports, make_request(10_000, "b0")))
        await wait_until(lambda: [s[0].broker.hold_table.total for s in sides] == [1, 1], 5)
        link = ports[1].watch_backend
        link.break_stream()
        await sides[1][0].send([Message(topic=TOPIC, body=b"during the cut")])
        async with asyncio.timeout(5):  # far below the 10 s poll
            got = await receive
        assert [m.message.body for m in got] == [b"during the cut"]
        await wait_until(lambda: link.connects >= 2, 5)  # re-subscribed on a new stream
        metrics.watch_links(ports)
        losses = "popmq_proxy_broker_link_losses_total"
        assert sample(metrics, losses, broker="b1") == 1  # the loss is visible to operators
        assert sample(metrics, losses, broker="b0") == 0
        await wait_until(lambda: _watch_state(strategy, ports[1]) is WatchState.ARMED, 5)
        await strategy.aclose()


@pytest.mark.wallclock  # real timing, generous bounds (see pyproject markers)
async def test_a_broker_gone_and_back_loses_no_message_and_no_poll_hangs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The broker's server goes away (as in a restart or a partition); messages stored while
    it is unreachable reach a long poll once it is back, and polls meanwhile end on time."""
    metrics = ProxyMetrics()
    strategy = NotifyStrategy(BrokerCalls(metrics), metrics, probe_false_empty=False)
    async with _remote_pair(tmp_path) as (ports, sides):
        warmup = await strategy.receive(ports, make_request(300))
        assert warmup == []
        local, server = sides[1]
        number = server.bound_port
        link = ports[1].watch_backend
        caplog.set_level(logging.INFO, logger="popmq.broker.wire.link")
        await server.aclose(0)
        await wait_until(lambda: _watch_state(strategy, ports[1]) is WatchState.UNKNOWN, 5)
        attempts = link.connects
        await wait_until(lambda: link.connects >= attempts + 3, 5)  # reconnects keep failing
        # One outage: one WARNING and one loss, not one per reconnect attempt (the "link
        # flapping" alert counts losses).
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
                    and r.name == "popmq.broker.wire.link"]  # fmt: skip
        assert len(warnings) == 1 and "lost" in warnings[0], warnings
        assert link.losses == 1
        # No poll hangs while the broker is unreachable: it ends at its deadline, empty.
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert await strategy.receive(ports, make_request(500)) == []
        assert loop.time() - started < 5
        await local.send([Message(topic=TOPIC, body=b"while away")])
        receive = asyncio.create_task(strategy.receive(ports, make_request(10_000, "b0")))
        await asyncio.sleep(0.2)
        assert not receive.done()
        sides[1][1] = BrokerGrpcServer(local, port_number=number)
        await sides[1][1].start()
        async with asyncio.timeout(8):  # reconnect back-off is at most 1 s
            got = await receive
        assert [m.message.body for m in got] == [b"while away"]

        def link_lines(level: int) -> list[str]:
            return [r.getMessage() for r in caplog.records
                    if r.name == "popmq.broker.wire.link" and r.levelno == level]  # fmt: skip

        await wait_until(lambda: link_lines(logging.INFO) == ["link to broker b1 is back"], 5)
        assert len(link_lines(logging.WARNING)) == 1 and link.losses == 1
        await strategy.aclose()
