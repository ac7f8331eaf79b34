"""`popmq bench scale` on a tiny scale, against a real `popmq serve`: POP shares 2 queues among
8 consumers with every message delivered once, queue-bound consumers stop at 2, and a hung
consumer's batch reaches the others after its invisible time."""

from __future__ import annotations

import json

import pytest

from popmq.bench.scale import bench_scale, format_table

pytestmark = pytest.mark.subprocess  # starts popmq or another process

QUEUES = 2  # 2 brokers x 1 queue
PROCESS_MS = 5.0
INVISIBLE_MS = 1_000
# Redelivery comes after invisible + first backoff (100 ms at time_scale 0.1) + a revive scan
# (200 ms) + the retry topic's turn in a pop; the rest is room for a loaded 2-core CI machine
# (each of those steps runs late there). A message never redelivered fails all_redelivered.
REDELIVERY_BOUND_S = INVISIBLE_MS / 1000 + 4.0


async def test_bench_scale_smoke() -> None:
    result = await bench_scale(
        consumers=(2, 8), brokers=2, queues=1, process_ms=PROCESS_MS, per_consumer=48,
        batch=8, body_bytes=128, hang_consumers=3, hang_messages=200,
        invisible_ms=INVISIBLE_MS, time_scale=0.1,
    )  # fmt: skip
    json.dumps(result)  # the CLI writes it with --json
    steps = {(s["kind"], s["consumers"]): s for s in result["scale"]}

    for count in (2, 8):
        pop = steps[("pop", count)]
        assert pop["queues"] == QUEUES
        assert pop["finished"] and pop["acked"] == pop["messages"] == 48 * count
        assert sum(pop["acked_per_consumer"]) == pop["messages"]
        assert pop["duplicates"] == 0 and pop["lost"] == 0 and pop["ack_failures"] == 0
    # Past the queue count every POP consumer still gets work; queue-bound ones stop at Q.
    assert steps[("pop", 8)]["active_consumers"] == 8
    assert steps[("queue-bound", 8)]["active_consumers"] == QUEUES
    queue_cap = QUEUES * 1000 / PROCESS_MS  # one worker per queue, PROCESS_MS per message
    assert steps[("queue-bound", 8)]["msgs_per_s"] <= queue_cap * 1.05
    assert steps[("pop", 8)]["msgs_per_s"] > steps[("queue-bound", 8)]["msgs_per_s"]

    hang = result["hang"]
    assert hang["hung_messages"] > 0 and hang["all_redelivered"]
    assert 0 not in hang["redelivered_to"]  # the hung consumer is consumer 0
    assert hang["redelivery_attempts"] == [2]
    assert hang["finished"] and hang["lost"] == 0 and hang["acked"] == 200
    assert hang["duplicates_other"] == 0 and hang["duplicates_hung_extra"] == 0
    # Not before the invisible time (counted from when the hung consumer asked), and soon after.
    assert hang["first_redelivery_since_asked_s"] >= INVISIBLE_MS / 1000
    assert hang["redelivered_after_s"]["max"] <= REDELIVERY_BOUND_S
    assert hang["others_msgs_per_s_during_hang"] > 0  # the others were not blocked

    table = format_table(result)
    assert "queue-bound msg/s" in table and "redelivered after" in table
