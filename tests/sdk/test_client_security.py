"""popmq's own client (popmq.client) against a proxy with an ACL and TLS: it signs like the
official clients and trusts a given CA."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from popmq.broker.contract.errors import Code
from popmq.broker.contract.types import Message
from popmq.broker.core import Broker
from popmq.broker.local import LocalBrokerPort
from popmq.broker.testing import fast_broker_config
from popmq.proxy.server import ProxyServer
from support.tls_certs import make_pki

from popmq.client import AsyncClient, ProxyError, ProxyUnavailable
from popmq.client.security import ClientSecurity
from popmq.config import PopmqConfig, ProxyConfig, TlsConfig


@pytest.fixture
async def secured_proxy(tmp_path: Path) -> Any:
    pki = make_pki(tmp_path / "pki")
    acl = tmp_path / "acl.yaml"
    acl.write_text(yaml.safe_dump({"users": [
        {"access_key": "app", "secret_key": "app-secret-0001",
         "allow": [{"publish": "t"}, {"subscribe": "g"}]},
    ]}))  # fmt: skip
    broker = Broker(fast_broker_config(tmp_path / "b"))
    await broker.start()
    config = PopmqConfig(
        proxy=ProxyConfig(
            port=0,
            acl=acl,
            tls=TlsConfig(cert=pki.server_cert, key=pki.server_key),
            min_long_polling_ms=100,
            min_invisible_ms=1_000,
        )
    )
    server = ProxyServer(config, [LocalBrokerPort(broker)])
    await server.start()
    yield f"127.0.0.1:{server.port}", pki
    await server.aclose(0.2)
    await broker.aclose()


async def test_signed_client_over_tls(secured_proxy: Any) -> None:
    endpoint, pki = secured_proxy
    security = ClientSecurity("app", "app-secret-0001", tls=True, ca_file=pki.ca)
    assert "app-secret" not in repr(security)
    async with AsyncClient(endpoint, security=security) as client:
        (receipt,) = await client.send([Message("t", b"hello")])
        queues = await client.query_route("t")
        got = []
        for queue in queues:
            got += await client.receive("g", queue, invisible_ms=5_000, long_polling_ms=100)
        assert [m.body for m in got] == [b"hello"]
        assert receipt.message_id == got[0].message_id

    wrong = ClientSecurity("app", "not-it", tls=True, ca_file=pki.ca)
    async with AsyncClient(endpoint, security=wrong) as client:
        with pytest.raises(ProxyError) as err:
            await client.send([Message("t", b"x")])
        assert err.value.code == Code.UNAUTHORIZED
    async with AsyncClient(endpoint, security=security) as client:
        with pytest.raises(ProxyError) as err:
            await client.send([Message("other-topic", b"x")])
        assert err.value.code == Code.FORBIDDEN


async def test_client_certificates_required_with_a_client_ca(tmp_path: Path) -> None:
    import grpc

    from popmq.pb.rocketmq.v2 import definition_pb2 as pb
    from popmq.pb.rocketmq.v2 import service_pb2 as s
    from popmq.pb.rocketmq.v2 import service_pb2_grpc

    pki = make_pki(tmp_path / "pki")
    broker = Broker(fast_broker_config(tmp_path / "b"))
    await broker.start()
    tls = TlsConfig(cert=pki.server_cert, key=pki.server_key, client_ca=pki.ca)
    server = ProxyServer(PopmqConfig(proxy=ProxyConfig(port=0, tls=tls)), [LocalBrokerPort(broker)])
    await server.start()
    address = f"127.0.0.1:{server.port}"
    request = s.QueryRouteRequest(topic=pb.Resource(name="t"))
    try:
        with_cert = grpc.ssl_channel_credentials(
            pki.ca.read_bytes(), pki.client_key.read_bytes(), pki.client_cert.read_bytes()
        )
        async with grpc.aio.secure_channel(address, with_cert) as channel:
            route = await service_pb2_grpc.MessagingServiceStub(channel).QueryRoute(
                request, timeout=5
            )
            assert route.status.code == Code.OK
        without = grpc.ssl_channel_credentials(pki.ca.read_bytes())
        async with grpc.aio.secure_channel(address, without) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await service_pb2_grpc.MessagingServiceStub(channel).QueryRoute(request, timeout=5)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await server.aclose(0.2)
        await broker.aclose()


async def test_client_certificate_for_an_mtls_proxy(tmp_path: Path) -> None:
    """Issue 10: ClientSecurity could not present a client certificate, so popmq's own client
    (and the Spark connector) could not use a proxy with ``proxy.tls.client_ca``."""
    pki = make_pki(tmp_path / "pki")
    broker = Broker(fast_broker_config(tmp_path / "b"))
    await broker.start()
    tls = TlsConfig(cert=pki.server_cert, key=pki.server_key, client_ca=pki.ca)
    server = ProxyServer(PopmqConfig(proxy=ProxyConfig(port=0, tls=tls)), [LocalBrokerPort(broker)])
    await server.start()
    endpoint = f"127.0.0.1:{server.port}"
    try:
        mtls = ClientSecurity(ca_file=pki.ca, cert_file=pki.client_cert, key_file=pki.client_key)
        async with AsyncClient(endpoint, security=mtls) as client:
            (receipt,) = await client.send([Message("t", b"over mtls")])
            assert receipt.message_id
        no_cert = ClientSecurity(ca_file=pki.ca)
        async with AsyncClient(endpoint, security=no_cert, timeout_s=2.0) as client:
            with pytest.raises(ProxyUnavailable, match="UNAVAILABLE"):  # handshake refused
                await client.send([Message("t", b"x")])
        with pytest.raises(ValueError, match="certificate and its key"):
            ClientSecurity(ca_file=pki.ca, cert_file=pki.client_cert)
    finally:
        await server.aclose(0.2)
        await broker.aclose()
