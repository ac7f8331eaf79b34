"""Visibility watches fire on every way a message becomes visible for a group: arrival,
nack (invisible time set to 0, then revived), delay delivery, and a consumer offset reset."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from popmq.broker.contract.types import AckEntry, FilterExpression, Message, PopRequest
from popmq.broker.contract.watch import VisibilityWatch, WatchKey, WatchState
from popmq.broker.local import LocalBrokerPort
from popmq.broker.testing import fast_broker_config, running_broker

TOPIC, GROUP = "t", "g"
KEY = WatchKey(GROUP, TOPIC, FilterExpression(), False)
POP = PopRequest(group=GROUP, topic=TOPIC, max_messages=32, invisible_time_ms=60_000)


async def _armed(port: LocalBrokerPort) -> VisibilityWatch:
    watch = VisibilityWatch(KEY, port.watch_backend)
    watch.arm()
    assert watch.state is WatchState.ARMED
    await asyncio.sleep(0.05)
    assert watch.state is WatchState.ARMED  # nothing visible: no event
    return watch


async def _fired(watch: VisibilityWatch) -> None:
    async with asyncio.timeout(5):
        await watch.wait()
    assert watch.state is WatchState.HAS


async def _drain(port: LocalBrokerPort) -> list[str]:
    result = await port.pop(POP)
    return [m.receipt_handle for m in result.messages]


async def test_arrival_and_nack_fire(tmp_path: Path) -> None:
    async with running_broker(fast_broker_config(tmp_path)) as broker:
        async with LocalBrokerPort(broker) as port:  # a port closes as it leaves the block
            await port.create_topic(TOPIC, 2)
            watch = await _armed(port)
            await port.send([Message(topic=TOPIC, body=b"a")])
            await _fired(watch)
            handles = await _drain(port)
            assert len(handles) == 1
            watch.arm()
            await asyncio.sleep(0.05)
            assert watch.state is WatchState.ARMED
            await port.change_invisible_time(GROUP, TOPIC, handles[0], 0)  # a nack
            await _fired(watch)


async def test_delay_delivery_fires_when_due(tmp_path: Path) -> None:
    async with running_broker(fast_broker_config(tmp_path)) as broker:
        port = LocalBrokerPort(broker)
        await port.create_topic(TOPIC, 2)
        watch = await _armed(port)
        due = int(time.time() * 1000) + 300
        await port.send([Message(topic=TOPIC, body=b"later", delivery_timestamp_ms=due)])
        await _fired(watch)
        assert int(time.time() * 1000) >= due - 50  # not before it is due
        await port.aclose()


async def test_offset_reset_fires(tmp_path: Path) -> None:
    async with running_broker(fast_broker_config(tmp_path)) as broker:
        port = LocalBrokerPort(broker)
        await port.create_topic(TOPIC, 1)
        await port.send([Message(topic=TOPIC, body=b"a")])
        handles = await _drain(port)
        await port.ack(GROUP, TOPIC, [AckEntry(h) for h in handles])
        watch = await _armed(port)
        await port.update_consumer_offset(GROUP, TOPIC, 0, 0)  # consume it all again
        await _fired(watch)
        assert len(await _drain(port)) == 1
        await port.aclose()
