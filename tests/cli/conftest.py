"""One small `popmq serve` (one broker, metrics on) shared by the CLI tests of a module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.official_clients import Deployment, start_serve


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    deployment = start_serve(tmp_path_factory.mktemp("cli-serve"))
    yield deployment
    assert deployment.stop() == [0]
