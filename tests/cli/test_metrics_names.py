"""/metrics of real processes: RocketMQ 5's rocketmq_* series next to popmq_*, process
collectors and build info, no _created twins; a proxy that cannot reach a broker says so."""

from __future__ import annotations

import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from cli_support import popmq
from popmq.broker.contract.types import Message
from prometheus_client.parser import text_string_to_metric_families
from support.official_clients import REPO, Deployment, unique

from popmq.client import Client

pytestmark = pytest.mark.subprocess  # starts popmq or another process


def _scrape(port: int) -> dict[str, list]:
    url = f"http://127.0.0.1:{port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    samples: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample)
    return samples


def test_rocketmq_series_with_their_labels(served: Deployment) -> None:
    assert served.metrics_port is not None
    topic, group = unique("metrics-topic"), unique("metrics-group")
    with Client(served.endpoint) as client:
        client.send([Message(topic, b"m%d" % i) for i in range(5)])
        queues = client.query_route(topic)
        received = []
        for queue in queues:
            received += client.receive(group, queue, batch_size=2, long_polling_ms=0)
            if received:
                break
    assert received  # left un-acked: in flight, and the rest is lag
    samples = _scrape(served.metrics_port)
    node = {"cluster": "DefaultCluster", "node_type": "broker"}

    def of(name: str, **labels: str) -> list:
        wanted = {**node, **labels}
        return [s for s in samples.get(name, []) if wanted.items() <= s.labels.items()]

    assert sum(s.value for s in of("rocketmq_messages_in_total", topic=topic)) == 5
    out = of("rocketmq_messages_out_total", topic=topic, consumer_group=group)
    assert sum(s.value for s in out) == len(received)
    lag = of("rocketmq_consumer_lag_messages", topic=topic, consumer_group=group)
    assert sum(s.value for s in lag) == 5  # nothing acked
    inflight = of("rocketmq_consumer_inflight_messages", topic=topic, consumer_group=group)
    assert sum(s.value for s in inflight) == len(received)
    latency = of("rocketmq_consumer_lag_latency", topic=topic, consumer_group=group)
    assert latency and max(s.value for s in latency) >= 0
    assert all(s.labels["node_id"].startswith("broker-") for s in out + lag)
    assert len(of("rocketmq_storage_size")) == 2  # one per broker
    assert any(s.value > 0 for s in of("rocketmq_storage_size"))
    rpc = [s for s in samples["rocketmq_rpc_latency_bucket"]
           if s.labels["request_code"] == "ReceiveMessage"]  # fmt: skip
    assert rpc and rpc[0].labels["node_type"] == "proxy"
    assert rpc[0].labels["protocol_type"] == "grpc"
    # the popmq_* series stay
    assert "popmq_proxy_rpc_requests_total" in samples
    assert "popmq_broker_group_backlog_messages" in samples
    # process collectors and build info; counters without _created twins
    assert samples["process_resident_memory_bytes"][0].value > 0
    assert "process_cpu_seconds_total" in samples
    build = samples["popmq_build_info"][0].labels
    assert re.match(r"\d", build["version"]) and build["python"]
    assert not [name for name in samples if name.endswith("_created")]


def test_proxy_reports_an_unreachable_broker(tmp_path: Path) -> None:
    log_path = tmp_path / "proxy.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "popmq", "proxy", "--port", "0", "--metrics-port", "0",
             "--broker", "gone=127.0.0.1:1"],
            cwd=REPO, stdout=subprocess.PIPE, stderr=log, text=True,
        )  # fmt: skip
        try:
            assert process.stdout is not None
            metrics_port = proxy_port = None
            for line in process.stdout:
                found = re.search(r"popmq metrics on [\w.]+:(\d+)", line)
                if found:
                    metrics_port = int(found.group(1))
                listening = re.search(r"listening on [\w.]+:(\d+)", line)
                if listening:
                    proxy_port = int(listening.group(1))
                    break
            assert metrics_port is not None and proxy_port is not None
            deadline = time.monotonic() + 30
            up = None
            while time.monotonic() < deadline:
                samples = _scrape(metrics_port).get("popmq_proxy_broker_up", [])
                up = [s.value for s in samples if s.labels["broker"] == "gone"]
                if up:
                    break
                time.sleep(0.2)
            assert up == [0.0]
            deadline = time.monotonic() + 30
            while "unreachable" not in log_path.read_text() and time.monotonic() < deadline:
                time.sleep(0.2)
            warning = [ln for ln in log_path.read_text().splitlines() if "unreachable" in ln]
            assert warning and "WARNING" in warning[0] and "127.0.0.1:1" in warning[0]
            # and `popmq admin cluster status` names it (exit 1, so scripts notice)
            status = popmq("admin", "--endpoint", f"127.0.0.1:{proxy_port}", "cluster", "status")
            assert status.returncode == 1 and "unreachable brokers: gone" in status.stderr
            row = next(ln.split() for ln in status.stdout.splitlines() if ln.startswith("gone"))
            assert row[:3] == ["gone", "127.0.0.1:1", "NO"]
        finally:
            process.terminate()
            assert process.wait(15) == 0
