"""Identity and access with the official Python client: AK/SK, permissions, TLS, admin port.

One `popmq serve` runs with an ACL, TLS on the client and admin ports (a CA made here), and the
admin API on its own port. The client trusts the CA through GRPC_DEFAULT_SSL_ROOTS_FILE_PATH, as
client 5.1.2 uses grpc's default roots."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.official_clients import (
    REPO,
    SERVER_SETTINGS,
    ClientSession,
    PopmqProcess,
    serve,
    unique,
)
from support.tls_certs import Pki, make_pki

pytestmark = pytest.mark.client

USERS = {
    "users": [
        {
            "access_key": "app1",
            "secret_key": "app1-secret-0001",
            "allow": [
                {"publish": "orders-*"},
                {"subscribe": {"group": "billing-*", "topics": ["orders-*"]}},
            ],
        },
        {
            "access_key": "reader",
            "secret_key": "reader-secret-0001",
            "allow": [{"subscribe": {"group": "audit-*", "topics": ["orders-*"]}}],
        },
        {"access_key": "ops", "secret_key": "ops-secret-0001", "admin": True},
    ]
}


class Secured:
    def __init__(self, process: PopmqProcess, endpoint: str, admin: str, metrics: int, pki: Pki):
        self.process, self.endpoint, self.admin_endpoint = process, endpoint, admin
        self.metrics_port, self.pki = metrics, pki

    def metric(self, method: str, code: str) -> float:
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics").read()
        for line in text.decode().splitlines():
            if line.startswith("popmq_proxy_rpc_requests_total{") and (
                f'method="{method}"' in line and f'code="{code}"' in line
            ):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def admin(self, *args: str, keys: tuple[str, str] | None = ("ops", "ops-secret-0001")) -> Any:
        command = [sys.executable, "-m", "popmq", "admin", "--endpoint", self.admin_endpoint,
                   "--tls-ca", str(self.pki.ca), "--json"]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith("POPMQ_")}
        if keys:
            env.update(POPMQ_ACCESS_KEY=keys[0], POPMQ_SECRET_KEY=keys[1])
        return subprocess.run(
            [*command, *args], cwd=REPO, capture_output=True, text=True, timeout=30, env=env
        )

    def backlog(self, topic: str) -> int:
        """Messages stored in a topic (0 if it does not exist), asked as an admin."""
        result = self.admin("topics", "describe", topic)
        if result.returncode != 0:
            assert "TOPIC_NOT_FOUND" in result.stderr, result.stderr
            return 0
        described = json.loads(result.stdout)
        return sum(
            int(q.get("max_offset", 0)) - int(q.get("min_offset", 0))
            for broker in described["topic"]["brokers"]
            for q in broker.get("queues", [])
        )


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    root = tmp_path_factory.mktemp("secured")
    pki = make_pki(root / "pki")
    acl = root / "acl.yaml"
    acl.write_text(yaml.safe_dump(USERS))
    process = serve(
        root / "data", brokers=2,
        extra_args=[
            "--acl", str(acl), "--tls-cert", str(pki.server_cert), "--tls-key",
            str(pki.server_key), "--admin-port", "0", "--metrics-port", "0",
        ],
    )  # fmt: skip
    port = process.wait_listening()
    admin = int(process.reader.wait_for(r"popmq admin listening on [\w.]+:(\d+)", 10).group(1))
    metrics = next(
        int(m.group(1))
        for m in (re.search(r"popmq metrics on [\w.]+:(\d+)", x) for x in process.reader.seen)
        if m
    )
    yield Secured(process, f"127.0.0.1:{port}", f"127.0.0.1:{admin}", metrics, pki)
    assert process.stop() == 0
    assert "ops-secret-0001" not in process.log_path.read_text()  # secrets never logged


@pytest.fixture
def client(
    secured: Secured, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., ClientSession]]:
    sessions: list[ClientSession] = []
    env = {"GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": str(secured.pki.ca)}

    def factory(role: str, ak: str, sk: str, **config: Any) -> ClientSession:
        home = tmp_path_factory.mktemp("client-home")
        config = {"endpoint": secured.endpoint, "role": role, "ak": ak, "sk": sk, "tls": True,
                  "request_timeout": 3, **config}  # fmt: skip
        session = ClientSession(config, home, env=env)
        sessions.append(session)
        return session

    yield factory
    for session in sessions:
        session.close()


def test_right_keys_over_tls_send_receive_ack(secured: Secured, client: Any) -> None:
    topic, group = unique("orders"), unique("billing")
    producer = client("producer", "app1", "app1-secret-0001", topics=[topic])
    (sent,) = producer.call("send", messages=[{"body": "paid"}])["results"]
    assert sent["ok"], sent
    consumer = client("simple", "app1", "app1-secret-0001", topics=[topic], group=group, await_s=2)
    got = consumer.call("receive_until", count=1, ack=True, timeout_s=20)
    assert [m["body"] for m in got["messages"]] == ["paid"]


def test_wrong_secret_is_unauthorized_and_writes_nothing(secured: Secured, client: Any) -> None:
    topic = unique("orders")
    before = secured.metric("QueryRoute", "UNAUTHORIZED")
    producer = client("producer", "app1", "not-the-secret", topics=[topic])
    (sent,) = producer.call("send", messages=[{"body": "forged"}])["results"]
    # client 5.1.2 turns a refused QueryRoute into a plain "failed to fetch topic" Exception
    assert not sent["ok"] and ("Unauthorized" in sent["error"] or "route" in sent["message"])
    assert secured.metric("QueryRoute", "UNAUTHORIZED") > before  # refused on the server
    assert secured.backlog(topic) == 0  # not even auto-created


def test_unknown_user_and_no_credentials_are_unauthorized(secured: Secured, client: Any) -> None:
    topic = unique("orders")
    before = secured.metric("QueryRoute", "UNAUTHORIZED")
    for ak, sk in (("nobody", "whatever"), ("", "")):
        producer = client("producer", ak, sk, topics=[topic])
        (sent,) = producer.call("send", messages=[{"body": "x"}])["results"]
        assert not sent["ok"]
    assert secured.metric("QueryRoute", "UNAUTHORIZED") >= before + 2
    assert secured.backlog(topic) == 0


def test_no_publish_permission_is_forbidden(secured: Secured, client: Any) -> None:
    topic = unique("orders")
    # The topic exists (a lookup by someone who may not publish on it would not create it).
    assert secured.admin("topics", "create", topic, "--queues", "2").returncode == 0
    before = secured.metric("SendMessage", "FORBIDDEN")
    producer = client("producer", "reader", "reader-secret-0001", topics=[topic])
    (sent,) = producer.call("send", messages=[{"body": "x"}])["results"]
    assert not sent["ok"] and sent["error"] == "ForbiddenException", sent
    assert secured.metric("SendMessage", "FORBIDDEN") > before
    assert secured.backlog(topic) == 0


def test_no_subscribe_permission_is_forbidden_and_reads_nothing(
    secured: Secured, client: Any
) -> None:
    topic, group = unique("orders"), unique("billing")
    producer = client("producer", "app1", "app1-secret-0001", topics=[topic])
    assert producer.call("send", messages=[{"body": "kept"}])["results"][0]["ok"]
    # reader may subscribe as audit-* only: as billing-* it is refused
    intruder = client("simple", "reader", "reader-secret-0001", topics=[topic], group=group,
                      await_s=1)  # fmt: skip
    refused = intruder.call("receive", max=1, invisible_s=30)
    assert not refused["ok"] and refused["error"] == "ForbiddenException", refused
    # nothing was popped: the rightful consumer gets the message at once (not in 30 s)
    owner = client("simple", "app1", "app1-secret-0001", topics=[topic], group=group, await_s=2)
    got = owner.call("receive_until", count=1, ack=True, timeout_s=20)
    assert [m["body"] for m in got["messages"]] == ["kept"]
    assert got["messages"][0]["delivery_attempt"] == 1


def test_admin_port_needs_an_admin(secured: Secured) -> None:
    stranger = secured.admin("topics", "list", keys=None)
    assert stranger.returncode == 1 and "UNAUTHORIZED" in stranger.stderr
    wrong = secured.admin("topics", "list", keys=("ops", "wrong-secret"))
    assert wrong.returncode == 1 and "UNAUTHORIZED" in wrong.stderr
    app = secured.admin("topics", "delete", "orders-x", keys=("app1", "app1-secret-0001"))
    assert app.returncode == 1 and "FORBIDDEN" in app.stderr
    assert secured.admin("topics", "list").returncode == 0


def test_admin_is_not_on_the_client_port(secured: Secured) -> None:
    command = [sys.executable, "-m", "popmq", "admin", "--endpoint", secured.endpoint,
               "--tls-ca", str(secured.pki.ca), "topics", "list"]  # fmt: skip
    env = dict(os.environ, POPMQ_ACCESS_KEY="ops", POPMQ_SECRET_KEY="ops-secret-0001")
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=30, env=env)
    assert result.returncode == 1 and "UNIMPLEMENTED" in result.stderr


def test_plaintext_client_cannot_talk_to_the_tls_port(secured: Secured, client: Any) -> None:
    with pytest.raises(RuntimeError):
        session = client("producer", "app1", "app1-secret-0001", topics=[unique("orders")],
                         tls=False)  # fmt: skip
        (sent,) = session.call("send", messages=[{"body": "x"}])["results"]
        if not sent["ok"]:
            raise RuntimeError(sent["message"])


NODE = shutil.which("node")
NODE_SESSION = REPO / "tests" / "official" / "node_session.js"
NODE_CLIENT = REPO / ".node-client" / "node_modules" / "rocketmq-client-nodejs" / "package.json"


@pytest.mark.skipif(
    NODE is None or not NODE_CLIENT.exists(), reason="node or .node-client is missing"
)
def test_node_client_signs_and_uses_tls(
    secured: Secured, client: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Node client 1.0.8 signs with UTC and upper-case hex; TLS roots from the env."""
    assert NODE is not None
    env = {
        "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": str(secured.pki.ca),
        "NODE_EXTRA_CA_CERTS": str(secured.pki.ca),
    }
    topic, group = unique("orders"), unique("billing")
    sessions = []

    def node(role: str, sk: str, **config: Any) -> ClientSession:
        home = tmp_path_factory.mktemp("node-home")
        session = ClientSession(
            {"endpoint": secured.endpoint, "role": role, "ak": "app1", "sk": sk, "tls": True,
             "topics": [topic], **config},
            home, command=[NODE, str(NODE_SESSION)], env=env,
        )  # fmt: skip
        sessions.append(session)
        return session

    try:
        producer = node("producer", "app1-secret-0001")
        (sent,) = producer.call("send", topic=topic, messages=[{"body": "from node"}])["results"]
        assert sent["ok"], sent
        consumer = node("simple", "app1-secret-0001", group=group, await_s=2)
        got = consumer.call("receive_until", count=1, ack=True, timeout_s=20)
        assert [m["body"] for m in got["messages"]] == ["from node"]

        def refusals() -> float:
            methods = ("SendMessage", "QueryRoute", "Telemetry")
            return sum(secured.metric(m, "UNAUTHORIZED") for m in methods)

        before = refusals()
        # A wrong secret: the Node client's startup waits for Telemetry settings, which a
        # refused stream never gives, so it fails to start or to send.
        with contextlib.suppress(RuntimeError):
            wrong = node("producer", "wrong-secret", start_timeout_s=5)
            (refused,) = wrong.call("send", topic=topic, messages=[{"body": "x"}])["results"]
            assert not refused["ok"]
        after = refusals()
        assert after > before
    finally:
        for session in sessions:
            session.close()


