"""Who is calling and until when: what every core operation may need to know of its caller.

The gRPC edge fills it from the request's x-mq-* headers, its peer and its deadline
(popmq.proxy.grpc.headers); any other edge fills it its own way.
"""

from __future__ import annotations

from dataclasses import dataclass

from popmq.proxy.core.caller import Caller

from popmq.clock import SYSTEM, Clock


@dataclass(slots=True)
class RequestContext:
    client_id: str = ""
    language: str = ""
    client_version: str = ""
    protocol: str = ""
    namespace: str = ""
    request_id: str = ""
    peer: str = ""
    # clock.monotonic() at which the client's deadline expires; None when it set none.
    deadline: float | None = None
    # The signed-in caller (None: authentication is off).
    caller: Caller | None = None
    # What the deadline is read against (a virtual one in tests).
    clock: Clock = SYSTEM

    @property
    def access_key(self) -> str:
        """The authenticated access key ("" without authentication)."""
        return self.caller.access_key if self.caller is not None else ""

    def create_topic(self, topic: str) -> bool | None:
        """May a route lookup auto-create `topic`? None: as configured (no caller to limit);
        False when the caller may not publish on it."""
        if self.caller is None or self.caller.may_create_topic(topic):
            return None
        return False

    def remaining_ms(self) -> int | None:
        if self.deadline is None:
            return None
        return int((self.deadline - self.clock.monotonic()) * 1000)

    def past_deadline(self) -> bool:
        """Has the client's deadline passed (it has seen DEADLINE_EXCEEDED)?"""
        return self.deadline is not None and self.clock.monotonic() > self.deadline
