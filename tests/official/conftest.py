"""Official-client tests: `popmq serve` and a remote cluster (two `popmq broker` + `popmq
proxy`), driven by rocketmq-python-client 5.1.2 from .venv-client (`make client-venv`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.official_clients import (
    ClientSession,
    Deployment,
    start_remote_cluster,
    start_serve,
)


@pytest.fixture(scope="session")
def serve_deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    deployment = start_serve(tmp_path_factory.mktemp("serve"))
    yield deployment
    assert deployment.stop() == [0], "popmq serve did not exit cleanly on SIGTERM"


@pytest.fixture(scope="session")
def cluster_deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    deployment = start_remote_cluster(tmp_path_factory.mktemp("cluster"))
    yield deployment
    assert deployment.stop() == [0, 0, 0, 0], "a cluster process did not exit cleanly"


@pytest.fixture(params=["serve", "cluster"])
def deployment(request: pytest.FixtureRequest) -> Deployment:
    return request.getfixturevalue(f"{request.param}_deployment")


@pytest.fixture
def client_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("client-home")


@pytest.fixture
def open_client(client_home: Path) -> Iterator[Callable[..., ClientSession]]:
    """open_client(endpoint, role, **config) -> ClientSession, closed after the test."""
    sessions: list[ClientSession] = []

    def factory(endpoint: str, role: str, **config: Any) -> ClientSession:
        session = ClientSession({"endpoint": endpoint, "role": role, **config}, client_home)
        sessions.append(session)
        return session

    yield factory
    for session in sessions:
        session.close()
