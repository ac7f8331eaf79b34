"""rocketmq-python-client 5.1.2, unchanged, with transactional messages: commit, rollback,
and check-backs answered COMMIT or ROLLBACK by the producer's TransactionChecker, embedded
(`popmq serve`) and as a cluster (two brokers, two proxies). A half message is never delivered
before its commit, nor after its rollback."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from support.official_clients import CLIENT_PYTHON, ClientSession, Deployment, unique

pytestmark = [
    pytest.mark.wallclock,
    pytest.mark.client,
    pytest.mark.skipif(
        not CLIENT_PYTHON.exists(),
        reason="the official client venv .venv-client is missing: run `make client-venv`",
    ),
]

OpenClient = Callable[..., ClientSession]


def _ok(answer: dict) -> dict:
    assert answer.get("ok"), answer
    return answer


def _bodies(consumer: ClientSession, count: int, timeout_s: float) -> list[str]:
    got = _ok(consumer.call("receive_until", count=count, timeout_s=timeout_s))
    return sorted(m["body"] for m in got["messages"])


def test_commit_delivers_and_rollback_discards(
    deployment: Deployment, open_client: OpenClient
) -> None:
    topic, group = unique("tx"), unique("g")
    consumer = open_client(deployment.endpoint, "simple", topics=[topic], group=group, await_s=2)
    producer = open_client(deployment.endpoint, "producer", topics=[topic], transactional=True)
    spec = {"body": "c1", "tag": "T", "keys": ["k1"], "properties": {"p": "v"}}
    committed = _ok(producer.call("tx_send", topic=topic, message=spec, end="commit"))
    assert committed["transaction_id"]
    _ok(producer.call("tx_send", topic=topic, message={"body": "r1"}, end="rollback"))
    got = _ok(consumer.call("receive_until", count=1, timeout_s=30))
    (message,) = got["messages"]
    assert message["body"] == "c1" and message["message_id"] == committed["message_id"]
    assert message["tag"] == "T" and message["keys"] == ["k1"]
    assert message["properties"] == {"p": "v"}
    assert _bodies(consumer, 1, 4) == []  # the rolled-back one never comes


def test_check_back_commits_and_rolls_back(deployment: Deployment, open_client: OpenClient) -> None:
    topic, group = unique("txcheck"), unique("g")
    consumer = open_client(deployment.endpoint, "simple", topics=[topic], group=group, await_s=2)
    producer = open_client(deployment.endpoint, "producer", topics=[topic], transactional=True)
    _ok(producer.call("set_decisions", decisions={"u-commit": "COMMIT", "u-roll": "ROLLBACK"}))
    sent = {}
    for body in ("u-commit", "u-roll"):
        sent[body] = _ok(producer.call("tx_send", topic=topic, message={"body": body},
                                       end="none"))["message_id"]  # fmt: skip
    # Nothing is delivered while the transactions are open (6 s check immunity).
    assert _bodies(consumer, 1, 3) == []
    assert _bodies(consumer, 1, 40) == ["u-commit"]
    checked = _ok(producer.call("checked", count=2, timeout_s=20))["checked"]
    assert {(c["body"], c["message_id"], c["topic"]) for c in checked} >= {
        ("u-commit", sent["u-commit"], topic), ("u-roll", sent["u-roll"], topic)}  # fmt: skip
    assert _bodies(consumer, 1, 4) == []  # the rolled-back one never comes
