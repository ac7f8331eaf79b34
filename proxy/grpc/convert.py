"""Conversions between apache.rocketmq.v2 messages and the broker port's plain types."""

from __future__ import annotations

import zlib

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from broker.api.types import (
    PROP_ORIGIN_MESSAGE_ID,
    PROP_ORIGIN_TOPIC,
    RETRY_PREFIX,
    Message,
    PoppedMessage,
    StoredMessage,
)
from popmq.pb.rocketmq.v2 import definition_pb2 as pb

INTERNAL_PROPERTY_PREFIX = "__popmq."


def timestamp(ms: int) -> Timestamp:
    stamp = Timestamp()
    stamp.FromMilliseconds(ms)
    return stamp


def duration(ms: int) -> Duration:
    value = Duration()
    value.FromMilliseconds(ms)
    return value


def crc32_hex(data: bytes) -> str:
    """The body digest the clients verify: CRC32, 8 upper-case hex digits."""
    return format(zlib.crc32(data) & 0xFFFFFFFF, "08X")


def message_from_pb(msg: pb.Message, topic: str, peer: str = "") -> Message:
    """A producer's message as the broker stores it (fields already validated)."""
    props = msg.system_properties
    delivery_ms = 0
    if props.HasField("delivery_timestamp"):
        delivery_ms = props.delivery_timestamp.ToMilliseconds()
    return Message(
        topic=topic,
        body=msg.body,
        tag=props.tag if props.HasField("tag") else "",
        keys=list(props.keys),
        properties=dict(msg.user_properties),
        message_id=props.message_id,
        message_group=props.message_group if props.HasField("message_group") else "",
        delivery_timestamp_ms=delivery_ms,
        born_timestamp_ms=props.born_timestamp.ToMilliseconds(),
        born_host=props.born_host or peer,
    )


def stored_to_pb(stored: StoredMessage, namespace: str = "") -> pb.Message:
    """A stored message as clients expect it. Retried messages travel through the group's
    retry topic; the client sees the original topic and message id."""
    topic = stored.topic
    message_id = stored.message_id
    properties = stored.properties
    if topic.startswith(RETRY_PREFIX):
        topic = properties.get(PROP_ORIGIN_TOPIC, topic)
        message_id = properties.get(PROP_ORIGIN_MESSAGE_ID, message_id)
    if properties and any(key.startswith(INTERNAL_PROPERTY_PREFIX) for key in properties):
        properties = {
            k: v for k, v in properties.items() if not k.startswith(INTERNAL_PROPERTY_PREFIX)
        }
    # Fields are set in place: building sub-messages and copying them in costs twice as much.
    msg = pb.Message(body=stored.body, user_properties=properties)
    msg.topic.name = topic
    if namespace:
        msg.topic.resource_namespace = namespace
    system = msg.system_properties
    system.message_id = message_id
    if stored.keys:
        system.keys.extend(stored.keys)
    system.body_digest.type = pb.CRC32
    system.body_digest.checksum = crc32_hex(stored.body)
    system.body_encoding = pb.IDENTITY
    system.born_timestamp.FromMilliseconds(stored.born_timestamp_ms)
    system.born_host = stored.born_host
    system.store_timestamp.FromMilliseconds(stored.store_timestamp_ms)
    system.store_host = stored.store_host
    system.queue_id = stored.queue_id
    system.queue_offset = stored.queue_offset
    if stored.tag:
        system.tag = stored.tag
    if stored.message_group:
        system.message_group = stored.message_group
        system.message_type = pb.FIFO
    elif stored.delivery_timestamp_ms > 0:
        system.message_type = pb.DELAY
    else:
        system.message_type = pb.NORMAL
    if stored.delivery_timestamp_ms > 0:
        system.delivery_timestamp.FromMilliseconds(stored.delivery_timestamp_ms)
    return msg


def popped_to_pb(popped: PoppedMessage, now_ms: int, namespace: str = "") -> pb.Message:
    msg = stored_to_pb(popped.message, namespace)
    system = msg.system_properties
    system.receipt_handle = popped.receipt_handle
    system.delivery_attempt = popped.delivery_attempt
    system.invisible_duration.FromMilliseconds(max(popped.invisible_until_ms - now_ms, 0))
    return msg
