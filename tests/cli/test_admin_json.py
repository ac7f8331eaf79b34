"""`popmq admin ... --json` against a real `popmq serve`: the shape of every command's JSON is
pinned (every field present, even 0, "" and false; 64-bit numbers as JSON numbers), and a
group that does not exist is an error, not a page of defaults."""

from __future__ import annotations

import json
from typing import Any

import pytest
from cli_support import popmq
from popmq.broker.contract.types import Message
from support.official_clients import Deployment, unique

from popmq.client import Client

pytestmark = pytest.mark.subprocess  # starts popmq


def shape(value: Any) -> Any:
    """Keys and JSON types, recursively; a list's items must all have one shape."""
    if isinstance(value, dict):
        return {key: shape(item) for key, item in value.items()}
    if isinstance(value, list):
        shapes = [shape(item) for item in value]
        assert all(s == shapes[0] for s in shapes), shapes
        return shapes[:1]
    if value is None:
        return None
    return type(value).__name__


def admin_json(served: Deployment, *args: str) -> Any:
    result = popmq("admin", "--endpoint", served.endpoint, *args, "--json")
    assert result.returncode == 0, (args, result.stdout, result.stderr)
    return json.loads(result.stdout)


QUEUE_OFFSETS = {"queue_id": "int", "min_offset": "int", "max_offset": "int"}
BROKER_TOPIC = {
    "broker": "str", "queue_count": "int", "queues": [QUEUE_OFFSETS], "message_type": "str",
}  # fmt: skip
TOPIC = {"name": "str", "brokers": [BROKER_TOPIC]}
GROUP = {
    "name": "str", "consume_mode": "str", "max_attempts": "int", "retry_levels": [],
    "fifo": "bool",
}  # fmt: skip
GROUP_QUEUE = {
    "broker": "str", "topic": "str", "queue_id": "int", "consumer_offset": "int",
    "max_offset": "int", "backlog": "int", "inflight": "int",
}  # fmt: skip
STORED = {
    "message_id": "str", "topic": "str", "broker": "str", "queue_id": "int",
    "queue_offset": "int", "tag": "str", "keys": ["str"], "born_timestamp_ms": "int",
    "store_timestamp_ms": "int", "reconsume_times": "int", "body_size": "int", "body": "str",
    "origin_topic": "str", "origin_message_id": "str", "properties": {},
}  # fmt: skip


def test_every_admin_json_shape(served: Deployment) -> None:
    topic, group = unique("shape"), unique("shape-group")
    assert admin_json(served, "topics", "create", topic, "--queues", "1") == {
        "topic": admin_json(served, "topics", "describe", topic)["topic"]
    }
    with Client(served.endpoint) as client:
        receipts = client.send([Message(topic, b"x", keys=["k-1"])])
        got = []
        for queue in client.query_route(topic):
            got += client.receive(group, queue, batch_size=1, long_polling_ms=0)
    assert len(got) == 1

    created = admin_json(served, "topics", "describe", topic)
    assert shape(created) == {"topic": TOPIC, "group_queues": []}
    queues = [q for b in created["topic"]["brokers"] for q in b["queues"]]
    assert {q["queue_id"] for q in queues} == {0}  # queue 0 is not `{}`
    assert sorted(q["max_offset"] for q in queues) == [0, 1]  # a number, not "1"

    described = admin_json(served, "topics", "describe", topic, "--group", group)
    assert shape(described) == {"topic": TOPIC, "group_queues": [GROUP_QUEUE]}
    assert {"inflight": 0, "consumer_offset": 0} in [
        {k: q[k] for k in ("inflight", "consumer_offset")} for q in described["group_queues"]
    ]
    assert shape(admin_json(served, "topics", "list")) == {"topics": [TOPIC]}
    assert shape(admin_json(served, "topics", "route", topic)) == {
        "topic": "str", "proxy": "str",
        "brokers": [{"broker": "str", "address": "str", "queue_count": "int"}],
    }  # fmt: skip

    group_json = admin_json(served, "groups", "get", group)
    assert shape(group_json) == {"group": GROUP}
    assert group_json["group"]["fifo"] is False  # false is printed, not dropped
    assert shape(admin_json(served, "groups", "set", group, "--max-attempts", "3")) == {
        "group": GROUP
    }
    assert shape(admin_json(served, "set-consume-mode", group, "POP")) == {"group": GROUP}
    listed = admin_json(served, "groups", "list")
    assert shape(listed) == {
        "groups": [{"group": GROUP, "brokers": ["str"], "inflight": "int",
                    "offset_queues": "int"}],
    }  # fmt: skip
    assert shape(admin_json(served, "groups", "describe", group)) == {
        "group": GROUP, "clients": [],
        "topics": {topic: {"lag": "int", "inflight": "int", "lag_latency_ms": "int"}},
    }  # fmt: skip
    progress = admin_json(served, "consumer-progress", group, "--topic", topic)
    assert shape(progress) == {
        "queues": [{"broker": "str", "topic": "str", "queue_id": "int",
                    "consumer_offset": "int", "max_offset": "int", "lag": "int",
                    "inflight": "int", "lag_latency_ms": "int"}],
    }  # fmt: skip
    assert sum(q["lag"] for q in progress["queues"]) == 1

    found = admin_json(served, "message", "get", "--id", receipts[0].message_id)
    assert shape(found) == {"messages": [STORED], "truncated": "bool"}
    keyed = admin_json(served, "message", "query", "--topic", topic, "--key", "k-1")
    assert shape(keyed) == {"messages": [STORED], "truncated": "bool"}
    assert keyed["messages"][0]["reconsume_times"] == 0

    assert shape(admin_json(served, "dlq", "list", group)) == {
        "messages": [], "total": "int", "truncated": "bool",
    }  # fmt: skip
    assert admin_json(served, "dlq", "resend", group, "--all") == {"resent": []}
    assert shape(admin_json(served, "offsets", "reset", group, "--topic", topic,
                            "--to", "latest")) == {
        "queues": [{"broker": "str", "queue_id": "int", "old_offset": "int",
                    "new_offset": "int"}],
    }  # fmt: skip
    # every page, merged: next_page_token is always "" here
    assert shape(admin_json(served, "clients")) == {
        "proxy": "str", "clients": [], "next_page_token": "str",
    }  # fmt: skip
    stats = admin_json(served, "stats")
    assert stats and all(isinstance(v, float) for v in stats.values())
    status = admin_json(served, "cluster", "status")
    assert shape(status) == {
        "proxy": "str", "version": "str", "clients": "int",
        "brokers": [{"broker": "str", "address": "str", "reachable": "bool",
                     "rtt_ms": "float", "topics": "int", "error": "str"}],
        "groups": [],  # replicated groups followed in etcd: none here
    }  # fmt: skip
    assert admin_json(served, "groups", "delete", group, "--force")["brokers"]
    assert admin_json(served, "topics", "delete", topic) == {"deleted": topic}


def test_a_missing_group_is_not_found(served: Deployment) -> None:
    group = unique("never-used")
    for args in (("groups", "get", group), ("groups", "describe", group),
                 ("consumer-progress", group), ("consumer-progress", group, "--json")):  # fmt: skip
        result = popmq("admin", "--endpoint", served.endpoint, *args)
        assert result.returncode == 1, (args, result.stdout, result.stderr)
        assert "CONSUMER_GROUP_NOT_FOUND" in result.stderr and result.stdout == ""
    listed = popmq("admin", "--endpoint", served.endpoint, "groups", "list", "--json")
    assert group not in listed.stdout  # reading it did not create it
