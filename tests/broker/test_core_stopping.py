"""A broker that is stopping refuses with a code proxies and clients retry (HA_NOT_AVAILABLE),
never INTERNAL_ERROR: during a rolling restart or a leader stepping down, the same request
succeeds on another broker or the group's next leader."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.types import Message
from popmq.broker.core import Broker
from popmq.broker.testing import fast_broker_config
from popmq.proxy.longpoll.base import is_broker_down


async def test_a_stopping_broker_refuses_with_a_retriable_code(tmp_path: Path) -> None:
    broker = Broker(fast_broker_config(tmp_path / "b"))
    with pytest.raises(RefusedError) as never_started:
        await broker.send([Message(topic="T", body=b"x")])
    assert never_started.value.code == Code.INTERNAL_ERROR  # a caller's bug, not a state
    await broker.start()
    await broker.send([Message(topic="T", body=b"before")])
    inside, release = anyio.Event(), anyio.Event()
    tasks = broker._tasks
    close_tasks = tasks.aclose

    async def slow_close() -> None:  # hold the broker half-way through aclose()
        inside.set()
        await release.wait()
        await close_tasks()

    tasks.aclose = slow_close  # type: ignore[method-assign]
    async with anyio.create_task_group() as group:
        group.start_soon(broker.aclose)
        await inside.wait()
        with pytest.raises(RefusedError) as stopping:
            await broker.send([Message(topic="T", body=b"during")])
        assert stopping.value.code == Code.HA_NOT_AVAILABLE
        assert "stopping" in stopping.value.message
        assert is_broker_down(stopping.value)  # the proxy tries another broker / the successor
        release.set()
    with pytest.raises(RefusedError) as stopped:
        await broker.send([Message(topic="T", body=b"after")])
    assert stopped.value.code == Code.HA_NOT_AVAILABLE
