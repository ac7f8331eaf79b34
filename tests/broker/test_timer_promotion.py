"""A promotion right after the timer moved a POP retry (issue 19's unexplained duplicates).

A message whose ack failed or never came is revived: a copy goes to the timer topic, and once
its back-off ends the timer moves it into the group's retry topic and commits its progress, a
consumer offset. Consumer offsets travel to the followers in consumer_offsets.json, which the
store's flush used to write up to ``store.flush_interval_ms`` (500 ms by default) later. A
follower promoted in that window held the retry copy but not the progress: its timer moved
the entry again, two retry copies were delivered and each acked (the duplicates seen after
failovers: `tests/chaos` run 6, `bench failover` run D). The timer now writes its progress
before ``deliver_due`` returns; the directory at that instant (what a follower copies) is
what a promoted node starts on here. Virtual time (looptime)."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import pytest
from popmq.broker.contract.types import AckEntry, Message, PopRequest
from popmq.broker.core import Broker
from popmq.broker.testing import fast_broker_config, running_broker

from popmq.clock import LoopClock
from popmq.config import BrokerConfig

pytestmark = pytest.mark.looptime

GROUP, TOPIC = "g", "t"
INVISIBLE_MS = 2_000


def _config(data_dir: Path) -> BrokerConfig:
    config = fast_broker_config(data_dir)
    # The production default: the window this test is about is one flush interval.
    return config.model_copy(
        update={"store": config.store.model_copy(update={"flush_interval_ms": 500})}
    )


async def _deliveries(broker: Broker, expected: int, rounds: int = 10) -> list[tuple[bytes, int]]:
    """(body, attempt) of every delivery (a pop of a topic reads its retry topic too), each
    acked as a consumer does: until ``expected`` came, then ``rounds`` more pops for any
    second copy. The store's and timer's threads take real time while the loop's is
    virtual: a fixed number of virtual rounds could end before a loaded machine moved the
    retries, so the first part waits for them (bounded)."""
    seen: list[tuple[bytes, int]] = []
    request = PopRequest(GROUP, TOPIC, max_messages=8, invisible_time_ms=60_000)
    extra = 0
    for _ in range(600):
        for popped in (await broker.pop(request)).messages:
            seen.append((bytes(popped.message.body), popped.delivery_attempt))
            await broker.ack(GROUP, TOPIC, [AckEntry(popped.receipt_handle)])
        if len(seen) >= expected:
            extra += 1
            if extra > rounds:
                break
        await asyncio.sleep(0.2)
    return seen


async def test_a_promotion_right_after_a_retry_moved_delivers_it_once(tmp_path: Path) -> None:
    leader_dir, promoted_dir = tmp_path / "leader", tmp_path / "promoted"
    async with running_broker(_config(leader_dir), LoopClock()) as leader:
        await leader.send([Message(TOPIC, b"unacked")], 0)
        request = PopRequest(GROUP, TOPIC, max_messages=8, invisible_time_ms=INVISIBLE_MS)
        assert len((await leader.pop(request)).messages) == 1  # its ack never comes
        timer = leader.timer
        real = timer.deliver_due
        copied = False

        async def copied_after(limit: int = 1024) -> int:
            nonlocal copied
            moved = await real(limit)
            if moved and not copied:
                # the earliest a follower can hold the retry copy: what the directory says now
                shutil.copytree(leader_dir, promoted_dir, ignore=shutil.ignore_patterns("LOCK"))
                copied = True
            return moved

        timer.deliver_due = copied_after  # type: ignore[method-assign]
        for _ in range(100):  # past the invisible time, the revive and the retry back-off
            await asyncio.sleep(0.1)
            if copied:
                break
        assert copied

    async with running_broker(fast_broker_config(promoted_dir), LoopClock()) as promoted:
        seen = await _deliveries(promoted, expected=1)
    assert seen == [(b"unacked", 2)]  # its retry, once


async def test_a_promotion_during_a_revive_pass_revives_only_the_one_being_revived(
    tmp_path: Path,
) -> None:
    """A revive writes a checkpoint's copies (to the timer) before it journals the entries as
    revived. Two checkpoints due in one pass: a follower that copies while the second one's
    copies are written must hold the first one's settlement (it used to wait in the journal's
    buffer until the pass ended: promoted there, the first message was revived twice)."""
    leader_dir, promoted_dir = tmp_path / "leader", tmp_path / "promoted"
    async with running_broker(_config(leader_dir), LoopClock()) as leader:
        await leader.send([Message(TOPIC, b"first"), Message(TOPIC, b"second")], 0)
        request = PopRequest(GROUP, TOPIC, max_messages=1, invisible_time_ms=INVISIBLE_MS)
        for _ in range(2):  # two checkpoints with the same deadline: one revive pass
            assert len((await leader.pop(request)).messages) == 1
        timer = leader.timer
        real = timer.schedule
        calls = 0

        async def copied_before_the_second(entries: list[tuple[Message, str, int]]) -> Any:
            nonlocal calls
            calls += 1
            if calls == 2:  # the first checkpoint revived, the second one's copy not written
                shutil.copytree(leader_dir, promoted_dir, ignore=shutil.ignore_patterns("LOCK"))
            return await real(entries)

        timer.schedule = copied_before_the_second  # type: ignore[method-assign]
        for _ in range(100):
            await asyncio.sleep(0.1)
            if calls >= 2:
                break
        assert calls >= 2

    async with running_broker(fast_broker_config(promoted_dir), LoopClock()) as promoted:
        seen = await _deliveries(promoted, expected=2)
    assert sorted(seen) == [(b"first", 2), (b"second", 2)]  # each retry, once
