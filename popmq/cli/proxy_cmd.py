"""`popmq serve` (proxy + embedded brokers, one process) and `popmq proxy` (cluster mode).

Both run until SIGTERM or SIGINT and exit 0 after a clean stop. Once serving they print
``popmq proxy listening on HOST:PORT`` (the real port when --port is 0).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Coroutine
from typing import Any

from popmq.cli.common import config_from_args, start_tracing_for
from popmq.config import BrokerAddress, PopmqConfig
from popmq.event_loop import run as run_on_loop
from popmq.gc_tuning import tune_for_serving
from popmq.security.files import owner_only_new_files, warn_if_data_exposed


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port to listen on (default 8081; 0: any)")
    parser.add_argument(
        "--advertise", metavar="HOST[:PORT]",
        help="address written into routes, if clients reach the proxy by another one",
    )  # fmt: skip
    parser.add_argument("--metrics-port", type=int, help="serve Prometheus /metrics on this port")
    parser.add_argument(
        "--strategy", choices=("pop", "slices", "notify", "adaptive"),
        help="long-polling strategy (default adaptive)",
    )  # fmt: skip
    parser.add_argument(
        "--acl", metavar="FILE",
        help="users, keys and permissions (YAML); without it anyone may do anything",
    )  # fmt: skip
    parser.add_argument("--tls-cert", metavar="FILE", help="TLS certificate (PEM) of the proxy")
    parser.add_argument("--tls-key", metavar="FILE", help="its private key (PEM)")
    parser.add_argument(
        "--tls-client-ca", metavar="FILE", help="require client certificates signed by this CA"
    )
    parser.add_argument(
        "--admin-port", type=int, help="serve the admin API on this port only (0: any free one)"
    )
    parser.add_argument(
        "--config", default=argparse.SUPPRESS, metavar="FILE",
        help="YAML/JSON config file (see docs/operations.md); flags and --set override it",
    )  # fmt: skip
    parser.add_argument(
        "--set", action="append", default=argparse.SUPPRESS, metavar="KEY=VALUE",
        help="override a config field, e.g. --set proxy.min_long_polling_ms=2000",
    )  # fmt: skip


def register(subparsers: argparse._SubParsersAction) -> None:
    serve = subparsers.add_parser(
        "serve",
        help="run a proxy with embedded brokers (one process)",
        description="Run the popmq proxy with N embedded brokers in one process; data in "
        "DATA_DIR/broker-<i>. Point RocketMQ 5 clients at HOST:PORT.",
    )
    _common(serve)
    serve.add_argument("--brokers", type=int, help="number of embedded brokers (default 3)")
    serve.add_argument("--data-dir", help="directory for the brokers' data (default ./data)")
    serve.add_argument(
        "--console-port", type=int, metavar="PORT",
        help="web console on 127.0.0.1:PORT (default 8080; 0: no console)",
    )  # fmt: skip
    serve.set_defaults(func=run_serve)

    proxy = subparsers.add_parser(
        "proxy",
        help="run a proxy in front of remote brokers (cluster mode)",
        description="Run a stateless popmq proxy in front of `popmq broker` processes.",
    )
    _common(proxy)
    proxy.add_argument(
        "--broker", action="append", metavar="NAME=HOST:PORT",
        help="a broker to front (repeat for each)",
    )  # fmt: skip
    proxy.add_argument(
        "--etcd", metavar="URL[,URL...]",
        help="follow the broker groups registered in this etcd (their leaders), no broker list",
    )  # fmt: skip
    proxy.add_argument(
        "--workers", type=int, metavar="N",
        help="run N proxy processes sharing the port (SO_REUSEPORT; default 1)",
    )  # fmt: skip
    proxy.add_argument(
        "--cluster-token-file", metavar="FILE",
        help="the brokers' cluster token (the file given to `popmq broker`)",
    )  # fmt: skip
    proxy.add_argument(
        "--broker-tls-ca", metavar="FILE", help="reach brokers over TLS, trusting this CA"
    )
    proxy.add_argument("--broker-tls-cert", metavar="FILE", help="client certificate for brokers")
    proxy.add_argument("--broker-tls-key", metavar="FILE", help="its private key")
    proxy.set_defaults(func=run_proxy)


def _overrides(args: argparse.Namespace) -> dict[str, object]:
    overrides: dict[str, object] = {
        "proxy.host": args.host,
        "proxy.port": args.port,
        "proxy.metrics_port": args.metrics_port,
        "proxy.strategy": args.strategy,
        "proxy.acl": args.acl,
        "proxy.tls.cert": args.tls_cert,
        "proxy.tls.key": args.tls_key,
        "proxy.tls.client_ca": args.tls_client_ca,
        "proxy.admin_port": args.admin_port,
    }
    if args.advertise:
        host, _, port = args.advertise.partition(":")
        overrides["proxy.advertise_host"] = host
        overrides["proxy.advertise_port"] = int(port) if port else None
    return overrides


def _setup_logging() -> None:
    if not logging.getLogger().handlers:
        logging.basicConfig(
            level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s"
        )


def _announce(line: str) -> None:
    print(line, flush=True)


def run_serve(args: argparse.Namespace) -> int:
    overrides = _overrides(args)
    overrides["serve.brokers"] = args.brokers
    overrides["serve.data_dir"] = args.data_dir
    overrides["serve.console_port"] = args.console_port
    config = config_from_args(args, overrides)
    refuse_broker_groups(config)
    _setup_logging()
    owner_only_new_files()  # its brokers' data directories and files: 0700 / 0600
    warn_if_data_exposed(config.serve.data_dir)  # one made before, with looser modes
    from popmq.proxy.runtime import run_serve as serve

    if not config.serve.console_port:
        return _run("serve", config, serve(config, _announce))
    from popmq.cli.console_cmd import serve_with_console

    with_console = serve_with_console(
        lambda announce, stop: serve(config, announce, stop),
        config.serve.console_port, config.proxy.tls.cert is not None, _announce,
        config.console.trusted_proxies,
    )  # fmt: skip
    return _run("serve", config, with_console)


def refuse_broker_groups(config: PopmqConfig) -> None:
    """`popmq serve`'s embedded brokers are never replicated nor elected: settings that ask for
    it are refused, not ignored (a user would believe writes are copied when they are not)."""
    broker = config.broker
    asked = []
    if broker.replication.mode != "off":
        asked.append(f"broker.replication.mode={broker.replication.mode}")
    if broker.group.name is not None:
        asked.append(f"broker.group.name={broker.group.name}")
    if broker.etcd.endpoints:
        asked.append("broker.etcd.endpoints")
    if config.proxy.etcd.endpoints:  # its proxy would follow etcd's groups beside its brokers
        asked.append("proxy.etcd.endpoints")
    if asked:
        raise SystemExit(
            f"{', '.join(asked)}: popmq serve runs embedded brokers without replication or "
            "etcd; run replicated groups as `popmq broker --etcd URL --group G --replication "
            "sync` behind `popmq proxy --etcd URL`, or remove these settings"
        )


def run_proxy(args: argparse.Namespace) -> int:
    overrides = _overrides(args)
    if args.broker:
        try:
            brokers = [BrokerAddress.parse(text).model_dump() for text in args.broker]
        except ValueError as exc:
            raise SystemExit(str(exc)) from None
        overrides["proxy.brokers"] = brokers
    overrides["proxy.workers"] = args.workers
    overrides["proxy.etcd.endpoints"] = args.etcd
    overrides["proxy.broker_link.cluster_token_file"] = args.cluster_token_file
    if args.broker_tls_ca or args.broker_tls_cert:
        overrides["proxy.broker_link.tls"] = True
    overrides["proxy.broker_link.ca"] = args.broker_tls_ca
    overrides["proxy.broker_link.cert"] = args.broker_tls_cert
    overrides["proxy.broker_link.key"] = args.broker_tls_key
    config = config_from_args(args, overrides)
    _setup_logging()
    if config.proxy.workers > 1:
        from popmq.cli.workers import run_workers

        return run_on_loop(run_workers(config, sys.argv[1:], _announce), config.server.event_loop)
    from popmq.proxy.runtime import run_cluster_proxy

    return _run("proxy", config, run_cluster_proxy(config, _announce))


def _run(command: str, config: PopmqConfig, main: Coroutine[Any, Any, None]) -> int:
    """Run `main` (with tracing when configured; buffered spans are flushed at the end)."""
    try:
        stop_tracing = start_tracing_for(config, f"popmq-{command}")
    except BaseException:
        main.close()
        raise
    tune_for_serving()  # a long-poll server's object churn: see popmq.gc_tuning
    try:
        run_on_loop(main, config.server.event_loop)
    except ValueError as exc:  # a bad ACL, certificate or token file: say which, no traceback
        print(f"popmq {command}: {exc}", file=sys.stderr)
        return 2  # a user's error: one line, exit 2
    finally:
        if stop_tracing is not None:
            stop_tracing()
    return 0
