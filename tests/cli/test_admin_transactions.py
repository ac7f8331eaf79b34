"""`popmq admin transactions list / commit / rollback` against a real `popmq serve`: undecided
transactional messages are listed, an operator's commit delivers one, a rollback discards one,
and a message no longer undecided is NOT_FOUND (a clear error, no traceback)."""

from __future__ import annotations

import json
import uuid

import grpc
import pytest
from cli_support import popmq
from support.official_clients import Deployment, unique

from popmq.client import Client
from popmq.pb.rocketmq.v2 import definition_pb2 as pb
from popmq.pb.rocketmq.v2 import service_pb2 as s
from popmq.pb.rocketmq.v2 import service_pb2_grpc

pytestmark = pytest.mark.subprocess  # starts popmq


def _admin(served: Deployment, *args: str) -> str:
    result = popmq("admin", "--endpoint", served.endpoint, *args)
    assert result.returncode == 0, (args, result.stdout, result.stderr)
    return result.stdout


def _half(endpoint: str, topic: str, body: bytes) -> str:
    system = pb.SystemProperties(message_id=uuid.uuid4().hex.upper(), body_encoding=pb.IDENTITY,
                                 message_type=pb.TRANSACTION, born_host="127.0.0.1")  # fmt: skip
    system.born_timestamp.GetCurrentTime()
    message = pb.Message(topic=pb.Resource(name=topic), body=body, system_properties=system)
    with grpc.insecure_channel(endpoint) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        sent = stub.SendMessage(s.SendMessageRequest(messages=[message]), timeout=10,
                                metadata=[("x-mq-client-id", "cli-test")])  # fmt: skip
    assert sent.status.code == pb.OK, sent.status
    assert sent.entries[0].transaction_id
    return sent.entries[0].message_id


def test_list_commit_and_rollback(served: Deployment) -> None:
    topic = unique("tx")
    keep, drop = _half(served.endpoint, topic, b"keep"), _half(served.endpoint, topic, b"drop")
    listed = json.loads(_admin(served, "--json", "transactions", "list"))["transactions"]
    mine = {t["message_id"]: t for t in listed if t["topic"] == topic}
    assert set(mine) == {keep, drop} and not any(t.get("parked") for t in mine.values())
    assert keep in _admin(served, "transactions", "list")  # the table
    assert "committed" in _admin(served, "transactions", "commit", keep)
    assert "rolled back" in _admin(served, "transactions", "rollback", drop)
    listed = json.loads(_admin(served, "--json", "transactions", "list")).get("transactions", [])
    assert not [t for t in listed if t["topic"] == topic]
    again = popmq("admin", "--endpoint", served.endpoint, "transactions", "commit", keep)
    assert again.returncode != 0 and "NOT_FOUND" in again.stderr + again.stdout
    assert "Traceback" not in again.stderr
    with Client(served.endpoint) as client:
        group, got = unique("g"), []
        for queue in client.query_route(topic):
            got += client.receive(group, queue, long_polling_ms=0)
        assert [m.body for m in got] == [b"keep"]
