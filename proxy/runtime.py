"""Running a proxy as a process: embedded brokers (`popmq serve`) or remote ones
(`popmq proxy`), the metrics endpoint, and a clean stop on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
from popmq.broker.contract.port import BrokerPort
from popmq.proxy.broker_watch import watch_brokers
from popmq.proxy.discovery import GroupFollower
from popmq.proxy.metrics import ProxyMetrics
from popmq.proxy.server import ProxyServer
from prometheus_client import CollectorRegistry

from popmq.config import PopmqConfig
from popmq.coord.store import CoordStore, CoordUnavailableError
from popmq.metrics_http import metrics_endpoint

log = logging.getLogger("popmq.proxy")

STOP_GRACE_S = 1.0
INITIAL_SYNC_S = 5.0


def embedded_broker_names(count: int) -> list[str]:
    return [f"broker-{i}" for i in range(count)]


@contextlib.asynccontextmanager
async def embedded_brokers(config: PopmqConfig) -> AsyncIterator[list[BrokerPort]]:
    """Start config.serve.brokers brokers in this process, data in DATA_DIR/<name>."""
    from popmq.broker.core import Broker
    from popmq.broker.local import LocalBrokerPort

    async with contextlib.AsyncExitStack() as stack:
        started: list[Broker] = []
        for name in embedded_broker_names(config.serve.brokers):
            broker_config = config.broker.model_copy(
                update={"name": name, "data_dir": config.serve.data_dir / name}
            )
            broker = Broker(broker_config)
            await broker.start()
            stack.push_async_callback(_close_logged, broker)  # closed in reverse order
            started.append(broker)
        yield [LocalBrokerPort(broker) for broker in started]


async def _close_logged(broker: Any) -> None:
    """One broker failing to close must not keep the others open."""
    try:
        await broker.aclose()
    except Exception:
        log.exception("broker %s did not stop cleanly", broker)


def remote_brokers(config: PopmqConfig) -> list[BrokerPort]:
    from popmq.broker.wire.remote import RemoteBrokerPort

    if not config.proxy.brokers and not config.proxy.etcd.endpoints:
        raise SystemExit("popmq proxy needs --etcd URL or at least one --broker NAME=HOST:PORT")
    link = config.proxy.broker_link
    return [RemoteBrokerPort(b.name, b.address, link=link) for b in config.proxy.brokers]


def embedded_registries(ports: list[BrokerPort]) -> list[CollectorRegistry]:
    """The metrics registries of the brokers behind in-process ports (none for remote ones)."""
    # Not imported here: `popmq proxy` would load the whole broker (store, pop engine,
    # cryptography: ~10 MiB per proxy process) only to find no in-process port.
    local = sys.modules.get("popmq.broker.local")
    if local is None:  # no in-process broker was ever made in this process
        return []
    return [
        port.broker.metrics.registry for port in ports if isinstance(port, local.LocalBrokerPort)
    ]


async def serve_proxy(
    config: PopmqConfig,
    ports: list[BrokerPort],
    *,
    announce: Callable[[str], None],
    stop: asyncio.Event,
) -> None:
    metrics = ProxyMetrics(cluster=config.proxy.cluster)
    proxy = config.proxy
    # `popmq serve`: the embedded brokers' metrics are served on the proxy's endpoint too.
    brokers = embedded_registries(ports)
    registry = metrics.registry
    if brokers:  # imported here: the broker's metrics module brings its store's types along
        from popmq.broker.metrics import merged_registry

        registry = merged_registry([metrics.registry, *brokers])
    metrics_port = proxy.metrics_port
    default_port = metrics_port is None and bool(brokers) and config.serve.metrics_port is not None
    if default_port:  # `popmq serve`: metrics on by default
        metrics_port = config.serve.metrics_port
    # Closed in reverse: the broker watch, the server, the metrics endpoint.
    async with contextlib.AsyncExitStack() as stack:
        http = stack.enter_context(
            metrics_endpoint(metrics_port, registry, proxy.host, any_port_if_taken=default_port)
        )
        server = ProxyServer(config, ports, metrics=metrics)
        # `popmq proxy --etcd`: brokers are the groups registered in etcd, followed live.
        store = follower = None
        if proxy.etcd.endpoints:
            from popmq.coord.etcd import EtcdStore  # httpx (and rich, click) only with etcd

            store = EtcdStore(proxy.etcd.endpoints, timeout_s=proxy.etcd.request_timeout_s)
            stack.push_async_callback(store.aclose)
            follower = await _follow_etcd_first(config, server, store)
            # Old leaders' ports, closed after the server (which closes the current ones).
            stack.push_async_callback(follower.close_retired, all_now=True)
        await server.start()
        stack.push_async_callback(server.aclose, STOP_GRACE_S)
        # The runtime's own task group: the broker watch ends with it, before the server.
        async with anyio.create_task_group() as group:
            if follower is not None and store is not None:
                group.start_soon(follower.follow, store, proxy.etcd.prefix)
            if proxy.brokers and not brokers:  # cluster mode: say when one is unreachable
                group.start_soon(watch_brokers, proxy.brokers, metrics, proxy.broker_link)
            else:
                for port in ports:
                    metrics.broker_up(port.name, True)
            if http is not None:
                url = f"http://{proxy.host}:{http.server_port}/metrics"
                log.info("metrics on %s", url)
                announce(f"popmq metrics on {proxy.host}:{http.server_port} ({url})")
            announce(f"popmq proxy listening on {proxy.host}:{server.port}")
            if server.admin_port is not None:
                announce(f"popmq admin listening on {proxy.host}:{server.admin_port}")
            await stop.wait()
            log.info("stopping proxy")
            group.cancel_scope.cancel()


async def _follow_etcd_first(
    config: PopmqConfig, server: ProxyServer, store: CoordStore
) -> GroupFollower:
    """A GroupFollower for the server's cluster, with the groups read once (bounded: a proxy
    whose etcd is down still starts, and follows once it answers)."""
    from popmq.broker.contract.errors import Code
    from popmq.broker.wire.remote import RemoteBrokerPort
    from popmq.proxy.discovery import GroupFollower

    link = config.proxy.broker_link
    cluster = server.cluster
    follower = GroupFollower(
        cluster,
        lambda group, address: RemoteBrokerPort(
            group, address, link=link, unreachable_code=Code.HA_NOT_AVAILABLE
        ),
        lambda: server.metrics.watch_links(cluster.ports),
        server.metrics.broker_up,
    )
    with anyio.move_on_after(INITIAL_SYNC_S):
        try:
            await follower.sync(store, config.proxy.etcd.prefix)
        except CoordUnavailableError as exc:
            log.warning("etcd unreachable at start (following once it answers): %s",
                        exc.message)  # fmt: skip
    return follower


@contextlib.contextmanager
def stop_on_signals(stop: asyncio.Event) -> Any:
    loop = asyncio.get_running_loop()
    signals = (signal.SIGTERM, signal.SIGINT)
    for signum in signals:
        loop.add_signal_handler(signum, stop.set)
    try:
        yield
    finally:
        for signum in signals:
            loop.remove_signal_handler(signum)


async def run_serve(
    config: PopmqConfig, announce: Callable[[str], None], stop: asyncio.Event | None = None
) -> None:
    """`popmq serve`: N embedded brokers and one proxy in this process."""
    stop = stop or asyncio.Event()
    with stop_on_signals(stop):
        async with embedded_brokers(config) as ports:
            await serve_proxy(config, ports, announce=announce, stop=stop)


async def run_cluster_proxy(
    config: PopmqConfig, announce: Callable[[str], None], stop: asyncio.Event | None = None
) -> None:
    """`popmq proxy`: a proxy in front of remote `popmq broker` processes."""
    stop = stop or asyncio.Event()
    with stop_on_signals(stop):
        await serve_proxy(config, remote_brokers(config), announce=announce, stop=stop)
