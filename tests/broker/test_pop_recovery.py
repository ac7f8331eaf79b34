"""Restart and crash recovery of POP state (real Broker on a real data dir)."""

import asyncio
import os
import signal
import sys
import textwrap
import time
from pathlib import Path

import pytest
from popmq.broker.contract.errors import Code
from popmq.broker.contract.types import AckEntry, GroupConfig, Message, PopRequest
from popmq.broker.testing import fast_broker_config, running_broker

REPO = Path(__file__).resolve().parents[2]


def _pop(invisible_ms: int, poll_ms: int = 0, max_messages: int = 32) -> PopRequest:
    return PopRequest(
        "g", "t", queue_id=0, max_messages=max_messages, invisible_time_ms=invisible_ms,
        poll_time_ms=poll_ms,
    )  # fmt: skip


async def test_graceful_restart_keeps_inflight_and_acks(tmp_path) -> None:
    config = fast_broker_config(tmp_path)
    async with running_broker(config) as broker:
        await broker.send([Message("t", f"m{i}".encode()) for i in range(5)], 0)
        popped = (await broker.pop(_pop(400, max_messages=3))).messages
        await broker.ack("g", "t", [AckEntry(popped[1].receipt_handle)])
        stopped_at = time.monotonic()
    async with running_broker(config) as broker:
        # never-popped messages are there at once; the in-flight ones are still invisible
        fresh = (await broker.pop(_pop(10_000))).messages
        assert [p.message.body for p in fresh] == [b"m3", b"m4"]
        stats = {s.queue_id: s for s in await broker.group_stats("g", "t")}
        assert stats[0].inflight == 4  # 0 and 2 recovered, 3 and 4 just popped
        back = []
        while len(back) < 2:
            back += (await broker.pop(_pop(10_000, poll_ms=3000))).messages
        assert time.monotonic() - stopped_at >= 0.35
        assert sorted(p.message.body for p in back) == [b"m0", b"m2"]
        assert all(p.delivery_attempt == 2 for p in back)
        # an old handle of a recovered checkpoint still acks... it was revived, so it is stale
        (stale,) = await broker.ack("g", "t", [AckEntry(popped[0].receipt_handle)])
        assert stale.code == Code.INVALID_RECEIPT_HANDLE
        await broker.ack("g", "t", [AckEntry(p.receipt_handle) for p in fresh + back])
        assert await broker.get_consumer_offset("g", "t", 0) == 5


async def test_recovered_checkpoint_acks_with_its_old_handle(tmp_path) -> None:
    config = fast_broker_config(tmp_path)
    async with running_broker(config) as broker:
        await broker.send([Message("t", b"x")], 0)
        (popped,) = (await broker.pop(_pop(10_000))).messages
    async with running_broker(config) as broker:
        (result,) = await broker.ack("g", "t", [AckEntry(popped.receipt_handle)])
        assert result.code == Code.OK
        assert await broker.get_consumer_offset("g", "t", 0) == 1


async def test_delay_messages_and_group_configs_survive_restart(tmp_path) -> None:
    config = fast_broker_config(tmp_path)
    # Due 2 s out: a loaded machine may take a good part of a second to open the broker, and
    # the first pop must still come before the message is due (it failed at 300 ms).
    due = int(time.time() * 1000) + 2000
    async with running_broker(config) as broker:
        await broker.update_group(GroupConfig("g", max_attempts=5, retry_levels=["2s"], fifo=True))
        await broker.send([Message("t", b"later", delivery_timestamp_ms=due)], 0)
        assert (await broker.pop(_pop(1000))).messages == []
    async with running_broker(config) as broker:
        group = await broker.get_group("g")
        assert (group.max_attempts, group.retry_levels, group.fifo) == (5, ["2s"], True)
        (late,) = (await broker.pop(_pop(1000, poll_ms=10_000))).messages
        assert late.message.body == b"later"
        assert time.time() * 1000 >= due


_CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from popmq.broker.contract.types import AckEntry, Message, PopRequest
    from popmq.broker.core import Broker
    from popmq.broker.testing import fast_broker_config

    async def main():
        broker = Broker(fast_broker_config(sys.argv[1]))
        await broker.start()
        await broker.send([Message("t", f"m{i}".encode()) for i in range(10)], 0)
        req = PopRequest("g", "t", queue_id=0, max_messages=4, invisible_time_ms=60_000)
        first = (await broker.pop(req)).messages
        await asyncio.sleep(0.2)  # the checkpoint spills (buffer 50 ms)
        await broker.ack("g", "t", [AckEntry(first[0].receipt_handle)])
        await asyncio.sleep(0.2)  # the consumer offset (1) is flushed
        req.max_messages = 3
        await broker.pop(req)  # offsets 4..6: checkpoint still only in memory
        print("READY", flush=True)
        await asyncio.sleep(60)

    asyncio.run(main())
    """
)


@pytest.mark.subprocess
async def test_kill_9_redelivers_unjournaled_and_keeps_journaled(tmp_path) -> None:
    data = tmp_path / "broker"
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _CHILD,
        str(data),
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO / "tests")},
    )
    try:
        assert child.stdout is not None
        line = await asyncio.wait_for(child.stdout.readline(), 20)
        assert line.strip() == b"READY"
    finally:
        child.send_signal(signal.SIGKILL)
        await child.wait()
    async with running_broker(fast_broker_config(data)) as broker:
        assert await broker.get_consumer_offset("g", "t", 0) == 1
        popped = (await broker.pop(_pop(10_000))).messages
        # 1..3 are still in flight (journaled, invisible for a minute); 4..6 were popped but
        # their checkpoint never reached the disk: delivered again (at least once); 7..9 new.
        assert [p.message.body for p in popped] == [f"m{i}".encode() for i in range(4, 10)]
        stats = {s.queue_id: s for s in await broker.group_stats("g", "t")}
        assert stats[0].inflight == 3 + 6
