"""Transaction ids: what a transactional send answers, and EndTransaction hands back.

Sealed like recall handles (broker/recall_handle.py) with the broker's handle keys:
``t1.<broker>.<key id>.<sealed>``, the sealed part an AES-256-GCM encryption of
``topic~half offset~message id`` with the clear prefix as associated data. A transaction id
cannot be made up or altered, so the offset it names is one this broker gave out; any proxy
routes it by the clear broker name (``peek_transaction_broker``).
"""

from __future__ import annotations

import binascii
import os
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.pop.handle_keys import HandleKeyring

TRANSACTION_VERSION = "t1"
_NONCE_BYTES = 12
_SEP = "~"
_TO_URL = bytes.maketrans(b"+/", b"-_")
_FROM_URL = bytes.maketrans(b"-_", b"+/")
MAX_TRANSACTION_ID_CHARS = 1024


@dataclass(slots=True, frozen=True)
class TransactionTicket:
    broker: str
    topic: str  # the real topic the producer sent to
    half_offset: int  # where the half message waits in the half topic
    message_id: str


def _encode(raw: bytes) -> str:
    return binascii.b2a_base64(raw, newline=False).translate(_TO_URL).rstrip(b"=").decode()


def _decode(text: str) -> bytes:
    raw = text.encode("ascii")
    return binascii.a2b_base64(raw.translate(_FROM_URL) + b"=" * (-len(raw) % 4), strict_mode=True)


def invalid(detail: str) -> RefusedError:
    return RefusedError(Code.INVALID_TRANSACTION_ID, f"invalid transaction id: {detail}")


def seal_transaction(keyring: HandleKeyring, ticket: TransactionTicket) -> str:
    key_id, cipher = keyring.active()
    prefix = f"{TRANSACTION_VERSION}.{_encode(ticket.broker.encode())}.{key_id}"
    plain = f"{ticket.topic}{_SEP}{ticket.half_offset}{_SEP}{ticket.message_id}"
    nonce = os.urandom(_NONCE_BYTES)
    sealed = nonce + cipher.encrypt(nonce, plain.encode(), prefix.encode())
    return f"{prefix}.{_encode(sealed)}"


def _split(text: str) -> tuple[str, str, str]:
    if not text:
        raise invalid("empty")
    if len(text) > MAX_TRANSACTION_ID_CHARS:
        raise invalid("too long")
    if not text.isascii() or text.count(".") != 3:
        raise invalid(f"expected {TRANSACTION_VERSION}.<broker>.<key id>.<sealed>")
    version, broker, key_id, sealed = text.split(".")
    if version != TRANSACTION_VERSION or not broker or not key_id or not sealed:
        raise invalid("not a transaction id of this service")
    try:
        return _decode(broker).decode(), key_id, sealed
    except (binascii.Error, ValueError):
        raise invalid("bad broker name encoding") from None


def peek_transaction_broker(text: str) -> str:
    """The broker a transaction id belongs to, read without a key (routing only)."""
    return _split(text)[0]


def open_transaction(keyring: HandleKeyring, text: str) -> TransactionTicket:
    """The ticket sealed in ``text``; INVALID_TRANSACTION_ID if malformed, altered, made up,
    another broker's or sealed with a retired key."""
    broker, key_id, sealed = _split(text)
    cipher = keyring.cipher(key_id)
    if cipher is None:
        raise invalid("its key is unknown here (another broker's id, or a retired key)")
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
    if len(fields) != 3:
        raise invalid("wrong field count")
    topic, offset, message_id = fields
    return TransactionTicket(broker, topic, int(offset), message_id)
