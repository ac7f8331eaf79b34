"""Conversions between apache.rocketmq.v2 messages and the broker port's plain types."""

from __future__ import annotations

import hashlib
from typing import Any

from popmq.broker.contract.types import (
    PROP_ORIGIN_MESSAGE_ID,
    PROP_ORIGIN_TOPIC,
    PROP_TRACE_CONTEXT,
    PROP_TRANSACTION,
    RETRY_PREFIX,
    Message,
    PoppedMessage,
    StoredMessage,
)
from popmq.proxy.core.send import LazyBody, OutgoingMessage, to_message
from popmq.proxy.grpc.namespace import unqualify

from popmq.pb.pool import Duration, Timestamp
from popmq.pb.rocketmq.v2 import definition_pb2 as pb

INTERNAL_PROPERTY_PREFIX = "__popmq."
# Bodies up to this size are copied out of the request at once; larger ones are read again
# when their chunk is sent (popmq.proxy.core.send.LazyBody), so a batch of large bodies is
# not held twice (in the decoded request and as bytes).
EAGER_BODY_BYTES = 64 * 1024
# MessageType names by number (MessageType.Name() per message is a descriptor lookup).
_MESSAGE_TYPES: dict[int, str] = {v.number: v.name for v in pb.MessageType.DESCRIPTOR.values}


def timestamp(ms: int) -> Timestamp:
    stamp = Timestamp()
    stamp.FromMilliseconds(ms)
    return stamp


def duration(ms: int) -> Duration:
    value = Duration()
    value.FromMilliseconds(ms)
    return value


def md5_hex(data: bytes | memoryview) -> str:
    """The body digest every official client verifies alike: MD5 in upper-case hex, as
    RocketMQ's proxy sends. (CRC32 is not: the Node.js client compares it as a decimal string,
    the Python client as hex, so one of them would flag every message as corrupted.)"""
    return hashlib.md5(data, usedforsecurity=False).hexdigest().upper()


def outgoing_from_pb(msg: pb.Message, split_body: memoryview | None = None) -> OutgoingMessage:
    """A producer's message as the core checks it (each field read once). ``split_body``: its
    body as a view of the request's bytes, when the request was decoded without its bodies
    (popmq.broker.wire.bodies); read into bytes only when the message is sent on."""
    props = msg.system_properties
    message_type = props.message_type
    kind = _MESSAGE_TYPES.get(message_type) or f"UNKNOWN({message_type})"
    body: bytes | LazyBody
    if split_body is not None:
        view = split_body
        body = LazyBody(len(view), view.tobytes) if len(view) > EAGER_BODY_BYTES else bytes(view)
    else:
        data = msg.body  # upb copies the body out at each read
        body = data
        if len(data) > EAGER_BODY_BYTES:
            body = LazyBody(len(data), lambda: msg.body)
        del data
    # Positional, in the fields' order: 15 keyword arguments cost 0.75 us more per message.
    return OutgoingMessage(
        msg.topic.name,  # topic
        body,
        kind,
        props.body_encoding == pb.GZIP,  # gzip
        props.HasField("lite_topic"),  # lite_topic
        props.tag,  # tag
        list(props.keys) if props.keys else None,  # keys
        props.message_group if props.HasField("message_group") else None,  # message_group
        dict(msg.user_properties) if msg.user_properties else None,  # properties
        props.trace_context if props.HasField("trace_context") else None,  # trace_context
        props.message_id,  # message_id
        props.delivery_timestamp if props.HasField("delivery_timestamp") else None,  # delivery
        props.born_timestamp,  # born_time
        props.born_host,  # born_host
        (  # check_immunity_s
            props.orphaned_transaction_recovery_duration.seconds
            if props.HasField("orphaned_transaction_recovery_duration")
            else None
        ),
    )


def message_from_pb(msg: pb.Message, topic: str, peer: str = "") -> Message:
    """A producer's message as the broker stores it (fields already validated)."""
    return to_message(outgoing_from_pb(msg), topic, peer)


def stored_to_pb(stored: StoredMessage, namespace: str = "") -> pb.Message:
    """A stored message as clients expect it. Retried messages travel through the group's
    retry topic; the client sees the original topic and message id."""
    msg = pb.Message()
    stored_into(msg, stored, namespace)
    return msg


