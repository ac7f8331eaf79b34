"""The hung-consumer run of `popmq bench scale`.

C consumers share a pre-filled backlog. Consumer 0 receives one batch and then hangs: it never
acks and never receives again. The other C-1 start right after it got its batch and work the
backlog (receive, process, ack). POP binds no queue to a consumer, so the others are not
blocked; the hung batch becomes visible again when its invisible time ends, goes through
revive to the group's retry topic (first backoff level x pop.time_scale), and is delivered to
the others. Measured: when each hung message reached another consumer, that nothing was lost,
and the others' throughput while the hung batch was invisible.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from dataclasses import asdict, dataclass
from typing import Any

from popmq.bench.scale_kit import (
    LoopSettings,
    Server,
    Tally,
    clients,
    fill,
    pop_consumer,
    run_until,
)
from popmq.client.aio import AsyncClient
from popmq.client.model import QueueRef

TOPIC = "bench-scale-hang"
HUNG = 0  # the index of the hung consumer
FIRST_RETRY_LEVEL_MS = 1_000  # RocketMQ's first delay level ("1s"), before time_scale


@dataclass(frozen=True, slots=True)
class HangParams:
    consumers: int
    messages: int
    invisible_ms: int
    process_ms: float
    batch: int
    body_bytes: int
    queues: int  # per broker
    time_scale: float
    channels: int
    revive_scan_ms: int
    long_polling_ms: int

    @property
    def expected_redelivery_s(self) -> float:
        """The invisible time plus the first retry backoff (revive scans add up to one
        scan interval on top)."""
        return (self.invisible_ms + FIRST_RETRY_LEVEL_MS * self.time_scale) / 1000


@dataclass
class _Hang:
    asked: float = 0.0
    received: float = 0.0
    message_ids: tuple[str, ...] = ()


async def _hang_once(
    client: AsyncClient, route: list[QueueRef], loop: LoopSettings, tally: Tally, hang: _Hang
) -> None:
    """Receive until a batch comes, then keep it and do nothing more."""
    while not hang.message_ids:
        asked = time.perf_counter()
        messages = await client.receive(
            loop.group, route[0], loop.batch, loop.invisible_ms, loop.long_polling_ms
        )
        hang.asked = asked
        hang.received = tally.received(HUNG, messages)
        hang.message_ids = tuple(m.message_id for m in messages)


def _rate(tally: Tally, since: float, until: float) -> float:
    acked = sum(n for at, consumer, n in tally.ack_log if since <= at < until and consumer != HUNG)
    return acked / (until - since) if until > since else 0.0


async def run_hang(server: Server, p: HangParams) -> dict[str, Any]:
    if p.consumers < 2:
        raise ValueError("the hung-consumer run needs at least 2 consumers")
    loop = LoopSettings(
        topic=TOPIC, group=f"{TOPIC}-group", batch=p.batch, process_ms=p.process_ms,
        invisible_ms=p.invisible_ms, long_polling_ms=p.long_polling_ms,
    )  # fmt: skip
    await server.create_topic(TOPIC, p.queues)
    hang = _Hang()
    async with clients(server.endpoint, min(p.consumers, p.channels)) as pool:
        ids = await fill(pool[0], TOPIC, p.messages, p.body_bytes)
        route = await pool[0].query_route(TOPIC)
        tally = Tally(p.consumers, set(ids))
        await _hang_once(pool[0], route, loop, tally, hang)
        others: list[Coroutine[Any, Any, object]] = [
            pop_consumer(i, pool[i % len(pool)], route, loop, tally) for i in range(1, p.consumers)
        ]
        others.append(asyncio.Event().wait())  # the hung consumer, holding its batch
        backlog_s = p.messages * p.process_ms / 1000 / (p.consumers - 1)
        limit_s = p.expected_redelivery_s + backlog_s * 3 + 30
        _, finished = await run_until(others, tally.all_acked, limit_s)
    return _summary(p, tally, hang, finished)


def _summary(p: HangParams, tally: Tally, hang: _Hang, finished: bool) -> dict[str, Any]:
    hung_ids = set(hang.message_ids)
    since_received: list[float] = []
    since_asked: list[float] = []
    attempts: set[int] = set()
    taken_by: set[int] = set()
    for message_id in hung_ids:
        later = [r for r in tally.receipts.get(message_id, []) if r[0] != HUNG]
        if later:
            consumer, at, attempt = min(later, key=lambda r: r[1])
            since_received.append(at - hang.received)
            since_asked.append(at - hang.asked)
            attempts.add(attempt)
            taken_by.add(consumer)
    others_dup = sum(len(seen) - 1 for mid, seen in tally.receipts.items() if mid not in hung_ids)
    hung_dup = sum(max(0, len(tally.receipts.get(mid, [])) - 2) for mid in hung_ids)
    window_end = hang.received + p.invisible_ms / 1000
    end = tally.ack_log[-1][0] if tally.ack_log else hang.received
    first_redelivery = hang.received + min(since_received, default=end - hang.received)
    acked_before = sum(n for at, _, n in tally.ack_log if at < first_redelivery)
    return {
        "params": asdict(p),
        "expected_redelivery_s": round(p.expected_redelivery_s, 3),
        "hung_messages": len(hung_ids),
        "redelivered": len(since_received),
        "all_redelivered": len(since_received) == len(hung_ids) > 0,
        "redelivered_after_s": {  # from the hung consumer's receipt of the batch
            "min": round(min(since_received, default=0.0), 3),
            "max": round(max(since_received, default=0.0), 3),
        },
        "first_redelivery_since_asked_s": round(min(since_asked, default=0.0), 3),
        "redelivery_attempts": sorted(attempts),
        "redelivered_to": sorted(taken_by),
        "finished": finished,
        "acked": tally.acked_count,
        "lost": tally.lost,
        "duplicates_other": others_dup,
        "duplicates_hung_extra": hung_dup,
        "ack_failures": tally.ack_failures,
        # The others while the hung batch was invisible, and over the whole run.
        "others_msgs_per_s_during_hang": round(_rate(tally, hang.received, window_end), 1),
        "others_msgs_per_s_overall": round(_rate(tally, hang.received, end), 1),
        "others_ideal_msgs_per_s": round((p.consumers - 1) * 1000 / p.process_ms, 1),
        # > 0: the others were still working the backlog when the hung batch came back.
        "backlog_left_at_first_redelivery": len(tally.expected) - len(hung_ids) - acked_before,
        "run_s": round(end - hang.received, 3),
    }


def format_hang(h: dict[str, Any]) -> list[str]:
    p = h["params"]
    after = h["redelivered_after_s"]
    lines = [
        f"hung consumer: {p['consumers']} consumers, backlog {p['messages']} messages, "
        f"{p['process_ms']} ms of work each, invisible time {p['invisible_ms']} ms, "
        f"pop.time_scale {p['time_scale']} (first retry backoff "
        f"{FIRST_RETRY_LEVEL_MS * p['time_scale']:.0f} ms), revive scan {p['revive_scan_ms']} ms",
        "",
    ]
    rows = [
        ["hung batch", f"{h['hung_messages']} messages, held by consumer {HUNG} without ack"],
        ["redelivered to others", f"{h['redelivered']} of {h['hung_messages']} "
         f"(to consumers {h['redelivered_to']}, delivery attempt {h['redelivery_attempts']})"],
        ["redelivered after", f"{after['min']:.3f}-{after['max']:.3f} s "
         f"(expected ~{h['expected_redelivery_s']:.2f} s = invisible + first backoff)"],
        ["lost", f"{h['lost']} of {p['messages']} (acked {h['acked']})"],
        ["duplicates", f"{h['duplicates_other']} outside the hung batch, "
         f"{h['duplicates_hung_extra']} beyond one redelivery"],
        ["others msg/s during hang", f"{h['others_msgs_per_s_during_hang']:.0f} "
         f"(ideal {h['others_ideal_msgs_per_s']:.0f}; over the run "
         f"{h['others_msgs_per_s_overall']:.0f}); backlog left at the first redelivery "
         f"{h['backlog_left_at_first_redelivery']}"],
    ]  # fmt: skip
    width = max(len(label) for label, _ in rows)
    lines += [f"{label.rjust(width)}  {value}" for label, value in rows]
    return lines
