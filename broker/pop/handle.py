"""Receipt handles: self-contained, signed locators of one popped message.

A handle is ``<payload>.<signature>``, both base64url without padding. The payload is a compact
JSON array (version, broker, group hash, topic popped, queue id, queue offset, pop time,
invisible-until time, checkpoint id, index in the checkpoint); the signature is a truncated
HMAC-SHA256 of the payload under the cluster's ``handle_secret``. Any proxy can therefore route
an ack to the right broker (``peek_broker_name`` needs no secret), and a broker rejects handles
it did not sign.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from dataclasses import dataclass
from functools import lru_cache

from broker.api.errors import BrokerError, Code

HANDLE_VERSION = 1
_SIGNATURE_BYTES = 16
_FIELDS = 10


@lru_cache(maxsize=4096)
def group_hash(group: str) -> str:
    """A short stable digest of a group name: handles stay small, the group stays checkable."""
    return hashlib.blake2b(group.encode(), digest_size=6).hexdigest()


@dataclass(slots=True, frozen=True)
class ReceiptHandle:
    broker: str
    group_hash: str
    topic: str  # the topic actually popped: the user topic or its retry topic
    queue_id: int
    offset: int
    pop_time_ms: int
    invisible_until_ms: int
    checkpoint_id: int
    index: int  # position of the message in its checkpoint


def _b64encode(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _b64decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _malformed(detail: str) -> BrokerError:
    return BrokerError(Code.INVALID_RECEIPT_HANDLE, f"malformed receipt handle: {detail}")


class HandleCodec:
    """Signs and verifies handles with one secret."""

    def __init__(self, secret: str) -> None:
        self._key = secret.encode()

    def _sign(self, payload: bytes) -> bytes:
        return hmac.new(self._key, payload, hashlib.sha256).digest()[:_SIGNATURE_BYTES]

    def encode(self, handle: ReceiptHandle) -> str:
        payload = json.dumps(
            [
                HANDLE_VERSION,
                handle.broker,
                handle.group_hash,
                handle.topic,
                handle.queue_id,
                handle.offset,
                handle.pop_time_ms,
                handle.invisible_until_ms,
                handle.checkpoint_id,
                handle.index,
            ],
            separators=(",", ":"),
        ).encode()
        return f"{_b64encode(payload)}.{_b64encode(self._sign(payload))}"

    def decode(self, text: str) -> ReceiptHandle:
        """The verified handle; INVALID_RECEIPT_HANDLE when malformed or not signed by us."""
        payload, fields = _parse(text)
        signature = _split(text)[1]
        try:
            given = _b64decode(signature)
        except (binascii.Error, ValueError):
            raise _malformed("bad signature encoding") from None
        if not hmac.compare_digest(given, self._sign(payload)):
            raise BrokerError(
                Code.INVALID_RECEIPT_HANDLE,
                "receipt handle signature does not match (forged, altered or from another cluster)",
            )
        return ReceiptHandle(*fields[1:])


def _split(text: str) -> tuple[str, str]:
    if not isinstance(text, str) or text.count(".") != 1:
        raise _malformed("expected <payload>.<signature>")
    payload, signature = text.split(".")
    if not payload or not signature:
        raise _malformed("empty part")
    return payload, signature


def _parse(text: str) -> tuple[bytes, list]:
    encoded, _ = _split(text)
    try:
        payload = _b64decode(encoded)
        fields = json.loads(payload)
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise _malformed("payload is not base64url JSON") from None
    if not isinstance(fields, list) or len(fields) != _FIELDS:
        raise _malformed("wrong field count")
    if fields[0] != HANDLE_VERSION:
        raise _malformed(f"unknown version {fields[0]!r}")
    kinds = (int, str, str, str, int, int, int, int, int, int)
    for value, kind in zip(fields, kinds, strict=True):
        if not isinstance(value, kind) or isinstance(value, bool):
            raise _malformed("field of the wrong type")
    return payload, fields


def peek_broker_name(handle: str) -> str:
    """The broker a handle belongs to, read without verifying it (for routing only)."""
    _, fields = _parse(handle)
    return fields[1]
