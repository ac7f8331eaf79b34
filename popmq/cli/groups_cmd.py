"""Broker groups in etcd, for operators (registered under `popmq admin` by admin_cmd):

    popmq admin cluster status --etcd URL [--json]    leaders, epochs, in-sync sets, nodes
    popmq admin brokers drain GROUP --etcd URL [--wait S]   no new sends; report when empty
    popmq admin brokers undrain GROUP --etcd URL
    popmq admin brokers remove GROUP --etcd URL [--force]

These read and write etcd directly (the proxies follow within seconds), so they work while
every proxy is down. ``--etcd`` defaults to the env POPMQ_ETCD.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from popmq.cli.failures import UserError
from popmq.cli.tables import print_table
from popmq.coord.directory import GroupView, read_groups, status_json
from popmq.coord.keys import DEFAULT_PREFIX, GroupKeys, encode, groups_prefix
from popmq.coord.store import CoordStore, CoordUnavailableError

DRAIN_POLL_S = 2.0


def _etcd_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--etcd", metavar="URL[,URL...]", default=os.environ.get("POPMQ_ETCD"),
        help="etcd client URLs (env POPMQ_ETCD)",
    )  # fmt: skip
    parser.add_argument(
        "--etcd-prefix", default=DEFAULT_PREFIX, help=f"key prefix (default {DEFAULT_PREFIX})"
    )


def add_status_options(status: argparse.ArgumentParser) -> None:
    """`cluster status --etcd`: the groups' view from etcd instead of the proxy's."""
    _etcd_options(status)


def register(commands: argparse._SubParsersAction) -> None:
    brokers = commands.add_parser("brokers", help="drain or remove broker groups (etcd)")
    verbs = brokers.add_subparsers(dest="brokers_command", required=True)
    drain = verbs.add_parser(
        "drain", help="stop new sends to a group; report when its messages are consumed",
        description="Mark GROUP draining in etcd: proxies send it nothing new but keep "
        "serving its messages (receives, acks). With --wait, ask the group's leader every "
        "few seconds until every consumer group has consumed and acked everything on it.",
    )  # fmt: skip
    drain.add_argument("group", help="the broker group (its name in etcd)")
    drain.add_argument(
        "--wait", type=float, metavar="SECONDS", default=0.0,
        help="wait up to this long for the group to be empty (exit 1 if not)",
    )  # fmt: skip
    drain.add_argument(
        "--cluster-token-file", metavar="FILE",
        help="the brokers' cluster token, to ask the leader (with --wait)",
    )  # fmt: skip
    drain.set_defaults(func=_drain)
    undrain = verbs.add_parser("undrain", help="let a drained group take sends again")
    undrain.add_argument("group", help="the broker group")
    undrain.set_defaults(func=_undrain)
    remove = verbs.add_parser(
        "remove", help="take a group out of the cluster (its keys in etcd)",
        description="Delete GROUP's keys from etcd; proxies stop routing to it. Refused while "
        "a node of the group is still registered (stop them first) and, unless --force, "
        "while the group is not draining.",
    )  # fmt: skip
    remove.add_argument("group", help="the broker group")
    remove.add_argument("--force", action="store_true", help="remove even if not drained")
    remove.set_defaults(func=_remove)
    for parser in (drain, undrain, remove):
        _etcd_options(parser)


def _run(args: argparse.Namespace, work: Callable[[CoordStore], Awaitable[int]]) -> int:
    from popmq.coord.etcd import EtcdStore

    if not args.etcd:
        raise UserError("give --etcd URL[,URL...] (or set POPMQ_ETCD)")
    endpoints = [url.strip() for url in args.etcd.split(",") if url.strip()]

    async def main() -> int:
        store = EtcdStore(endpoints)
        try:
            return await work(store)
        except CoordUnavailableError as exc:
            raise UserError(f"etcd: {exc.message}") from None
        finally:
            await store.aclose()

    return asyncio.run(main())


async def _groups(store: CoordStore, prefix: str) -> dict[str, GroupView]:
    kvs, _ = await store.get_prefix(groups_prefix(prefix))
    return read_groups(prefix, kvs)


def cluster_status(args: argparse.Namespace) -> int:
    async def work(store: CoordStore) -> int:
        groups = await _groups(store, args.etcd_prefix)
        status: dict[str, Any] = status_json(groups)
        if args.json:
            print(json.dumps(status, indent=2))
        else:
            rows = []
            for group in status["groups"]:
                for node in group["nodes"]:
                    rows.append((group["name"], group["epoch"], node["name"], node["role"],
                                 "yes" if node["name"] in group["in_sync"] else "no",
                                 _dash(node["lag_bytes"]), _dash(node["lag_s"]),
                                 "draining" if group["draining"] else ""))  # fmt: skip
            print_table(("group", "epoch", "node", "role", "in_sync", "lag_bytes", "lag_s",
                         "state"), rows, title=f"{len(groups)} broker groups")  # fmt: skip
        leaderless = [g["name"] for g in status["groups"] if g["leader"] is None]
        if leaderless:  # exit 1, so scripts notice
            print(f"error: groups without a leader: {', '.join(leaderless)}", file=sys.stderr)
            return 1
        return 0

    return _run(args, work)


def _dash(value: object) -> object:
    return "-" if value is None else value


def _drain(args: argparse.Namespace) -> int:
    async def work(store: CoordStore) -> int:
        keys = GroupKeys(args.etcd_prefix, args.group)
        groups = await _groups(store, args.etcd_prefix)
        if args.group not in groups:
            raise UserError(f"no broker group {args.group!r} in etcd")
        await store.put(keys.drain, encode({"since": time.time()}))
        print(f"group {args.group} is draining: proxies send it nothing new")
        if args.wait <= 0:
            return 0
        deadline = time.monotonic() + args.wait
        while True:
            view = (await _groups(store, args.etcd_prefix)).get(args.group)
            left = await _remaining(view, args.cluster_token_file) if view else None
            if left is not None and not left:
                print(f"group {args.group} is empty: every message on it was consumed and acked")
                return 0
            if time.monotonic() >= deadline:
                what = "no leader to ask" if left is None else "; ".join(left)
                print(f"group {args.group} is not empty yet: {what}")
                return 1
            await asyncio.sleep(DRAIN_POLL_S)

    return _run(args, work)


async def _remaining(view: GroupView, token_file: str | None) -> list[str] | None:
    """What is still unconsumed on the group's leader, per (consumer group, topic); None if
    there is no leader to ask."""
    from popmq.broker.contract.types import SYSTEM_PREFIX
    from popmq.broker.wire.remote import RemoteBrokerPort
    from popmq.config import BrokerLinkConfig

    if view.leader is None:
        return None
    link = BrokerLinkConfig(cluster_token_file=token_file) if token_file else None
    port = RemoteBrokerPort(view.name, view.leader.address, link=link)
    left: list[str] = []
    try:
        groups = await port.list_groups()
        topics = [t.name for t in await port.list_topics() if not t.name.startswith(SYSTEM_PREFIX)]
        for summary in groups:
            for topic in topics:
                stats = await port.group_stats(summary.config.name, topic)
                touched = [s for s in stats if s.consumer_offset >= 0 or s.inflight]
                backlog = sum(s.backlog + s.inflight for s in touched)
                if backlog:
                    left.append(f"{summary.config.name} on {topic}: {backlog}")
    except Exception as exc:  # the leader is the operator's to fix; say what happened
        return [f"cannot ask leader {view.leader.name}: {exc}"]
    finally:
        await port.aclose()
    return left


def _undrain(args: argparse.Namespace) -> int:
    async def work(store: CoordStore) -> int:
        await store.delete(GroupKeys(args.etcd_prefix, args.group).drain)
        print(f"group {args.group} takes sends again")
        return 0

    return _run(args, work)


def _remove(args: argparse.Namespace) -> int:
    async def work(store: CoordStore) -> int:
        view = (await _groups(store, args.etcd_prefix)).get(args.group)
        if view is None:
            raise UserError(f"no broker group {args.group!r} in etcd")
        if view.members:
            raise UserError(f"group {args.group} still has running nodes "
                            f"({', '.join(sorted(view.members))}): stop them first")  # fmt: skip
        if not view.draining and not args.force:
            raise UserError(f"group {args.group} is not draining: drain it first "
                            "(`popmq admin brokers drain`), or --force")  # fmt: skip
        prefix = GroupKeys(args.etcd_prefix, args.group).root
        kvs, _ = await store.get_prefix(prefix)
        for kv in kvs:
            await store.delete(kv.key)
        print(f"group {args.group} removed ({len(kvs)} keys); proxies stop routing to it")
        return 0

    return _run(args, work)
