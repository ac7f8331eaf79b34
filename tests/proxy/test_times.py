"""Issue 9, defects 8 and 10: invalid Timestamps and Durations get the protocol's codes and a
helpful message (never INTERNAL_ERROR, never ValueError text); Durations out of range are
refused, not normalised; milliseconds sent in Timestamp.seconds are read as milliseconds."""

from __future__ import annotations

import time

import pytest
from popmq.broker.contract.errors import Code, RefusedError
from popmq.proxy.core.times import duration_ms, timestamp_ms
from proxy_support import Cluster, message, unique

from popmq.pb.pool import Duration, Timestamp
from popmq.pb.rocketmq.v2 import definition_pb2 as pb
from popmq.pb.rocketmq.v2 import service_pb2 as s

pytestmark = pytest.mark.slow  # scheduled first in make check (tests/conftest.py)


def test_timestamp_rules() -> None:
    code = Code.ILLEGAL_DELIVERY_TIME
    assert timestamp_ms(Timestamp(seconds=1_700_000_000, nanos=5_000_000), code, "t") == (
        1_700_000_000_005
    )
    # The official Python client's delay: milliseconds in the seconds field.
    assert timestamp_ms(Timestamp(seconds=1_800_000_000_123), code, "t") == 1_800_000_000_123
    for bad in (
        Timestamp(seconds=10**17),  # beyond the range even as milliseconds
        Timestamp(seconds=-(10**13)),
        Timestamp(seconds=1, nanos=-1),
        Timestamp(seconds=1, nanos=1_000_000_000),
        Timestamp(seconds=1_800_000_000_123, nanos=1),  # not a plain ms value
    ):
        with pytest.raises(RefusedError) as err:
            timestamp_ms(bad, code, "delivery time")
        assert err.value.code == code
        assert "delivery time" in str(err.value) and "ValueError" not in str(err.value)


def test_duration_rules() -> None:
    code = Code.ILLEGAL_INVISIBLE_TIME
    assert duration_ms(Duration(seconds=2, nanos=500_000_000), code, "d") == 2_500
    assert duration_ms(Duration(seconds=-2, nanos=-500_000_000), code, "d") == -2_500
    for bad in (
        Duration(seconds=315_576_000_001),  # out of range: refused, not normalised
        Duration(seconds=1, nanos=-1),  # mixed signs
        Duration(seconds=-1, nanos=1),
        Duration(seconds=0, nanos=1_000_000_000),
    ):
        with pytest.raises(RefusedError) as err:
            duration_ms(bad, code, "invisible duration")
        assert err.value.code == code


def _send_request(topic: str, delivery: Timestamp) -> s.SendMessageRequest:
    msg = message(topic, b"x")
    msg.system_properties.delivery_timestamp.CopyFrom(delivery)
    msg.system_properties.message_type = pb.DELAY
    return s.SendMessageRequest(messages=[msg])


async def test_invalid_times_get_protocol_codes_over_grpc(cluster: Cluster) -> None:
    topic, group = unique("t"), unique("g")
    for delivery in (Timestamp(seconds=10**17), Timestamp(seconds=5, nanos=-3)):
        sent = await cluster.stub.SendMessage(
            _send_request(topic, delivery), metadata=cluster.metadata(), timeout=5
        )
        assert sent.status.code == Code.ILLEGAL_DELIVERY_TIME, sent.status
        assert "ValueError" not in sent.status.message
    born = message(topic, b"x")
    born.system_properties.born_timestamp.seconds = 10**17
    sent = await cluster.stub.SendMessage(
        s.SendMessageRequest(messages=[born]), metadata=cluster.metadata(), timeout=5
    )
    assert sent.status.code == Code.BAD_REQUEST, sent.status

    def receive(**durations: Duration) -> s.ReceiveMessageRequest:
        return s.ReceiveMessageRequest(
            group=pb.Resource(name=group),
            message_queue=pb.MessageQueue(topic=pb.Resource(name=topic)),
            filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"),
            batch_size=1,
            **durations,
        )

    cases = [
        (receive(invisible_duration=Duration(seconds=10**15)), Code.ILLEGAL_INVISIBLE_TIME),
        (receive(invisible_duration=Duration(seconds=30, nanos=-1)), Code.ILLEGAL_INVISIBLE_TIME),
        (
            receive(
                invisible_duration=Duration(seconds=30),
                long_polling_timeout=Duration(seconds=-(10**15)),
            ),
            Code.ILLEGAL_POLLING_TIME,
        ),
    ]
    for request, code in cases:
        frames = [f async for f in cluster.stub.ReceiveMessage(
            request, metadata=cluster.metadata(), timeout=5)]  # fmt: skip
        assert frames[0].status.code == code, frames[0].status
        assert "ValueError" not in frames[0].status.message
    changed = await cluster.stub.ChangeInvisibleDuration(
        s.ChangeInvisibleDurationRequest(
            group=pb.Resource(name=group),
            topic=pb.Resource(name=topic),
            receipt_handle="x",
            invisible_duration=Duration(seconds=10**15),
            message_id="X",
        ),
        metadata=cluster.metadata(),
        timeout=5,
    )
    assert changed.status.code == Code.ILLEGAL_INVISIBLE_TIME


async def test_milliseconds_in_seconds_field_are_a_delay(cluster: Cluster) -> None:
    """What the official Python client sends for a delay given in ms (as its docs say)."""
    topic, group = unique("t"), unique("g")
    due_ms = int(time.time() * 1000) + 3_000
    sent = await cluster.stub.SendMessage(
        _send_request(topic, Timestamp(seconds=due_ms)), metadata=cluster.metadata(), timeout=5
    )
    assert sent.status.code == Code.OK, sent.status
    _, early, _ = await cluster.receive(group, topic, poll_ms=300)
    assert early == []  # not before its time
    got: list[pb.Message] = []
    deadline = time.monotonic() + 15
    while not got and time.monotonic() < deadline:
        _, got, _ = await cluster.receive(group, topic, poll_ms=1000)
    assert len(got) == 1
    assert got[0].system_properties.delivery_timestamp.ToMilliseconds() == due_ms
    assert int(time.time() * 1000) >= due_ms
