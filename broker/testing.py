"""A real broker for tests and tools: fast settings, and a throwaway data directory.

Not a fake: the same Broker and LocalBrokerPort that `popmq serve` runs, with POP timings
shrunk so retries and revives happen in milliseconds::

    async with local_broker() as port:            # a BrokerPort; data in a temp dir
        await port.create_topic("t", 4)

    async with running_broker(fast_broker_config(tmp_path), LoopClock()) as broker:
        ...                                       # the Broker itself, on virtual time
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from popmq.broker.core import Broker
from popmq.broker.local import LocalBrokerPort

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
async def running_broker(config: BrokerConfig, clock: Any = None) -> AsyncIterator[Broker]:
    """A started Broker for the duration of the block, closed afterwards. A test on virtual
    time (@pytest.mark.looptime) passes clock=LoopClock()."""
    async with Broker(config, clock) if clock is not None else Broker(config) as broker:
        yield broker


@contextlib.asynccontextmanager
async def local_broker(
    config: BrokerConfig | None = None, *, name: str = "broker-a", clock: Any = None
) -> AsyncIterator[LocalBrokerPort]:
    """A LocalBrokerPort over a running Broker; without a config, a fast one whose data lives
    in a temporary directory removed afterwards."""
    with contextlib.ExitStack() as dirs:
        if config is None:
            data_dir = Path(dirs.enter_context(tempfile.TemporaryDirectory(prefix="popmq-")))
            config = fast_broker_config(data_dir, name)
        async with running_broker(config, clock) as broker:
            port = LocalBrokerPort(broker)
            try:
                yield port
            finally:
                await port.aclose()
