"""A replicated node that won its election opens its store off the event loop, so its server
answers while the store opens. A call that comes then waits (bounded) for the node to lead,
as it did when the open blocked the loop, instead of being refused "this node is starting"
(tests/broker/test_replication_process.py failed that way)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.replication.port import PROMOTION_WAIT_S, Leading, NodePort

pytestmark = pytest.mark.looptime


class _Leader:
    def leads(self) -> bool:
        return True

    def check_available(self) -> None:
        return None


class _Port:
    async def list_topics(self) -> list[Any]:
        return ["T"]


def leading() -> Leading:
    return Leading(broker=None, port=_Port(), replication=_Leader())  # type: ignore[arg-type]


async def test_a_call_during_the_promotion_waits_for_the_node_to_lead() -> None:
    port = NodePort("a-0")
    port.promotion_started()
    answers: list[Any] = []

    async def call() -> None:
        answers.append(await port.list_topics())

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(call)
        await anyio.sleep(1.0)  # the store is still opening
        assert answers == []
        port.leading = leading()
        port.promotion_ended()
    assert answers == [["T"]]


async def test_a_promotion_that_fails_or_lasts_too_long_ends_in_the_refusal() -> None:
    port = NodePort("a-0")
    port.promotion_started()
    started = anyio.current_time()
    with pytest.raises(RefusedError) as refused:
        await port.list_topics()
    assert refused.value.code == Code.HA_NOT_AVAILABLE
    assert anyio.current_time() - started == pytest.approx(PROMOTION_WAIT_S)
    port.refusal = "a-0 cannot play its role"
    port.promotion_ended()  # failed: the next call is refused at once
    started = anyio.current_time()
    with pytest.raises(RefusedError, match="cannot play its role"):
        await port.list_topics()
    assert anyio.current_time() == started


async def test_a_node_not_promoting_refuses_at_once() -> None:
    port = NodePort("a-0")
    started = anyio.current_time()
    with pytest.raises(RefusedError, match="starting"):
        await port.list_topics()
    assert anyio.current_time() == started
