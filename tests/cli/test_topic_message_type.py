"""`popmq admin topics create --message-type` against a real `popmq serve`: the type is shown,
and a send of another type is refused with MESSAGE_PROPERTY_CONFLICT_WITH_TYPE."""

from __future__ import annotations

import json

import pytest
from cli_support import popmq
from popmq.broker.contract.errors import Code
from popmq.broker.contract.types import Message
from support.official_clients import Deployment, unique

from popmq.client import Client
from popmq.client.errors import ProxyError

pytestmark = pytest.mark.subprocess  # starts popmq


def _admin(served: Deployment, *args: str) -> str:
    result = popmq("admin", "--endpoint", served.endpoint, *args)
    assert result.returncode == 0, (args, result.stdout, result.stderr)
    return result.stdout


def test_create_with_a_message_type(served: Deployment) -> None:
    fifo, default = unique("fifo"), unique("plain")
    assert "FIFO messages" in _admin(served, "topics", "create", fifo, "--message-type", "fifo")
    created = json.loads(_admin(served, "--json", "topics", "create", default))
    assert {b["message_type"] for b in created["topic"]["brokers"]} == {"NORMAL"}  # RocketMQ's
    with Client(served.endpoint) as client:
        assert client.send([Message(fifo, b"f", message_group="g1")])
        for topic, message in (
            (fifo, Message(fifo, b"n")),
            (default, Message(default, b"f", message_group="g")),
        ):
            with pytest.raises(ProxyError) as err:
                client.send([message])
            assert err.value.code == Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, (topic, err.value)
    refused = popmq("admin", "--endpoint", served.endpoint, "topics", "create", unique("x"),
                    "--message-type", "SOMETIMES")  # fmt: skip
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
