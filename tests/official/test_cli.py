"""The `popmq serve` process, its metrics endpoint, and `popmq admin` against it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import grpc
from support.official_clients import REPO, Deployment, serve, unique

from popmq.pb.rocketmq.v2 import definition_pb2 as pb
from popmq.pb.rocketmq.v2 import service_pb2 as s
from popmq.pb.rocketmq.v2 import service_pb2_grpc


def admin(deployment: Deployment, *args: str, ok: bool = True) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "popmq", "admin", "--endpoint", deployment.endpoint, *args],
        cwd=REPO, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert (result.returncode == 0) == ok, (args, result.stdout, result.stderr)
    return result.stdout if ok else result.stderr


def test_admin_topics(serve_deployment: Deployment) -> None:
    topic = unique("admin-topic")
    created = admin(serve_deployment, "topics", "create", topic, "--queues", "2")
    assert f"topic {topic}: 4 queues" in created  # 2 queues on each of 2 brokers
    listed = json.loads(admin(serve_deployment, "--json", "topics", "list"))
    assert topic in [t["name"] for t in listed["topics"]]
    described = admin(serve_deployment, "topics", "describe", topic, "--group", "billing")
    assert "broker-0" in described and "broker-1" in described and "backlog" in described
    assert "TOPIC_NOT_FOUND" in admin(
        serve_deployment, "topics", "describe", unique("missing"), ok=False
    )
    assert "ILLEGAL_TOPIC" in admin(serve_deployment, "topics", "create", "bad name", ok=False)
    assert f"deleted topic {topic}" in admin(serve_deployment, "topics", "delete", topic)


def test_admin_groups(serve_deployment: Deployment) -> None:
    group = unique("admin-group")
    admin(serve_deployment, "groups", "set", group, "--max-attempts", "3",
          "--retry-levels", "1s,2s")  # fmt: skip
    admin(serve_deployment, "set-consume-mode", group, "PULL")
    got = json.loads(admin(serve_deployment, "--json", "groups", "get", group))["group"]
    assert got["consume_mode"] == "PULL" and got["max_attempts"] == 3
    assert got["retry_levels"] == ["1s", "2s"]
    admin(serve_deployment, "groups", "set", group, "--retry-levels", "default", "--fifo")
    got = json.loads(admin(serve_deployment, "--json", "groups", "get", group))["group"]
    assert got.get("retry_levels", []) == [] and got["fifo"] is True


def test_admin_clients_stats_and_metrics_endpoint(serve_deployment: Deployment) -> None:
    with grpc.insecure_channel(serve_deployment.endpoint) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        beat = stub.Heartbeat(
            s.HeartbeatRequest(group=pb.Resource(name="cli-group"), client_type=pb.PUSH_CONSUMER),
            metadata=(("x-mq-client-id", "cli@1"), ("x-mq-language", "PYTHON")),
            timeout=5,
        )
        assert beat.status.code == 20000
    clients = admin(serve_deployment, "clients", "--group", "cli-group")
    assert "clients of proxy" in clients and "cli@1" in clients and "PUSH_CONSUMER" in clients
    stats = json.loads(admin(serve_deployment, "--json", "stats"))
    assert any(name.startswith("popmq_proxy_rpc_requests_total") for name in stats)
    url = f"http://127.0.0.1:{serve_deployment.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    assert "popmq_proxy_rpc_requests_total" in text
    assert "popmq_proxy_rpc_duration_seconds_bucket" in text


def test_admin_unreachable_endpoint() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "popmq", "admin", "--endpoint", "127.0.0.1:1", "topics", "list"],
        cwd=REPO, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert result.returncode == 2 and "cannot reach" in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_serve_stops_cleanly_on_sigint(tmp_path: Path) -> None:
    process = serve(tmp_path / "data", brokers=1)
    process.wait_listening()
    process.process.send_signal(signal.SIGINT)
    assert process.process.wait(15) == 0
    process.stop()
    assert (tmp_path / "data" / "broker-0").is_dir()
