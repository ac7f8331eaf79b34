"""Brokers for benchmarks: in-process (LocalBrokerPort) or a `popmq broker` child process.

Both yield a BrokerPort, so a benchmark measures the same work over either transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator

from popmq.bench.process_stats import cpu_seconds
from popmq.broker.contract.port import BrokerPort
from popmq.config import BrokerConfig


@contextlib.asynccontextmanager
async def local_broker(config: BrokerConfig) -> AsyncIterator[BrokerPort]:
    from popmq.broker.core import Broker
    from popmq.broker.local import LocalBrokerPort

    broker = Broker(config)
    await broker.start()
    try:
        yield LocalBrokerPort(broker)
    finally:
        await broker.aclose()


def process_cpu_s(pid: int) -> float:
    """user + system CPU seconds of a live process; 0 when it is gone."""
    return cpu_seconds(pid)


@contextlib.asynccontextmanager
async def remote_broker(
    config: BrokerConfig, pids: list[int] | None = None, extra_args: tuple[str, ...] = ()
) -> AsyncIterator[BrokerPort]:
    """A `popmq broker` process on a free loopback port, reached over gRPC.

    Its process id is appended to ``pids`` (for CPU accounting) while it runs.
    """
    from popmq.broker.wire.remote import RemoteBrokerPort

    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "popmq", "broker", "--name", config.name, "--port", "0",
        "--data-dir", str(config.data_dir), "--flush", config.store.flush, *extra_args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    if pids is not None:
        pids.append(process.pid)
    port: RemoteBrokerPort | None = None
    try:
        assert process.stdout is not None
        async with asyncio.timeout(30):
            line = (await process.stdout.readline()).decode()
        if "listening on" not in line:
            raise RuntimeError(f"broker {config.name} did not start: {line!r}")
        port = RemoteBrokerPort(config.name, line.rsplit(" ", 1)[1].strip())
        yield port
    finally:
        if port is not None:
            await port.aclose()
        if process.returncode is None:
            process.terminate()
            try:
                async with asyncio.timeout(10):
                    await process.wait()
            except TimeoutError:
                process.kill()
                await process.wait()
