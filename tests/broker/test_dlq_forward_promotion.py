"""A promotion in the middle of a forward to the DLQ (issue 19): a duplicate, never a loss.

The forward's claim (CheckpointLedger.forwarding) is the leader's memory; its DLQ copy is
written (commitlog) before the entry is journaled as settled, and a follower receives
documents before the commitlog bytes they refer to. The worst a promotion can leave is the
copy without the settlement: the state of the leader's directory right after the DLQ write.
A broker started on that state (the promoted follower) holds the DLQ copy and delivers the
message again after its invisible time: the duplicate docs/reliability.md states. Virtual
time (looptime)."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import pytest
from popmq.broker.contract.types import Message, PopRequest, PullRequest, dlq_topic
from popmq.broker.testing import fast_broker_config, running_broker

from popmq.clock import LoopClock

pytestmark = pytest.mark.looptime

GROUP, TOPIC = "g", "t"
INVISIBLE_MS = 8_000


async def test_a_promotion_between_the_dlq_copy_and_the_settlement_duplicates_not_loses(
    tmp_path: Path,
) -> None:
    leader_dir, promoted_dir = tmp_path / "leader", tmp_path / "promoted"
    async with running_broker(fast_broker_config(leader_dir), LoopClock()) as leader:
        await leader.send([Message(TOPIC, b"poison")], 0)
        request = PopRequest(GROUP, TOPIC, max_messages=8, invisible_time_ms=INVISIBLE_MS)
        (popped,) = (await leader.pop(request)).messages
        await asyncio.sleep(1)  # past the checkpoint buffer: the pop is journaled
        service = leader.revive_service
        real = service._append_system

        async def copied_after(topic: str, queue_id: int, messages: list[Message]) -> Any:
            result = await real(topic, queue_id, messages)
            # the most a follower can hold here: the copy, not yet the settlement
            shutil.copytree(leader_dir, promoted_dir, ignore=shutil.ignore_patterns("LOCK"))
            return result

        service._append_system = copied_after
        await leader.forward_to_dlq(GROUP, TOPIC, popped.receipt_handle)

    async with running_broker(fast_broker_config(promoted_dir), LoopClock()) as promoted:
        dlq = await promoted.pull(PullRequest(dlq_topic(GROUP), 0, 0))
        assert [m.body for m in dlq.messages] == [b"poison"]  # the copy: nothing lost
        assert (await promoted.pop(request)).messages == []  # still in flight
        again: list[bytes] = []
        for _ in range(20):  # after its invisible time (and the retry back-off)
            await asyncio.sleep(INVISIBLE_MS / 1000 / 4)
            again += [m.message.body for m in (await promoted.pop(request)).messages]
            if again:
                break
        assert again == [b"poison"]  # the documented duplicate: in the DLQ and delivered
