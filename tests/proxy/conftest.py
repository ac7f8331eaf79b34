"""Fixtures: a real proxy (ProxyServer on a free port) over real in-process brokers."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio
from popmq.broker.core import Broker
from popmq.broker.local import LocalBrokerPort
from popmq.proxy.server import ProxyServer
from proxy_support import Cluster, make_config

from popmq.pb.rocketmq.v2 import service_pb2_grpc


@asynccontextmanager
async def cluster_factory(tmp_path: Path) -> AsyncIterator[Any]:
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

    try:
        yield factory
    finally:
        for cluster in opened:
            await cluster.channel.close()
            await cluster.server.aclose(0.2)
        for broker in started_brokers:
            await broker.aclose()


@pytest.fixture
async def make_cluster(tmp_path: Path) -> AsyncIterator[Any]:
    """Factory: make_cluster(brokers=2, **config overrides) -> Cluster; all closed at the end."""
    async with cluster_factory(tmp_path) as factory:
        yield factory


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def module_cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Cluster]:
    """One default cluster for a module's tests that only read and write their own unique
    topics and groups (their tests run with ``pytest.mark.asyncio(loop_scope="module")``):
    a cluster's start and stop cost more than most such checks."""
    async with cluster_factory(tmp_path_factory.mktemp("cluster")) as factory:
        yield await factory()


@pytest.fixture
async def cluster(make_cluster: Any) -> Cluster:
    return await make_cluster()
