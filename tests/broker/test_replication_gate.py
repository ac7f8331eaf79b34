"""The node's ReplicationService gate: a follower that dials a newly elected node before it has
opened its broker waits for it to lead (it used to be refused at once and back off 0.5 s or
more, which lengthened every failover); a node that does not come to lead still refuses."""

from __future__ import annotations

from typing import Any, cast

import anyio
import grpc
import pytest
from popmq.broker.replication.leader import ReplicationLeader
from popmq.broker.replication.node import ReplicationGate

pytestmark = pytest.mark.looptime


class Aborted(Exception):
    pass


class FakeContext:
    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise Aborted(f"{code.name}: {details}")


class FakeLeader:
    def __init__(self) -> None:
        self.streams = 0

    async def Replicate(self, request_iterator: Any, context: Any) -> None:
        self.streams += 1


async def test_a_stream_waits_for_the_node_to_start_leading() -> None:
    gate = ReplicationGate(leader_wait_s=2.0)
    leader = FakeLeader()

    async def lead_soon() -> None:
        await anyio.sleep(0.3)  # the new leader opens its broker
        gate.leader = cast(ReplicationLeader, leader)

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(lead_soon)
        started = anyio.current_time()
        await gate.Replicate(cast(Any, iter(())), FakeContext())
        assert leader.streams == 1
        assert anyio.current_time() - started == pytest.approx(0.3)


async def test_a_node_that_does_not_lead_refuses_after_the_wait() -> None:
    gate = ReplicationGate(leader_wait_s=2.0)
    started = anyio.current_time()
    with pytest.raises(Aborted, match="UNAVAILABLE: this node is not the leader"):
        await gate.Replicate(cast(Any, iter(())), FakeContext())
    assert anyio.current_time() - started == pytest.approx(2.0)
    gate.leader = cast(ReplicationLeader, FakeLeader())
    gate.leader = None  # stopped leading: waits again
    with pytest.raises(Aborted):
        await gate.Replicate(cast(Any, iter(())), FakeContext())
