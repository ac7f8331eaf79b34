"""`popmq bench e2e`'s stall check (cluster modes): messages a broker popped that no consumer
got are counted within seconds, not found only as a run 60 s too slow (virtual time)."""

from __future__ import annotations

import asyncio

import pytest
from popmq.broker.contract.types import GroupQueueStats

from popmq.bench.e2e import STALL_QUIET_S, _Progress, _stall_check, format_table

pytestmark = pytest.mark.looptime


class _Broker:
    def __init__(self, inflight: int) -> None:
        self.inflight = inflight

    async def group_stats(self, group: str, topic: str) -> list[GroupQueueStats]:
        return [
            GroupQueueStats(topic, 0, 0, 100, self.inflight),
            GroupQueueStats(topic, 1, 0, 0, 0),
        ]


async def _checked(progress: _Progress, brokers: list[_Broker], seconds: float) -> None:
    check = asyncio.ensure_future(_stall_check(brokers, "t", progress))
    await asyncio.sleep(seconds)
    check.cancel()
    with pytest.raises(asyncio.CancelledError):
        await check


async def test_popped_messages_no_consumer_holds_are_counted_once_the_run_stalls() -> None:
    progress = _Progress(target=100, sent=100, acked=60)
    progress.holding, progress.dropped = 2, 3  # an ack on its way; a receive timed out
    await _checked(progress, [_Broker(30), _Broker(10)], STALL_QUIET_S - 0.5)
    assert progress.undelivered == 0  # not quiet long enough yet
    await _checked(progress, [_Broker(30), _Broker(10)], STALL_QUIET_S * 2)
    assert progress.undelivered == 40 - 2 - 3


async def test_a_run_that_acks_or_still_sends_is_not_stalled() -> None:
    progress = _Progress(target=100, sent=50, acked=10)  # still sending
    await _checked(progress, [_Broker(30)], STALL_QUIET_S * 3)
    assert progress.undelivered == 0
    progress.sent = 100
    check = asyncio.ensure_future(_stall_check([_Broker(30)], "t", progress))
    for _ in range(10):  # acks keep coming
        await asyncio.sleep(STALL_QUIET_S / 2)
        progress.acked += 1
    check.cancel()
    with pytest.raises(asyncio.CancelledError):
        await check
    assert progress.undelivered == 0


def test_the_table_says_how_many_were_popped_and_not_delivered() -> None:
    figures = {"msgs_per_s": 1, "send_msgs_per_s": 1, "latency_p50_ms": 1, "latency_p99_ms": 1,
               "receives": 1, "empty_receives": 0, "cpu_s_load_generator": 0, "cpu_s_server": 0,
               "server_cpu_us_per_msg": 0, "proxy_cpu_us_per_msg": 0, "brokers_cpu_us_per_msg": 0,
               "undelivered": 32}  # fmt: skip
    params = {"messages": 1, "body_bytes": 1, "producers": 1, "send_batch": 1, "consumers": 1,
              "receive_batch": 1, "brokers": 1, "queues": 1, "strategy": "pop"}  # fmt: skip
    table = format_table({"params": params, "results": {"cluster": figures}})
    assert "popped but not delivered: cluster 32" in table
