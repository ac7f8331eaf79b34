"""Replicated broker groups for benchmarks: a static leader and its followers, as processes.

``popmq broker --replication MODE --role leader|follower`` on 127.0.0.1: the roles are given
by flags (no etcd), so a benchmark measures replication itself, not elections. With sync, the
leader's ``--min-in-sync`` is the group's size unless told otherwise; either way every answer
waits for every node of the in-sync set.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

from popmq.bench.brokers import remote_broker
from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.port import BrokerPort
from popmq.broker.wire.remote import RemoteBrokerPort
from popmq.config import BrokerConfig


def _min_in_sync(replicas: int, mode: str, wanted: int | None = None) -> int:
    if mode != "sync":
        return 1
    return min(wanted, replicas) if wanted else replicas


@contextlib.asynccontextmanager
async def _follower(
    config: BrokerConfig, index: int, leader: str, min_in_sync: int, mode: str, pids: list[int]
) -> AsyncIterator[None]:
    data_dir = Path(config.data_dir).parent / f"{Path(config.data_dir).name}-{index}"
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "popmq", "broker", "--name", config.name, "--port", "0",
        "--data-dir", str(data_dir), "--flush", config.store.flush, "--replication", mode,
        "--role", "follower", "--leader", leader, "--min-in-sync",
        str(min_in_sync), "--node-name", f"{config.name}-{index}",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    pids.append(process.pid)
    try:
        assert process.stdout is not None
        async with asyncio.timeout(30):
            await process.stdout.readline()
        yield
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                async with asyncio.timeout(10):
                    await process.wait()
            except TimeoutError:
                process.kill()
                await process.wait()


@contextlib.asynccontextmanager
async def replicated_group(
    config: BrokerConfig,
    replicas: int,
    mode: str,
    pids: list[int],
    min_in_sync: int | None = None,
) -> AsyncIterator[RemoteBrokerPort]:
    """A leader (on ``config.data_dir``) and ``replicas - 1`` followers (beside it); yields
    the leader's port. ``replicas`` 1 with mode ``off`` is a plain broker. With sync, the
    leader's ``--min-in-sync`` is ``min_in_sync`` (default: every node)."""
    quorum = _min_in_sync(replicas, mode, min_in_sync)
    extra: tuple[str, ...] = ()
    if mode != "off":
        extra = ("--replication", mode, "--role", "leader", "--epoch", "1", "--min-in-sync",
                 str(quorum), "--node-name", f"{config.name}-0")  # fmt: skip
    async with remote_broker(config, pids, extra) as port, contextlib.AsyncExitStack() as stack:
        assert isinstance(port, RemoteBrokerPort)
        for index in range(1, replicas if mode != "off" else 1):
            await stack.enter_async_context(
                _follower(config, index, port.address, quorum, mode, pids)
            )
        yield port


async def create_topic_in_sync(
    port: BrokerPort, topic: str, queues: int, timeout_s: float = 60.0
) -> None:
    """Create ``topic``, retrying while the group's followers are not in sync yet."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            await port.create_topic(topic, queues)
            return
        except RefusedError as refused:
            if refused.code != Code.HA_NOT_AVAILABLE or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)
