"""The code a caller sees when a broker cannot be reached. A proxy following a group in etcd
says HA_NOT_AVAILABLE (its leader is gone and the next one not known yet: clients retry it);
with a static broker list the error keeps INTERNAL_SERVER_ERROR. Found in the HA chaos
scenario: sends during a leader switch failed with INTERNAL_SERVER_ERROR "Connection refused"."""

from __future__ import annotations

import socket

import anyio
import pytest
from popmq.broker.contract.errors import BrokerUnavailableError, Code
from popmq.broker.contract.types import Message
from popmq.broker.wire.remote import RemoteBrokerPort


def _closed_port() -> int:
    """A port on 127.0.0.1 with nothing listening (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize(
    ("unreachable_code", "seen"),
    [(None, Code.INTERNAL_SERVER_ERROR), (Code.HA_NOT_AVAILABLE, Code.HA_NOT_AVAILABLE)],
)
async def test_an_unreachable_broker_fails_with_the_port_s_code(
    unreachable_code: Code | None, seen: Code
) -> None:
    address = f"127.0.0.1:{_closed_port()}"
    port = RemoteBrokerPort("ga", address, rpc_timeout_s=5, unreachable_code=unreachable_code)
    try:
        with anyio.fail_after(30):  # a hang guard: a refused connection fails at once
            # a send (request link and its coalescer) and a unary call
            with pytest.raises(BrokerUnavailableError) as sent:
                await port.send([Message(topic="t", body=b"x")], 0)
            with pytest.raises(BrokerUnavailableError) as looked_up:
                await port.get_topic("t")
    finally:
        await port.aclose()
    assert sent.value.code == seen, sent.value
    assert looked_up.value.code == seen, looked_up.value
