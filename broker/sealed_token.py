"""Sealed tokens: ``<version>.<broker>.<key id>.<sealed>``, what recall handles and transaction
ids are made of.

The sealed part is a random nonce and the AES-256-GCM encryption of ``~``-joined fields with
the broker's handle keys (broker/pop/handle_keys.py); the clear prefix is the associated data,
so nothing can be altered or made up, and any proxy routes a token by its clear broker name.
Each kind names its own version prefix and refusal, so one kind is never taken for another.
"""

from __future__ import annotations

import binascii
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from popmq.broker.contract.errors import RefusedError

if TYPE_CHECKING:  # cryptography (~7 MiB) only where a keyring is: a proxy only peeks
    from popmq.broker.pop.handle_keys import HandleKeyring

_NONCE_BYTES = 12
_SEP = "~"
_TO_URL = bytes.maketrans(b"+/", b"-_")
_FROM_URL = bytes.maketrans(b"-_", b"+/")

Invalid = Callable[[str], RefusedError]


def _encode(raw: bytes) -> str:
    return binascii.b2a_base64(raw, newline=False).translate(_TO_URL).rstrip(b"=").decode()


def _decode(text: str) -> bytes:
    raw = text.encode("ascii")
    return binascii.a2b_base64(raw.translate(_FROM_URL) + b"=" * (-len(raw) % 4), strict_mode=True)


def seal(keyring: HandleKeyring, version: str, broker: str, fields: list[str]) -> str:
    key_id, cipher = keyring.active()
    prefix = f"{version}.{_encode(broker.encode())}.{key_id}"
    nonce = os.urandom(_NONCE_BYTES)
    sealed = nonce + cipher.encrypt(nonce, _SEP.join(fields).encode(), prefix.encode())
    return f"{prefix}.{_encode(sealed)}"


def split(text: str, version: str, invalid: Invalid, not_ours: str) -> tuple[str, str, str]:
    """(broker, key id, sealed part) of a token of kind ``version``, read without a key."""
    if not isinstance(text, str) or not text.isascii() or text.count(".") != 3:
        raise invalid(f"expected {version}.<broker>.<key id>.<sealed>")
    version_seen, broker, key_id, sealed = text.split(".")
    if version_seen != version or not broker or not key_id or not sealed:
        raise invalid(not_ours)
    try:
        return _decode(broker).decode(), key_id, sealed
    except (binascii.Error, ValueError):
        raise invalid("bad broker name encoding") from None


def unseal(
    keyring: HandleKeyring, text: str, version: str, field_count: int, invalid: Invalid,
    not_ours: str,
) -> tuple[str, list[str]]:  # fmt: skip
    """(broker, fields) sealed in ``text``; ``invalid(...)`` if malformed, altered, made up,
    another broker's or sealed with a retired key."""
    broker, key_id, sealed = split(text, version, invalid, not_ours)
    cipher = keyring.cipher(key_id)
    if cipher is None:
        raise invalid("its key is unknown here (another broker's, or a retired key)")
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
    except Exception as exc:
        from cryptography.exceptions import InvalidTag  # imported already by the keyring

        if isinstance(exc, InvalidTag):
            raise invalid("it does not open (forged, altered, or from another broker)") from None
        raise
    fields = plain.decode().split(_SEP)
    if len(fields) != field_count:
        raise invalid("wrong field count")
    return broker, fields
