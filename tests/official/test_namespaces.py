"""Namespaces (issue 13, item 4): the official client's namespace scopes topics and groups.

The same topic and group names in two namespaces are two separate resources; retries stay in
their namespace; `popmq admin --namespace` sees a namespace's topics by their client names.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support.official_clients import ClientSession, Deployment, unique

pytestmark = [pytest.mark.client, pytest.mark.slow]


def _ok(answer: dict) -> dict:
    assert answer.get("ok"), answer
    return answer


def _admin(endpoint: str, *args: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "popmq", "admin", "--endpoint", endpoint, "--json", *args],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_same_names_in_two_namespaces_are_separate(
    serve_deployment: Deployment, open_client
) -> None:  # type: ignore[no-untyped-def]
    endpoint = serve_deployment.endpoint
    topic, group = unique("orders"), unique("billing")
    spaces = {"ns-a": "A", "ns-b": "B"}
    for namespace, label in spaces.items():
        producer: ClientSession = open_client(
            endpoint, "producer", topics=[topic], namespace=namespace
        )
        bodies = [{"body": f"{label}-{i}"} for i in range(3)]
        sent = _ok(producer.call("send", topic=topic, messages=bodies))
        assert all(r["ok"] for r in sent["results"]), sent

    for namespace, label in spaces.items():
        consumer = open_client(
            endpoint, "simple", topics=[topic], group=group, namespace=namespace, await_s=1
        )
        got = _ok(consumer.call("receive_until", count=3, timeout_s=20, invisible_s=5))
        assert sorted(m["body"] for m in got["messages"]) == [f"{label}-{i}" for i in range(3)]
        assert {m["topic"] for m in got["messages"]} == {topic}  # the client's own name
        # Nothing of the other namespace arrives later either.
        more = _ok(consumer.call("receive_until", count=1, timeout_s=2, invisible_s=5))
        assert more["messages"] == []

    # A client without a namespace does not see either one under the plain name.
    plain = open_client(endpoint, "simple", topics=[topic], group=group, await_s=1)
    assert _ok(plain.call("receive_until", count=1, timeout_s=2))["messages"] == []

    inside = {t["name"] for t in _admin(endpoint, "--namespace", "ns-a", "topics", "list")
              .get("topics", [])}  # fmt: skip
    assert topic in inside
    everything = {t["name"] for t in _admin(endpoint, "topics", "list").get("topics", [])}
    assert {f"ns-a%{topic}", f"ns-b%{topic}"} <= everything
    described = _admin(endpoint, "--namespace", "ns-b", "topics", "describe", topic)
    assert described["topic"]["name"] == f"ns-b%{topic}"


def test_retries_stay_in_their_namespace(serve_deployment: Deployment, open_client) -> None:  # type: ignore[no-untyped-def]
    endpoint = serve_deployment.endpoint
    topic, group = unique("retried"), unique("g")
    producer = open_client(endpoint, "producer", topics=[topic], namespace="ns-r")
    _ok(producer.call("send", topic=topic, messages=[{"body": "again"}]))
    consumer = open_client(
        endpoint, "simple", topics=[topic], group=group, namespace="ns-r", await_s=1
    )
    first = _ok(consumer.call("receive_until", count=1, timeout_s=20, invisible_s=1, ack=False))
    assert [m["body"] for m in first["messages"]] == ["again"]
    # Not acked: it comes back (through the group's retry topic) in the same namespace only.
    other = open_client(endpoint, "simple", topics=[topic], group=group, namespace="ns-s",
                        await_s=1)  # fmt: skip
    again = _ok(consumer.call("receive_until", count=1, timeout_s=30, invisible_s=5))
    assert [(m["body"], m["topic"]) for m in again["messages"]] == [("again", topic)]
    assert again["messages"][0]["delivery_attempt"] >= 2
    assert _ok(other.call("receive_until", count=1, timeout_s=2))["messages"] == []
    system = {t["name"] for t in _admin(endpoint, "topics", "list", "--all").get("topics", [])}
    retry = [name for name in system if name.startswith("%RETRY%") and group in name]
    assert retry and all(f"ns-r%{group}" in name for name in retry), retry


def test_push_consumer_in_a_namespace(serve_deployment: Deployment, open_client) -> None:  # type: ignore[no-untyped-def]
    """Telemetry settings, assignment and push retries inside a namespace."""
    endpoint = serve_deployment.endpoint
    topic, group = unique("pushed"), unique("g")
    producer = open_client(endpoint, "producer", topics=[topic], namespace="ns-p")
    _ok(producer.call("send", topic=topic, messages=[{"body": f"p{i}"} for i in range(3)]))
    # A same-named topic outside the namespace must not leak in.
    outsider = open_client(endpoint, "producer", topics=[topic])
    _ok(outsider.call("send", topic=topic, messages=[{"body": "outside"}]))
    consumer = open_client(
        endpoint, "push", topics=[topic], group=group, namespace="ns-p", fail_attempts=1
    )
    consumed = _ok(consumer.call("push_collect", count=3, timeout_s=40))["consumed"]
    succeeded = sorted(r["body"] for r in consumed if r["result"] == "SUCCESS")
    assert succeeded == ["p0", "p1", "p2"]  # each failed once, then came back from the retry
    assert {r["topic"] for r in consumed} == {topic}
    assert "outside" not in {r["body"] for r in consumed}
