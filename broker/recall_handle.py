"""Recall handles: what a delay message's SendReceipt carries so its sender can cancel it.

A sealed token (broker/sealed_token.py) with the broker's handle keys:
``r1.<broker>.<key id>.<sealed>``, sealing ``topic~timer offset~message id~due ms``. A recall
handle cannot be altered, made up, or opened by another broker, and a receipt handle is no
recall handle (other prefix, other fields). Any proxy routes it by the clear broker name
(``peek_recall_broker``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from popmq.broker import sealed_token
from popmq.broker.contract.errors import Code, RefusedError

if TYPE_CHECKING:  # cryptography only where a keyring is: a proxy only peeks
    from popmq.broker.pop.handle_keys import HandleKeyring

RECALL_VERSION = "r1"
_NOT_OURS = "not a recall handle"


@dataclass(slots=True, frozen=True)
class RecallTicket:
    broker: str
    topic: str  # the destination topic the sender named
    timer_offset: int  # where the message waits in the timer topic
    message_id: str
    due_ms: int


def invalid(detail: str) -> RefusedError:
    return RefusedError(Code.BAD_REQUEST, f"invalid recall handle: {detail}")


def seal_recall(keyring: HandleKeyring, ticket: RecallTicket) -> str:
    fields = [ticket.topic, str(ticket.timer_offset), ticket.message_id, str(ticket.due_ms)]
    return sealed_token.seal(keyring, RECALL_VERSION, ticket.broker, fields)


def peek_recall_broker(text: str) -> str:
    """The broker a recall handle belongs to, read without a key (routing only)."""
    return sealed_token.split(text, RECALL_VERSION, invalid, _NOT_OURS)[0]


def open_recall(keyring: HandleKeyring, text: str) -> RecallTicket:
    """The ticket sealed in ``text``; BAD_REQUEST if malformed, altered, made up, another
    broker's or sealed with a retired key."""
    broker, fields = sealed_token.unseal(keyring, text, RECALL_VERSION, 4, invalid, _NOT_OURS)
    topic, offset, message_id, due = fields
    return RecallTicket(broker, topic, int(offset), message_id, int(due))
