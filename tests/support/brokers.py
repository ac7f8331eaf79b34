"""Helpers for tests that need a real, fast Broker (used by several test suites)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from popmq.config import BrokerConfig


def fast_broker_config(data_dir: Path, name: str = "broker-a", **pop: Any) -> BrokerConfig:
    """A BrokerConfig for tests: tiny minimum invisible time, fast revive and retries
    (``time_scale`` 0.001: the 1 s retry level takes 1 ms), short checkpoint buffer.
    Keyword arguments override ``pop`` settings."""
    settings: dict[str, Any] = {
        "min_invisible_ms": 1,
        "revive_scan_interval_ms": 10,
        "time_scale": 0.001,
        "checkpoint_buffer_ms": 50,
    }
    settings.update(pop)
    return BrokerConfig.model_validate(
        {
            "name": name,
            "data_dir": str(data_dir),
            "store": {"flush_interval_ms": 50},
            "topics": {"queue_count": 4},
            "pop": settings,
        }
    )


@contextlib.asynccontextmanager
async def running_broker(config: BrokerConfig, clock: Any = None) -> AsyncIterator[Any]:
    """Start a Broker for the duration of the block, and stop it afterwards. A test on
    virtual time (@pytest.mark.looptime) passes clock=LoopClock()."""
    from popmq.broker.core import Broker

    async with Broker(config, clock) if clock is not None else Broker(config) as broker:
        yield broker
