"""Topic message types (RocketMQ 5's TopicMessageType) and which messages fit which topic.

A topic accepts one kind of message (NORMAL, FIFO, DELAY, TRANSACTION), or every kind when an
operator makes it MIXED. A message's kind follows from its properties, as RocketMQ's proxy
derives it: a message group makes it FIFO, a delivery time DELAY, otherwise NORMAL
(transactions are declared by the sender). UNSPECIFIED is a topic auto-created by a route
lookup before its first message: that first message settles its type.
"""

from __future__ import annotations

from enum import StrEnum

from popmq.broker.contract.errors import Code, RefusedError


class MessageType(StrEnum):
    UNSPECIFIED = "UNSPECIFIED"
    NORMAL = "NORMAL"
    FIFO = "FIFO"
    DELAY = "DELAY"
    TRANSACTION = "TRANSACTION"
    MIXED = "MIXED"


# What an operator may create a topic as (UNSPECIFIED only ever comes from auto-creation).
CREATABLE = (
    MessageType.NORMAL,
    MessageType.FIFO,
    MessageType.DELAY,
    MessageType.TRANSACTION,
    MessageType.MIXED,
)
# What a MIXED or undecided topic shows in routes.
SERVED = (MessageType.NORMAL, MessageType.FIFO, MessageType.DELAY, MessageType.TRANSACTION)


def parse_message_type(text: str) -> MessageType:
    """A type by name (case-insensitive; empty: UNSPECIFIED), or BAD_REQUEST naming the choices."""
    name = (text or "UNSPECIFIED").strip().upper()
    try:
        return MessageType(name)
    except ValueError:
        choices = ", ".join(t.value for t in CREATABLE)
        raise RefusedError(
            Code.BAD_REQUEST, f"unknown message type {text!r}; one of {choices}"
        ) from None


def accepted_types(topic_type: MessageType) -> tuple[MessageType, ...]:
    """The message types a topic of this type takes (what routes show)."""
    if topic_type in (MessageType.MIXED, MessageType.UNSPECIFIED):
        return SERVED
    return (topic_type,)


def message_kind(
    message_group: str, delivery_timestamp_ms: int, transactional: bool = False
) -> MessageType:
    if transactional:
        return MessageType.TRANSACTION
    if message_group:
        return MessageType.FIFO
    if delivery_timestamp_ms > 0:
        return MessageType.DELAY
    return MessageType.NORMAL


def check_fits(topic: str, topic_type: MessageType, kind: MessageType) -> None:
    """MESSAGE_PROPERTY_CONFLICT_WITH_TYPE unless a ``kind`` message fits the topic."""
    if topic_type in (MessageType.MIXED, MessageType.UNSPECIFIED) or topic_type == kind:
        return
    raise RefusedError(
        Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
        f"topic {topic!r} takes {topic_type.value} messages; this is a {kind.value} message "
        "(send it to a topic of its type, or create the topic as MIXED)",
    )
