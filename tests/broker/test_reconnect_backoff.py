"""A proxy's long-lived channel to a broker reaches it again within about a second of its
return, however long it was down (issue 22: `cluster status` showed a restarted broker
unreachable 8 s after the proxy's health check, on a fresh channel, logged it reachable; the
port's channel was waiting out grpc's reconnect backoff, which grows to 120 s by default, and
sends and pops to that broker failed as long)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from popmq.broker.local import LocalBrokerPort
from popmq.broker.testing import fast_broker_config, running_broker
from popmq.broker.wire.remote import RemoteBrokerPort
from popmq.broker.wire.server import BrokerGrpcServer

from popmq.errors import PopmqError

OUTAGE_S = 9.0  # long enough for grpc's default backoff to reach several seconds


@pytest.mark.wallclock
async def test_a_broker_back_after_an_outage_is_reached_within_about_a_second(
    tmp_path: Path,
) -> None:
    async with running_broker(fast_broker_config(tmp_path / "b", name="broker-a")) as broker:
        server = BrokerGrpcServer(LocalBrokerPort(broker), "127.0.0.1", 0)
        await server.start()
        port_number = server.bound_port
        remote = RemoteBrokerPort("broker-a", server.address, rpc_timeout_s=2.0)
        try:
            await remote.list_topics()
            await server.aclose(0)
            # The proxy keeps asking meanwhile (watch links, cluster status): each failure
            # grows the channel's backoff.
            down_until = time.monotonic() + OUTAGE_S
            while time.monotonic() < down_until:
                with pytest.raises(PopmqError):
                    await remote.list_topics()
                await asyncio.sleep(0.3)
            server = BrokerGrpcServer(LocalBrokerPort(broker), "127.0.0.1", port_number)
            await server.start()
            back = time.monotonic()
            while True:
                try:
                    await remote.list_topics()
                    break
                except PopmqError:
                    assert time.monotonic() - back < 10, "never reached again"
                    await asyncio.sleep(0.05)
            # The channel re-dials at least every 1 s (+20% jitter); grpc's default would wait
            # out a backoff of several seconds by now. Slack for a loaded CI machine.
            assert time.monotonic() - back < 3.0
        finally:
            await remote.aclose()
            await server.aclose(0)
