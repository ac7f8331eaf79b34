"""`popmq admin` verbs on par with mqadmin (registered by admin_cmd):

popmq admin consumer-progress billing [--topic orders]
popmq admin offsets reset billing --topic orders --to-time 2026-11-23T10:00:00Z
popmq admin offsets reset billing --topic orders --to earliest|latest
popmq admin message get --id 0A1B... [--topic orders]
popmq admin message query --topic orders --key order-42
popmq admin dlq list billing
popmq admin dlq resend billing --id 0A1B... | --all
popmq admin cluster status
popmq admin topics route orders
"""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from typing import Any

from popmq.cli.admin_cmd import AdminError, _all_clients, _call, _command, _print_json, _table
from popmq.cli.failures import UserError


def register(
    commands: argparse._SubParsersAction,
    topic_commands: argparse._SubParsersAction,
    group_commands: argparse._SubParsersAction,
) -> None:
    describe = group_commands.add_parser(
        "describe", help="a group's settings, progress per topic and connected consumers"
    )
    describe.add_argument("name", help="consumer group")
    describe.set_defaults(func=_groups_describe)

    route = topic_commands.add_parser("route", help="which brokers serve a topic, and where")
    route.add_argument("name", help="topic name")
    route.set_defaults(func=_topic_route)

    progress = commands.add_parser(
        "consumer-progress", help="a group's offsets, lag and lag latency per queue"
    )
    progress.add_argument("group", help="consumer group")
    progress.add_argument("--topic", default="", help="only this topic (default: every topic)")
    progress.set_defaults(func=_consumer_progress)

    offsets = commands.add_parser("offsets", help="move a group's consumer offsets")
    offset_commands = offsets.add_subparsers(dest="offsets_command", required=True)
    reset = offset_commands.add_parser("reset", help="reset a group's offsets on a topic")
    reset.add_argument("group", help="consumer group")
    reset.add_argument("--topic", required=True, help="topic whose offsets move")
    where = reset.add_mutually_exclusive_group(required=True)
    where.add_argument("--to-time", metavar="ISO", help="first message stored at or after, "
                       "e.g. 2026-11-23T10:00:00Z (no zone: UTC)")  # fmt: skip
    where.add_argument("--to", choices=("earliest", "latest"), help="oldest kept or newest")
    reset.set_defaults(func=_offsets_reset)

    message = commands.add_parser("message", help="find stored messages")
    message_commands = message.add_subparsers(dest="message_command", required=True)
    get = message_commands.add_parser("get", help="a message by its id")
    get.add_argument("--id", required=True, help="message id (or the id it had before a DLQ)")
    get.add_argument("--topic", default="", help="look only in this topic")
    get.add_argument("--body", action="store_true", help="print the body too")
    get.add_argument("--max-scan", type=int, default=0, help="newest messages scanned per queue "
                     "(0: 10000)")  # fmt: skip
    get.set_defaults(func=_message_get)
    query = message_commands.add_parser("query", help="messages with a key")
    query.add_argument("--topic", required=True, help="topic to search")
    query.add_argument("--key", required=True, help="message key")
    query.add_argument("--limit", type=int, default=32, help="at most this many messages")
    query.add_argument("--max-scan", type=int, default=0, help="newest messages scanned per "
                       "queue (0: 10000)")  # fmt: skip
    query.set_defaults(func=_message_query)

    dlq = commands.add_parser("dlq", help="a group's dead-letter queue")
    dlq_commands = dlq.add_subparsers(dest="dlq_command", required=True)
    listing = dlq_commands.add_parser("list", help="messages in the group's DLQ, newest first")
    listing.add_argument("group", help="consumer group")
    listing.add_argument("--limit", type=int, default=100, help="at most this many messages")
    listing.set_defaults(func=_dlq_list)
    resend = dlq_commands.add_parser("resend", help="send DLQ messages back to their topic")
    resend.add_argument("group", help="consumer group")
    which = resend.add_mutually_exclusive_group(required=True)
    which.add_argument("--id", action="append", default=[], help="message id (repeatable)")
    which.add_argument("--all", action="store_true", help="every message in the DLQ")
    resend.set_defaults(func=_dlq_resend)

    cluster = commands.add_parser("cluster", help="the proxy and its brokers")
    cluster_commands = cluster.add_subparsers(dest="cluster_command", required=True)
    status = cluster_commands.add_parser("status", help="brokers, reachability and round trips")
    status.set_defaults(func=_cluster_status_or_groups)
    from popmq.cli import groups_cmd  # broker groups in etcd (--etcd)

    groups_cmd.add_status_options(status)


