"""Transaction ids: what a transactional send answers, and EndTransaction hands back.

A sealed token (broker/sealed_token.py) with the broker's handle keys:
``t1.<broker>.<key id>.<sealed>``, sealing ``topic~half offset~message id``. A transaction id
cannot be made up or altered, so the offset it names is one this broker gave out; any proxy
routes it by the clear broker name (``peek_transaction_broker``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from popmq.broker import sealed_token
from popmq.broker.contract.errors import Code, RefusedError

if TYPE_CHECKING:  # cryptography only where a keyring is: a proxy only peeks
    from popmq.broker.pop.handle_keys import HandleKeyring

TRANSACTION_VERSION = "t1"
MAX_TRANSACTION_ID_CHARS = 1024
_NOT_OURS = "not a transaction id of this service"


@dataclass(slots=True, frozen=True)
class TransactionTicket:
    broker: str
    topic: str  # the real topic the producer sent to
    half_offset: int  # where the half message waits in the half topic
    message_id: str


def invalid(detail: str) -> RefusedError:
    return RefusedError(Code.INVALID_TRANSACTION_ID, f"invalid transaction id: {detail}")


def _checked(text: str) -> str:
    if not text:
        raise invalid("empty")
    if len(text) > MAX_TRANSACTION_ID_CHARS:
        raise invalid("too long")
    return text


def seal_transaction(keyring: HandleKeyring, ticket: TransactionTicket) -> str:
    fields = [ticket.topic, str(ticket.half_offset), ticket.message_id]
    return sealed_token.seal(keyring, TRANSACTION_VERSION, ticket.broker, fields)


def peek_transaction_broker(text: str) -> str:
    """The broker a transaction id belongs to, read without a key (routing only)."""
    return sealed_token.split(_checked(text), TRANSACTION_VERSION, invalid, _NOT_OURS)[0]


def open_transaction(keyring: HandleKeyring, text: str) -> TransactionTicket:
    """The ticket sealed in ``text``; INVALID_TRANSACTION_ID if malformed, altered, made up,
    another broker's or sealed with a retired key."""
    broker, fields = sealed_token.unseal(
        keyring, _checked(text), TRANSACTION_VERSION, 3, invalid, _NOT_OURS
    )
    topic, offset, message_id = fields
    return TransactionTicket(broker, topic, int(offset), message_id)
