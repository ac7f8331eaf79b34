"""Prometheus /metrics over HTTP for a process's lifetime (prometheus_client's own server)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server


@contextlib.contextmanager
def metrics_endpoint(
    port: int | None, registry: CollectorRegistry, host: str
) -> Iterator[WSGIServer | None]:
    """Serve `registry` at http://host:port/metrics (port None: not at all; 0: any free port,
    read it from the yielded server's ``server_port``) while the context is open."""
    if port is None:
        yield None
        return
    server, thread = start_http_server(port, addr=host, registry=registry)
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=2)
