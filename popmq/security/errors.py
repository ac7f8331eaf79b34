"""Refusals of the access layer, with the RocketMQ code a client should see."""

from __future__ import annotations

from popmq.errors import Code, RefusedError

UNAUTHORIZED = Code.UNAUTHORIZED
FORBIDDEN = Code.FORBIDDEN
# What a caller hears for an unknown access key and for a wrong signature alike: telling them
# apart would let anyone enumerate the access keys.
BAD_CREDENTIALS = "access key or signature not valid"


class AccessDenied(RefusedError):
    """A request refused before anything was read or written.

    `message` goes to the caller; `detail` (default: the message) and `reason` (a metric label)
    stay on the server, for its log and metrics."""

    def __init__(
        self, code: Code, message: str, *, detail: str | None = None, reason: str = ""
    ) -> None:
        super().__init__(code, message)
        self.detail = detail or message
        self.reason = reason or ("forbidden" if code == FORBIDDEN else "unauthorized")


def unauthorized(message: str, *, detail: str | None = None, reason: str = "") -> AccessDenied:
    return AccessDenied(UNAUTHORIZED, message, detail=detail, reason=reason)


def forbidden(message: str) -> AccessDenied:
    return AccessDenied(FORBIDDEN, message)
