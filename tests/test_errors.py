"""popmq's one error tree: refusals and transport failures are told apart by type."""

from __future__ import annotations

import grpc
import pytest
from popmq.broker.contract.errors import (
    BrokerAuthError,
    BrokerTimeoutError,
    BrokerUnavailableError,
)
from popmq.broker.store.errors import OffsetPurgedError
from popmq.broker.wire.remote import map_rpc_errors as map_broker_errors
from popmq.proxy.grpc.status import code_of
from popmq.proxy.longpoll.base import is_broker_down

from popmq.client import ProxyError, ProxyTimeout, ProxyUnavailable
from popmq.client.errors import map_rpc_errors as map_client_errors
from popmq.errors import (
    Code,
    DeadlineError,
    PopmqError,
    RefusedError,
    TransportError,
)
from popmq.spark import DataLossError, OptionError, TopicNotFoundError


class FakeRpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str = "boom") -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


def test_every_error_has_the_one_root() -> None:
    for kind in (
        RefusedError,
        BrokerUnavailableError,
        BrokerTimeoutError,
        BrokerAuthError,
        OffsetPurgedError,
        ProxyError,
        ProxyUnavailable,
        ProxyTimeout,
        OptionError,
        DataLossError,
        TopicNotFoundError,
    ):
        assert issubclass(kind, PopmqError), kind


def test_refused_and_unreachable_are_different_types() -> None:
    for transport in (BrokerUnavailableError, BrokerTimeoutError, ProxyUnavailable, ProxyTimeout):
        assert issubclass(transport, TransportError)
        assert not issubclass(transport, RefusedError), transport
    for refusal in (BrokerAuthError, OffsetPurgedError, ProxyError):
        assert not issubclass(refusal, TransportError), refusal


def test_spark_errors_keep_their_builtin_bases() -> None:
    assert issubclass(OptionError, ValueError)
    assert issubclass(DataLossError, RuntimeError)
    assert issubclass(TopicNotFoundError, LookupError)
    assert issubclass(DeadlineError, TimeoutError)


@pytest.mark.parametrize(
    ("status", "kind", "code"),
    [
        (grpc.StatusCode.UNAVAILABLE, BrokerUnavailableError, Code.INTERNAL_SERVER_ERROR),
        (grpc.StatusCode.CANCELLED, BrokerUnavailableError, Code.INTERNAL_SERVER_ERROR),
        (grpc.StatusCode.DEADLINE_EXCEEDED, BrokerTimeoutError, Code.PROXY_TIMEOUT),
        (grpc.StatusCode.UNAUTHENTICATED, BrokerAuthError, Code.INTERNAL_SERVER_ERROR),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, RefusedError, Code.INTERNAL_ERROR),
    ],
)
def test_broker_port_maps_grpc_errors_in_one_place(
    status: grpc.StatusCode, kind: type[PopmqError], code: Code
) -> None:
    error = grpc.aio.AioRpcError(status, grpc.aio.Metadata(), grpc.aio.Metadata(), "boom")
    with pytest.raises(kind) as caught, map_broker_errors("b1"):
        raise error
    assert caught.value.code is code
    assert "b1" in caught.value.message
    assert code_of(caught.value) == (code, caught.value.message)


def test_transport_errors_and_a_group_without_leader_mean_broker_down() -> None:
    assert is_broker_down(BrokerUnavailableError("b", "gone"))
    assert is_broker_down(BrokerTimeoutError("b", "slow"))
    assert not is_broker_down(RefusedError(Code.PROXY_TIMEOUT, "a refusal, whatever its code"))
    assert not is_broker_down(BrokerAuthError("b", "UNAUTHENTICATED"))
    # A replicated group between leaders (issue 19): its next leader may serve the receive.
    assert is_broker_down(RefusedError(Code.HA_NOT_AVAILABLE, "no leader"))
    assert is_broker_down(RefusedError(Code.SLAVE_PERSISTENCE_TIMEOUT, "in-sync follower lost"))
    assert not is_broker_down(RefusedError(Code.FORBIDDEN, "the client's own"))


@pytest.mark.parametrize(
    ("status", "kind", "code"),
    [
        (grpc.StatusCode.UNAVAILABLE, ProxyUnavailable, Code.INTERNAL_ERROR),
        (grpc.StatusCode.DEADLINE_EXCEEDED, ProxyTimeout, Code.PROXY_TIMEOUT),
    ],
)
def test_client_maps_grpc_errors_to_transport_errors(
    status: grpc.StatusCode, kind: type[ProxyUnavailable], code: Code
) -> None:
    with pytest.raises(kind) as caught, map_client_errors("h:1", "QueryRoute"):
        raise FakeRpcError(status)
    assert caught.value.code is code and caught.value.rpc == "QueryRoute"
    assert caught.value.timed_out is (kind is ProxyTimeout)
    assert not isinstance(caught.value, ProxyError)
