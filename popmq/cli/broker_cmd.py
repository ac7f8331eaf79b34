"""`popmq broker`: one broker (durable store + POP engine) behind its gRPC server.

Runs until SIGTERM or SIGINT, then stops taking calls (held long polls are released), stops the
broker (final flush) and exits 0. Once serving it prints one line on stdout,
``popmq broker NAME listening on HOST:PORT``, with the real port when --port is 0. With
--metrics-port it also serves Prometheus /metrics on HOST (the bound port is logged on stderr).

``popmq broker verify --data-dir DIR [--json]`` checks a data directory for damage without
changing anything (see popmq.broker.verify); exit code 0 when clean, 1 when damage was found,
2 when the directory cannot be read.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import socket
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from popmq.broker.contract.errors import RefusedError
from popmq.broker.contract.port import BrokerPort
from popmq.cli.common import config_from_args, start_tracing_for
from popmq.config import BrokerConfig
from popmq.event_loop import run as run_on_loop
from popmq.security.files import owner_only_new_files, warn_if_data_exposed

if TYPE_CHECKING:
    from popmq.broker.core import Broker
    from popmq.broker.leader_gate import LeaderGatedPort

log = logging.getLogger("popmq.broker")

WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", "[::]", ""})
# How long in-flight calls may finish after a stop signal before they are cancelled.
STOP_GRACE_S = 1.0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "broker",
        help="run one broker behind its gRPC server (cluster mode)",
        description="Run one popmq broker: a durable store with POP consumption, served over "
        "gRPC (popmq.broker.v1.BrokerService) for proxies in cluster mode.",
    )
    parser.add_argument("--name", help="broker name, unique in the cluster (default broker-a)")
    parser.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port to listen on; 0 picks a free one")
    parser.add_argument("--data-dir", help="directory of the broker's store (default ./data/NAME)")
    parser.add_argument(
        "--flush", choices=("sync", "async"), help="sync: a send returns after fsync"
    )
    parser.add_argument(
        "--metrics-port", type=int, help="serve Prometheus /metrics on this port (0: any)"
    )
    parser.add_argument("--tls-cert", metavar="FILE", help="TLS certificate (PEM) of the broker")
    parser.add_argument("--tls-key", metavar="FILE", help="its private key (PEM)")
    parser.add_argument(
        "--tls-client-ca", metavar="FILE",
        help="admit only callers with a client certificate signed by this CA (mutual TLS)",
    )  # fmt: skip
    parser.add_argument(
        "--cluster-token-file", metavar="FILE",
        help="admit only callers presenting this shared token (the proxies)",
    )  # fmt: skip
    parser.add_argument(
        "--handle-keys-file", metavar="FILE",
        help="receipt-handle keyring to use (default DATA_DIR/handle-keys.json, made on start)",
    )  # fmt: skip
    ha = parser.add_argument_group(
        "broker groups (high availability; see docs/operations.md)",
        "With --etcd the broker registers in etcd and elects its group's leader there; with "
        "--replication the nodes copy the leader and fail over by themselves. Without --etcd "
        "nothing changes (a group of one).",
    )
    ha.add_argument("--etcd", metavar="URL[,URL...]", help="etcd client URLs (http://HOST:PORT)")
    ha.add_argument(
        "--group",
        help="the broker group this node belongs to (the name proxies see); --name is then "
        "the node's name in it",
    )
    ha.add_argument(
        "--unclean-election", action="store_true", default=None,
        help="let a node outside the in-sync set become leader (may lose acknowledged writes)",
    )  # fmt: skip
    ha.add_argument(
        "--advertise", metavar="HOST:PORT",
        help="address proxies reach this node at (default: --host and the bound port)",
    )  # fmt: skip
    replication = parser.add_argument_group("replication (a broker group of several nodes)")
    replication.add_argument(
        "--replication", choices=("off", "sync", "async"),
        help="copy this broker to followers; sync: answer writes once --min-in-sync nodes "
        "have them (default off: a group of one)",
    )  # fmt: skip
    replication.add_argument(
        "--min-in-sync", type=int, metavar="N",
        help="nodes (this one counted) that must hold a write; fewer: sends are refused",
    )  # fmt: skip
    replication.add_argument(
        "--role", choices=("leader", "follower"), help="static role (without an election)"
    )
    replication.add_argument("--epoch", type=int, help="the leader's epoch (static role)")
    replication.add_argument(
        "--leader", metavar="HOST:PORT", help="the leader a follower copies (static role)"
    )
    replication.add_argument(
        "--node-name", help="this node's name in the in-sync set (default NAME@HOST:PORT)"
    )
    # Also accepted after the subcommand; SUPPRESS keeps the top-level values when absent.
    parser.add_argument(
        "--config", default=argparse.SUPPRESS, metavar="FILE",
        help="YAML/JSON config file (see docs/operations.md); flags and --set override it",
    )  # fmt: skip
    parser.add_argument(
        "--set", action="append", default=argparse.SUPPRESS, metavar="KEY=VALUE",
        help="override a config field, e.g. --set broker.pop.time_scale=0.01",
    )  # fmt: skip
    parser.set_defaults(func=run)
    commands = parser.add_subparsers(dest="broker_command", metavar="{verify}")
    verify = commands.add_parser(
        "verify",
        help="check a data directory for damage, changing nothing",
        description="Check a broker's data directory (commitlog frames, queue indexes against "
        "the commitlog, metadata checksums, pop journal) without changing anything. Safe on a "
        "stopped broker's directory; exit code 1 when damage was found.",
    )
    verify.add_argument("--data-dir", help="the data directory (default: broker.data_dir)")
    verify.add_argument("--json", action="store_true", help="print the report as JSON")
    verify.set_defaults(func=run_verify)


def run_verify(args: argparse.Namespace) -> int:
    from popmq.broker.verify import format_table, verify

    data_dir = args.data_dir or config_from_args(args, {}).broker.data_dir
    try:
        report = verify(data_dir)
    except OSError as error:
        print(f"popmq broker verify: {error}", file=sys.stderr)
        return 2
    print(json.dumps(report.to_json(), indent=2) if args.json else format_table(report))
    return 1 if report.damaged else 0


def run(args: argparse.Namespace) -> int:
    config = config_from_args(
        args,
        {
            "broker.name": args.name,
            "broker.host": args.host,
            "broker.port": args.port,
            "broker.data_dir": args.data_dir,
            "broker.store.flush": args.flush,
            "broker.metrics_port": args.metrics_port,
            "broker.tls.cert": args.tls_cert,
            "broker.tls.key": args.tls_key,
            "broker.tls.client_ca": args.tls_client_ca,
            "broker.cluster_token_file": args.cluster_token_file,
            "broker.handle_keys_file": args.handle_keys_file,
            "broker.etcd.endpoints": args.etcd,
            "broker.group.name": args.group,
            "broker.group.unclean_election": args.unclean_election,
            "broker.group.advertise": args.advertise,
            "broker.replication.mode": args.replication,
            "broker.replication.min_in_sync": args.min_in_sync,
            "broker.replication.role": args.role,
            "broker.replication.epoch": args.epoch,
            "broker.replication.leader": args.leader,
            "broker.replication.node": args.node_name,
        },
    )
    if not logging.getLogger().handlers:
        logging.basicConfig(
            level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s"
        )
    owner_only_new_files()  # the data directory and every file in it: 0700 / 0600
    warn_if_data_exposed(config.broker.data_dir)  # one made before, with looser modes
    stop_tracing = start_tracing_for(config, "popmq-broker")
    try:
        run_on_loop(serve_broker(config.broker, announce=_announce), config.server.event_loop)
    except (OSError, RefusedError, ValueError) as error:  # port taken, data dir locked, bad keys
        print(f"popmq broker: {error.message if isinstance(error, RefusedError) else error}",
              file=sys.stderr)  # fmt: skip
        return 2  # a user's error: one line, exit 2
    finally:
        if stop_tracing is not None:
            stop_tracing()
    return 0


async def _serve_node(
    config: BrokerConfig, announce: Callable[[str], None], stop: asyncio.Event
) -> None:
    """A node of a replicated group, its role from the flags (static)."""
    import anyio

    from popmq.broker.replication.node import ReplicatedNode, role_from_config
    from popmq.broker.replication.role import StaticRoleSource
    from popmq.metrics_http import metrics_endpoint

    node = ReplicatedNode(config, StaticRoleSource(role_from_config(config)))
    await node.start()
    try:
        with metrics_endpoint(config.metrics_port, node.metrics_registry(), config.host) as http:
            if http is not None:  # stderr only: stdout's first line is the contract
                log.info("metrics on http://%s:%d/metrics", config.host, http.server_port)
            async with anyio.create_task_group() as group:
                group.start_soon(node.run)
                log.info("node %s of broker %s, %s (static role)", node.node, config.name,
                         config.replication.role)  # fmt: skip
                announce(f"popmq broker {config.name} listening on {config.host}:{node.bound_port}")
                await stop.wait()
                log.info("stopping broker %s (node %s)", config.name, node.node)
                await node.aclose(STOP_GRACE_S)
                group.cancel_scope.cancel()
    finally:
        await node.aclose(STOP_GRACE_S)


def _advertised(config: BrokerConfig, bound_port: int) -> str:
    if config.group.advertise:
        return config.group.advertise
    if config.host in WILDCARD_HOSTS:
        # Listening everywhere: proxies need a name that reaches this host (a pod's FQDN).
        return f"{socket.getfqdn()}:{bound_port}"
    return f"{config.host}:{bound_port}"


async def _serve_elected_node(
    config: BrokerConfig, announce: Callable[[str], None], stop: asyncio.Event
) -> None:
    """A node of a replicated group whose role the group's election in etcd decides: it
    copies the leader while it follows, campaigns when the group has no leader (if it is in
    sync), and stops acknowledging when its lease deadline passes."""
    import anyio

    from popmq.broker.leader_gate import GroupCollector
    from popmq.broker.replication.etcd_role import ElectedRoleSource, publish_lag
    from popmq.broker.replication.node import ReplicatedNode
    from popmq.coord.etcd import EtcdStore
    from popmq.coord.group import MemberSettings, join_group
    from popmq.metrics_http import metrics_endpoint

    config = config.as_group_node()
    node = ReplicatedNode(config)
    await node.start()
    store = EtcdStore(config.etcd.endpoints, timeout_s=config.etcd.request_timeout_s)
    try:
        settings = MemberSettings(
            group=config.name,
            name=node.node,
            address=_advertised(config, node.bound_port),
            prefix=config.etcd.prefix,
            lease_ttl_s=config.etcd.lease_ttl_s,
            unclean_election=config.group.unclean_election,
        )
        registry = node.metrics_registry(role_gauges=False)  # GroupCollector has them
        with metrics_endpoint(config.metrics_port, registry, config.host) as http:
            if http is not None:  # stderr only: stdout's first line is the contract
                log.info("metrics on http://%s:%d/metrics", config.host, http.server_port)
            async with (
                join_group(store, settings, node.holds_whole_copy, node.holds_data) as member,
                anyio.create_task_group() as group,
            ):
                registry.register(GroupCollector(member))
                group.start_soon(node.run, ElectedRoleSource(member))
                group.start_soon(publish_lag, member, lambda: node.leader)
                log.info("node %s of group %s joined the election in etcd (%s, min in sync "
                         "%d)", node.node, config.name, config.replication.mode,
                         config.replication.min_in_sync)  # fmt: skip
                announce(f"popmq broker {config.name} listening on {config.host}:{node.bound_port}")
                await stop.wait()
                log.info("stopping broker %s (node %s)", config.name, node.node)
                await node.aclose(STOP_GRACE_S)
                group.cancel_scope.cancel()
    finally:
        await node.aclose(STOP_GRACE_S)
        await store.aclose()


def _announce(line: str) -> None:
    print(line, flush=True)


async def serve_broker(
    config: BrokerConfig,
    *,
    announce: Callable[[str], None] = _announce,
    stop: asyncio.Event | None = None,
) -> None:
    """Serve until `stop` is set (default: until SIGTERM/SIGINT)."""
    # Imported here so `popmq --help` works while a broker module fails to import.
    from popmq.broker.core import Broker
    from popmq.broker.leader_gate import LeaderGatedPort
    from popmq.broker.local import LocalBrokerPort
    from popmq.broker.wire.server import BrokerGrpcServer
    from popmq.metrics_http import metrics_endpoint

    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    signals = (signal.SIGTERM, signal.SIGINT)
    for signum in signals:
        loop.add_signal_handler(signum, stop.set)
    grouped = bool(config.etcd.endpoints)
    # In a group every node stores under the group's name: it is what receipt handles and
    # proxies call the broker, whichever node leads.
    core_config = config.model_copy(update={"name": config.group.name or config.name})
    try:
        if config.replication.mode != "off":
            if grouped:
                await _serve_elected_node(config, announce, stop)
            else:
                await _serve_node(config, announce, stop)
            return
        # Started in order, closed in reverse: the metrics endpoint, the server, the broker.
        async with contextlib.AsyncExitStack() as stack:
            broker = await stack.enter_async_context(Broker(core_config if grouped else config))
            port: BrokerPort = LocalBrokerPort(broker)
            gate = LeaderGatedPort(port, config.replication) if grouped else None
            server = BrokerGrpcServer(gate or port, config.host, config.port, config=config)
            await server.start()
            stack.push_async_callback(server.aclose, STOP_GRACE_S)
            http = stack.enter_context(
                metrics_endpoint(config.metrics_port, broker.metrics.registry, config.host)
            )
            if http is not None:  # stderr only: stdout's first line is the contract
                log.info("metrics on http://%s:%d/metrics", config.host, http.server_port)
            address = f"{config.host}:{server.bound_port}"
            if gate is None:
                announce(f"popmq broker {config.name} listening on {address}")
                await stop.wait()
            else:
                await _serve_in_group(config, gate, broker, address, announce, stop)
            log.info("stopping broker %s", config.name)
    finally:
        for signum in signals:
            loop.remove_signal_handler(signum)


async def _serve_in_group(
    config: BrokerConfig,
    gate: LeaderGatedPort,
    broker: Broker,
    address: str,
    announce: Callable[[str], None],
    stop: asyncio.Event,
) -> None:
    """Be a member of the group (elections, fencing) until `stop`; the lease is revoked on
    the way out so another node takes over at once."""
    from popmq.broker.leader_gate import GroupCollector
    from popmq.coord.etcd import EtcdStore
    from popmq.coord.group import MemberSettings, join_group

    group = config.group.name or config.name
    if config.host in WILDCARD_HOSTS and not config.group.advertise:
        # Listening everywhere: proxies need a name that reaches this host (a pod's FQDN).
        address = f"{socket.getfqdn()}:{address.rsplit(':', 1)[1]}"
    settings = MemberSettings(
        group=group,
        name=config.name,
        address=config.group.advertise or address,
        prefix=config.etcd.prefix,
        lease_ttl_s=config.etcd.lease_ttl_s,
        unclean_election=config.group.unclean_election,
    )
    store = EtcdStore(config.etcd.endpoints, timeout_s=config.etcd.request_timeout_s)
    try:
        async with join_group(store, settings) as member:
            gate.member = member
            collector = GroupCollector(member)
            broker.metrics.registry.register(collector)
            announce(f"popmq broker {config.name} listening on {address}")
            log.info("node %s of group %s registered in etcd", config.name, group)
            try:
                await stop.wait()
            finally:
                broker.metrics.registry.unregister(collector)
    finally:
        await store.aclose()