def test_cluster_mode_brokers_admit_only_proxies_with_the_token(
    tmp_path: Path, open_client: Any
) -> None:
    """`popmq broker --cluster-token-file` behind `popmq proxy --cluster-token-file`: clients
    work through the proxy; a stranger on the broker port moves no offset and lists nothing."""
    token = tmp_path / "cluster-token"
    token.write_text("kClusterTokenForTheTest0123456789\n")
    token.chmod(0o600)
    settings = [a for s in SERVER_SETTINGS if s.startswith("broker.") for a in ("--set", s)]
    broker_process = PopmqProcess(
        ["broker", "--name", "broker-a", "--port", "0", "--data-dir", str(tmp_path / "b"),
         "--cluster-token-file", str(token), *settings],
        tmp_path / "broker.log",
    )  # fmt: skip
    processes = [broker_process]
    try:
        broker_port = broker_process.wait_listening("broker")
        proxy_settings = [a for s in SERVER_SETTINGS for a in ("--set", s)]
        proxy_process = PopmqProcess(
            ["proxy", "--port", "0", "--broker", f"broker-a=127.0.0.1:{broker_port}",
             "--cluster-token-file", str(token), *proxy_settings],
            tmp_path / "proxy.log",
        )  # fmt: skip
        processes.append(proxy_process)
        endpoint = f"127.0.0.1:{proxy_process.wait_listening()}"
        topic, group = unique("orders"), unique("billing")
        producer = open_client(endpoint, "producer", topics=[topic])
        assert producer.call("send", messages=[{"body": "via proxy"}])["results"][0]["ok"]

        stranger = subprocess.run(
            [sys.executable, "-c", STRANGER, f"127.0.0.1:{broker_port}", group, topic],
            cwd=REPO, capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert stranger.stdout.split() == ["UNAUTHENTICATED"] * 3, stranger.stderr

        consumer = open_client(endpoint, "simple", topics=[topic], group=group, await_s=2)
        got = consumer.call("receive_until", count=1, ack=True, timeout_s=20)
        assert [m["body"] for m in got["messages"]] == ["via proxy"]  # offset never moved
        assert "OPEN to anyone" not in (tmp_path / "broker.log").read_text()
    finally:
        for process in reversed(processes):
            process.stop()


# A client on the broker port without the token: move offsets, delete the topic, list topics.
STRANGER = """
import sys, grpc
from popmq.pb.broker.v1 import broker_pb2 as pb, broker_pb2_grpc
address, group, topic = sys.argv[1:]
stub = broker_pb2_grpc.BrokerServiceStub(grpc.insecure_channel(address))
calls = [
    (stub.UpdateConsumerOffset,
     pb.UpdateConsumerOffsetRequest(group=group, topic=topic, queue_id=0, offset=10**6)),
    (stub.DeleteTopic, pb.DeleteTopicRequest(topic=topic)),
    (stub.ListTopics, pb.ListTopicsRequest()),
]
for call, request in calls:
    try:
        call(request, timeout=5)
        print("OK")
    except grpc.RpcError as exc:
        print(exc.code().name)
"""
