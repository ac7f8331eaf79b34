"""`popmq bench scale`: throughput as consumers grow past the queue count, and a hung consumer.

Scale past queues: one topic with Q queues in total (B brokers x q queues), C consumers for
each C in a list, each message costing a fixed simulated processing time before its ack. Each
step gets a fresh topic holding a pre-filled backlog of ``per_consumer * C`` messages, so every
step is the same work per consumer. Two consumer kinds run side by side:

- ``pop``: SimpleConsumer loops (receive a batch through the proxy, process, ack). Any consumer
  may pop any queue, so throughput keeps growing with C past Q.
- ``queue-bound``: the Push-consumer model (rebalance gives each queue to one consumer, which
  pulls it by offset and commits). Consumers past Q get no queue, so throughput stops at Q
  consumers' worth. Runs stop at a time limit when the backlog would take much longer.

Hung consumer: see popmq.bench.hung.

Both go through a real ``popmq serve`` process over gRPC (popmq.client.AsyncClient), as a
RocketMQ client would; the load generator shares the machine's cores with it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

from popmq.bench import progress as live
from popmq.bench.brokers import process_cpu_s
from popmq.bench.hung import HangParams, format_hang, run_hang
from popmq.bench.scale_kit import (
    LoopSettings,
    Server,
    Tally,
    allocate_averagely,
    clients,
    fill,
    pop_consumer,
    queue_bound_consumer,
    run_until,
    serve,
)
from popmq.bench.table_text import grid

KINDS = ("pop", "queue-bound")
SCENARIOS = ("scale", "hang")
SCALE_INVISIBLE_MS = 60_000  # long enough that nothing comes back during a step
LONG_POLLING_MS = 2_000


def server_settings(
    queues: int, strategy: str, invisible_ms: int, time_scale: float
) -> dict[str, Any]:
    """--set flags of the `popmq serve` both scenarios share (shown in the output)."""
    return {
        "broker.topics.queue_count": queues,
        "proxy.strategy": strategy,
        "proxy.min_long_polling_ms": 1_000,
        # The hung-consumer run asks a short invisible time: both layers must allow it.
        "proxy.min_invisible_ms": min(invisible_ms, 1_000),
        "broker.pop.min_invisible_ms": min(invisible_ms, 1_000),
        # Retry backoff levels scaled: the first redelivery waits 1 s x time_scale.
        "broker.pop.time_scale": time_scale,
        "proxy.false_empty_probe": False,  # measurement RPCs would count against throughput
    }


async def _scale_step(
    server: Server, kind: str, consumers: int, params: dict[str, Any]
) -> dict[str, Any]:
    topic = f"bench-scale-{kind}-c{consumers}"
    loop = LoopSettings(
        topic=topic, group=f"{topic}-group", batch=params["batch"],
        process_ms=params["process_ms"], invisible_ms=SCALE_INVISIBLE_MS,
        long_polling_ms=LONG_POLLING_MS,
    )  # fmt: skip
    await server.create_topic(topic, params["queues"])
    messages = params["per_consumer"] * consumers
    ideal_s = params["per_consumer"] * params["process_ms"] / 1000  # every consumer busy
    async with clients(server.endpoint, min(consumers, params["channels"])) as pool:
        ids = await fill(pool[0], topic, messages, params["body_bytes"])
        route = await pool[0].query_route(topic)
        tally = Tally(consumers, set(ids))
        if kind == "pop":
            loops = [pop_consumer(i, pool[i % len(pool)], route, loop, tally)
                     for i in range(consumers)]  # fmt: skip
            limit_s = ideal_s * 4 + 30
        else:
            loops = [
                queue_bound_consumer(
                    i, pool[i % len(pool)], allocate_averagely(route, consumers, i), loop, tally
                )
                for i in range(consumers)
            ]
            # Past Q consumers the backlog takes C/Q times longer: measure a window instead.
            limit_s = ideal_s * 2 + 1
        cpu_before = (time.process_time(), process_cpu_s(server.local.pid))
        elapsed_s, finished = await run_until(loops, tally.all_acked, limit_s)
        cpu_gen = time.process_time() - cpu_before[0]
        cpu_server = process_cpu_s(server.local.pid) - cpu_before[1]
    fair = tally.acked_count / consumers
    shares = [n / fair for n in tally.acked_by] if fair else [0.0]
    return {
        "kind": kind,
        "consumers": consumers,
        "queues": len(route),
        "messages": messages,
        "acked": tally.acked_count,
        "finished": finished,
        "elapsed_s": round(elapsed_s, 3),
        "msgs_per_s": round(tally.acked_count / elapsed_s, 1) if elapsed_s else 0.0,
        # Every consumer processing back to back, nothing else in the way.
        "ideal_msgs_per_s": round(consumers * 1000 / params["process_ms"], 1),
        "active_consumers": sum(1 for n in tally.acked_by if n),
        "share_min": round(min(shares), 2),
        "share_max": round(max(shares), 2),
        "duplicates": tally.duplicates,
        "lost": tally.lost if finished else None,
        "ack_failures": tally.ack_failures,
        "receives": tally.receives,
        "empty_receives": tally.empty_receives,
        "acked_per_consumer": tally.acked_by,
        "cpu_s_server": round(cpu_server, 2),
        "cpu_s_load_generator": round(cpu_gen, 2),
        # Of ONE core: the server runs one event loop, so near 100 it is the limit.
        "server_cpu_percent": round(100 * cpu_server / elapsed_s) if elapsed_s else 0,
        "load_generator_cpu_percent": round(100 * cpu_gen / elapsed_s) if elapsed_s else 0,
    }


async def bench_scale(
    consumers: Sequence[int] = (1, 2, 4, 8, 16, 32),
    brokers: int = 2,
    queues: int = 2,
    process_ms: float = 5.0,
    per_consumer: int = 256,
    batch: int = 16,
    body_bytes: int = 1024,
    kinds: Sequence[str] = KINDS,
    strategy: str = "adaptive",
    channels: int = 4,
    scenarios: Sequence[str] = SCENARIOS,
    hang_consumers: int = 4,
    hang_messages: int = 2_000,
    invisible_ms: int = 2_000,
    time_scale: float = 0.1,
) -> dict[str, Any]:
    """Run the scenarios against one `popmq serve`; return the JSON-serialisable figures.

    ``queues`` is per broker; each scale step and the hang run get a fresh topic and group.
    """
    for name, allowed, given in (("kinds", KINDS, kinds), ("scenarios", SCENARIOS, scenarios)):
        unknown = set(given) - set(allowed)
        if unknown:
            raise ValueError(f"unknown {name} {sorted(unknown)}: choose from {allowed}")
    settings = server_settings(queues, strategy, invisible_ms, time_scale)
    params: dict[str, Any] = {
        "consumers": list(consumers), "brokers": brokers, "queues": queues,
        "total_queues": brokers * queues, "process_ms": process_ms,
        "per_consumer": per_consumer, "batch": batch, "body_bytes": body_bytes,
        "kinds": list(kinds), "strategy": strategy, "channels": channels,
        "long_polling_ms": LONG_POLLING_MS, "cpus": os.cpu_count(), "server": settings,
    }  # fmt: skip
    result: dict[str, Any] = {"params": params, "path": "popmq serve over gRPC (AsyncClient)"}
    async with serve(brokers, settings) as server:
        if "scale" in scenarios:
            steps = []
            for count in consumers:
                for kind in kinds:
                    live.phase(f"scale: {count} {kind} consumers")
                    steps.append(await _scale_step(server, kind, count, params))
            result["scale"] = steps
        if "hang" in scenarios:
            live.phase(f"hang: {hang_consumers} consumers, one stops acking")
            hang = HangParams(
                consumers=hang_consumers, messages=hang_messages, invisible_ms=invisible_ms,
                process_ms=process_ms, batch=batch, body_bytes=body_bytes,
                queues=queues, time_scale=time_scale, channels=channels,
                revive_scan_ms=200, long_polling_ms=LONG_POLLING_MS,
            )  # fmt: skip
            result["hang"] = await run_hang(server, hang)
    return result


# -- the table -----------------------------------------------------------------------------------
def _grid(rows: list[list[str]]) -> list[str]:
    return grid(rows)


def format_scale(result: dict[str, Any]) -> list[str]:
    p = result["params"]
    steps = result["scale"]
    by = {(s["consumers"], s["kind"]): s for s in steps}
    lines = [
        f"scale past queues: {p['brokers']} brokers x {p['queues']} queues = "
        f"{p['total_queues']} queues; {p['process_ms']} ms of work per message before the ack; "
        f"backlog {p['per_consumer']} messages per consumer; receive batch {p['batch']}; "
        f"{p['body_bytes']} B; strategy {p['strategy']}; via {result['path']}",
        "",
    ]
    header = ["consumers", "C/Q", "ideal msg/s"]
    for kind in p["kinds"]:
        header += [f"{kind} msg/s"]
    if "pop" in p["kinds"]:
        header += ["pop vs ideal", "pop share min-max", "pop dup", "pop lost", "pop CPU server/gen"]
    if "queue-bound" in p["kinds"]:
        header += ["queue-bound active"]
    rows = [header]
    for count in p["consumers"]:
        first = by[(count, p["kinds"][0])]
        row = [str(count), f"{count / p['total_queues']:g}", f"{first['ideal_msgs_per_s']:.0f}"]
        for kind in p["kinds"]:
            step = by[(count, kind)]
            row.append(f"{step['msgs_per_s']:.0f}" + ("" if step["finished"] else "*"))
        if "pop" in p["kinds"]:
            pop = by[(count, "pop")]
            row += [
                f"{pop['msgs_per_s'] / pop['ideal_msgs_per_s']:.2f}",
                f"{pop['share_min']:.2f}-{pop['share_max']:.2f}",
                str(pop["duplicates"]),
                "-" if pop["lost"] is None else str(pop["lost"]),
                f"{pop['server_cpu_percent']}%/{pop['load_generator_cpu_percent']}%",
            ]
        if "queue-bound" in p["kinds"]:
            row.append(str(by[(count, "queue-bound")]["active_consumers"]))
        rows.append(row)
    lines += _grid(rows)
    lines += [
        "ideal: C x 1000 / work ms (every consumer busy all the time); share: a consumer's "
        "acked messages / fair share",
        "* stopped at its time limit (rate over the window); CPU: the server's and the load "
        "generator's CPU time over the step, in % of one core (each is one event loop)",
    ]
    pops = [by[(c, "pop")] for c in p["consumers"] if (c, "pop") in by]
    if pops:
        top = max(pops, key=lambda s: s["msgs_per_s"])
        at_q = [s for s in pops if s["consumers"] == p["total_queues"]]
        if at_q and at_q[0]["msgs_per_s"]:
            lines.append(
                f"pop: best {top['msgs_per_s']:.0f} msg/s at {top['consumers']} consumers = "
                f"{top['msgs_per_s'] / at_q[0]['msgs_per_s']:.2f}x its rate at C = Q"
            )
    return lines


def format_table(result: dict[str, Any]) -> str:
    lines: list[str] = []
    if "scale" in result:
        lines += format_scale(result)
    if "hang" in result:
        if lines:
            lines.append("")
        lines += format_hang(result["hang"])
    flags = " ".join(f"--set {k}={v}" for k, v in result["params"]["server"].items())
    lines += ["", f"server: popmq serve --brokers {result['params']['brokers']} {flags}"]
    return "\n".join(lines)