def _ms_ago(ms: int) -> str:
    if not ms:
        return "-"
    return f"{ms / 1000:.1f}s"


def _time(ms: int) -> str:
    if not ms:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def parse_time_ms(text: str) -> int:
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise UserError(f"bad time {text!r}: use ISO 8601, e.g. 2026-11-23T10:00:00Z") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


@_command
def _groups_describe(args: argparse.Namespace) -> None:
    from popmq.cli.json_out import message_dict
    from popmq.pb.admin.v1 import admin_pb2 as a

    group = _call(args, "GetGroup", a.GetGroupRequest(name=args.name)).group
    progress = _call(args, "ConsumerProgress", a.ConsumerProgressRequest(group=args.name))
    clients = _all_clients(args, args.name)
    per_topic: dict[str, list[int]] = {}
    for q in progress.queues:
        row = per_topic.setdefault(q.topic, [0, 0, 0])
        row[0] += q.lag
        row[1] += q.inflight
        row[2] = max(row[2], q.lag_latency_ms)
    if args.json:
        as_dict = {
            "group": message_dict(group),
            "topics": {t: {"lag": r[0], "inflight": r[1], "lag_latency_ms": r[2]}
                       for t, r in sorted(per_topic.items())},
            "clients": [c.client_id for c in clients.clients],
        }  # fmt: skip
        print(json.dumps(as_dict, indent=2, sort_keys=True))
        return
    levels = ",".join(group.retry_levels) or "(broker default)"
    _table(("group", "consume_mode", "max_attempts", "fifo", "retry_levels"),
           [(group.name, group.consume_mode, group.max_attempts, group.fifo, levels)])  # fmt: skip
    _table(("topic", "lag", "inflight", "lag_latency"),
           [(t, r[0], r[1], _ms_ago(r[2])) for t, r in sorted(per_topic.items())],
           title="progress (without --topic: topics the group consumed from)")  # fmt: skip
    print(f"consumers connected to {clients.proxy}: {len(clients.clients)}")


@_command
def _topic_route(args: argparse.Namespace) -> None:
    from popmq.pb.admin.v1 import admin_pb2 as a

    response = _call(args, "TopicRoute", a.TopicRouteRequest(topic=args.name))
    if args.json:
        _print_json(response)
        return
    _table(("broker", "address", "queues"),
           [(b.broker, b.address, b.queue_count) for b in response.brokers],
           title=f"topic {response.topic}: clients are routed to {response.proxy}")  # fmt: skip


@_command
def _consumer_progress(args: argparse.Namespace) -> None:
    from popmq.pb.admin.v1 import admin_pb2 as a

    request = a.ConsumerProgressRequest(group=args.group, topic=args.topic)
    response = _call(args, "ConsumerProgress", request)
    if args.json:
        _print_json(response)
        return
    rows = [(q.broker, q.topic, q.queue_id, q.consumer_offset, q.max_offset, q.lag, q.inflight,
             _ms_ago(q.lag_latency_ms)) for q in response.queues]  # fmt: skip
    _table(("broker", "topic", "queue", "consumer_offset", "max_offset", "lag", "inflight",
            "lag_latency"), rows, title=f"group {args.group}")  # fmt: skip
    worst = max((q.lag_latency_ms for q in response.queues), default=0)
    lag = sum(q.lag for q in response.queues)
    inflight = sum(q.inflight for q in response.queues)
    print(f"total lag {lag}, in flight {inflight}, max lag latency {_ms_ago(worst)}")


@_command
def _offsets_reset(args: argparse.Namespace) -> None:
    from popmq.pb.admin.v1 import admin_pb2 as a

    request = a.ResetOffsetRequest(group=args.group, topic=args.topic)
    if args.to_time:
        request.timestamp_ms = parse_time_ms(args.to_time)
    elif args.to == "earliest":
        request.earliest = True
    else:
        request.latest = True
    response = _call(args, "ResetOffset", request)
    if args.json:
        _print_json(response)
        return
    _table(("broker", "queue", "old_offset", "new_offset"),
           [(q.broker, q.queue_id, q.old_offset, q.new_offset) for q in response.queues],
           title=f"group {args.group} on {args.topic}")  # fmt: skip


def _print_messages(args: argparse.Namespace, messages: Any, title: str) -> None:
    rows = [(m.message_id, m.topic, m.broker, m.queue_id, m.queue_offset, m.tag or "-",
             ",".join(m.keys) or "-", _time(m.store_timestamp_ms), m.reconsume_times,
             m.body_size) for m in messages]  # fmt: skip
    _table(("message_id", "topic", "broker", "queue", "offset", "tag", "keys", "stored (UTC)",
            "reconsumes", "bytes"), rows, title=title)  # fmt: skip


