"""Stored/popped messages as the official clients read them."""

from __future__ import annotations

from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.types import (
    PROP_ORIGIN_MESSAGE_ID,
    PROP_ORIGIN_TOPIC,
    PoppedMessage,
    StoredMessage,
    retry_topic,
)
from popmq.proxy.grpc.convert import md5_hex, popped_to_pb

from popmq.pb.rocketmq.v2 import definition_pb2 as pb


def stored(**overrides) -> StoredMessage:
    fields = dict(
        topic="orders", queue_id=2, queue_offset=41, body=b"hello", tag="TagA",
        keys=["k1"], properties={"app": "x"}, message_id="MID1", message_group="",
        delivery_timestamp_ms=0, born_timestamp_ms=1_700_000_000_123, born_host="10.0.0.1",
        store_timestamp_ms=1_700_000_000_456, store_host="broker-0", reconsume_times=0,
    )  # fmt: skip
    fields.update(overrides)
    return StoredMessage(**fields)


def test_body_digest_is_upper_hex_md5() -> None:
    assert md5_hex(b"hello") == "5D41402ABC4B2A76B9719D911017C592"
    assert md5_hex(b"") == "D41D8CD98F00B204E9800998ECF8427E"


def test_popped_message_fields() -> None:
    now = 1_700_000_010_000
    msg = popped_to_pb(PoppedMessage(stored(reconsume_times=2), "HANDLE", now + 30_000), now)
    props = msg.system_properties
    assert msg.topic.name == "orders" and msg.body == b"hello"
    assert props.body_encoding == pb.IDENTITY
    assert props.body_digest.type == pb.MD5 and props.body_digest.checksum == md5_hex(b"hello")
    assert props.receipt_handle == "HANDLE"
    assert props.delivery_attempt == 3
    assert props.tag == "TagA" and list(props.keys) == ["k1"]
    assert props.message_type == pb.NORMAL
    assert props.born_timestamp.ToMilliseconds() == 1_700_000_000_123
    assert props.invisible_duration.ToMilliseconds() == 30_000
    assert props.queue_id == 2 and props.queue_offset == 41
    assert not props.HasField("delivery_timestamp")
    assert dict(msg.user_properties) == {"app": "x"}


def test_retried_message_shows_origin_topic_and_id_without_internal_props() -> None:
    retried = stored(
        topic=retry_topic("g", "orders"),
        message_id="RETRY-ID",
        properties={PROP_ORIGIN_TOPIC: "orders", PROP_ORIGIN_MESSAGE_ID: "MID1", "app": "x"},
    )
    msg = popped_to_pb(PoppedMessage(retried, "H", 0), 0)
    assert msg.topic.name == "orders"
    assert msg.system_properties.message_id == "MID1"
    assert dict(msg.user_properties) == {"app": "x"}


def test_fifo_and_delay_types() -> None:
    fifo = popped_to_pb(PoppedMessage(stored(message_group="g1"), "H", 0), 0)
    assert fifo.system_properties.message_type == pb.FIFO
    assert fifo.system_properties.message_group == "g1"
    delay = popped_to_pb(PoppedMessage(stored(delivery_timestamp_ms=1_800_000_000_000), "H", 0), 0)
    assert delay.system_properties.message_type == pb.DELAY
    assert delay.system_properties.delivery_timestamp.ToMilliseconds() == 1_800_000_000_000


def test_times_match_protobuf_conversions_including_negative_ones() -> None:
    # Times are set without FromMilliseconds on the hot path; they must read back the same.
    for born in (0, 1, 999, 1_000, 1_700_000_000_123, -1, -1_500):
        msg = popped_to_pb(PoppedMessage(stored(born_timestamp_ms=born), "H", 5_250), 1_000)
        expected = pb.Message()
        expected.system_properties.born_timestamp.FromMilliseconds(born)
        assert msg.system_properties.born_timestamp == expected.system_properties.born_timestamp
        assert msg.system_properties.born_timestamp.ToMilliseconds() == born
        assert msg.system_properties.invisible_duration.ToMilliseconds() == 4_250


def test_filling_a_frame_in_place_equals_building_the_message() -> None:
    from popmq.proxy.grpc.convert import popped_into

    from popmq.pb.rocketmq.v2 import service_pb2 as s

    popped = PoppedMessage(stored(properties={"app": "x", "__popmq.internal": "y"}), "H", 9)
    frame = s.ReceiveMessageResponse()
    popped_into(frame.message, popped, 5, "ns")
    assert frame.message == popped_to_pb(popped, 5, "ns")
    assert dict(frame.message.user_properties) == {"app": "x"}
    assert frame.message.topic.resource_namespace == "ns"


def test_producer_times_read_like_protobuf_and_invalid_ones_are_refused() -> None:
    import pytest
    from popmq.proxy.grpc.convert import message_from_pb

    for ms in (0, 1, 1_700_000_000_123, -1, -1_500):
        msg = pb.Message(body=b"x")
        msg.system_properties.born_timestamp.FromMilliseconds(ms)
        msg.system_properties.delivery_timestamp.FromMilliseconds(ms + 5)
        converted = message_from_pb(msg, "orders")
        assert converted.born_timestamp_ms == ms
        assert converted.delivery_timestamp_ms == ms + 5
    broken = pb.Message(body=b"x")
    broken.system_properties.born_timestamp.seconds = 10**16  # past year 9999, even as ms
    with pytest.raises(RefusedError) as err:
        message_from_pb(broken, "orders")
    assert err.value.code == Code.BAD_REQUEST and "ValueError" not in str(err.value)


