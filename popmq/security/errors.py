"""Refusals of the access layer, with the RocketMQ code a client should see."""

from __future__ import annotations

# apache.rocketmq.v2.Code values (kept here so this layer needs no server module).
UNAUTHORIZED = 40100
FORBIDDEN = 40300


class AccessDenied(Exception):
    """A request refused before anything was read or written."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def unauthorized(message: str) -> AccessDenied:
    return AccessDenied(UNAUTHORIZED, message)


def forbidden(message: str) -> AccessDenied:
    return AccessDenied(FORBIDDEN, message)
