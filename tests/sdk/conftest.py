from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.fake_proxy import FakeProxy


@pytest.fixture
def fake_proxy() -> Iterator[FakeProxy]:
    proxy = FakeProxy(topics={"orders", "events"}).start()
    try:
        yield proxy
    finally:
        proxy.stop()