def test_outgoing_messages_carry_their_types_name_and_unknown_ones_say_so() -> None:
    from popmq.proxy.grpc.convert import outgoing_from_pb

    for number, name in ((pb.NORMAL, "NORMAL"), (pb.FIFO, "FIFO"), (pb.TRANSACTION, "TRANSACTION"),
                         (pb.MESSAGE_TYPE_UNSPECIFIED, "MESSAGE_TYPE_UNSPECIFIED")):  # fmt: skip
        msg = pb.Message(body=b"x", system_properties=pb.SystemProperties(message_type=number))
        assert outgoing_from_pb(msg).kind == name
    future = pb.Message(body=b"x")
    future.system_properties.message_type = 99  # a type newer than our protocol files
    assert outgoing_from_pb(future).kind == "UNKNOWN(99)"


def test_an_expired_invisible_time_is_sent_as_zero_not_left_out() -> None:
    """A message whose invisible time ran out before its frame was built still carries the
    field (zero), as protobuf's own conversion sets it: clients read it without a presence check."""
    msg = popped_to_pb(PoppedMessage(stored(), "H", 1_000), 5_000)
    props = msg.system_properties
    assert props.HasField("invisible_duration")
    assert props.invisible_duration.ToMilliseconds() == 0
    assert props.HasField("delivery_attempt") and props.HasField("queue_offset")


def test_transactional_message_type_trace_context_and_namespace() -> None:
    from popmq.broker.contract.types import PROP_TRACE_CONTEXT, PROP_TRANSACTION

    committed = stored(
        properties={PROP_TRANSACTION: "true", PROP_TRACE_CONTEXT: "00-abc-01", "app": "x"},
        message_group="",
    )
    msg = popped_to_pb(PoppedMessage(committed, "H", 0), 0, "ns1")
    assert msg.system_properties.message_type == pb.TRANSACTION
    assert msg.system_properties.trace_context == "00-abc-01"
    assert msg.topic.resource_namespace == "ns1" and msg.topic.name == "orders"
    # Every property a producer set reaches the consumer; popmq's own (__popmq.*) do not.
    assert "app" in msg.user_properties
    assert not [key for key in msg.user_properties if key.startswith("__popmq.")]


def test_a_frame_built_unqualified_equals_the_interceptors_walk_of_it() -> None:
    """popped_into(..., unqualify_for=ns) gives the frame the namespace interceptor's
    unqualify_response made of a frame built with inside names, for every kind of name."""
    from popmq.proxy.grpc.convert import popped_into
    from popmq.proxy.grpc.namespace import unqualify_response

    from popmq.pb.rocketmq.v2 import service_pb2 as s

    cases = [
        ("ns%orders", {}),
        ("other%orders", {}),
        ("orders", {}),
        (retry_topic("ns%g", "ns%orders"), {PROP_ORIGIN_TOPIC: "ns%orders"}),
        ("%DLQ%ns%g", {}),
    ]
    for topic, properties in cases:
        popped = PoppedMessage(stored(topic=topic, properties=properties), "H", 9)
        for request_namespace in ("", "ns"):
            walked = s.ReceiveMessageResponse()
            popped_into(walked.message, popped, 5, request_namespace)
            unqualify_response(walked, "ns")
            built = s.ReceiveMessageResponse()
            popped_into(built.message, popped, 5, request_namespace, "ns")
            assert built == walked, (topic, request_namespace)


def test_every_field_of_a_producers_message_lands_in_its_own_place() -> None:
    """outgoing_from_pb and to_message build their dataclasses positionally (cheaper per
    message): every field set to a distinct value must come out under its own name."""
    from popmq.broker.contract.types import PROP_TRACE_CONTEXT, Message
    from popmq.proxy.core.send import OutgoingMessage, to_message
    from popmq.proxy.grpc.convert import outgoing_from_pb

    msg = pb.Message(body=b"payload", user_properties={"app": "x"})
    msg.topic.name = "orders"
    props = msg.system_properties
    props.message_type = pb.TRANSACTION
    props.body_encoding = pb.GZIP
    # lite_topic left unset: False, where gzip is True (a swap of the two shows)
    props.tag = "TagA"
    props.keys.extend(["k1", "k2"])
    props.message_group = "g1"
    props.trace_context = "00-trace-01"
    props.message_id = "MID1"
    props.delivery_timestamp.FromMilliseconds(1_700_000_000_999)
    props.born_timestamp.FromMilliseconds(1_700_000_000_123)
    props.born_host = "10.0.0.1"
    props.orphaned_transaction_recovery_duration.seconds = 42
    out = outgoing_from_pb(msg)
    assert isinstance(out, OutgoingMessage)
    assert (out.topic, out.body, out.kind, out.gzip, out.lite_topic, out.tag) == (
        "orders", b"payload", "TRANSACTION", True, False, "TagA",
    )  # fmt: skip
    assert (out.keys, out.message_group, out.properties, out.trace_context, out.message_id) == (
        ["k1", "k2"], "g1", {"app": "x"}, "00-trace-01", "MID1",
    )  # fmt: skip
    assert out.delivery_time is not None and out.born_time is not None
    assert out.delivery_time.ToMilliseconds() == 1_700_000_000_999
    assert out.born_time.ToMilliseconds() == 1_700_000_000_123
    assert (out.born_host, out.check_immunity_s) == ("10.0.0.1", 42)

    stored = to_message(out, "ns%orders", "peer:1")
    assert stored == Message(
        topic="ns%orders", body=b"payload", tag="TagA", keys=["k1", "k2"],
        properties={"app": "x", PROP_TRACE_CONTEXT: "00-trace-01"},
        message_id="MID1", message_group="g1", delivery_timestamp_ms=1_700_000_000_999,
        born_timestamp_ms=1_700_000_000_123, born_host="10.0.0.1",
    )  # fmt: skip
    assert to_message(outgoing_from_pb(pb.Message(body=b"x")), "t", "peer:1").born_host == "peer:1"
