"""Recall handles: what a delay message's SendReceipt carries so its sender can cancel it.

Sealed like receipt handles (broker/pop/handle.py), with the same per-broker keys
(broker/pop/handle_keys.py): ``r1.<broker>.<key id>.<sealed>``, where the sealed part is a
random nonce and the AES-256-GCM encryption of ``topic~timer offset~message id~due ms`` with
the clear prefix as associated data. A recall handle cannot be altered, made up, or opened by
another broker, and a receipt handle is no recall handle (other prefix, other fields). Any
proxy routes it by the clear broker name (``peek_recall_broker``).
"""

from __future__ import annotations

import binascii
import os
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.pop.handle_keys import HandleKeyring

RECALL_VERSION = "r1"
_NONCE_BYTES = 12
_SEP = "~"
_TO_URL = bytes.maketrans(b"+/", b"-_")
_FROM_URL = bytes.maketrans(b"-_", b"+/")


@dataclass(slots=True, frozen=True)
class RecallTicket:
    broker: str
    topic: str  # the destination topic the sender named
    timer_offset: int  # where the message waits in the timer topic
    message_id: str
    due_ms: int


def _encode(raw: bytes) -> str:
    return binascii.b2a_base64(raw, newline=False).translate(_TO_URL).rstrip(b"=").decode()


def _decode(text: str) -> bytes:
    raw = text.encode("ascii")
    return binascii.a2b_base64(raw.translate(_FROM_URL) + b"=" * (-len(raw) % 4), strict_mode=True)


def invalid(detail: str) -> RefusedError:
    return RefusedError(Code.BAD_REQUEST, f"invalid recall handle: {detail}")


def seal_recall(keyring: HandleKeyring, ticket: RecallTicket) -> str:
    key_id, cipher = keyring.active()
    prefix = f"{RECALL_VERSION}.{_encode(ticket.broker.encode())}.{key_id}"
    plain = (
        f"{ticket.topic}{_SEP}{ticket.timer_offset}{_SEP}{ticket.message_id}{_SEP}{ticket.due_ms}"
    )
    nonce = os.urandom(_NONCE_BYTES)
    sealed = nonce + cipher.encrypt(nonce, plain.encode(), prefix.encode())
    return f"{prefix}.{_encode(sealed)}"


def _split(text: str) -> tuple[str, str, str]:
    if not isinstance(text, str) or not text.isascii() or text.count(".") != 3:
        raise invalid(f"expected {RECALL_VERSION}.<broker>.<key id>.<sealed>")
    version, broker, key_id, sealed = text.split(".")
    if version != RECALL_VERSION or not broker or not key_id or not sealed:
        raise invalid("not a recall handle")
    try:
        return _decode(broker).decode(), key_id, sealed
    except (binascii.Error, ValueError):
        raise invalid("bad broker name encoding") from None


def peek_recall_broker(text: str) -> str:
    """The broker a recall handle belongs to, read without a key (routing only)."""
    return _split(text)[0]


def open_recall(keyring: HandleKeyring, text: str) -> RecallTicket:
    """The ticket sealed in ``text``; BAD_REQUEST if malformed, altered, made up, another
    broker's or sealed with a retired key."""
    broker, key_id, sealed = _split(text)
    cipher = keyring.cipher(key_id)
    if cipher is None:
        raise invalid("its key is unknown here (another broker's handle, or a retired key)")
    try:
        raw = _decode(sealed)
    except (binascii.Error, ValueError):
        raise invalid("bad sealed part encoding") from None
    if len(raw) <= _NONCE_BYTES:
        raise invalid("sealed part too short")
    try:
        plain = cipher.decrypt(
            raw[:_NONCE_BYTES], raw[_NONCE_BYTES:], text[: text.rindex(".")].encode()
        )
    except InvalidTag:
        raise invalid("it does not open (forged, altered, or from another broker)") from None
    fields = plain.decode().split(_SEP)
    if len(fields) != 4:
        raise invalid("wrong field count")
    topic, offset, message_id, due = fields
    return RecallTicket(broker, topic, int(offset), message_id, int(due))
