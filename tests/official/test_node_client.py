"""The official Node.js client (rocketmq-client-nodejs 1.0.8, `make node-client`) against
`popmq serve`, unchanged: tests/official/node_session.js drives it by JSON lines."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.official_clients import CLIENT_PYTHON, REPO, ClientSession, Deployment, unique

NODE = shutil.which("node")
NODE_CLIENT = REPO / ".node-client" / "node_modules" / "rocketmq-client-nodejs" / "package.json"
NODE_SESSION = REPO / "tests" / "official" / "node_session.js"
INVALID_RECEIPT_HANDLE = 40013

pytestmark = [
    pytest.mark.wallclock,  # awaitDuration holds are measured in real time (generous windows)
    pytest.mark.client,
    pytest.mark.skipif(NODE is None, reason="node is not installed (Node.js >= 18 is needed)"),
    pytest.mark.skipif(
        not NODE_CLIENT.exists(),
        reason="rocketmq-client-nodejs is not installed in .node-client: run `make node-client`",
    ),
]
needs_python_client = pytest.mark.skipif(
    not CLIENT_PYTHON.exists(),
    reason="the official Python client venv .venv-client is missing: run `make client-venv`",
)

OpenClient = Callable[..., ClientSession]


@pytest.fixture
def open_node(client_home: Path) -> Iterator[OpenClient]:
    """open_node(endpoint, role, **config) -> a Node.js client session, closed after the test.
    It is returned once startup() finished: the client's startup waits for the server to
    answer Telemetry with Settings, so a returned session proves that answer came."""
    sessions: list[ClientSession] = []

    def factory(endpoint: str, role: str, **config: Any) -> ClientSession:
        assert NODE is not None
        session = ClientSession(
            {"endpoint": endpoint, "role": role, **config},
            client_home,
            command=[NODE, str(NODE_SESSION)],
        )
        sessions.append(session)
        return session

    yield factory
    for session in sessions:
        session.close()


def _ok(answer: dict) -> dict:
    assert answer.get("ok"), answer
    return answer


def _send(producer: ClientSession, topic: str, messages: list[dict]) -> list[dict]:
    results = _ok(producer.call("send", topic=topic, messages=messages))["results"]
    for result in results:
        assert result["ok"], result
    return results


def _admin(deployment: Deployment, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "popmq", "admin", "--endpoint", deployment.endpoint, *args],
        cwd=REPO, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert result.returncode == 0, (args, result.stdout, result.stderr)
    return result.stdout


def _tagged_specs(prefix: str, count: int) -> list[dict]:
    return [
        {"body": f"{prefix}-{i}", "tag": "TagA" if i % 2 else "TagB", "keys": [f"k{i}", "common"],
         "properties": {"n": str(i)}}
        for i in range(count)
    ]  # fmt: skip


def _check_fields(messages: list[dict], specs: list[dict], topic: str) -> None:
    by_body = {m["body"]: m for m in messages}
    assert sorted(by_body) == sorted(s["body"] for s in specs)
    for spec in specs:
        m = by_body[spec["body"]]
        assert m["topic"] == topic and not m["corrupted"], m
        assert m["tag"] == spec["tag"] and m["keys"] == sorted(spec["keys"])
        assert m["properties"] == spec["properties"]
        assert m["delivery_attempt"] == 1 and m["receipt_handle"]
        assert m["born_timestamp"] > 0 and m["born_host"]


def test_node_client_roundtrip_and_empty_receive(
    serve_deployment: Deployment, open_node: OpenClient
) -> None:
    endpoint = serve_deployment.endpoint
    topic, group = unique("node-normal"), unique("g")
    producer = open_node(endpoint, "producer", topics=[topic])
    consumer = open_node(endpoint, "simple", topics=[topic], group=group, await_s=2)
    specs = _tagged_specs("hello", 8)
    receipts = _send(producer, topic, specs)
    assert len({r["message_id"] for r in receipts}) == 8

    got = _ok(consumer.call("receive_until", count=8, timeout_s=20, max=16, invisible_s=15))
    assert got["errors"] == []
    _check_fields(got["messages"], specs, topic)
    assert {m["message_id"] for m in got["messages"]} == {r["message_id"] for r in receipts}
    for m in got["messages"]:
        assert m["transport_delivery_timestamp"] >= m["born_timestamp"] - 1000

    # all acked: the next receive returns nothing, without error, after about awaitDuration
    empty = _ok(consumer.call("receive", max=16, invisible_s=15))
    assert empty["messages"] == []
    # Held for the client's 2 s, not the server's 5 s maximum; the upper bound leaves a
    # loaded CI machine 2.5 s of slack and still tells the two apart.
    assert 1.5 <= empty["elapsed_s"] <= 4.5


def test_node_default_await_is_held_to_the_server_maximum(
    serve_deployment: Deployment, open_node: OpenClient
) -> None:
    endpoint = serve_deployment.endpoint
    # The Node client asks for 30 s of long polling with a 33 s deadline; the server's
    # maximum (5 s in these tests) wins and the empty answer arrives without an error.
    topic, group = unique("node-await"), unique("g")
    consumer = open_node(endpoint, "simple", topics=[topic], group=group)
    empty = _ok(consumer.call("receive", max=4, invisible_s=15, timeout=40))
    assert empty["messages"] == []
    assert 4.5 <= empty["elapsed_s"] <= 8


def test_node_fifo_group_keeps_order(serve_deployment: Deployment, open_node: OpenClient) -> None:
    endpoint = serve_deployment.endpoint
    topic, group = unique("node-fifo"), unique("g")
    _admin(serve_deployment, "groups", "set", group, "--fifo")
    producer = open_node(endpoint, "producer", topics=[topic])
    specs = [{"body": f"{key}-{i}", "group": key} for i in range(6) for key in ("A", "B")]
    _send(producer, topic, specs)
    consumer = open_node(endpoint, "simple", topics=[topic], group=group, await_s=1)

    # While a message group has a message in flight, nothing later of that group comes.
    first = _ok(consumer.call("receive_until", count=1, timeout_s=15, max=2, ack=False))
    held = first["messages"]
    assert held and all(m["message_group"] in ("A", "B") for m in held)
    during = _ok(consumer.call("receive", max=16, invisible_s=15))["messages"]
    held_groups = {m["message_group"] for m in held}
    assert not [m for m in during if m["message_group"] in held_groups], during
    for m in held + during:
        _ok(consumer.call("ack", id=m["message_id"]))

    rest = _ok(consumer.call("receive_until", count=12 - len(held) - len(during), timeout_s=20))
    assert rest["errors"] == []
    received = held + during + rest["messages"]
    for key in ("A", "B"):
        bodies = [m["body"] for m in received if m["message_group"] == key]
        assert bodies == [f"{key}-{i}" for i in range(6)]


def test_node_delay_message(serve_deployment: Deployment, open_node: OpenClient) -> None:
    endpoint = serve_deployment.endpoint
    topic, group = unique("node-delay"), unique("g")
    producer = open_node(endpoint, "producer", topics=[topic])
    consumer = open_node(endpoint, "simple", topics=[topic], group=group, await_s=1)
    sent_ms = time.time() * 1000
    (sent,) = _send(producer, topic, [{"body": "later", "delay_s": 2.5}])
    # The first receive (1 s) usually comes back empty; on a slow machine the send itself may
    # take long enough for it to span the due time, so what is checked is the cause: no
    # delivery before the message is due.
    got = _ok(consumer.call("receive", max=4, invisible_s=15))["messages"]
    for message in got:
        _ok(consumer.call("ack", id=message["message_id"]))
    if not got:
        got = _ok(consumer.call("receive_until", count=1, timeout_s=15))["messages"]
    (message,) = got
    assert message["body"] == "later" and not message["corrupted"]
    due = message["delivery_timestamp"]
    # The time the client set, to the millisecond (the session reports it: comparing with the
    # test's own clock would also measure how long the message took to reach the session).
    assert due == sent["delivery_timestamp"] and due >= int(sent_ms) + 2500
    assert message["received_at_ms"] >= due  # not delivered before it was due


def test_node_change_invisible_duration(
    serve_deployment: Deployment, open_node: OpenClient
) -> None:
    endpoint = serve_deployment.endpoint
    topic, group = unique("node-invisible"), unique("g")
    producer = open_node(endpoint, "producer", topics=[topic])
    consumer = open_node(endpoint, "simple", topics=[topic], group=group, await_s=1)
    _send(producer, topic, [{"body": "hold-on"}])
    (message,) = _ok(
        consumer.call("receive_until", count=1, timeout_s=15, invisible_s=3, ack=False)
    )["messages"]  # 3 s: the change must reach the proxy before (slack for a loaded CI)
    changed = _ok(consumer.call("change_invisible", id=message["message_id"], invisible_s=8))
    assert changed["receipt_handle"] and changed["receipt_handle"] != changed["old_receipt_handle"]
    time.sleep(3.5)  # past the first invisible time: the change keeps it hidden
    assert _ok(consumer.call("receive", max=4, invisible_s=15))["messages"] == []
    # the replaced handle no longer works; the new one does
    _ok(consumer.call("set_handle", id=message["message_id"],
                      receipt_handle=changed["old_receipt_handle"]))  # fmt: skip
    stale = consumer.call("ack", id=message["message_id"])
    assert not stale["ok"] and stale["code"] == INVALID_RECEIPT_HANDLE, stale
    _ok(consumer.call("set_handle", id=message["message_id"],
                      receipt_handle=changed["receipt_handle"]))  # fmt: skip
    _ok(consumer.call("ack", id=message["message_id"]))


@needs_python_client
def test_node_and_python_clients_read_each_other(
    serve_deployment: Deployment, open_node: OpenClient, open_client: OpenClient
) -> None:
    endpoint = serve_deployment.endpoint
    topic = unique("node-python")

    node_specs = _tagged_specs("from-node", 4)
    node_producer = open_node(endpoint, "producer", topics=[topic])
    node_ids = {r["message_id"] for r in _send(node_producer, topic, node_specs)}
    py_consumer = open_client(endpoint, "simple", topics=[topic], group=unique("py"), await_s=1)
    got = _ok(py_consumer.call("receive_until", count=4, timeout_s=20))
    assert got["errors"] == []
    _check_fields(got["messages"], node_specs, topic)
    assert {m["message_id"] for m in got["messages"]} == node_ids

    py_specs = _tagged_specs("from-python", 4)
    py_producer = open_client(endpoint, "producer", topics=[topic])
    py_ids = {r["message_id"] for r in _send(py_producer, topic, py_specs)}
    node_consumer = open_node(endpoint, "simple", topics=[topic], group=unique("node"), await_s=1)
    # A fresh group starts at the topic's end or beginning alike for both clients: take all 8.
    got = _ok(node_consumer.call("receive_until", count=8, timeout_s=20))
    assert got["errors"] == []
    from_python = [m for m in got["messages"] if m["message_id"] in py_ids]
    _check_fields(from_python, py_specs, topic)
    assert sorted(m["body"] for m in got["messages"]) == sorted(
        s["body"] for s in node_specs + py_specs
    )


def test_node_transactions_commit_rollback_and_check_back(
    serve_deployment: Deployment, open_node: OpenClient
) -> None:
    """The Node client's transactional producer (beginTransaction, send with the transaction,
    commit/rollback, a TransactionChecker for check-backs), unchanged: commit delivers with
    the message's identity, rollback discards, and open transactions are asked about on the
    producer's Telemetry stream and decided by its checker's answer. Nothing is delivered
    before its commit."""
    endpoint = serve_deployment.endpoint
    topic, group = unique("node-tx"), unique("g")
    consumer = open_node(endpoint, "simple", topics=[topic], group=group, await_s=1)
    producer = open_node(endpoint, "producer", topics=[topic], transactional=True)
    _ok(producer.call("set_decisions", decisions={"u-commit": "COMMIT", "u-roll": "ROLLBACK"}))
    open_ = {}
    for body in ("u-commit", "u-roll"):  # left open: the check-back decides them
        open_[body] = _ok(producer.call("tx_send", topic=topic, message={"body": body},
                                        end="none"))  # fmt: skip
    spec = {"body": "c1", "tag": "T", "keys": ["k1"], "properties": {"p": "v"}}
    committed = _ok(producer.call("tx_send", topic=topic, message=spec, end="commit"))
    assert committed["transaction_id"]
    _ok(producer.call("tx_send", topic=topic, message={"body": "r1"}, end="rollback"))
    got = _ok(consumer.call("receive_until", count=1, timeout_s=5))["messages"]
    (message,) = got  # the committed one (the open ones are immune from checks for 6 s)
    assert message["body"] == "c1" and message["message_id"] == committed["message_id"]
    assert message["tag"] == "T" and message["keys"] == ["k1"]
    assert message["properties"] == {"p": "v"}
    got = _ok(consumer.call("receive_until", count=1, timeout_s=30))["messages"]
    assert [m["body"] for m in got] == ["u-commit"]
    assert got[0]["message_id"] == open_["u-commit"]["message_id"]
    checked = _ok(producer.call("checked", count=2, timeout_s=10))["checked"]
    assert {(c["body"], c["message_id"], c["topic"]) for c in checked} >= {
        (body, open_[body]["message_id"], topic) for body in open_}  # fmt: skip
    got = _ok(consumer.call("receive_until", count=1, timeout_s=2))["messages"]
    assert got == []  # neither the rolled-back one nor the one the checker rolled back
