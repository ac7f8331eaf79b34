"""A broker channel's connect attempt gets seconds, not the 250 ms of its re-dial backoff.

gRPC takes `grpc.min_reconnect_backoff_ms` as the shortest time a connect attempt may take
(its connect timeout). At 250 ms, a proxy on a loaded host whose first handshake with a broker
took longer failed its first calls UNAVAILABLE ("tcp handshaker shutdown")."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import grpc
import pytest
from popmq.broker.wire.remote import CHANNEL_OPTIONS

pytestmark = pytest.mark.wallclock


@pytest.fixture
def silent_listener() -> Iterator[str]:
    """A port whose kernel completes TCP handshakes but whose owner never speaks HTTP/2."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield f"127.0.0.1:{listener.getsockname()[1]}"


async def test_a_slow_handshake_is_waited_for_within_the_calls_deadline(
    silent_listener: str,
) -> None:
    async with grpc.aio.insecure_channel(silent_listener, options=CHANNEL_OPTIONS) as channel:
        call = channel.unary_unary("/popmq.test.Nobody/Call")
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await call(b"", timeout=2.0)
    # Still connecting when the deadline came: the attempt was not cut short at 250 ms.
    assert failure.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED, failure.value.details()


def test_re_dialling_stays_at_most_a_second_apart() -> None:
    options = dict(CHANNEL_OPTIONS)
    assert options["grpc.initial_reconnect_backoff_ms"] <= 250
    assert options["grpc.max_reconnect_backoff_ms"] <= 1_000
    # gRPC's connect timeout: long enough for a loaded host's handshake.
    assert options["grpc.min_reconnect_backoff_ms"] >= 5_000