def stored_into(
    msg: pb.Message, stored: StoredMessage, namespace: str = "", unqualify_for: str = ""
) -> None:
    """``stored_to_pb`` into an empty message, e.g. the one inside a response frame (building
    a message and then copying it into the frame would copy the body too). ``unqualify_for``:
    as ``popped_into``'s."""
    _fill(msg, stored, namespace, unqualify_for)


def _fill(msg: pb.Message, stored: StoredMessage, namespace: str, unqualify_for: str = "") -> Any:
    """``stored_into``; returns the message's system properties (``popped_into`` adds to
    them). Every delivered message passes here: fields are set in place (building
    sub-messages and copying them in costs twice as much), user properties one by one (the
    map's ``update`` goes through Python's MutableMapping, item by item, with more checks),
    times inline (a call each was a tenth of this function). ``unqualify_for``: see
    ``popped_into``."""
    topic = stored.topic
    message_id = stored.message_id
    properties = stored.properties
    system = msg.system_properties
    if properties:
        if topic.startswith(RETRY_PREFIX):
            topic = properties.get(PROP_ORIGIN_TOPIC, topic)
            message_id = properties.get(PROP_ORIGIN_MESSAGE_ID, message_id)
        trace_context = properties.get(PROP_TRACE_CONTEXT)
        if trace_context:
            system.trace_context = trace_context
        user = msg.user_properties
        for key, value in properties.items():
            if not key.startswith(INTERNAL_PROPERTY_PREFIX):
                user[key] = value
    if unqualify_for:
        client_topic = unqualify(unqualify_for, topic)
        if client_topic != topic:
            topic, namespace = client_topic, unqualify_for
    body = stored.body
    msg.body = bytes(body)  # the same object for bytes (a broker's record)
    resource = msg.topic
    resource.name = topic
    if namespace:
        resource.resource_namespace = namespace
    system.message_id = message_id
    if stored.keys:
        system.keys.extend(stored.keys)
    digest = system.body_digest
    digest.type = pb.MD5
    digest.checksum = md5_hex(body)
    system.body_encoding = pb.IDENTITY
    _set_ms(system.born_timestamp, stored.born_timestamp_ms)
    _set_ms(system.store_timestamp, stored.store_timestamp_ms)
    system.born_host = stored.born_host
    system.store_host = stored.store_host
    system.queue_id = stored.queue_id
    system.queue_offset = stored.queue_offset
    if stored.tag:
        system.tag = stored.tag
    delivery = stored.delivery_timestamp_ms
    if PROP_TRANSACTION in properties:
        system.message_type = pb.TRANSACTION
    elif stored.message_group:
        system.message_group = stored.message_group
        system.message_type = pb.FIFO
    elif delivery > 0:
        system.message_type = pb.DELAY
    else:
        system.message_type = pb.NORMAL
    if delivery > 0:
        _set_ms(system.delivery_timestamp, delivery)
    return system


def popped_to_pb(popped: PoppedMessage, now_ms: int, namespace: str = "") -> pb.Message:
    msg = pb.Message()
    popped_into(msg, popped, now_ms, namespace)
    return msg


def popped_into(
    msg: pb.Message,
    popped: PoppedMessage,
    now_ms: int,
    namespace: str = "",
    unqualify_for: str = "",
) -> None:
    """``popped_to_pb`` into an empty message (see ``stored_into``). ``unqualify_for``: the
    namespace the call is served in; the topic leaves as the client names it (what
    ``namespace.unqualify_response`` does to a whole frame, done here once per message
    instead of walking every frame's Resources)."""
    system = _fill(msg, popped.message, namespace, unqualify_for)
    system.receipt_handle = popped.receipt_handle
    system.delivery_attempt = popped.message.reconsume_times + 1
    left = popped.invisible_until_ms - now_ms
    invisible = system.invisible_duration
    if left > 0:
        invisible.seconds, millis = divmod(left, 1000)
        invisible.nanos = millis * 1_000_000
    else:
        invisible.seconds = 0  # present, and zero


def _set_ms(value: Timestamp | Duration, ms: int) -> None:
    """FromMilliseconds without its validation, for times we made ourselves (non-negative;
    for negative ones FromMilliseconds is used, which normalises the nanos' sign)."""
    if ms >= 0:
        value.seconds, millis = divmod(ms, 1000)
        value.nanos = millis * 1_000_000
    else:
        value.FromMilliseconds(ms)
