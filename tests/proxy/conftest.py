"""Fixtures: a real proxy (ProxyServer on a free port) over real in-process brokers."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from popmq.broker.core import Broker
from popmq.broker.local import LocalBrokerPort
from popmq.proxy.server import ProxyServer
from proxy_support import Cluster, make_config

from popmq.pb.rocketmq.v2 import service_pb2_grpc


@pytest.fixture
async def make_cluster(tmp_path: Path) -> AsyncIterator[Any]:
    """Factory: make_cluster(brokers=2, **config overrides) -> Cluster; all closed at the end."""
    opened: list[Cluster] = []
    started_brokers: list[Broker] = []

    async def factory(brokers: int = 2, **overrides: Any) -> Cluster:
        root = tmp_path / f"cluster{len(opened)}"
        config = make_config(root, **overrides)
        made = []
        for i in range(brokers):
            broker_config = config.broker.model_copy(
                update={"name": f"broker-{i}", "data_dir": root / f"broker-{i}"}
            )
            broker = Broker(broker_config)
            await broker.start()
            made.append(broker)
            started_brokers.append(broker)
        config.proxy.port = 0
        server = ProxyServer(config, [LocalBrokerPort(b) for b in made])
        await server.start()
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
        cluster = Cluster(
            config, made, server, channel, service_pb2_grpc.MessagingServiceStub(channel),
            client_id=f"test@{uuid.uuid4().hex[:8]}",
        )  # fmt: skip
        opened.append(cluster)
        return cluster

    yield factory
    for cluster in opened:
        await cluster.channel.close()
        await cluster.server.aclose(0.2)
    for broker in started_brokers:
        await broker.aclose()


@pytest.fixture
async def cluster(make_cluster: Any) -> Cluster:
    return await make_cluster()
