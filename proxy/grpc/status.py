"""Building apache.rocketmq.v2.Status and mapping exceptions to RocketMQ codes."""

from __future__ import annotations

import asyncio
import logging
from typing import cast

from popmq.errors import Code, PopmqError
from popmq.pb.rocketmq.v2 import definition_pb2 as pb

log = logging.getLogger(__name__)


def status(code: Code | int, message: str = "") -> pb.Status:
    code = Code(code)
    # Code's values are the protocol enum's (tests/test_codes.py)
    return pb.Status(code=cast("pb.Code", int(code)), message=message or code.name)


def ok() -> pb.Status:
    return status(Code.OK)


def code_of(exc: BaseException) -> tuple[Code, str]:
    """The RocketMQ code a client should see for an exception raised while serving it.

    Every popmq error carries its code (refusals their own; a broker that is unreachable
    INTERNAL_SERVER_ERROR, one that timed out PROXY_TIMEOUT). gRPC errors never get here: the
    remote broker port maps them where it calls gRPC."""
    if isinstance(exc, PopmqError):
        return exc.code, exc.message
    if isinstance(exc, TimeoutError | asyncio.TimeoutError):
        return Code.PROXY_TIMEOUT, "the broker did not answer in time"
    log.exception("unexpected error while serving a request", exc_info=exc)
    return Code.INTERNAL_ERROR, f"{type(exc).__name__}: {exc}"


def status_of(exc: BaseException) -> pb.Status:
    code, message = code_of(exc)
    return status(code, message)


def combined_code(codes: list[Code]) -> Code:
    """Top-level code of a batch: the shared code if all entries agree, else MULTIPLE_RESULTS."""
    distinct = set(codes)
    if not distinct:
        return Code.OK
    if len(distinct) == 1:
        return distinct.pop()
    return Code.MULTIPLE_RESULTS
