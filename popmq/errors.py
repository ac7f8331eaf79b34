"""popmq's one error tree: every error popmq raises on purpose is a PopmqError.

    PopmqError                      .code: the RocketMQ Code a client sees if this ends a request
    ├── RefusedError (RefusedError)  a request refused, with the protocol Code saying why
    │   └── (store, client ProxyError, ...)
    └── TransportError              no answer at all: the same request may succeed elsewhere
        ├── UnavailableError        the peer could not be reached (refused, lost, shutting down)
        └── DeadlineError           the peer did not answer in time (also a builtin TimeoutError)

Callers tell "refused" (the same on every broker) from "unreachable" (try another) by type.
gRPC errors are turned into these only where gRPC is called (popmq.broker.wire.remote / link and
popmq.client), each through one map_rpc_errors-style context manager. The Code values are
apache.rocketmq.v2.Code's, so a broker's refusal reaches the client unchanged;
tests/test_codes.py checks them against the generated protocol enum.
"""

from __future__ import annotations

from enum import IntEnum


class Code(IntEnum):
    OK = 20000
    MULTIPLE_RESULTS = 30000
    BAD_REQUEST = 40000
    ILLEGAL_ACCESS_POINT = 40001
    ILLEGAL_TOPIC = 40002
    ILLEGAL_CONSUMER_GROUP = 40003
    ILLEGAL_MESSAGE_TAG = 40004
    ILLEGAL_MESSAGE_KEY = 40005
    ILLEGAL_MESSAGE_GROUP = 40006
    ILLEGAL_MESSAGE_PROPERTY_KEY = 40007
    INVALID_TRANSACTION_ID = 40008
    ILLEGAL_MESSAGE_ID = 40009
    ILLEGAL_FILTER_EXPRESSION = 40010
    ILLEGAL_INVISIBLE_TIME = 40011
    ILLEGAL_DELIVERY_TIME = 40012
    INVALID_RECEIPT_HANDLE = 40013
    MESSAGE_PROPERTY_CONFLICT_WITH_TYPE = 40014
    UNRECOGNIZED_CLIENT_TYPE = 40015
    MESSAGE_CORRUPTED = 40016
    CLIENT_ID_REQUIRED = 40017
    ILLEGAL_POLLING_TIME = 40018
    ILLEGAL_OFFSET = 40019
    ILLEGAL_LITE_TOPIC = 40020
    UNAUTHORIZED = 40100
    PAYMENT_REQUIRED = 40200
    FORBIDDEN = 40300
    NOT_FOUND = 40400
    MESSAGE_NOT_FOUND = 40401
    TOPIC_NOT_FOUND = 40402
    CONSUMER_GROUP_NOT_FOUND = 40403
    OFFSET_NOT_FOUND = 40404
    REQUEST_TIMEOUT = 40800
    PAYLOAD_TOO_LARGE = 41300
    MESSAGE_BODY_TOO_LARGE = 41301
    MESSAGE_BODY_EMPTY = 41302
    PRECONDITION_FAILED = 42800
    TOO_MANY_REQUESTS = 42900
    LITE_TOPIC_QUOTA_EXCEEDED = 42901
    LITE_SUBSCRIPTION_QUOTA_EXCEEDED = 42902
    REQUEST_HEADER_FIELDS_TOO_LARGE = 43100
    MESSAGE_PROPERTIES_TOO_LARGE = 43101
    INTERNAL_ERROR = 50000
    INTERNAL_SERVER_ERROR = 50001
    HA_NOT_AVAILABLE = 50002
    NOT_IMPLEMENTED = 50100
    PROXY_TIMEOUT = 50400
    MASTER_PERSISTENCE_TIMEOUT = 50401
    SLAVE_PERSISTENCE_TIMEOUT = 50402
    UNSUPPORTED = 50500
    VERSION_UNSUPPORTED = 50501
    VERIFY_FIFO_MESSAGE_UNSUPPORTED = 50502
    FAILED_TO_CONSUME_MESSAGE = 60000


class PopmqError(Exception):
    """Root of popmq's errors. ``code`` is the RocketMQ Code a client sees when the error ends
    a request; ``message`` is the text without the code's name."""

    code: Code = Code.INTERNAL_ERROR

    @property
    def message(self) -> str:
        return str(self)


class RefusedError(PopmqError):
    """A request refused, with the RocketMQ code the client should see (bad input, not found,
    forbidden, ...): asking another broker would get the same answer."""

    def __init__(self, code: Code, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self._message = message

    @property
    def message(self) -> str:
        return self._message


class TransportError(PopmqError):
    """The call got no answer (peer unreachable, or too slow); it may or may not have been
    applied. Another broker or a retry may serve it."""

    def __init__(self, peer: str, message: str) -> None:
        super().__init__(message)
        self.peer = peer


class UnavailableError(TransportError):
    """The peer could not be reached (connection refused or lost, server shutting down)."""

    code = Code.INTERNAL_SERVER_ERROR


class DeadlineError(TransportError, TimeoutError):
    """The peer did not answer before the call's deadline."""

    code = Code.PROXY_TIMEOUT