@_command
def _message_get(args: argparse.Namespace) -> None:
    from popmq.pb.admin.v1 import admin_pb2 as a

    request = a.QueryMessagesRequest(topic=args.topic, message_id=args.id, limit=1,
                                     max_scan=args.max_scan, include_body=args.body)  # fmt: skip
    response = _call(args, "QueryMessages", request)
    if not response.messages:
        hint = " (older messages were not searched: raise --max-scan)" if response.truncated else ""
        raise AdminError(f"message {args.id} not found{hint}")
    if args.json:
        _print_json(response)
        return
    m = response.messages[0]
    _print_messages(args, [m], title=f"message {args.id}")
    if m.origin_topic:
        print(f"first sent to {m.origin_topic} as {m.origin_message_id or m.message_id}")
    for key, value in sorted(m.properties.items()):
        print(f"  {key} = {value}")
    if args.body:
        print(m.body.decode(errors="replace"))


@_command
def _message_query(args: argparse.Namespace) -> None:
    from popmq.pb.admin.v1 import admin_pb2 as a

    request = a.QueryMessagesRequest(topic=args.topic, key=args.key, limit=args.limit,
                                     max_scan=args.max_scan)  # fmt: skip
    response = _call(args, "QueryMessages", request)
    if args.json:
        _print_json(response)
        return
    _print_messages(args, response.messages, title=f"key {args.key} in {args.topic}")
    if response.truncated:
        print("(older messages were not searched: raise --max-scan)")


@_command
def _dlq_list(args: argparse.Namespace) -> None:
    from popmq.pb.admin.v1 import admin_pb2 as a

    response = _call(args, "ListDlq", a.ListDlqRequest(group=args.group, limit=args.limit))
    if args.json:
        _print_json(response)
        return
    rows = [(m.origin_message_id or m.message_id, m.origin_topic or "-", m.broker,
             m.reconsume_times, _time(m.store_timestamp_ms), m.body_size)
            for m in response.messages]  # fmt: skip
    _table(("message_id", "topic", "broker", "attempts", "dead-lettered (UTC)", "bytes"), rows,
           title=f"%DLQ%{args.group}: {response.total} messages")  # fmt: skip


@_command
def _dlq_resend(args: argparse.Namespace) -> None:
    from popmq.pb.admin.v1 import admin_pb2 as a

    request = a.ResendDlqRequest(group=args.group, message_ids=args.id, all=args.all)
    response = _call(args, "ResendDlq", request)
    if args.json:
        _print_json(response)
        return
    _table(("was", "topic", "broker", "queue", "offset", "new message_id"),
           [(m.origin_message_id or "-", m.topic, m.broker, m.queue_id, m.queue_offset,
             m.message_id) for m in response.resent],
           title=f"resent {len(response.resent)} messages")  # fmt: skip


def _cluster_status_or_groups(args: argparse.Namespace) -> int:
    """With --etcd (or POPMQ_ETCD): the broker groups as etcd has them; else the proxy's view."""
    if args.etcd:
        from popmq.cli.groups_cmd import cluster_status

        return cluster_status(args)
    return _cluster_status(args)


@_command
def _cluster_status(args: argparse.Namespace) -> None:
    from popmq.pb.admin.v1 import admin_pb2 as a

    response = _call(args, "ClusterStatus", a.ClusterStatusRequest())
    if args.json:
        _print_json(response)
        return
    rows = [(b.broker, b.address, "yes" if b.reachable else "NO",
             f"{b.rtt_ms:.1f}" if b.reachable else "-", b.topics if b.reachable else "-",
             b.error or "-") for b in response.brokers]  # fmt: skip
    _table(("broker", "address", "reachable", "rtt_ms", "topics", "error"), rows,
           title=f"proxy {response.proxy} (popmq {response.version}), "
           f"{response.clients} clients")  # fmt: skip
    if response.groups:  # replicated groups the proxy follows in etcd
        _table(("group", "epoch", "node", "role", "in_sync", "lag_bytes", "lag_s", "state"),
               [(g.name, g.epoch, n.name, n.role, "yes" if n.name in g.in_sync else "no",
                 n.lag_bytes if n.lag_known else "-", n.lag_s if n.lag_known else "-",
                 "draining" if g.draining else "") for g in response.groups for n in g.nodes],
               title=f"{len(response.groups)} broker groups")  # fmt: skip
    down = [b.broker for b in response.brokers if not b.reachable]
    if down:  # exit 1, so scripts notice
        raise AdminError(f"unreachable brokers: {', '.join(down)}")
