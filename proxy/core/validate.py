"""Request validation with RocketMQ's rules and codes (GrpcValidator / Validators)."""

from __future__ import annotations

import re

from popmq.broker import names
from popmq.broker.contract.errors import Code, RefusedError

# Names: the one set of rules shared with the broker and the store (derived names included).
TOPIC_MAX_LENGTH = names.TOPIC_MAX_LENGTH
GROUP_MAX_LENGTH = names.GROUP_MAX_LENGTH
MESSAGE_GROUP_MAX_LENGTH = 64
# Internal property keys the broker sets; clients may not send them.
RESERVED_PROPERTY_PREFIX = "__popmq."
# RocketMQ's proxy: maxUserPropertySize and userPropertyMaxNum (MESSAGE_PROPERTIES_TOO_LARGE).
MAX_PROPERTIES_BYTES = 16 * 1024
MAX_PROPERTIES = 128
# Keys travel as one property (KEYS, space-separated): held to the same size as user
# properties, so that a 1-byte body cannot carry megabytes of keys past the body limit.
MAX_KEYS_BYTES = 16 * 1024
# popmq's receipt handles are a few hundred characters; anything far longer is not one of
# ours (and would be echoed back, or kept, at the caller's size).
MAX_RECEIPT_HANDLE_LENGTH = 4096
# Topics one client may name (its settings, the topics it asks assignments for): the
# registry keeps them for every client, so they are bounded and must be topic names.
MAX_CLIENT_TOPICS = 1024
# RocketMQ rejects timers further ahead than this (timerMaxDelaySec: 3 days).
MAX_DELAY_MS = 3 * 24 * 3_600_000


def topic_name(name: str, *, allow_dlq: bool = False) -> str:
    """A user topic: RocketMQ's character set and length; no system or retry topics."""
    return names.check_topic(name, allow_dlq=allow_dlq)


def group_name(name: str) -> str:
    return names.check_group(name)


_CONTROL_CHAR = re.compile("[\x00-\x1f\x7f]")


def _has_control_chars(text: str) -> bool:
    return _CONTROL_CHAR.search(text) is not None  # (a Python loop took 3 s over 16 MiB)


def tag(value: str) -> str:
    if value and (not value.strip() or "|" in value or _has_control_chars(value)):
        raise RefusedError(
            Code.ILLEGAL_MESSAGE_TAG, "tag must not be blank or contain '|' or control characters"
        )
    return value


def keys(values: list[str]) -> list[str]:
    size = len(values)  # the separators
    for key in values:
        size += len(key.encode())
        if size > MAX_KEYS_BYTES:  # before a key's characters are read: it may be 16 MiB
            raise RefusedError(
                Code.ILLEGAL_MESSAGE_KEY,
                f"message keys take more than {MAX_KEYS_BYTES} bytes ({len(values)} keys)",
            )
        if not key.strip() or _has_control_chars(key):
            raise RefusedError(
                Code.ILLEGAL_MESSAGE_KEY, "message keys must not be blank or contain control chars"
            )
    return values


def client_topics(topics: set[str] | list[str]) -> set[str]:
    if len(topics) > MAX_CLIENT_TOPICS:
        raise RefusedError(
            Code.BAD_REQUEST,
            f"a client may name at most {MAX_CLIENT_TOPICS} topics; this one names {len(topics)}",
        )
    return {topic_name(topic, allow_dlq=True) for topic in topics}


def message_group(value: str) -> str:
    if value and (len(value) > MESSAGE_GROUP_MAX_LENGTH or _has_control_chars(value)):
        raise RefusedError(
            Code.ILLEGAL_MESSAGE_GROUP,
            f"message group must be at most {MESSAGE_GROUP_MAX_LENGTH} printable characters",
        )
    return value


def properties(values: dict[str, str]) -> dict[str, str]:
    if len(values) > MAX_PROPERTIES:
        raise RefusedError(
            Code.MESSAGE_PROPERTIES_TOO_LARGE,
            f"{len(values)} user properties, more than {MAX_PROPERTIES}",
        )
    size = 0
    for key, value in values.items():
        if not key or key.startswith(RESERVED_PROPERTY_PREFIX) or _has_control_chars(key):
            raise RefusedError(
                Code.ILLEGAL_MESSAGE_PROPERTY_KEY, f"property key {key!r} is empty or reserved"
            )
        size += len(key.encode()) + len(value.encode())
    if size > MAX_PROPERTIES_BYTES:
        raise RefusedError(
            Code.MESSAGE_PROPERTIES_TOO_LARGE,
            f"user properties take {size} bytes, more than {MAX_PROPERTIES_BYTES}",
        )
    return values


def body(data: bytes, max_bytes: int) -> bytes:
    if not data:
        raise RefusedError(Code.MESSAGE_BODY_EMPTY, "message body is empty")
    if len(data) > max_bytes:
        raise RefusedError(
            Code.MESSAGE_BODY_TOO_LARGE,
            f"message body is {len(data)} bytes, more than the limit of {max_bytes}",
        )
    return data


def invisible_time(ms: int, min_ms: int, max_ms: int) -> int:
    if ms < min_ms:
        raise RefusedError(
            Code.ILLEGAL_INVISIBLE_TIME, f"invisible duration {ms} ms is below the minimum {min_ms}"
        )
    if ms > max_ms:
        raise RefusedError(
            Code.ILLEGAL_INVISIBLE_TIME, f"invisible duration {ms} ms is above the maximum {max_ms}"
        )
    return ms


def receipt_handle(handle: str) -> str:
    if not handle:
        raise RefusedError(Code.INVALID_RECEIPT_HANDLE, "receipt handle is empty")
    if len(handle) > MAX_RECEIPT_HANDLE_LENGTH:
        raise RefusedError(
            Code.INVALID_RECEIPT_HANDLE,
            f"receipt handle is {len(handle)} characters, more than {MAX_RECEIPT_HANDLE_LENGTH}",
        )
    return handle
