"""Prometheus /metrics over HTTP for a process's lifetime (prometheus_client's own server).

Every endpoint also serves the process collectors (``process_*``, ``python_*``) and
``popmq_build_info``; counters have no ``_created`` twins (one series per counter is what
dashboards query, and it halves the scrape).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import platform
from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError, version
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Info,
    disable_created_metrics,
    start_http_server,
)
from prometheus_client.registry import Collector

disable_created_metrics()

log = logging.getLogger(__name__)


def build_version() -> str:
    try:
        return version("popmq")
    except PackageNotFoundError:
        return "unknown"


class _Registries(Collector):
    """Another registry's families, served as part of this one."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def describe(self) -> list:
        return []

    def collect(self) -> Iterator:
        yield from self._registry.collect()


def with_process_metrics(registry: CollectorRegistry) -> CollectorRegistry:
    """`registry` plus process_*, python_* and popmq_build_info."""
    served = CollectorRegistry()
    served.register(_Registries(registry))
    for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
        served.register(collector)
    Info("popmq_build", "popmq's version and runtime", registry=served).info(
        {"version": build_version(), "python": platform.python_version()}
    )
    return served


@contextlib.contextmanager
def metrics_endpoint(
    port: int | None, registry: CollectorRegistry, host: str, *, any_port_if_taken: bool = False
) -> Iterator[WSGIServer | None]:
    """Serve `registry` (plus the process metrics) at http://host:port/metrics (port None: not
    at all; 0: any free port, read it from the yielded server's ``server_port``) while the
    context is open. any_port_if_taken: a default port another process holds is not worth
    failing for; a free one is used instead."""
    if port is None:
        yield None
        return
    served = with_process_metrics(registry)
    try:
        server, thread = start_http_server(port, addr=host, registry=served)
    except OSError as exc:
        if not any_port_if_taken or exc.errno != errno.EADDRINUSE:
            raise
        log.warning("metrics port %d is taken; serving metrics on a free port instead", port)
        server, thread = start_http_server(0, addr=host, registry=served)
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=2)
