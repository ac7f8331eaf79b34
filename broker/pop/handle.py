"""Receipt handles: sealed locators of one popped message, opened only by the broker that
issued them.

A handle is ``2.<broker>.<key id>.<sealed>`` (broker and sealed part base64url without
padding). The sealed part is a random 12-byte nonce and the AES-256-GCM encryption of
``group hash~topic~queue~offset~pop time~invisible until~checkpoint id~index`` under the
broker's handle key ``key id`` (broker/pop/handle_keys.py); the clear prefix
``2.<broker>.<key id>`` is authenticated as associated data. So a handle reveals no offsets, cannot
be altered or made up without the key, and any proxy can still route an ack by the clear broker
name (``peek_broker_name`` needs no key). No key is ever shared between brokers.

The broker still decides with its own checkpoint state (engine ``_resolve``): a handle only
says which checkpoint entry it names.
"""

from __future__ import annotations

import binascii
import hashlib
import os
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

from popmq.broker.contract.errors import Code, RefusedError

if TYPE_CHECKING:  # cryptography (~7 MiB) only where a keyring is: a proxy only peeks
    from popmq.broker.pop.handle_keys import HandleKeyring

HANDLE_VERSION = 2
_VERSION_TEXT = str(HANDLE_VERSION)
_NONCE_BYTES = 12
_FIELDS = 8
_SEP = "~"
_TO_URL = bytes.maketrans(b"+/", b"-_")
_FROM_URL = bytes.maketrans(b"-_", b"+/")


@lru_cache(maxsize=4096)
def group_hash(group: str) -> str:
    """A short stable digest of a group name: handles stay small, the group stays checkable."""
    return hashlib.blake2b(group.encode(), digest_size=6).hexdigest()


# Not frozen: a frozen dataclass's __init__ sets each of the nine fields through
# object.__setattr__ (1.7 us against 0.3 us), once per acked message; nothing changes a handle.
@dataclass(slots=True)
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


def _malformed(detail: str) -> RefusedError:
    return RefusedError(Code.INVALID_RECEIPT_HANDLE, f"malformed receipt handle: {detail}")


@lru_cache(maxsize=256)
def _prefix(broker: str, key_id: str) -> str:
    return f"{_VERSION_TEXT}.{_b64encode(broker.encode())}.{key_id}"


class HandleCodec:
    """Seals and opens handles with one broker's keyring."""

    def __init__(self, keyring: HandleKeyring) -> None:
        self.keyring = keyring

    def encode(self, h: ReceiptHandle) -> str:
        plain = (
            f"{h.group_hash}~{h.topic}~{h.queue_id}~{h.offset}~{h.pop_time_ms}"
            f"~{h.invisible_until_ms}~{h.checkpoint_id}~{h.index}"
        )
        return self._seal(h.broker, [plain])[0]

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
        """Handles of a whole checkpoint at once (same form as ``encode`` per message)."""
        head = f"{group_hash}~{topic}~{queue_id}~"
        tail = f"~{pop_time_ms}~{invisible_until_ms}~{checkpoint_id}~"
        return self._seal(
            broker, [f"{head}{offset}{tail}{index}" for index, offset in enumerate(offsets)]
        )

    def _seal(self, broker: str, plains: list[str]) -> list[str]:
        key_id, cipher = self.keyring.active()
        prefix = _prefix(broker, key_id)
        aad = prefix.encode()
        nonces = os.urandom(_NONCE_BYTES * len(plains))
        out = []
        for i, plain in enumerate(plains):
            nonce = nonces[i * _NONCE_BYTES : (i + 1) * _NONCE_BYTES]
            sealed = nonce + cipher.encrypt(nonce, plain.encode(), aad)
            out.append(f"{prefix}.{_b64encode(sealed)}")
        return out

    def decode(self, text: str) -> ReceiptHandle:
        """The opened handle; INVALID_RECEIPT_HANDLE when malformed, altered, made up, sealed
        by another broker or with a retired key."""
        broker, key_id, sealed = _split(text)
        cipher = self.keyring.cipher(key_id)
        if cipher is None:
            raise RefusedError(
                Code.INVALID_RECEIPT_HANDLE,
                "receipt handle key unknown here (another broker's handle, or a retired key)",
            )
        try:
            raw = _b64decode(sealed)
        except (binascii.Error, ValueError):
            raise _malformed("bad sealed part encoding") from None
        if len(raw) <= _NONCE_BYTES:
            raise _malformed("sealed part too short")
        aad = text[: text.rindex(".")].encode()
        try:
            plain = cipher.decrypt(raw[:_NONCE_BYTES], raw[_NONCE_BYTES:], aad)
        except Exception as exc:
            from cryptography.exceptions import InvalidTag  # imported already by the keyring

            if not isinstance(exc, InvalidTag):
                raise
            raise RefusedError(
                Code.INVALID_RECEIPT_HANDLE,
                "receipt handle does not open (forged, altered, or from another broker)",
            ) from None
        fields = plain.decode().split(_SEP)
        if len(fields) != _FIELDS:
            raise _malformed("wrong field count")
        ghash, topic, queue, offset, pop, until, ck, index = fields
        return ReceiptHandle(
            broker, ghash, topic, int(queue), int(offset), int(pop), int(until), int(ck), int(index)
        )


# A handle's broker part (base64) -> the name it decodes to: a proxy routes, and a broker
# opens, every handle of an ack by it, and a cluster has a few brokers. Bounded: a caller's
# made-up names must not grow it.
_BROKER_NAMES: dict[str, str] = {}
_BROKER_NAMES_MAX = 256


def _split(text: str) -> tuple[str, str, str]:
    if not isinstance(text, str) or text.count(".") != 3:
        raise _malformed("expected 2.<broker>.<key id>.<sealed>")
    version, broker, key_id, sealed = text.split(".")
    if version != _VERSION_TEXT:
        raise _malformed(f"unknown version {version[:8]!r}")
    if not broker or not key_id or not sealed:
        raise _malformed("empty part")
    name = _BROKER_NAMES.get(broker)
    if name is None:
        try:
            name = _b64decode(broker).decode()
        except (binascii.Error, ValueError):
            raise _malformed("bad broker name encoding") from None
        if len(_BROKER_NAMES) >= _BROKER_NAMES_MAX:
            _BROKER_NAMES.clear()
        _BROKER_NAMES[broker] = name
    return name, key_id, sealed


def peek_broker_name(handle: str) -> str:
    """The broker a handle belongs to, read without a key (for routing only: the broker
    opens and checks the rest)."""
    return _split(handle)[0]
