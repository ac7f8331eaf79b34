"""`popmq bench ...`: benchmarks that print a table and write JSON.

Each benchmark compares modes or strategies side by side in ONE run, because these machines are
shared and noisy: read the ratios, not the absolute figures. The logic lives next to what it
measures; this module only parses flags, runs it, prints and saves.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _table(rows: list[list[str]]) -> str:
    from popmq.bench.table_text import grid  # rich: imported by a bench, not by the CLI

    return "\n".join(grid(rows))


def format_broker(result: dict[str, Any]) -> str:
    params = result["params"]
    head = (
        f"{params['messages']} messages x {params['body_bytes']} B, batch {params['batch']}, "
        f"{params['producers']} producers, {params['consumers']} consumers, "
        f"{params['queues']} queues"
    )
    rows = [["mode", "send msg/s", "pop+ack msg/s", "pull msg/s"]]
    for mode, figures in result["results"].items():
        rows.append(
            [
                mode,
                str(figures["send_msgs_per_s"]),
                str(figures["pop_ack_msgs_per_s"]),
                str(figures["pull_msgs_per_s"]),
            ]
        )
    return head + "\n\n" + _table(rows)


def _emit(result: dict[str, Any], table: str, json_path: str | None) -> int:
    print(table)
    if json_path:
        Path(json_path).write_text(json.dumps(result, indent=2, default=str))
        print(f"\nwrote {json_path}")
    return 0


def _run_bench(module: str, function: str, formatter: Callable[[dict[str, Any]], str] | str,
               json_path: str | None, **kwargs: Any) -> int:  # fmt: skip
    # Here, not with the CLI: rich's progress display is no cost of a serving process.
    from popmq.cli.bench_display import live_progress

    bench = getattr(importlib.import_module(module), function)
    with live_progress(f"bench {function.removeprefix('bench_')}"):
        result = asyncio.run(bench(**kwargs))
    render = (
        getattr(importlib.import_module(module), formatter)
        if isinstance(formatter, str)
        else formatter
    )
    return _emit(result, render(result), json_path)


def _broker(args: argparse.Namespace) -> int:
    return _run_bench(
        "popmq.bench.broker_throughput", "bench_broker", format_broker, args.json,
        messages=args.messages, body_bytes=args.body_bytes, batch=args.batch,
        producers=args.producers, consumers=args.consumers, queues=args.queues,
        transports=tuple(args.transport), flush_modes=tuple(args.flush),
    )  # fmt: skip


def _longpoll(args: argparse.Namespace) -> int:
    return _run_bench(
        "popmq.bench.longpoll", "bench_longpoll", "format_table", args.json,
        brokers=args.brokers, consumers=args.consumers, rate=args.rate,
        duration_s=args.duration, await_ms=args.await_ms, strategies=tuple(args.strategy),
        remote=args.remote, busy=args.busy, busy_consumers=args.busy_consumers,
        busy_rate=args.busy_rate,
    )  # fmt: skip


def _e2e(args: argparse.Namespace) -> int:
    return _run_bench(
        "popmq.bench.e2e", "bench_e2e", "format_table", args.json,
        messages=args.messages, body_bytes=args.body_bytes, producers=args.producers,
        consumers=args.consumers, brokers=args.brokers, queues=args.queues,
        strategy=args.strategy, modes=tuple(args.mode), proxy_workers=tuple(args.proxy_workers),
        replicas=args.replicas, replication=tuple(args.replication),
        min_in_sync=args.min_in_sync, transactions=args.transactions,
        acl=args.acl,
    )  # fmt: skip


def _replication(args: argparse.Namespace) -> int:
    return _run_bench(
        "popmq.bench.replication", "bench_replication", "format_table", args.json,
        messages=args.messages, body_bytes=args.body_bytes, batch=args.batch,
        producers=args.producers, queues=args.queues, setups=tuple(args.setup),
    )  # fmt: skip


def _failover(args: argparse.Namespace) -> int:
    return _run_bench(
        "popmq.bench.failover", "bench_failover", "format_table", args.json,
        kills=args.kills, lease_ttl_s=args.lease_ttl, keep_logs=args.keep_logs,
    )  # fmt: skip


def _spark(args: argparse.Namespace) -> int:
    return _run_bench(
        "popmq.bench.spark", "bench_spark", "format_table", args.json,
        messages=args.messages, body_bytes=args.body_bytes, brokers=args.brokers,
        queues=args.queues, master=args.master, endpoint=args.endpoint,
    )  # fmt: skip


def _scale(args: argparse.Namespace) -> int:
    return _run_bench(
        "popmq.bench.scale", "bench_scale", "format_table", args.json,
        consumers=tuple(args.consumers), brokers=args.brokers, queues=args.queues,
        process_ms=args.process_ms, per_consumer=args.per_consumer, batch=args.batch,
        body_bytes=args.body_bytes, kinds=tuple(args.kind), strategy=args.strategy,
        scenarios=tuple(args.scenario), hang_consumers=args.hang_consumers,
        hang_messages=args.hang_messages, invisible_ms=args.invisible_ms,
        time_scale=args.time_scale,
    )  # fmt: skip


def _idle(args: argparse.Namespace) -> int:
    settings = {}
    for text in args.proxy_set:
        key, sep, value = text.partition("=")
        if not sep:
            raise SystemExit(f"--proxy-set wants KEY=VALUE, got {text!r}")
        settings[key] = value
    return _run_bench(
        "popmq.bench.idle", "bench_idle", "format_table", args.json,
        long_polls=args.long_polls, brokers=args.brokers, duration_s=args.duration,
        strategies=tuple(args.strategy), await_ms=args.await_ms, channels=args.channels,
        ramp_s=args.ramp, proxy_settings=settings, acl=args.acl,
    )  # fmt: skip


def register(subparsers: argparse._SubParsersAction) -> None:
    bench = subparsers.add_parser("bench", help="benchmarks: print a table, write --json")
    kinds = bench.add_subparsers(dest="bench", required=True)

    broker = kinds.add_parser("broker", help="send, pop+ack and pull msg/s of one broker")
    broker.add_argument("--messages", type=int, default=50_000)
    broker.add_argument("--body-bytes", type=int, default=1024)
    broker.add_argument("--batch", type=int, default=32)
    broker.add_argument("--producers", type=int, default=4)
    broker.add_argument("--consumers", type=int, default=4)
    broker.add_argument("--queues", type=int, default=8)
    broker.add_argument("--transport", nargs="+", choices=("inproc", "grpc"),
                        default=["inproc", "grpc"])  # fmt: skip
    broker.add_argument("--flush", nargs="+", choices=("async", "sync"), default=["async", "sync"])
    broker.add_argument("--json", help="also write the figures to this file")
    broker.set_defaults(func=_broker)

    longpoll = kinds.add_parser("longpoll", help="real-time delivery per long-poll strategy")
    longpoll.add_argument("--brokers", type=int, default=8)
    longpoll.add_argument("--consumers", type=int, default=1)
    longpoll.add_argument("--rate", type=float, default=5.0, help="messages per second sent")
    longpoll.add_argument("--duration", type=float, default=30.0, help="seconds per strategy")
    longpoll.add_argument("--await-ms", type=int, default=20_000, help="client awaitDuration")
    longpoll.add_argument("--strategy", nargs="+", default=["pop", "slices", "notify", "adaptive"],
                          choices=("pop", "slices", "notify", "adaptive"))  # fmt: skip
    longpoll.add_argument("--remote", action="store_true", help="brokers over gRPC")
    longpoll.add_argument("--busy", action="store_true", help="also run the busy scenario")
    longpoll.add_argument("--busy-consumers", type=int, default=32)
    longpoll.add_argument("--busy-rate", type=float, default=1000.0)
    longpoll.add_argument("--json", help="also write the figures to this file")
    longpoll.set_defaults(func=_longpoll)

    e2e = kinds.add_parser("e2e", help="send + receive + ack msg/s through one proxy vs direct")
    e2e.add_argument("--messages", type=int, default=50_000)
    e2e.add_argument("--body-bytes", type=int, default=1024)
    e2e.add_argument("--producers", type=int, default=8)
    e2e.add_argument("--consumers", type=int, default=32)
    e2e.add_argument("--brokers", type=int, default=3)
    e2e.add_argument("--queues", type=int, default=8, help="queues per broker")
    e2e.add_argument("--strategy", default="adaptive",
                     choices=("pop", "slices", "notify", "adaptive"))  # fmt: skip
    e2e.add_argument("--mode", nargs="+", default=["direct", "proxy"],
                     choices=("direct", "proxy", "cluster", "cluster-unary", "floor"),
                     help="cluster: popmq proxy + popmq broker processes; cluster-unary: the "
                          "same with one unary RPC per broker request (no request link); floor: "
                          "the same gRPC load on a server that does no work")  # fmt: skip
    e2e.add_argument("--proxy-workers", type=int, nargs="+", default=[1],
                     help="cluster mode: popmq proxy --workers N, one run per N")  # fmt: skip
    e2e.add_argument("--replicas", type=int, default=1,
                     help="cluster mode: also run it with every broker a replicated group of "
                          "N nodes (leader + N-1 followers) and print the ratio")  # fmt: skip
    e2e.add_argument("--replication", choices=("sync", "async"), nargs="+", default=["sync"],
                     help="the replicated groups' modes, one run each (sync async: both, in "
                          "the same run as the unreplicated cluster)")  # fmt: skip
    e2e.add_argument("--min-in-sync", type=int, default=None,
                     help="sync groups' --min-in-sync (default: --replicas)")  # fmt: skip
    e2e.add_argument(
        "--transactions",
        action="store_true",
        help="also run each mode with transactional messages (half send + commit + "
        "receive + ack), one message per send in both runs; prints the ratio",
    )
    e2e.add_argument("--acl", action=argparse.BooleanOptionalAction, default=True,
                     help="run the proxy with an ACL and sign every call, as issue 18 measures "
                          "(the default; --no-acl: an open proxy)")  # fmt: skip
    e2e.add_argument("--json", help="also write the figures to this file")
    e2e.set_defaults(func=_e2e)

    replication = kinds.add_parser(
        "replication", help="send msg/s of one broker vs a sync/async replicated group"
    )
    replication.add_argument("--messages", type=int, default=20_000)
    replication.add_argument("--body-bytes", type=int, default=1024)
    replication.add_argument("--batch", type=int, default=16, help="messages per send")
    replication.add_argument("--producers", type=int, default=8)
    replication.add_argument("--queues", type=int, default=8)
    replication.add_argument(
        "--setup", nargs="+", default=["none", "sync-2", "sync-3"],
        choices=("none", "sync-2", "sync-3", "async-2", "async-3"),
        help="none: replication off; sync-N / async-N: a leader and N-1 followers",
    )  # fmt: skip
    replication.add_argument("--json", help="also write the figures to this file")
    replication.set_defaults(func=_replication)

    failover = kinds.add_parser(
        "failover", help="time to serve again after kill -9 of a replicated group's leader"
    )
    failover.add_argument("--kills", type=int, default=3, help="leader kills, one after another")
    failover.add_argument(
        "--lease-ttl", type=int, default=2, help="the nodes' etcd lease TTL in seconds"
    )
    failover.add_argument(
        "--keep-logs", metavar="DIR", help="copy the logs of etcd, the nodes and the proxy here"
    )
    failover.add_argument("--json", help="also write the figures to this file")
    failover.set_defaults(func=_failover)

    spark = kinds.add_parser("spark", help="Spark connector read/write msg/s vs raw pull")
    spark.add_argument("--messages", type=int, default=100_000)
    spark.add_argument("--body-bytes", type=int, default=256)
    spark.add_argument("--brokers", type=int, default=2)
    spark.add_argument("--queues", type=int, default=4, help="queues per broker")
    spark.add_argument("--master", default="local[2]")
    spark.add_argument("--endpoint", help="use this proxy instead of starting popmq serve")
    spark.add_argument("--json", help="also write the figures to this file")
    spark.set_defaults(func=_spark)

    scale = kinds.add_parser(
        "scale", help="msg/s as consumers grow past the queue count; a hung consumer"
    )
    scale.add_argument("--consumers", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    scale.add_argument("--brokers", type=int, default=2)
    scale.add_argument("--queues", type=int, default=2, help="queues per broker")
    scale.add_argument("--process-ms", type=float, default=5.0,
                       help="simulated work per message before its ack")  # fmt: skip
    scale.add_argument("--per-consumer", type=int, default=256,
                       help="backlog messages per consumer in each step")  # fmt: skip
    scale.add_argument("--batch", type=int, default=16, help="receive / pull batch size")
    scale.add_argument("--body-bytes", type=int, default=1024)
    scale.add_argument("--kind", nargs="+", default=["pop", "queue-bound"],
                       choices=("pop", "queue-bound"))  # fmt: skip
    scale.add_argument("--strategy", default="adaptive",
                       choices=("pop", "slices", "notify", "adaptive"))  # fmt: skip
    scale.add_argument("--scenario", nargs="+", default=["scale", "hang"],
                       choices=("scale", "hang"))  # fmt: skip
    scale.add_argument("--hang-consumers", type=int, default=4)
    scale.add_argument("--hang-messages", type=int, default=2_000)
    scale.add_argument("--invisible-ms", type=int, default=2_000,
                       help="invisible time of the hung-consumer run")  # fmt: skip
    scale.add_argument("--time-scale", type=float, default=0.1,
                       help="broker pop.time_scale: retry backoff multiplier")  # fmt: skip
    scale.add_argument("--json", help="also write the figures to this file")
    scale.set_defaults(func=_scale)

    idle = kinds.add_parser(
        "idle", help="proxy memory, broker RPC/s and CPU of thousands of idle long polls"
    )
    idle.add_argument("--long-polls", type=int, default=2000, help="concurrent idle receives")
    idle.add_argument("--brokers", type=int, default=4, help="broker processes")
    idle.add_argument("--duration", type=float, default=20.0, help="seconds measured each")
    idle.add_argument("--strategy", nargs="+", default=["pop", "notify", "adaptive"],
                      choices=("pop", "slices", "notify", "adaptive", "floor"),
                      help="floor: a do-nothing grpc.aio server, same receives")  # fmt: skip
    idle.add_argument("--await-ms", type=int, default=20_000, help="client awaitDuration")
    idle.add_argument("--channels", type=int, default=4, help="client gRPC connections")
    idle.add_argument("--ramp", type=float, help="seconds over which the polls start "
                      "(default: awaitDuration)")  # fmt: skip
    idle.add_argument("--proxy-set", action="append", default=[], metavar="KEY=VALUE",
                      help="proxy config override, e.g. proxy.false_empty_probe=false")  # fmt: skip
    idle.add_argument("--acl", action=argparse.BooleanOptionalAction, default=True,
                      help="run the proxy with an ACL and sign every call, as issue 18 measures "
                           "(the default; --no-acl: an open proxy)")  # fmt: skip
    idle.add_argument("--json", help="also write the figures to this file")
    idle.set_defaults(func=_idle)
