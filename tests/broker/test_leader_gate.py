"""LeaderGatedPort: a group node serves only while it is the fenced leader (fake member and
port; elections against a real etcd are in tests/coord)."""

from __future__ import annotations

from typing import Any

import pytest
from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.types import Message, PopRequest, PopResult, PopStatus, SendResult
from popmq.broker.leader_gate import LeaderGatedPort

from popmq.config import ReplicationConfig
from popmq.coord.group import NO_LEADER, GroupRole, MemberSettings


class FakeMember:
    def __init__(self) -> None:
        self.settings = MemberSettings("ga", "ga-0", "h:1")
        self.role = GroupRole(7, "ga-0", "h:1", True)
        self.in_sync = ["ga-0"]
        self.holds = True

    def may_write(self) -> bool:
        return self.role.is_leader and self.holds


class FakePort:
    name = "ga"

    def __init__(self, member: FakeMember) -> None:
        self.member = member
        self.sent = 0
        self.fence_while_writing = False

    async def send(self, messages: list[Message], queue_id: int = -1) -> list[SendResult]:
        self.sent += len(messages)
        if self.fence_while_writing:
            self.member.holds = False  # the lease deadline passed during the write
        return [SendResult("id", "t", 0, 0, "ga") for _ in messages]

    async def pop(self, request: PopRequest) -> PopResult:
        return PopResult(PopStatus.NO_MESSAGE)


def gate(min_in_sync: int = 1, replication: str = "sync") -> tuple[LeaderGatedPort, Any, Any]:
    member = FakeMember()
    port = FakePort(member)
    config = ReplicationConfig(min_in_sync=min_in_sync, mode=replication)  # type: ignore[arg-type]
    gated = LeaderGatedPort(port, config)  # type: ignore[arg-type]
    gated.member = member  # type: ignore[assignment]
    return gated, member, port


async def refused(call: Any) -> RefusedError:
    with pytest.raises(RefusedError) as error:
        await call
    assert error.value.code == Code.HA_NOT_AVAILABLE
    return error.value


async def test_the_leader_serves() -> None:
    gated, _, port = gate()
    assert len(await gated.send([Message("t", b"x")])) == 1 and port.sent == 1


async def test_before_joining_and_as_follower_everything_is_refused() -> None:
    gated, member, port = gate()
    gated.member = None
    assert "not joined" in (await refused(gated.pop(PopRequest("g", "t")))).message
    gated.member = member
    member.role = GroupRole(9, "ga-1", "h:2", False)
    error = await refused(gated.send([Message("t", b"x")]))
    assert "follower; the leader is ga-1 (epoch 9)" in error.message
    member.role = NO_LEADER
    assert "no leader" in (await refused(gated.pop(PopRequest("g", "t")))).message
    assert port.sent == 0


async def test_a_leader_past_its_lease_deadline_is_fenced() -> None:
    gated, member, _ = gate()
    member.holds = False
    assert "fenced" in (await refused(gated.send([Message("t", b"x")]))).message


async def test_a_write_that_outlives_the_lease_is_not_acknowledged() -> None:
    gated, _, port = gate()
    port.fence_while_writing = True
    await refused(gated.send([Message("t", b"x")]))
    assert port.sent == 1  # written locally, never acknowledged: a retry duplicates, not loses


async def test_sync_sends_need_min_in_sync_nodes() -> None:
    gated, member, port = gate(min_in_sync=2)
    error = await refused(gated.send([Message("t", b"x")]))
    assert "fewer than min_in_sync 2" in error.message and port.sent == 0
    await gated.pop(PopRequest("g", "t"))  # consuming is not a send
    member.in_sync = ["ga-0", "ga-1"]
    assert len(await gated.send([Message("t", b"x")])) == 1
    relaxed, _, _ = gate(min_in_sync=2, replication="async")
    assert len(await relaxed.send([Message("t", b"x")])) == 1
