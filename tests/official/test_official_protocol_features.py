"""rocketmq-python-client 5.1.2, unchanged, against popmq's SQL92 filters and topic message
types, embedded (`popmq serve`) and as a cluster."""

from __future__ import annotations

import random
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
ILLEGAL_FILTER_EXPRESSION = 40010
MESSAGE_PROPERTY_CONFLICT_WITH_TYPE = 40014


def _ok(answer: dict) -> dict:
    assert answer.get("ok"), answer
    return answer


def _specs(count: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    specs = []
    for i in range(count):
        props = {}
        if rng.random() < 0.8:
            props["a"] = str(rng.randint(0, 10))
        if rng.random() < 0.8:
            props["region"] = rng.choice(["eu", "us", "ap"])
        spec: dict = {"body": f"m{i}", "properties": props}
        if rng.random() < 0.6:
            spec["tag"] = rng.choice(["TagA", "TagB"])
        specs.append(spec)
    return specs


def _reference(spec: dict) -> bool:
    a, region = spec["properties"].get("a"), spec["properties"].get("region")
    return a is not None and int(a) > 5 and region in ("eu", "us") and bool(spec.get("tag"))


def test_sql92_subscription_gets_exactly_the_matching_messages(
    deployment: Deployment, open_client: OpenClient
) -> None:
    topic, group = unique("sql"), unique("g")
    expression = "a > 5 AND region IN ('eu', 'us') AND TAGS IS NOT NULL"
    consumer = open_client(deployment.endpoint, "simple", topics=[topic], group=group,
                           await_s=2, filter=expression, filter_type="SQL")  # fmt: skip
    producer = open_client(deployment.endpoint, "producer", topics=[topic])
    specs = _specs(120, seed=5)
    results = _ok(producer.call("send", topic=topic, messages=specs))["results"]
    assert all(r["ok"] for r in results), results
    expected = {s["body"] for s in specs if _reference(s)}
    assert 5 < len(expected) < 60
    got = _ok(consumer.call("receive_until", count=len(expected), timeout_s=40))
    bodies = [m["body"] for m in got["messages"]]
    assert sorted(bodies) == sorted(expected), got["errors"]
    extra = _ok(consumer.call("receive_until", count=1, timeout_s=4))
    assert extra["messages"] == []  # nothing that does not match comes later either


def test_malformed_sql92_expression_is_refused(
    deployment: Deployment, open_client: OpenClient
) -> None:
    topic, group = unique("sqlbad"), unique("g")
    consumer = open_client(deployment.endpoint, "simple", topics=[topic], group=group,
                           await_s=1, filter="a > AND", filter_type="SQL")  # fmt: skip
    answer = consumer.call("receive")
    assert not answer["ok"] and answer["code"] == ILLEGAL_FILTER_EXPRESSION, answer


def test_a_topic_takes_only_its_message_type(
    deployment: Deployment, open_client: OpenClient
) -> None:
    topic = unique("typed")
    producer = open_client(deployment.endpoint, "producer", topics=[topic])
    # The topic is auto-created by the route lookup; its first message makes it NORMAL.
    first = _ok(producer.call("send", topic=topic, messages=[{"body": "n"}]))["results"]
    assert first[0]["ok"], first
    fifo = _ok(producer.call("send", topic=topic, messages=[{"body": "f", "group": "g1"}]))
    (refused,) = fifo["results"]
    assert not refused["ok"] and refused["code"] == MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, refused
    # A fresh producer reads the NORMAL-only route and refuses a FIFO send itself.
    other = open_client(deployment.endpoint, "producer", topics=[topic])
    (local,) = _ok(other.call("send", topic=topic, messages=[{"body": "f", "group": "g1"}]))[
        "results"
    ]
    assert not local["ok"], local
    assert _ok(other.call("send", topic=topic, messages=[{"body": "n2"}]))["results"][0]["ok"]


def test_recall_a_delay_message_before_and_after_its_delivery(
    deployment: Deployment, open_client: OpenClient
) -> None:
    topic, group = unique("recall"), unique("g")
    producer = open_client(deployment.endpoint, "producer", topics=[topic])
    consumer = open_client(deployment.endpoint, "simple", topics=[topic], group=group, await_s=2)
    specs = [{"body": "keep", "delay_s": 3}, {"body": "drop", "delay_s": 3}]
    keep, drop = _ok(producer.call("send", topic=topic, messages=specs))["results"]
    assert keep["ok"] and drop["ok"] and drop["recall_handle"], (keep, drop)
    recalled = _ok(producer.call("recall", topic=topic, recall_handle=drop["recall_handle"]))
    assert recalled["message_id"] == drop["message_id"]
    got = _ok(consumer.call("receive_until", count=2, timeout_s=10))
    assert [m["body"] for m in got["messages"]] == ["keep"]
    # Delivered: nothing is left to recall, and the client hears why.
    late = producer.call("recall", topic=topic, recall_handle=keep["recall_handle"])
    assert not late["ok"] and late["code"] == 40400, late
    forged = producer.call("recall", topic=topic, recall_handle=keep["recall_handle"][:-3] + "AAA")
    assert not forged["ok"] and forged["code"] == 40000, forged
