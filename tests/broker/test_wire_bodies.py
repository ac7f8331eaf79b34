"""A batch send decoded without copying its bodies (issue 20, fewer copies of a body): the
request's encoding split into its bodies (views of grpc's bytes) and the rest, which protobuf
decodes; the result is the request protobuf would decode, with the bodies beside it."""

from __future__ import annotations

import contextvars
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.message import DecodeError
from popmq.broker.contract.errors import Code
from popmq.broker.contract.types import PopRequest
from popmq.broker.local import LocalBrokerPort
from popmq.broker.testing import fast_broker_config, running_broker
from popmq.broker.wire import bodies as bodies_module
from popmq.broker.wire import server as server_module
from popmq.broker.wire.bodies import split, splitting_decoder, take_bodies
from popmq.broker.wire.server import BrokerGrpcServer

from popmq.pb.broker.v1 import broker_pb2 as bpb
from popmq.pb.broker.v1 import broker_pb2_grpc
from popmq.pb.rocketmq.v2 import definition_pb2 as pb
from popmq.pb.rocketmq.v2 import service_pb2 as s


def _request() -> s.SendMessageRequest:
    request = s.SendMessageRequest()
    for i, body in enumerate([b"a" * 300, b"", b"\x00\xff" * 70_000, b"z"]):
        message = request.messages.add(topic=pb.Resource(name=f"t{i}"))
        if body:
            message.body = body
        message.user_properties["k"] = "v" * i
        message.system_properties.message_id = f"id-{i}"
        message.system_properties.keys.extend(["x", "y"])
    return request


def test_the_rest_decodes_as_the_request_without_its_bodies() -> None:
    request = _request()
    rest, bodies = split(request.SerializeToString(), 1, 4)
    stripped = s.SendMessageRequest.FromString(rest)
    expected = s.SendMessageRequest()
    expected.CopyFrom(request)
    for message in expected.messages:
        message.ClearField("body")
    assert stripped == expected
    assert [None if b is None else bytes(b) for b in bodies] == [
        m.body if m.body else None for m in request.messages
    ]
    assert len(rest) < 1000  # no body in it


def test_bodies_are_views_of_the_request_bytes_not_copies() -> None:
    data = _request().SerializeToString()
    _, bodies = split(data, 1, 4)
    assert all(b is None or b.obj is data for b in bodies)


def test_a_repeated_body_field_keeps_the_last_as_protobuf_does() -> None:
    first = pb.Message(body=b"first").SerializeToString()
    second = pb.Message(body=b"second", topic=pb.Resource(name="t")).SerializeToString()
    message = first + second  # protobuf merges concatenated encodings: the last body wins
    data = s.SendMessageRequest(messages=[pb.Message.FromString(message)]).SerializeToString()
    raw = bytes([0x0A, len(message)]) + message
    _, bodies = split(raw, 1, 4)
    assert bodies[0] is not None and bytes(bodies[0]) == b"second"
    assert s.SendMessageRequest.FromString(data).messages[0].body == b"second"


def test_other_fields_of_the_request_are_kept() -> None:
    request = bpb.SendRequest(
        messages=[bpb.Message(topic="t", body=b"b" * 5000, tag="x")], queue_id=7
    )
    rest, bodies = split(request.SerializeToString(), 1, 2)
    stripped = bpb.SendRequest.FromString(rest)
    assert stripped.queue_id == 7 and stripped.messages[0].tag == "x"
    assert stripped.messages[0].body == b"" and bytes(bodies[0] or b"") == b"b" * 5000


def _decode(data: bytes) -> tuple[s.SendMessageRequest, list[memoryview | None] | None]:
    """Decode then take the bodies in one fresh context, as grpc runs a call in its task."""

    def run() -> tuple[s.SendMessageRequest, list[memoryview | None] | None]:
        decode = splitting_decoder(s.SendMessageRequest.FromString, 1, 4)
        request = decode(data)
        return request, take_bodies(request)

    return contextvars.copy_context().run(run)


def test_a_large_request_is_split_and_its_bodies_taken_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(bodies_module, "SPLIT_FROM_BYTES", 1000)
    request = _request()

    def run() -> None:
        decode = splitting_decoder(s.SendMessageRequest.FromString, 1, 4)
        decoded = decode(request.SerializeToString())
        assert all(not m.body for m in decoded.messages)
        assert take_bodies(s.SendMessageRequest()) is None  # another request: not its bodies
        taken = take_bodies(decoded)
        assert taken is not None and bytes(taken[2] or b"") == request.messages[2].body
        assert take_bodies(decoded) is None  # taken: a task started now does not keep them

    contextvars.copy_context().run(run)


def test_a_small_request_is_decoded_whole() -> None:
    request = _request()
    decoded, taken = _decode(request.SerializeToString())
    assert decoded == request and taken is None


@pytest.mark.parametrize(
    "data",
    [
        b"\x0a\x05\x22\x10abc",  # a body longer than its message
        b"\x0a\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",  # a varint past 64 bits
        b"\x0b\x0c",  # a group
        b"\x0a\x02\x22",  # a truncated field
    ],
)
def test_a_malformed_request_gets_protobufs_own_verdict(
    monkeypatch: pytest.MonkeyPatch, data: bytes
) -> None:
    monkeypatch.setattr(bodies_module, "SPLIT_FROM_BYTES", 0)
    try:
        expected: object = s.SendMessageRequest.FromString(data)
    except DecodeError:
        with pytest.raises(DecodeError):
            _decode(data)
        return
    decoded, taken = _decode(data)
    assert decoded == expected and taken is None


async def test_a_large_unary_send_to_a_broker_is_stored_from_the_request_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """BrokerService.Send past SPLIT_FROM_BYTES: decoded without its bodies, each stored from
    its view of grpc's bytes, intact, with the other fields as sent."""
    taken: list[int] = []
    real_take = server_module.take_bodies

    def recording_take(request: Any) -> Any:
        bodies = real_take(request)
        taken.append(-1 if bodies is None else len(bodies))
        return bodies

    monkeypatch.setattr(server_module, "take_bodies", recording_take)
    bodies = [bytes([65 + i]) * (400_000 + i) for i in range(3)] + [b"small"]
    request = bpb.SendRequest(
        messages=[
            bpb.Message(topic="big", body=b, tag="T", message_id=f"m{i}")
            for i, b in enumerate(bodies)
        ],
        queue_id=0,
    )
    async with running_broker(fast_broker_config(tmp_path / "b", name="broker-a")) as broker:
        server = BrokerGrpcServer(LocalBrokerPort(broker), "127.0.0.1", 0)
        await server.start()
        try:
            async with grpc.aio.insecure_channel(server.address) as channel:
                answer = await broker_pb2_grpc.BrokerServiceStub(channel).Send(request, timeout=10)
            assert answer.status.code == Code.OK, answer.status
            assert taken == [4]
            popped = await LocalBrokerPort(broker).pop(
                PopRequest("g", "big", max_messages=32, invisible_time_ms=60_000)
            )
        finally:
            await server.aclose(0)
    got = sorted((m.message.message_id, m.message.body, m.message.tag) for m in popped.messages)
    assert got == [(f"m{i}", b, "T") for i, b in enumerate(bodies)]
