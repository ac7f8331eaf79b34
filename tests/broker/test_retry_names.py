"""Issue 9, defect 2: retry topics of different groups must not collide, and retry messages
written in the old form (``%RETRY%group_topic``) before an upgrade are still delivered."""

from __future__ import annotations

import asyncio

import pytest
from popmq.broker.contract.errors import Code
from popmq.broker.contract.types import (
    PROP_ORIGIN_TOPIC,
    AckEntry,
    Message,
    PopRequest,
    legacy_retry_topic,
    retry_topic,
)
from popmq.broker.core import Broker
from popmq.broker.names import parse_retry_topic
from popmq.broker.testing import fast_broker_config, running_broker

from popmq.clock import LoopClock

# Virtual time (looptime, the brokers on a LoopClock): each drain's 1.5 s passes at once.
pytestmark = pytest.mark.looptime


async def _drain(broker: Broker, group: str, topic: str, seconds: float = 1.5) -> list:
    got: list = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while loop.time() < deadline:
        request = PopRequest(group, topic, max_messages=16, invisible_time_ms=60_000,
                             poll_time_ms=100)  # fmt: skip
        result = await broker.pop(request)
        for popped in result.messages:
            got.append(popped)
            (ack,) = await broker.ack(group, topic, [AckEntry(popped.receipt_handle)])
            assert ack.code == Code.OK
    return got


def test_retry_topic_names_are_injective() -> None:
    assert retry_topic("a_b", "c") != retry_topic("a", "b_c")
    assert retry_topic("a_b", "c") == "%RETRY%a_b+c"  # RocketMQ 5's V2 form
    assert parse_retry_topic(retry_topic("a_b", "c")) == ("a_b", "c")
    assert parse_retry_topic(retry_topic("a", "b_c")) == ("a", "b_c")


async def test_groups_with_colliding_v1_names_get_only_their_own_retries(tmp_path) -> None:
    async with running_broker(fast_broker_config(tmp_path), LoopClock()) as broker:
        await broker.send([Message("c", b"for a_b")])
        await broker.send([Message("b_c", b"for a")])
        for group, topic in (("a_b", "c"), ("a", "b_c")):
            request = PopRequest(group, topic, invisible_time_ms=20, poll_time_ms=0)
            (_first,) = (await broker.pop(request)).messages  # not acked: it will retry
        got_ab = await _drain(broker, "a_b", "c")
        got_a = await _drain(broker, "a", "b_c")
        assert [m.message.body for m in got_ab] == [b"for a_b"]
        assert [m.message.body for m in got_a] == [b"for a"]
        assert all(m.delivery_attempt == 2 for m in got_ab + got_a)


async def test_old_form_retry_messages_survive_an_upgrade(tmp_path) -> None:
    """A data dir with messages in ``%RETRY%a_b_c``, which both a_b/c and a/b_c map to in the
    old form: after a restart each group gets exactly its own (by origin topic), and acks."""
    config = fast_broker_config(tmp_path)
    clock = LoopClock()
    legacy = legacy_retry_topic("a_b", "c")
    assert legacy == legacy_retry_topic("a", "b_c") == "%RETRY%a_b_c"
    async with running_broker(config, clock) as broker:
        await broker.send([Message("c", b"seed c")])
        await broker.send([Message("b_c", b"seed b_c")])
        broker.store.create_topic(legacy, 1)
        old = [
            Message(
                legacy, b"old for a_b 1", properties={PROP_ORIGIN_TOPIC: "c"}, reconsume_times=1
            ),
            Message(legacy, b"old for a", properties={PROP_ORIGIN_TOPIC: "b_c"}, reconsume_times=1),
            Message(
                legacy, b"old for a_b 2", properties={PROP_ORIGIN_TOPIC: "c"}, reconsume_times=1
            ),
        ]
        await broker.store.append(legacy, 0, old)
    async with running_broker(config, clock) as broker:  # the old data is on disk now
        got_ab = await _drain(broker, "a_b", "c")
        got_a = await _drain(broker, "a", "b_c")
        assert sorted(m.message.body for m in got_ab) == [
            b"old for a_b 1",
            b"old for a_b 2",
            b"seed c",
        ]
        assert sorted(m.message.body for m in got_a) == [b"old for a", b"seed b_c"]
        for popped in got_ab + got_a:
            assert popped.message.topic in ("c", "b_c")  # consumers see their own topic
        stats = await broker.group_stats("a_b", "c")
        assert any(s.topic == legacy for s in stats)
