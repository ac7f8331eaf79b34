"""Who the access guard let in, for the core behind it (a context variable: the guard
and the servicer run in the same task for every RPC).

Unset (no ACL: authentication off) means nobody is known and nothing is restricted beyond the
configuration, so the core behaves exactly as before.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass

from popmq.security.acl import User


@dataclass(frozen=True, slots=True)
class Caller:
    access_key: str
    # May a lookup of this topic create it (auto-creation)? As in RocketMQ, where a topic
    # comes into being when a producer sends to it: only who may publish on it.
    may_create_topic: Callable[[str], bool]
    user: User | None = None  # the ACL entry, for the admin API's WhoAmI


CALLER: ContextVar[Caller | None] = ContextVar("popmq_caller", default=None)
