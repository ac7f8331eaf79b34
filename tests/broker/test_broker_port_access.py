"""The broker port accepts only proxies: the cluster token, or mutual TLS.

A stranger who reaches the port directly can do nothing (no offsets moved, no topic deleted,
nothing read); health checks stay open for probes. The proxy side (RemoteBrokerPort with the
link settings) gets in."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from popmq.broker.contract.errors import BrokerAuthError, BrokerUnavailableError, Code
from popmq.broker.contract.types import Message
from popmq.broker.core import Broker
from popmq.broker.local import LocalBrokerPort
from popmq.broker.testing import fast_broker_config
from popmq.broker.wire import convert
from popmq.broker.wire.remote import RemoteBrokerPort
from popmq.broker.wire.server import BrokerGrpcServer
from support.tls_certs import Pki, make_pki

from popmq.config import BrokerConfig, BrokerLinkConfig, TlsConfig
from popmq.pb.broker.v1 import broker_pb2 as pb
from popmq.pb.broker.v1 import broker_pb2_grpc

TOKEN = "cluster-token-0123456789abcdef"


@contextlib.asynccontextmanager
async def guarded_broker(config: BrokerConfig) -> AsyncIterator[tuple[Broker, str]]:
    broker = Broker(config)
    await broker.start()
    server = BrokerGrpcServer(LocalBrokerPort(broker), "127.0.0.1", 0, config=config)
    try:
        await server.start()
        yield broker, server.address
    finally:
        await server.aclose(0.2)
        await broker.aclose()


async def _stranger_tries_everything(channel: grpc.aio.Channel) -> list[grpc.StatusCode]:
    stub = broker_pb2_grpc.BrokerServiceStub(channel)
    codes = []
    for call, request in (
        (stub.UpdateConsumerOffset, pb.UpdateConsumerOffsetRequest(
            group="billing", topic="orders", queue_id=0, offset=18)),
        (stub.DeleteTopic, pb.DeleteTopicRequest(topic="orders")),
        (stub.Pop, pb.PopRequest(group="billing", topic="orders", max_messages=8,
                                 invisible_time_ms=60_000, queue_id=-1)),
        (stub.Pull, pb.PullRequest(topic="orders", queue_id=0, max_messages=8)),
        (stub.ListTopics, pb.ListTopicsRequest()),
    ):  # fmt: skip
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call(request, timeout=5)
        codes.append(err.value.code())
    # The streams too: the request link would store this message, the watch arm a poll.
    send = pb.SendRequest(messages=[convert.message_to_proto(Message("orders", b"x"))], queue_id=0)
    arm = pb.WatchArm(id=1, group="billing", topic="orders")
    for stream in (
        stub.Call(iter([pb.LinkRequests(requests=[pb.LinkRequest(id=1, send=send)])]), timeout=5),
        stub.Watch(iter([pb.WatchRequest(arm=arm)]), timeout=5),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in stream:
                pass
        codes.append(err.value.code())
    return codes


async def _nothing_changed(broker: Broker) -> None:
    assert await broker.get_consumer_offset("billing", "orders", 0) == -1
    info = await broker.get_topic("orders")
    assert info.queues[0].max_offset == 3  # the topic and its messages are still there


async def test_cluster_token_keeps_strangers_out(tmp_path: Path, caplog) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)  # else the start WARNING about its mode is a second token line
    config = fast_broker_config(tmp_path / "b").model_copy(
        update={"cluster_token_file": token_file}
    )
    async with guarded_broker(config) as (broker, address):
        await broker.send([Message("orders", b"o") for _ in range(3)], 0)
        async with grpc.aio.insecure_channel(address) as channel:
            with caplog.at_level(logging.WARNING, logger="popmq.security.link"):
                codes = await _stranger_tries_everything(channel)
            assert set(codes) == {grpc.StatusCode.UNAUTHENTICATED}
            # The probe leaves a trace, but not one line per call.
            (line,) = [
                r.getMessage()
                for r in caplog.records
                if "without the cluster token" in r.getMessage()
            ]
            assert "refused 1 call" in line and TOKEN not in line
            health = health_pb2_grpc.HealthStub(channel)
            answer = await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
        wrong = tmp_path / "wrong"
        wrong.write_text("not-the-cluster-token-at-all")
        intruder = RemoteBrokerPort("b", address, link=BrokerLinkConfig(cluster_token_file=wrong))
        with pytest.raises(BrokerAuthError, match="UNAUTHENTICATED") as refused:
            await intruder.update_consumer_offset("billing", "orders", 0, 18)
        # A deployment fault, said as one: never INTERNAL_ERROR, and it names the setting.
        assert refused.value.code is Code.INTERNAL_SERVER_ERROR
        assert "cluster_token_file" in refused.value.message
        await intruder.aclose()
        streamed = RemoteBrokerPort(
            "b", address, link=BrokerLinkConfig(cluster_token_file=wrong, coalesce_ms=0)
        )
        # On the request link. grpcio's aio client can report a stream the server refused as
        # INTERNAL "Internal error from Core" when its write of the first request loses the
        # race with the refusal (grpc/grpc#36066, open): that one answer is tolerated, never a
        # stored message, and the refusal must come through as itself in one of ten tries.
        refusals = []
        for _ in range(10):
            with pytest.raises((BrokerAuthError, BrokerUnavailableError)) as err:
                await streamed.send([Message("orders", b"x")], 0)
            if not isinstance(err.value, BrokerAuthError):
                assert "Internal error from Core" in str(err.value), err.value
            refusals.append(err.value)
        auth = [e for e in refusals if isinstance(e, BrokerAuthError)]
        assert auth and all("UNAUTHENTICATED" in str(e) for e in auth), refusals
        await streamed.aclose()
        await _nothing_changed(broker)

        proxy = RemoteBrokerPort("b", address, link=BrokerLinkConfig(cluster_token_file=token_file))
        try:
            assert (await proxy.get_topic("orders")).queues[0].max_offset == 3
            await proxy.update_consumer_offset("billing", "orders", 0, 1)
            assert await broker.get_consumer_offset("billing", "orders", 0) == 1
        finally:
            await proxy.aclose()


async def test_mutual_tls_keeps_strangers_out(tmp_path: Path) -> None:
    pki: Pki = make_pki(tmp_path / "pki")
    config = fast_broker_config(tmp_path / "b")
    config.tls = TlsConfig(cert=pki.server_cert, key=pki.server_key, client_ca=pki.ca)
    async with guarded_broker(config) as (broker, address):
        await broker.send([Message("orders", b"o") for _ in range(3)], 0)
        for credentials in (
            grpc.ssl_channel_credentials(pki.ca.read_bytes()),  # TLS, but no client cert
            None,  # plaintext
        ):
            channel = (
                grpc.aio.secure_channel(address, credentials)
                if credentials
                else grpc.aio.insecure_channel(address)
            )
            async with channel:
                codes = await _stranger_tries_everything(channel)
                assert grpc.StatusCode.OK not in codes
        await _nothing_changed(broker)

        link = BrokerLinkConfig(tls=True, ca=pki.ca, cert=pki.client_cert, key=pki.client_key)
        proxy = RemoteBrokerPort("b", address, link=link)
        try:
            await proxy.update_consumer_offset("billing", "orders", 0, 2)
            assert await broker.get_consumer_offset("billing", "orders", 0) == 2
        finally:
            await proxy.aclose()
