"""A replicated pop whose sync barrier fails hands its messages back at once (virtual time)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.types import Message, PopRequest
from popmq.broker.local import LocalBrokerPort
from popmq.broker.replication.epochs import EpochHistory
from popmq.broker.replication.leader import ReplicationLeader
from popmq.broker.replication.port import Leading, NodePort
from popmq.broker.replication.role import GroupRole, StaticRoleSource
from popmq.broker.store import changes
from popmq.broker.testing import fast_broker_config, running_broker

from popmq.clock import LoopClock
from popmq.config import ReplicationConfig

pytestmark = pytest.mark.looptime

ROLE = GroupRole(epoch=1, leader_name="broker-a", leader_address="127.0.0.1:1", is_leader=True)
POP = PopRequest(group="G", topic="T", max_messages=8, invisible_time_ms=60_000)


async def test_a_pop_whose_barrier_times_out_hands_its_messages_back_at_once(
    tmp_path: Path,
) -> None:
    """Without the hand-back, the popped messages stayed invisible for the pop's whole
    invisible time (60 s here) though no consumer ever received them."""
    config = fast_broker_config(tmp_path / "a0")
    settings = ReplicationConfig(mode="sync", min_in_sync=2, sync_timeout_ms=2_000)
    loop = asyncio.get_running_loop()
    async with running_broker(config, LoopClock()) as broker:
        local = LocalBrokerPort(broker)
        await local.create_topic("T", 1)
        await local.send([Message(topic="T", body=b"one"), Message(topic="T", body=b"two")])
        leader = ReplicationLeader(
            tmp_path / "a0", "a0", ROLE, StaticRoleSource(ROLE), settings,
            EpochHistory(tmp_path / "a0"), clock=LoopClock(),
        )  # fmt: skip
        async with leader:
            node = NodePort("broker-a")
            node.leading = Leading(broker, local, leader)
            leader.in_sync.connected("a1")  # in sync once, then silent
            await leader.acknowledged("a1", changes.newest(), loop.time(), True, 0)
            await leader.reevaluate()
            with pytest.raises(RefusedError) as refused:
                await node.pop(POP)
            assert refused.value.code == Code.SLAVE_PERSISTENCE_TIMEOUT
            again = await local.pop(POP)  # 2 s later, 58 s before their invisible time
            assert sorted(m.message.body for m in again.messages) == [b"one", b"two"]
            # Never received by anyone: no delivery attempt was counted.
            assert [m.delivery_attempt for m in again.messages] == [1, 1]


async def test_a_cancelled_replicated_pop_hands_its_messages_back(tmp_path: Path) -> None:
    """A caller that gives up during the barrier (the proxy's deadline) loses nothing."""
    config = fast_broker_config(tmp_path / "a0")
    settings = ReplicationConfig(mode="sync", min_in_sync=2)
    loop = asyncio.get_running_loop()
    async with running_broker(config, LoopClock()) as broker:
        local = LocalBrokerPort(broker)
        await local.create_topic("T", 1)
        await local.send([Message(topic="T", body=b"one")])
        leader = ReplicationLeader(
            tmp_path / "a0", "a0", ROLE, StaticRoleSource(ROLE), settings,
            EpochHistory(tmp_path / "a0"), clock=LoopClock(),
        )  # fmt: skip
        async with leader:
            node = NodePort("broker-a")
            node.leading = Leading(broker, local, leader)
            leader.in_sync.connected("a1")
            await leader.acknowledged("a1", changes.newest(), loop.time(), True, 0)
            await leader.reevaluate()
            pop = asyncio.ensure_future(node.pop(POP))
            await asyncio.sleep(0.5)
            assert not pop.done()  # waiting for a1's next batch
            pop.cancel()
            with pytest.raises(asyncio.CancelledError):
                await pop
            again = await local.pop(POP)
            assert [m.message.body for m in again.messages] == [b"one"]


async def test_a_proxys_hand_back_reaches_the_journal_and_answers_past_a_failed_barrier(
    tmp_path: Path,
) -> None:
    """The proxy hands back what its long poll could not deliver: the entry's new state is in
    the pop journal (what followers copy and a promoted node replays), and the messages are
    visible on the leader at once even when the barrier then times out (no error: the
    release did happen)."""
    config = fast_broker_config(tmp_path / "a0")
    settings = ReplicationConfig(mode="sync", min_in_sync=2, sync_timeout_ms=2_000)
    async with running_broker(config, LoopClock()) as broker:
        local = LocalBrokerPort(broker)
        await local.create_topic("T", 1)
        await local.send([Message(topic="T", body=b"one")])
        leader = ReplicationLeader(
            tmp_path / "a0", "a0", ROLE, StaticRoleSource(ROLE), settings,
            EpochHistory(tmp_path / "a0"), clock=LoopClock(),
        )  # fmt: skip
        async with leader:
            node = NodePort("broker-a")
            node.leading = Leading(broker, local, leader)
            popped = (await local.pop(POP)).messages  # answered; its client then left
            handles = [m.receipt_handle for m in popped]
            await leader.reevaluate()
            leader.in_sync.connected("a1")  # in sync once, then silent: the barrier fails
            loop = asyncio.get_running_loop()
            await leader.acknowledged("a1", changes.newest(), loop.time(), True, 0)
            await leader.reevaluate()
            started = loop.time()
            assert await node.hand_back("G", "T", handles) == 1
            assert loop.time() - started >= 2  # it waited out the barrier's sync timeout
            journal = (tmp_path / "a0" / "pop" / "journal.log").read_bytes()
            assert b'"s":6' in journal  # HANDED_BACK
            again = (await local.pop(POP)).messages
            assert [(m.message.body, m.delivery_attempt) for m in again] == [(b"one", 1)]
