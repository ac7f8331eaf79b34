"""broker/wire/convert.py: every port dataclass survives the trip through broker.proto."""

from __future__ import annotations

import dataclasses

import pytest
from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.types import (
    AckEntry,
    AckEntryResult,
    ChangeInvisibleResult,
    ConsumeMode,
    FilterExpression,
    GroupConfig,
    GroupQueueStats,
    Message,
    NotifyRequest,
    NotifyResult,
    PoppedMessage,
    PopRequest,
    PopResult,
    PopStatus,
    PullRequest,
    PullResult,
    PullStatus,
    QueueInfo,
    SendResult,
    StoredMessage,
    TopicInfo,
)
from popmq.broker.wire import convert

from popmq.pb.broker.v1 import broker_pb2 as pb


def stored(offset: int) -> StoredMessage:
    return StoredMessage(
        topic="orders", queue_id=3, queue_offset=offset, body=b"\x00body\xff",
        tag="TagA", keys=["k1", "k2"], properties={"a": "1", "b": ""},
        message_id=f"id-{offset}", message_group="g1", delivery_timestamp_ms=1_700_000_000_123,
        born_timestamp_ms=1_700_000_000_001, born_host="10.0.0.1",
        store_timestamp_ms=1_700_000_000_002, store_host="broker-a", reconsume_times=4,
    )  # fmt: skip


# (value, to_proto, from_proto): each value sets every field away from its default.
ROUND_TRIPS = [
    (
        Message(
            topic="t", body=b"b", tag="x", keys=["k"], properties={"p": "v"}, message_id="m",
            message_group="grp", delivery_timestamp_ms=5, born_timestamp_ms=6, born_host="h",
            reconsume_times=2,
        ),
        convert.message_to_proto, convert.message_from_proto,
    ),
    (stored(7), convert.stored_to_proto, convert.stored_from_proto),
    (
        SendResult("m", "t", 2, 99, "broker-b", "r1.handle", "t1.transaction"),
        convert.send_result_to_proto, convert.send_result_from_proto,
    ),
    (
        PopRequest(
            group="g", topic="t", queue_id=1, max_messages=5, invisible_time_ms=30_000,
            poll_time_ms=2_000, filter=FilterExpression("A || B"), fifo=True,
        ),
        convert.pop_request_to_proto, convert.pop_request_from_proto,
    ),
    (
        PopResult(
            PopStatus.FOUND,
            [PoppedMessage(stored(1), "rh1", 123), PoppedMessage(stored(2), "rh2", 456)],
            17,
        ),
        convert.pop_result_to_proto, convert.pop_result_from_proto,
    ),
    (PopResult(PopStatus.POLLING_FULL), convert.pop_result_to_proto, convert.pop_result_from_proto),
    (AckEntry("rh", "m"), convert.ack_entry_to_proto, convert.ack_entry_from_proto),
    (
        AckEntryResult("rh", "m", Code.INVALID_RECEIPT_HANDLE, "expired"),
        convert.ack_result_to_proto, convert.ack_result_from_proto,
    ),
    (
        ChangeInvisibleResult("rh-new", 789),
        convert.change_invisible_to_proto, convert.change_invisible_from_proto,
    ),
    (
        NotifyRequest("g", "t", 2, 1_500, FilterExpression("A"), True),
        convert.notify_request_to_proto, convert.notify_request_from_proto,
    ),
    (NotifyResult(True, True), convert.notify_result_to_proto, convert.notify_result_from_proto),
    (
        PullRequest("t", 1, 42, 8, 3_000, FilterExpression("C")),
        convert.pull_request_to_proto, convert.pull_request_from_proto,
    ),
    (
        PullResult(PullStatus.OFFSET_PURGED, [stored(3)], 4, 2, 10),
        convert.pull_result_to_proto, convert.pull_result_from_proto,
    ),
    (
        TopicInfo("t", 2, [QueueInfo(0, 1, 5), QueueInfo(1, 0, 9)], "FIFO"),
        convert.topic_to_proto, convert.topic_from_proto,
    ),
    (
        GroupConfig("g", ConsumeMode.PULL, 3, ["1s", "2s"], True),
        convert.group_to_proto, convert.group_from_proto,
    ),
    (
        GroupQueueStats("t", 1, 5, 9, 2),
        convert.group_stats_to_proto, convert.group_stats_from_proto,
    ),
]  # fmt: skip


@pytest.mark.parametrize(
    ("value", "to_proto", "from_proto"), ROUND_TRIPS, ids=lambda v: type(v).__name__
)
def test_round_trip_through_bytes(value, to_proto, from_proto) -> None:
    proto = to_proto(value)
    decoded = type(proto).FromString(proto.SerializeToString())
    back = from_proto(decoded)
    assert back == value
    assert type(back) is type(value)


def test_every_dataclass_field_is_set_in_the_samples() -> None:
    """Guards the round trips above: a default value could hide a field lost on the wire."""
    for value, _, _ in ROUND_TRIPS:
        if isinstance(value, PopResult) and value.status is PopStatus.POLLING_FULL:
            continue
        for field in dataclasses.fields(value):
            if field.default is not dataclasses.MISSING:
                assert getattr(value, field.name) != field.default, (type(value), field.name)
            elif field.default_factory is not dataclasses.MISSING:
                assert getattr(value, field.name) != field.default_factory(), field.name


def test_every_port_dataclass_is_covered() -> None:
    covered = {type(value) for value, _, _ in ROUND_TRIPS} | {PoppedMessage, QueueInfo}
    covered |= {FilterExpression}
    wanted = {
        Message, StoredMessage, SendResult, PopRequest, PopResult, PoppedMessage, AckEntry,
        AckEntryResult, ChangeInvisibleResult, NotifyRequest, NotifyResult, PullRequest,
        PullResult, QueueInfo, TopicInfo, GroupConfig, GroupQueueStats, FilterExpression,
    }  # fmt: skip
    assert wanted <= covered


def test_converted_values_hold_no_protobuf_containers() -> None:
    back = convert.stored_from_proto(convert.stored_to_proto(stored(1)))
    assert type(back.keys) is list and type(back.properties) is dict


def test_every_status_maps_to_a_proto_enum() -> None:
    for status in PopStatus:
        assert convert.pop_status_from_proto(convert.pop_status_to_proto(status)) is status
    for status in PullStatus:
        assert convert.pull_status_from_proto(convert.pull_status_to_proto(status)) is status
    for mode in ConsumeMode:
        assert convert.consume_mode_from_proto(convert.consume_mode_to_proto(mode)) is mode


def test_empty_filter_means_everything() -> None:
    assert convert.filter_from_proto(pb.FilterExpression()).matches("any")


def test_status_carries_the_broker_error() -> None:
    status = convert.error_status(RefusedError(Code.TOPIC_NOT_FOUND, "no topic x"))
    with pytest.raises(RefusedError) as caught:
        convert.raise_for_status(pb.Status.FromString(status.SerializeToString()))
    assert caught.value.code is Code.TOPIC_NOT_FOUND
    assert caught.value.message == "no topic x"
    convert.raise_for_status(convert.ok_status())  # OK raises nothing


def test_unknown_status_code_becomes_internal_error() -> None:
    with pytest.raises(RefusedError) as caught:
        convert.raise_for_status(pb.Status(code=12345, message="odd"))
    assert caught.value.code is Code.INTERNAL_ERROR
    assert "12345" in caught.value.message
