"""What a client tells us in gRPC metadata (x-mq-* headers) and the call's deadline."""

from __future__ import annotations

import time
from dataclasses import dataclass

import grpc
from popmq.proxy.grpc.caller import CALLER, Caller


@dataclass(slots=True)
class RequestContext:
    client_id: str = ""
    language: str = ""
    client_version: str = ""
    protocol: str = ""
    namespace: str = ""
    request_id: str = ""
    peer: str = ""
    # time.monotonic() at which the client's deadline expires; None when it set none.
    deadline: float | None = None
    # The signed-in caller (None: authentication is off).
    caller: Caller | None = None

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
        return int((self.deadline - time.monotonic()) * 1000)

    @classmethod
    def from_grpc(cls, context: grpc.aio.ServicerContext) -> RequestContext:
        headers: dict[str, str] = {}
        for key, value in context.invocation_metadata() or ():
            if isinstance(value, bytes):  # binary (-bin) headers: not ours
                continue
            headers[key.lower()] = value
        remaining = context.time_remaining()
        return cls(
            client_id=headers.get("x-mq-client-id", ""),
            language=headers.get("x-mq-language", ""),
            client_version=headers.get("x-mq-client-version", ""),
            protocol=headers.get("x-mq-protocol", ""),
            namespace=headers.get("x-mq-namespace", ""),
            request_id=headers.get("x-mq-request-id", ""),
            peer=context.peer() or "",
            deadline=None if remaining is None else time.monotonic() + remaining,
            caller=CALLER.get(),
        )
