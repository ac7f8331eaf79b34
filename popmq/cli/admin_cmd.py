"""`popmq admin`: topics, groups, clients and stats, through a proxy's AdminService.

    popmq admin --endpoint 127.0.0.1:8081 topics create orders --queues 8
    popmq admin topics list | topics describe orders --group billing | topics delete orders
    popmq admin groups list | groups get billing
    popmq admin groups delete billing [--clean-offsets] [--force]
    popmq admin groups set billing --consume-mode PULL --max-attempts 5 --retry-levels 1s,10s
    popmq admin set-consume-mode billing POP
    popmq admin clients [--group billing]
    popmq admin stats [--raw]
    popmq admin transactions list | transactions commit MSGID | transactions rollback MSGID
    (and the mqadmin-level verbs of admin_ops: consumer-progress, offsets, message, dlq,
    cluster status, topics route)

Every command takes --json for machine-readable output. Exit status 1 on a refusal.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from popmq.cli.failures import UserError
from popmq.cli.json_out import print_response
from popmq.cli.parser_kit import inherit
from popmq.cli.tables import print_table

DEFAULT_ENDPOINT = "127.0.0.1:8081"
TIMEOUT_S = 10.0


def register(subparsers: argparse._SubParsersAction) -> None:
    admin = subparsers.add_parser(
        "admin", help="administer topics, groups and clients through a proxy",
        description="Administer a popmq cluster through any of its proxies.",
    )  # fmt: skip
    admin.add_argument(
        "--endpoint", default=DEFAULT_ENDPOINT, help=f"proxy address (default {DEFAULT_ENDPOINT})"
    )
    admin.add_argument("--json", action="store_true", help="print JSON instead of tables")
    admin.add_argument(
        "--access-key", default=os.environ.get("POPMQ_ACCESS_KEY"),
        help="access key of an admin user (env POPMQ_ACCESS_KEY)",
    )  # fmt: skip
    admin.add_argument(
        "--secret-key", default=os.environ.get("POPMQ_SECRET_KEY"),
        help="its secret key (env POPMQ_SECRET_KEY; prefer the env to the command line)",
    )  # fmt: skip
    admin.add_argument("--tls-ca", metavar="FILE", help="connect with TLS, trusting this CA (PEM)")
    admin.add_argument(
        "--tls", action="store_true", help="connect with TLS, trusting the system's CAs"
    )
    admin.add_argument(
        "--namespace", default="",
        help="the clients' namespace (x-mq-namespace): names are taken and shown inside it",
    )  # fmt: skip
    commands = admin.add_subparsers(dest="admin_command", required=True)

    topics = commands.add_parser("topics", help="create, list, describe, delete topics")
    topic_commands = topics.add_subparsers(dest="topics_command", required=True)
    create = topic_commands.add_parser("create", help="create a topic on every broker")
    create.add_argument("name")
    create.add_argument("--queues", type=int, default=8, help="queues per broker (default 8)")
    create.add_argument("--broker", action="append", default=[], help="only on these brokers")
    create.add_argument(
        "--message-type", default="NORMAL", type=str.upper,
        choices=("NORMAL", "FIFO", "DELAY", "TRANSACTION", "MIXED"),
        help="the one message type the topic takes, or MIXED for any (default NORMAL, as "
        "RocketMQ); a send of another type is refused (MESSAGE_PROPERTY_CONFLICT_WITH_TYPE)",
    )  # fmt: skip
    create.set_defaults(func=_topics_create)
    listing = topic_commands.add_parser("list", help="list topics")
    listing.add_argument("--all", action="store_true", help="include %%RETRY%% and %%DLQ%% topics")
    listing.set_defaults(func=_topics_list)
    describe = topic_commands.add_parser("describe", help="queues, offsets and a group's backlog")
    describe.add_argument("name")
    describe.add_argument("--group", help="also show this group's offsets and backlog")
    describe.set_defaults(func=_topics_describe)
    delete = topic_commands.add_parser("delete", help="delete a topic and its messages")
    delete.add_argument("name")
    delete.set_defaults(func=_topics_delete)

    groups = commands.add_parser("groups", help="show or change consumer group settings")
    group_commands = groups.add_subparsers(dest="groups_command", required=True)
    group_list = group_commands.add_parser(
        "list", help="groups registered on the brokers, with in-flight counts"
    )
    group_list.set_defaults(func=_groups_list)
    group_delete = group_commands.add_parser(
        "delete", help="delete a group's settings from every broker (mqadmin deleteSubGroup)",
        description="Delete a group's settings from every broker. Its %%RETRY%% and %%DLQ%% "
        "topics are kept. Refused while the group has messages in flight, unless --force "
        "(they then revive as usual). A client using the group again re-creates it with the "
        "defaults, if auto-creation is on.",
    )  # fmt: skip
    group_delete.add_argument("name")
    group_delete.add_argument(
        "--clean-offsets", action="store_true",
        help="also remove its committed offsets (a new group of that name starts afresh)",
    )  # fmt: skip
    group_delete.add_argument(
        "--force", action="store_true", help="delete even with messages in flight"
    )
    group_delete.set_defaults(func=_groups_delete)
    get = group_commands.add_parser("get", help="a group's settings")
    get.add_argument("name")
    get.set_defaults(func=_groups_get)
    update = group_commands.add_parser("set", help="change a group's settings")
    update.add_argument("name")
    _group_options(update)
    update.set_defaults(func=_groups_set)

    transactions = commands.add_parser(
        "transactions", help="undecided transactional messages: list, commit, roll back"
    )
    tx_commands = transactions.add_subparsers(dest="transactions_command", required=True)
    tx_list = tx_commands.add_parser(
        "list", help="half messages without a decision on every broker (parked ones included)"
    )
    tx_list.set_defaults(func=_transactions_list)
    for verb, commit in (("commit", True), ("rollback", False)):
        resolve = tx_commands.add_parser(
            verb, help=f"{verb} an undecided transactional message (by its message id)"
        )
        resolve.add_argument("message_id", help="its message id (as `transactions list` shows it)")
        resolve.set_defaults(func=_transactions_resolve, commit=commit)

    mode = commands.add_parser("set-consume-mode", help="POP (default) or PULL for a group")
    mode.add_argument("name")
    mode.add_argument("mode", choices=("POP", "PULL", "pop", "pull"))
    mode.set_defaults(func=_set_consume_mode)

    clients = commands.add_parser("clients", help="clients connected to this proxy")
    clients.add_argument("--group", default="", help="only this group's clients")
    clients.set_defaults(func=_clients)

    stats = commands.add_parser("stats", help="the proxy's metrics")
    stats.add_argument("--raw", action="store_true", help="the full Prometheus text")
    stats.set_defaults(func=_stats)

    from popmq.cli import admin_ops  # mqadmin-level verbs, in their own module

    admin_ops.register(commands, topic_commands, group_commands)
    from popmq.cli import groups_cmd  # broker groups in etcd: drain, remove

    groups_cmd.register(commands)
    # --endpoint and --json also after the verb: `popmq admin topics list --json`.
    inherit(admin)


def _group_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--consume-mode", choices=("POP", "PULL", "pop", "pull"))
    parser.add_argument("--max-attempts", type=int, help="deliveries before the DLQ")
    parser.add_argument(
        "--retry-levels", metavar="1s,5s,...|default", help="redelivery delays, or 'default'"
    )
    fifo = parser.add_mutually_exclusive_group()
    fifo.add_argument("--fifo", dest="fifo", action="store_true", default=None)
    fifo.add_argument("--no-fifo", dest="fifo", action="store_false")


# -- plumbing ----------------------------------------------------------------------------------


class AdminError(Exception):
    pass


def _stub(args: argparse.Namespace) -> Any:
    import grpc

    from popmq.pb.admin.v1 import admin_pb2_grpc

    if args.tls or args.tls_ca:
        ca = Path(args.tls_ca).read_bytes() if args.tls_ca else None
        credentials = grpc.ssl_channel_credentials(root_certificates=ca)
        channel = grpc.secure_channel(args.endpoint, credentials)
    else:
        channel = grpc.insecure_channel(args.endpoint)
    return channel, admin_pb2_grpc.AdminServiceStub(channel)


def _metadata(args: argparse.Namespace) -> list[tuple[str, str]] | None:
    """The MQv2 signature headers when a key pair is given (the proxy checks admin rights)."""
    if not args.access_key and not args.secret_key:
        return None
    if not args.access_key or not args.secret_key:
        raise AdminError("give both --access-key and --secret-key (or POPMQ_* env)")
    from popmq.security.signature import signed_metadata

    return signed_metadata(args.access_key, args.secret_key)


def _call(args: argparse.Namespace, method: str, request: Any) -> Any:
    import grpc

    from popmq.broker.contract.errors import Code

    metadata = _metadata(args)
    channel, stub = _stub(args)
    try:
        response = getattr(stub, method)(request, timeout=TIMEOUT_S, metadata=metadata)
    except grpc.RpcError as exc:
        detail = f"{exc.code().name} {exc.details()}"
        if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            raise UserError(f"cannot reach {args.endpoint}: {detail}") from None
        raise AdminError(f"{args.endpoint} failed: {detail}") from None
    finally:
        channel.close()
    if response.status.code != Code.OK:
        try:
            name = Code(response.status.code).name
        except ValueError:
            name = str(response.status.code)
        raise AdminError(f"{name}: {response.status.message}")
    return response


def _all_clients(args: argparse.Namespace, group: str = "") -> Any:
    """ListClients, every page: one answer with all of them (no next_page_token)."""
    from popmq.pb.admin.v1 import admin_pb2 as a

    request = a.ListClientsRequest(group=group)
    merged = a.ListClientsResponse()
    while True:
        page = _call(args, "ListClients", request)
        merged.status.CopyFrom(page.status)
        merged.proxy = page.proxy
        merged.clients.extend(page.clients)
        if not page.next_page_token:
            return merged
        request.page_token = page.next_page_token


def _print_json(message: Any) -> None:
    print_response(message)


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]], title: str | None = None) -> None:
    print_table(headers, rows, title=title)


def _command(func: Callable[[argparse.Namespace], None]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        try:
            _enter_namespace(args)
            func(args)
        except AdminError as exc:  # the server refused: exit 1 (unreachable is UserError, 2)
            print(f"error: {exc}", file=sys.stderr)
            return 1
        return 0

    return run


def _enter_namespace(args: argparse.Namespace) -> None:
    """--namespace NS: the topic and group named on the command line are NS's (inside popmq
    they are `NS%name`, as the proxy maps them for clients of that namespace)."""
    namespace = getattr(args, "namespace", "")
    if not namespace:
        return
    from popmq.broker.contract.errors import RefusedError
    from popmq.proxy.grpc.namespace import check_namespace, qualify

    try:
        check_namespace(namespace)
        if getattr(args, "name", None):
            args.name = qualify(namespace, args.name, group=args.admin_command != "topics")
        if getattr(args, "group", None):
            args.group = qualify(namespace, args.group, group=True)
    except RefusedError as exc:
        raise AdminError(exc.message) from None


def _shown(args: argparse.Namespace, name: str) -> str:
    from popmq.proxy.grpc.namespace import unqualify

    return unqualify(getattr(args, "namespace", ""), name)


def _in_namespace(args: argparse.Namespace, name: str) -> bool:
    namespace = getattr(args, "namespace", "")
    return not namespace or _shown(args, name) != name


# -- commands ----------------------------------------------------------------------------------


def _print_topic(args: argparse.Namespace, response: Any) -> None:
    if args.json:
        _print_json(response)
        return
    topic = response.topic
    rows = [
        (b.broker, q.queue_id, q.min_offset, q.max_offset, q.max_offset - q.min_offset)
        for b in topic.brokers
        for q in b.queues
    ]
    types = "/".join(dict.fromkeys(b.message_type for b in topic.brokers if b.message_type))
    print(f"topic {_shown(args, topic.name)}: {sum(b.queue_count for b in topic.brokers)} queues"
          + (f", {types} messages" if types else ""))  # fmt: skip
    _table(("broker", "queue", "min_offset", "max_offset", "messages"), rows)
    group_rows = getattr(response, "group_queues", None)
    if group_rows:
        print()
        _table(
            ("broker", "topic", "queue", "consumer_offset", "max_offset", "backlog", "inflight"),
            [
                (
                    g.broker,
                    g.topic,
                    g.queue_id,
                    g.consumer_offset,
                    g.max_offset,
                    g.backlog,
                    g.inflight,
                )
                for g in group_rows
            ],
        )
        print(f"total backlog {sum(g.backlog for g in group_rows)}, "
              f"in flight {sum(g.inflight for g in group_rows)}")  # fmt: skip


@_command
def _topics_create(args: argparse.Namespace) -> None:
    from popmq.pb.admin.v1 import admin_pb2 as a

    request = a.CreateTopicRequest(name=args.name, queue_count=args.queues, brokers=args.broker,
                                   message_type=args.message_type)  # fmt: skip
    _print_topic(args, _call(args, "CreateTopic", request))


@_command
def _topics_list(args: argparse.Namespace) -> None:
    from popmq.pb.admin.v1 import admin_pb2 as a

    response = _call(args, "ListTopics", a.ListTopicsRequest(include_system=args.all))
    if getattr(args, "namespace", ""):  # only the namespace's topics, by their client names
        kept = [t for t in response.topics if _in_namespace(args, t.name)]
        del response.topics[:]
        for topic in kept:
            topic.name = _shown(args, topic.name)
            response.topics.append(topic)
    if args.json:
        _print_json(response)
        return
    rows = []
    for topic in response.topics:
        queues = sum(b.queue_count for b in topic.brokers)
        messages = sum(q.max_offset - q.min_offset for b in topic.brokers for q in b.queues)
        rows.append((topic.name, len(topic.brokers), queues, messages))
    _table(("topic", "brokers", "queues", "messages"), rows)


@_command
def _topics_describe(args: argparse.Namespace) -> None:
    from popmq.pb.admin.v1 import admin_pb2 as a

    request = a.DescribeTopicRequest(name=args.name, group=args.group or "")
    _print_topic(args, _call(args, "DescribeTopic", request))


@_command
def _topics_delete(args: argparse.Namespace) -> None:
    from popmq.pb.admin.v1 import admin_pb2 as a

    _call(args, "DeleteTopic", a.DeleteTopicRequest(name=args.name))
    print(json.dumps({"deleted": args.name}) if args.json else f"deleted topic {args.name}")


def _print_group(args: argparse.Namespace, response: Any) -> None:
    if args.json:
        _print_json(response)
        return
    group = response.group
    levels = ",".join(group.retry_levels) or "(broker default)"
    _table(
        ("group", "consume_mode", "max_attempts", "fifo", "retry_levels"),
        [(group.name, group.consume_mode, group.max_attempts, group.fifo, levels)],
    )


@_command
def _groups_list(args: argparse.Namespace) -> None:
    from popmq.pb.admin.v1 import admin_pb2 as a

    response = _call(args, "ListGroups", a.ListGroupsRequest())
    if getattr(args, "namespace", ""):  # only the namespace's groups, by their client names
        kept = [g for g in response.groups if _in_namespace(args, g.group.name)]
        del response.groups[:]
        for summary in kept:
            summary.group.name = _shown(args, summary.group.name)
            response.groups.append(summary)
    if args.json:
        _print_json(response)
        return
    rows = [
        (s.group.name, s.group.consume_mode, s.group.max_attempts, s.group.fifo,
         ",".join(s.group.retry_levels) or "(default)", len(s.brokers), s.offset_queues,
         s.inflight)
        for s in response.groups
    ]  # fmt: skip
    _table(("group", "consume_mode", "max_attempts", "fifo", "retry_levels", "brokers",
            "offset_queues", "inflight"), rows)  # fmt: skip


@_command
def _transactions_list(args: argparse.Namespace) -> None:
    from popmq.pb.admin.v1 import admin_pb2 as a

    response = _call(args, "ListTransactions", a.ListTransactionsRequest())
    if args.json:
        _print_json(response)
        return
    rows = [
        (t.message_id, _shown(args, t.topic), t.broker,
         time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t.stored_ms / 1000)), t.checks,
         "parked" if t.parked else "open")
        for t in response.transactions
    ]  # fmt: skip
    _table(("message_id", "topic", "broker", "stored (UTC)", "checks", "state"), rows)


@_command
def _transactions_resolve(args: argparse.Namespace) -> None:
    from popmq.pb.admin.v1 import admin_pb2 as a

    request = a.ResolveTransactionRequest(message_id=args.message_id, commit=args.commit)
    response = _call(args, "ResolveTransaction", request)
    if args.json:
        _print_json(response)
        return
    done = "committed" if args.commit else "rolled back"
    print(f"{done} message {args.message_id} of topic {_shown(args, response.topic)} on "
          f"broker {response.broker}")  # fmt: skip


@_command
def _groups_delete(args: argparse.Namespace) -> None:
    from popmq.pb.admin.v1 import admin_pb2 as a

    request = a.DeleteGroupRequest(
        name=args.name, clean_offsets=args.clean_offsets, force=args.force
    )
    response = _call(args, "DeleteGroup", request)
    if args.json:
        _print_json(response)
        return
    print(f"deleted group {_shown(args, args.name)} from {len(response.brokers)} brokers "
          f"({', '.join(response.brokers)}); {response.offsets_removed} offsets removed, "
          f"{response.inflight} messages still in flight")  # fmt: skip


@_command
def _groups_get(args: argparse.Namespace) -> None:
    from popmq.pb.admin.v1 import admin_pb2 as a

    _print_group(args, _call(args, "GetGroup", a.GetGroupRequest(name=args.name)))


def _update_request(args: argparse.Namespace) -> Any:
    from popmq.pb.admin.v1 import admin_pb2 as a

    request = a.UpdateGroupRequest(name=args.name)
    if args.consume_mode:
        request.consume_mode = args.consume_mode.upper()
    if args.max_attempts is not None:
        request.max_attempts = args.max_attempts
    if args.retry_levels:
        if args.retry_levels == "default":
            request.reset_retry_levels = True
        else:
            request.retry_levels.extend(x.strip() for x in args.retry_levels.split(",") if x)
    if args.fifo is not None:
        request.fifo = args.fifo
    return request


@_command
def _groups_set(args: argparse.Namespace) -> None:
    _print_group(args, _call(args, "UpdateGroup", _update_request(args)))


@_command
def _set_consume_mode(args: argparse.Namespace) -> None:
    from popmq.pb.admin.v1 import admin_pb2 as a

    request = a.UpdateGroupRequest(name=args.name, consume_mode=args.mode.upper())
    _print_group(args, _call(args, "UpdateGroup", request))


@_command
def _clients(args: argparse.Namespace) -> None:
    import time

    response = _all_clients(args, args.group)
    if args.json:
        _print_json(response)
        return
    now = time.time()
    rows = [
        (c.client_id, c.client_type, c.group or "-", ",".join(c.topics) or "-",
         f"{c.language} {c.version}".strip(), c.peer, f"{now - c.last_seen:.0f}s ago")
        for c in response.clients
    ]  # fmt: skip
    print(f"clients of proxy {response.proxy}: {len(rows)}")
    _table(("client_id", "type", "group", "topics", "client", "peer", "last_seen"), rows)


# Metrics summarised by `popmq admin stats` (the rest with --raw).
_SUMMARY_PREFIXES = (
    "popmq_proxy_rpc_requests_total",
    "popmq_proxy_long_polls_total",
    "popmq_proxy_first_pop_hits_total",
    "popmq_proxy_empty_responses_total",
    "popmq_proxy_false_empty_responses_total",
    "popmq_proxy_pop_with_notify_total",
    "popmq_proxy_messages_delivered_total",
    "popmq_proxy_broker_rpcs_total",
    "popmq_proxy_held_notification_tasks",
    "popmq_proxy_adaptive_mode",
    "popmq_proxy_pop_request_rate",
    "popmq_proxy_adaptive_switches_total",
    "popmq_proxy_broker_rpc_errors_total",
    "popmq_proxy_released_messages_total",
    "popmq_proxy_broker_up",
)


@_command
def _stats(args: argparse.Namespace) -> None:
    from popmq.pb.admin.v1 import admin_pb2 as a

    text = _call(args, "Stats", a.StatsRequest()).prometheus_text
    if args.raw:
        print(text, end="")
        return
    from prometheus_client.parser import text_string_to_metric_families

    samples = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith(_SUMMARY_PREFIXES):
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
                samples.append((f"{sample.name}{{{labels}}}" if labels else sample.name,
                                sample.value))  # fmt: skip
    if args.json:
        print(json.dumps(dict(samples), indent=2, sort_keys=True))
        return
    _table(("metric", "value"), [(n, f"{v:g}") for n, v in samples])
