"""The config round trip: the ConfigMap and Secret the chart renders, handed to a real popmq
process on loopback the way a pod gets them (--config file + POPMQ_* env), serve a client with
exactly the settings the values asked for."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from deploykit import REPO, cli_commands, pod_env, render
from grpc_health.v1 import health_pb2, health_pb2_grpc
from popmq.broker.contract.errors import Code
from popmq.broker.contract.types import Message

from popmq.client import Client, ProxyError

pytestmark = pytest.mark.subprocess  # starts popmq or another process

if "serve" not in cli_commands():
    pytest.skip("`popmq serve` is not registered in popmq.cli yet", allow_module_level=True)

VALUES = {
    "clusterToken": {"value": "kRoundTripSecret0123456789"},
    "proxy": {"advertise": {"host": "mq.internal.example", "port": 443}},
    "config": {
        "broker": {"topics": {"queue_count": 2}, "store": {"flush": "sync"}},
        "proxy": {"strategy": "notify", "min_long_polling_ms": 1000, "max_long_polling_ms": 3000},
    },
}


def _announced(process: subprocess.Popen[str], **patterns: str) -> dict[str, str]:
    """Read stdout until every pattern matched once (the process announces its ports there,
    in any order); returns each pattern's first group."""
    assert process.stdout is not None
    found: dict[str, str] = {}
    seen = []
    for line in process.stdout:
        seen.append(line)
        for key, pattern in patterns.items():
            match = re.search(pattern, line)
            if match and key not in found:
                found[key] = match.group(1)
        if len(found) == len(patterns):
            return found
    raise AssertionError(f"popmq exited before announcing {sorted(patterns)}; stdout: {seen}")


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """`popmq --config <rendered popmq.yaml> serve` with the proxy pod's environment."""
    out = render(VALUES)
    config_file = tmp_path / "popmq.yaml"
    config_file.write_text(out.config_text())
    env = {k: v for k, v in os.environ.items() if not k.startswith("POPMQ_")}
    env.update(pod_env(out.one("Deployment"), "unused"))
    argv = [
        sys.executable, "-m", "popmq", "--config", str(config_file),
        "serve", "--host", "127.0.0.1", "--port", "0", "--metrics-port", "0",
        "--brokers", "1", "--data-dir", str(tmp_path / "data"),
    ]  # fmt: skip
    process = subprocess.Popen(
        argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        ports = _announced(
            process, proxy=r"popmq proxy listening on (\S+)", metrics=r"popmq metrics on (\S+)"
        )
        yield ports["proxy"], ports["metrics"]
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.mark.timeout(180)  # starts a process: slow on a loaded CI machine (a failure bound)
def test_rendered_config_serves_a_client(served: tuple[str, str]) -> None:
    proxy, metrics = served
    with grpc.insecure_channel(proxy) as channel:
        answer = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=5
        )
    assert answer.status == health_pb2.HealthCheckResponse.SERVING

    with Client(proxy, timeout_s=5) as client:
        queues = client.query_route("roundtrip")
        # topics.queue_count from the values, per embedded broker
        assert len(queues) == 2
        # proxy.advertise from the values: routes name the advertised address
        assert {q.endpoint for q in queues} == {"mq.internal.example:443"}

        # min_long_polling_ms from the values: a shorter awaitDuration is refused
        with pytest.raises(ProxyError) as refused:
            client.receive("g1", queues[0], long_polling_ms=500)
        assert refused.value.code == Code.ILLEGAL_POLLING_TIME

        client.send([Message(topic="roundtrip", body=b"through the chart's config")])
        received = []
        for queue in queues:
            received += client.receive("g1", queue, long_polling_ms=1000)
        assert [m.body for m in received] == [b"through the chart's config"]
        outcomes = client.ack(
            "g1", "roundtrip", [(m.message_id, m.receipt_handle) for m in received]
        )
        assert all(o.ok for o in outcomes)

    # strategy from the values: the receives ran under "notify"
    text = urllib.request.urlopen(f"http://{metrics}/metrics", timeout=5).read().decode()
    assert re.search(r'popmq_proxy_long_polls_total\{strategy="notify"\} [1-9]', text), text
