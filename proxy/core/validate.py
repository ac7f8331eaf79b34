"""Request validation with RocketMQ's rules and codes (GrpcValidator / Validators)."""

from __future__ import annotations

from popmq.broker import names
from popmq.broker.contract.errors import Code, RefusedError

# Names: the one set of rules shared with the broker and the store (derived names included).
TOPIC_MAX_LENGTH = names.TOPIC_MAX_LENGTH
GROUP_MAX_LENGTH = names.GROUP_MAX_LENGTH
MESSAGE_GROUP_MAX_LENGTH = 64
# Internal property keys the broker sets; clients may not send them.
RESERVED_PROPERTY_PREFIX = "__popmq."
MAX_PROPERTIES_BYTES = 16 * 1024
# RocketMQ rejects timers further ahead than this (timerMaxDelaySec: 3 days).
MAX_DELAY_MS = 3 * 24 * 3_600_000


def topic_name(name: str, *, allow_dlq: bool = False) -> str:
    """A user topic: RocketMQ's character set and length; no system or retry topics."""
    return names.check_topic(name, allow_dlq=allow_dlq)


def group_name(name: str) -> str:
    return names.check_group(name)


def _has_control_chars(text: str) -> bool:
    return any(ord(ch) < 32 or ord(ch) == 127 for ch in text)


def tag(value: str) -> str:
    if value and (not value.strip() or "|" in value or _has_control_chars(value)):
        raise RefusedError(
            Code.ILLEGAL_MESSAGE_TAG, "tag must not be blank or contain '|' or control characters"
        )
    return value


def keys(values: list[str]) -> list[str]:
    for key in values:
        if not key.strip() or _has_control_chars(key):
            raise RefusedError(
                Code.ILLEGAL_MESSAGE_KEY, "message keys must not be blank or contain control chars"
            )
    return values


def message_group(value: str) -> str:
    if value and (len(value) > MESSAGE_GROUP_MAX_LENGTH or _has_control_chars(value)):
        raise RefusedError(
            Code.ILLEGAL_MESSAGE_GROUP,
            f"message group must be at most {MESSAGE_GROUP_MAX_LENGTH} printable characters",
        )
    return value


def properties(values: dict[str, str]) -> dict[str, str]:
    size = 0
    for key, value in values.items():
        if not key or key.startswith(RESERVED_PROPERTY_PREFIX) or _has_control_chars(key):
            raise RefusedError(
                Code.ILLEGAL_MESSAGE_PROPERTY_KEY, f"property key {key!r} is empty or reserved"
            )
        size += len(key.encode()) + len(value.encode())
    if size > MAX_PROPERTIES_BYTES:
        raise RefusedError(
            Code.PAYLOAD_TOO_LARGE,
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
    return handle
