"""`popmq admin` mqadmin-level verbs against a real `popmq serve`: human tables and --json."""

from __future__ import annotations

import json

import pytest
from cli_support import popmq
from popmq.broker.contract.types import Message
from support.official_clients import Deployment, unique

from popmq.client import Client

pytestmark = pytest.mark.subprocess  # starts popmq or another process


def admin(served: Deployment, *args: str, ok: bool = True) -> str:
    result = popmq("admin", "--endpoint", served.endpoint, *args)
    assert (result.returncode == 0) == ok, (args, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    return result.stdout if ok else result.stderr


def _rows(text: str, first: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines() if line.split()[:1] == [first]]


def test_progress_reset_route_status_message_dlq(served: Deployment) -> None:
    topic, group = unique("verbs"), unique("verbs-group")
    admin(served, "topics", "create", topic, "--queues", "1")
    with Client(served.endpoint) as client:
        receipts = client.send([Message(topic, b"x", keys=["k-1"]), Message(topic, b"y")])
        queues = client.query_route(topic)
        got = []
        for queue in queues:
            got += client.receive(group, queue, batch_size=1, long_polling_ms=0)
            if got:
                break
    assert got

    text = admin(served, "consumer-progress", group, "--topic", topic)
    rows = [r for r in _rows(text, "broker-0") + _rows(text, "broker-1") if r[1] == topic]
    assert sum(int(r[5]) for r in rows) == 2 and sum(int(r[6]) for r in rows) == 1
    assert "total lag 2, in flight 1" in text
    as_json = json.loads(admin(served, "consumer-progress", group, "--topic", topic, "--json"))
    assert sum(q["lag"] for q in as_json["queues"] if q["topic"] == topic) == 2

    described = admin(served, "groups", "describe", group)
    assert [r[:3] for r in _rows(described, topic)] == [[topic, "2", "1"]]
    assert "consumers connected to" in described
    as_json = json.loads(admin(served, "groups", "describe", group, "--json"))
    assert as_json["topics"][topic]["lag"] == 2 and as_json["group"]["name"] == group

    text = admin(served, "offsets", "reset", group, "--topic", topic, "--to", "latest")
    assert "new_offset" in text
    reset = json.loads(admin(served, "--json", "offsets", "reset", group, "--topic", topic,
                             "--to-time", "2000-01-01T00:00:00Z"))  # fmt: skip
    assert all(q["new_offset"] == 0 for q in reset["queues"])
    assert "bad time" in admin(served, "offsets", "reset", group, "--topic", topic,
                               "--to-time", "yesterday", ok=False)  # fmt: skip

    route = admin(served, "topics", "route", topic)
    assert f"clients are routed to {served.endpoint}" in route
    assert [r[:3] for r in _rows(route, "broker-0")] == [["broker-0", "in-process", "1"]]
    assert len(json.loads(admin(served, "topics", "route", topic, "--json"))["brokers"]) == 2

    status = admin(served, "cluster", "status")
    assert [r[:3] for r in _rows(status, "broker-0") + _rows(status, "broker-1")] == [
        ["broker-0", "in-process", "yes"], ["broker-1", "in-process", "yes"],
    ]  # fmt: skip
    assert json.loads(admin(served, "cluster", "status", "--json"))["version"]

    message_id = receipts[0].message_id
    found = admin(served, "message", "get", "--id", message_id, "--topic", topic)
    assert _rows(found, message_id)[0][1] == topic
    keyed = json.loads(admin(served, "message", "query", "--topic", topic, "--key", "k-1",
                             "--json"))  # fmt: skip
    assert [m["message_id"] for m in keyed["messages"]] == [message_id]
    assert "not found" in admin(served, "message", "get", "--id", "NOPE", "--topic", topic,
                                ok=False)  # fmt: skip

    dlq = admin(served, "dlq", "list", group)
    assert f"%DLQ%{group}: 0 messages" in dlq
    both = popmq("admin", "--endpoint", served.endpoint, "dlq", "resend", group, "--id", "X",
                 "--all")  # fmt: skip
    assert both.returncode == 2 and "not allowed with" in both.stderr


def test_groups_list_and_delete(served: Deployment) -> None:
    topic, group, busy = unique("gl"), unique("gl-group"), unique("gl-busy")
    admin(served, "topics", "create", topic, "--queues", "1")
    admin(served, "groups", "set", group, "--max-attempts", "4")
    with Client(served.endpoint) as client:
        client.send([Message(topic, b"x")])
        held = []
        for queue in client.query_route(topic):
            held += client.receive(busy, queue, batch_size=1, long_polling_ms=0)
    assert len(held) == 1

    table = admin(served, "groups", "list")
    assert "offset_queues" in table and "inflight" in table
    assert _rows(table, group)[0][1:3] == ["POP", "4"]
    assert _rows(table, busy)[0][-1] == "1"  # one message in flight
    as_json = json.loads(admin(served, "groups", "list", "--json"))
    by_name = {g["group"]["name"]: g for g in as_json["groups"]}
    assert by_name[group]["group"]["max_attempts"] == 4 and len(by_name[group]["brokers"]) == 2

    refused = admin(served, "groups", "delete", busy, ok=False)
    assert "PRECONDITION_FAILED" in refused and "in flight" in refused
    forced = json.loads(admin(served, "groups", "delete", busy, "--force", "--json"))
    assert forced["inflight"] == 1
    text = admin(served, "groups", "delete", group, "--clean-offsets")
    assert f"deleted group {group} from 2 brokers" in text
    listed = admin(served, "groups", "list")
    assert _rows(listed, group) == [] and _rows(listed, busy) == []
    assert "CONSUMER_GROUP_NOT_FOUND" in admin(served, "groups", "delete", group, ok=False)
