from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from popmq.proxy.metrics import ProxyMetrics

from .fake_broker import FakeBroker


@pytest.fixture
def metrics() -> ProxyMetrics:
    return ProxyMetrics()


@pytest.fixture
async def fakes() -> AsyncIterator[list[FakeBroker]]:
    brokers = [FakeBroker(f"b{i}") for i in range(4)]
    yield brokers
    assert all(b.held == 0 for b in brokers), "a broker still holds a request"
