"""Receipt handles: self-contained, signed locators of one popped message.

A handle is ``<payload>.<signature>``, both base64url without padding. The payload is the text
``version~group hash~topic~queue~offset~pop time~invisible until~checkpoint id~index~broker``
(the topic popped may be the retry topic; the broker name comes last so it may hold any
character); the signature is a truncated HMAC-SHA256 of the payload under the cluster's
``handle_secret``. Any proxy can therefore route an ack to the right broker
(``peek_broker_name`` needs no secret), and a broker rejects handles it did not sign.
"""

from __future__ import annotations

import binascii
import hashlib
import hmac
from dataclasses import dataclass
from functools import lru_cache

from popmq.broker.api.errors import BrokerError, Code

HANDLE_VERSION = 1
_VERSION_TEXT = str(HANDLE_VERSION)
_SIGNATURE_BYTES = 16
_FIELDS = 10
_SEP = "~"
_TO_URL = bytes.maketrans(b"+/", b"-_")
_FROM_URL = bytes.maketrans(b"-_", b"+/")
_hmac_digest = hmac.digest


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
    return binascii.b2a_base64(raw, newline=False).translate(_TO_URL).rstrip(b"=").decode()


def _b64decode(text: str) -> bytes:
    raw = text.encode("ascii")
    return binascii.a2b_base64(raw.translate(_FROM_URL) + b"=" * (-len(raw) % 4), strict_mode=True)


def _malformed(detail: str) -> BrokerError:
    return BrokerError(Code.INVALID_RECEIPT_HANDLE, f"malformed receipt handle: {detail}")


class HandleCodec:
    """Signs and verifies handles with one secret."""

    def __init__(self, secret: str) -> None:
        self._key = secret.encode()

    def _sign(self, payload: bytes) -> bytes:
        return _hmac_digest(self._key, payload, "sha256")[:_SIGNATURE_BYTES]

    def encode(self, h: ReceiptHandle) -> str:
        payload = (
            f"{HANDLE_VERSION}~{h.group_hash}~{h.topic}~{h.queue_id}~{h.offset}~{h.pop_time_ms}"
            f"~{h.invisible_until_ms}~{h.checkpoint_id}~{h.index}~{h.broker}"
        ).encode()
        return f"{_b64encode(payload)}.{_b64encode(self._sign(payload))}"

    def encode_batch(
        self,
        broker: str,
        group_hash: str,
        topic: str,
        queue_id: int,
        offsets: list[int],
        pop_time_ms: int,
        invisible_until_ms: int,
        checkpoint_id: int,
    ) -> list[str]:
        """Handles of a whole checkpoint at once (same bytes as ``encode`` per message)."""
        head = f"{HANDLE_VERSION}~{group_hash}~{topic}~{queue_id}~"
        tail = f"~{pop_time_ms}~{invisible_until_ms}~{checkpoint_id}~"
        handles = []
        for index, offset in enumerate(offsets):
            payload = f"{head}{offset}{tail}{index}~{broker}".encode()
            handles.append(f"{_b64encode(payload)}.{_b64encode(self._sign(payload))}")
        return handles

    def decode(self, text: str) -> ReceiptHandle:
        """The verified handle; INVALID_RECEIPT_HANDLE when malformed or not signed by us."""
        encoded, signature = _split(text)
        payload, handle = _parse(encoded)
        try:
            given = _b64decode(signature)
        except (binascii.Error, ValueError):
            raise _malformed("bad signature encoding") from None
        if not hmac.compare_digest(given, self._sign(payload)):
            raise BrokerError(
                Code.INVALID_RECEIPT_HANDLE,
                "receipt handle signature does not match (forged, altered or from another cluster)",
            )
        return handle


def _split(text: str) -> tuple[str, str]:
    if not isinstance(text, str) or text.count(".") != 1:
        raise _malformed("expected <payload>.<signature>")
    payload, signature = text.split(".")
    if not payload or not signature:
        raise _malformed("empty part")
    return payload, signature


def _parse(encoded: str) -> tuple[bytes, ReceiptHandle]:
    try:
        payload = _b64decode(encoded)
        fields = payload.decode().split(_SEP, _FIELDS - 1)
    except (binascii.Error, ValueError):
        raise _malformed("payload is not base64url text") from None
    if len(fields) != _FIELDS:
        raise _malformed("wrong field count")
    if fields[0] != _VERSION_TEXT:
        raise _malformed(f"unknown version {fields[0][:8]!r}")
    _, ghash, topic, queue, offset, pop, until, ck, index, broker = fields
    try:
        handle = ReceiptHandle(
            broker, ghash, topic, int(queue), int(offset), int(pop), int(until), int(ck), int(index)
        )
    except ValueError:
        raise _malformed("a numeric field is not a number") from None
    return payload, handle


def peek_broker_name(handle: str) -> str:
    """The broker a handle belongs to, read without verifying it (for routing only: the
    broker checks the rest, so the numeric fields are not parsed here)."""
    encoded, _ = _split(handle)
    try:
        fields = _b64decode(encoded).decode().split(_SEP, _FIELDS - 1)
    except (binascii.Error, ValueError):
        raise _malformed("payload is not base64url text") from None
    if len(fields) != _FIELDS:
        raise _malformed("wrong field count")
    if fields[0] != _VERSION_TEXT:
        raise _malformed(f"unknown version {fields[0][:8]!r}")
    return fields[-1]
