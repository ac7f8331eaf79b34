"""`popmq serve` (run in-process, real HTTP and gRPC on 127.0.0.1): its /metrics endpoint shows
the proxy's metrics and every embedded broker's, one family per name, a `broker` label each."""

from __future__ import annotations

import asyncio
import re
import urllib.request
from pathlib import Path

import grpc
from popmq.proxy.runtime import run_serve
from proxy_support import make_config, message

from popmq.pb.rocketmq.v2 import service_pb2 as s
from popmq.pb.rocketmq.v2 import service_pb2_grpc


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.read().decode()


async def test_serve_endpoint_includes_embedded_brokers(tmp_path: Path) -> None:
    config = make_config(tmp_path, **{"proxy.port": 0, "proxy.metrics_port": 0})
    config.serve.brokers = 2
    lines: list[str] = []
    listening = asyncio.Event()

    def announce(line: str) -> None:
        lines.append(line)
        if "listening" in line:
            listening.set()

    stop = asyncio.Event()
    serving = asyncio.create_task(run_serve(config, announce, stop))
    try:
        await asyncio.wait_for(listening.wait(), 10)
        (metrics_line,) = [line for line in lines if line.startswith("popmq metrics on ")]
        metrics_port = int(re.search(r"on [\d.]+:(\d+)", metrics_line).group(1))
        proxy_port = int(lines[-1].rsplit(":", 1)[1])
        async with grpc.aio.insecure_channel(f"127.0.0.1:{proxy_port}") as channel:
            stub = service_pb2_grpc.MessagingServiceStub(channel)
            request = s.SendMessageRequest(messages=[message("metered", b"x") for _ in range(3)])
            reply = await stub.SendMessage(request, timeout=5)
            assert reply.status.code == 20000
        text = await asyncio.to_thread(fetch, f"http://127.0.0.1:{metrics_port}/metrics")
    finally:
        stop.set()
        await asyncio.wait_for(serving, 10)

    assert "popmq_proxy_rpc_requests_total" in text
    for name in ("broker-0", "broker-1"):
        assert f'popmq_broker_held_requests_limit{{broker="{name}"}}' in text
    stored = re.findall(
        r'^popmq_broker_messages_stored_total\{broker="broker-\d",topic="metered"\} (\S+)$',
        text,
        re.M,
    )
    assert sum(float(v) for v in stored) == 3
    types = re.findall(r"^# TYPE (\S+) ", text, re.M)
    assert len(types) == len(set(types)), "a metric family appears twice"


async def _announced(config: object) -> list[str]:
    """The lines `popmq serve` prints at start (it is stopped once it listens)."""
    lines: list[str] = []
    listening = asyncio.Event()

    def announce(line: str) -> None:
        lines.append(line)
        if "proxy listening" in line:
            listening.set()

    stop = asyncio.Event()
    serving = asyncio.create_task(run_serve(config, announce, stop))  # type: ignore[arg-type]
    try:
        await asyncio.wait_for(listening.wait(), 10)
    finally:
        stop.set()
        await asyncio.wait_for(serving, 10)
    return lines


async def test_serve_has_metrics_by_default(tmp_path: Path) -> None:
    """No metrics flag: serve.metrics_port (9090); a port someone else holds is not fatal."""
    import socket

    assert make_config(tmp_path).serve.metrics_port == 9090
    with socket.socket() as holder:  # the default port, taken (tests never rely on 9090)
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        config = make_config(tmp_path / "a", **{"proxy.port": 0, "serve.metrics_port": taken})
        config.serve.brokers = 1
        lines = await _announced(config)
    (metrics_line,) = [line for line in lines if line.startswith("popmq metrics on ")]
    found = re.fullmatch(r"popmq metrics on 127\.0\.0\.1:(\d+) \((http://\S+)\)", metrics_line)
    assert found and int(found.group(1)) != taken, metrics_line
    assert found.group(2) == f"http://127.0.0.1:{found.group(1)}/metrics"
    config = make_config(tmp_path / "b", **{"proxy.port": 0})
    config.serve.brokers, config.serve.metrics_port = 1, None  # turned off
    assert not any("metrics" in line for line in await _announced(config))
