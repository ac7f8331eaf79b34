"""Refusals of the access layer, with the RocketMQ code a client should see."""

from __future__ import annotations

from popmq.errors import Code, RefusedError

UNAUTHORIZED = Code.UNAUTHORIZED
FORBIDDEN = Code.FORBIDDEN


class AccessDenied(RefusedError):
    """A request refused before anything was read or written."""

    def __init__(self, code: Code, message: str) -> None:
        super().__init__(code, message)


def unauthorized(message: str) -> AccessDenied:
    return AccessDenied(UNAUTHORIZED, message)


def forbidden(message: str) -> AccessDenied:
    return AccessDenied(FORBIDDEN, message)
