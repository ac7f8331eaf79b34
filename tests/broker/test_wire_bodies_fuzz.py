"""The body split (popmq.broker.wire.bodies) against protobuf's own parser, on generated wire
input: a request the split decodes must be the one protobuf decodes (bodies put back, unknown
fields included), and one protobuf refuses must be refused (the decoder falls back to it)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from popmq.broker.wire import bodies as bodies_module
from popmq.broker.wire.bodies import splitting_decoder, take_bodies
from support.examples import examples

from popmq.pb.broker.v1 import broker_pb2 as bpb
from popmq.pb.rocketmq.v2 import service_pb2 as s


def _varint(value: int, pad: int = 0) -> bytes:
    """``value`` as a varint, ``pad`` bytes longer than needed (overlong, as some encoders
    or an attacker may write it)."""
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value or pad:
            out.append(byte | 0x80)
            if not value:
                pad -= 1
                while pad:
                    out.append(0x80)
                    pad -= 1
                out.append(0)
                return bytes(out)
        else:
            out.append(byte)
            return bytes(out)


pads = st.sampled_from([0, 0, 0, 0, 1, 4, 5, 9])


@st.composite
def field(
    draw: st.DrawFn, numbers: st.SearchStrategy[int], payload: st.SearchStrategy[bytes]
) -> bytes:
    number = draw(numbers)
    wire = draw(st.sampled_from([0, 1, 2, 2, 2, 2, 3, 5, 6]))
    key = _varint(number << 3 | wire, draw(pads))
    if wire == 0:
        return key + _varint(draw(st.integers(0, 2**64 - 1)), draw(pads))
    if wire == 1:
        return key + draw(st.binary(min_size=8, max_size=8))
    if wire == 5:
        return key + draw(st.binary(min_size=4, max_size=4))
    if wire == 2:
        value = draw(payload)
        return key + _varint(len(value), draw(pads)) + value
    return key  # a group's start, or an invalid wire type


def message_fields(body_field: int) -> st.SearchStrategy[bytes]:
    numbers = st.sampled_from([body_field, body_field, 1, 3, 5, 99, 2**29 - 1])
    return st.lists(field(numbers, st.binary(max_size=12)), max_size=6).map(b"".join)


def request(body_field: int) -> st.SearchStrategy[bytes]:
    numbers = st.sampled_from([1, 1, 1, 2, 7])
    top = st.lists(field(numbers, message_fields(body_field)), max_size=5).map(b"".join)

    @st.composite
    def damaged(draw: st.DrawFn) -> bytes:
        data = draw(top)
        if data and draw(st.booleans()):
            cut = draw(st.integers(0, len(data) - 1))
            return data[:cut]  # truncated anywhere: a varint, a length past the end
        return data

    return damaged()


CASES = [(s.SendMessageRequest, 1, 4), (bpb.SendRequest, 1, 2)]


@pytest.mark.parametrize(("kind", "messages_field", "body_field"), CASES)
@settings(max_examples=examples(100), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_split_decodes_exactly_what_protobuf_decodes(
    kind: Any, messages_field: int, body_field: int, data: st.DataObject
) -> None:
    raw = data.draw(request(body_field))
    with every_request_split():
        check(kind, messages_field, body_field, raw)


def check(kind: Any, messages_field: int, body_field: int, raw: bytes) -> None:
    try:
        expected = kind.FromString(raw)
    except DecodeError:
        expected = None
    decode = splitting_decoder(kind.FromString, messages_field, body_field)
    if expected is None:
        with pytest.raises(DecodeError):
            decode(raw)
        return
    got = decode(raw)
    bodies = take_bodies(got)
    if bodies is not None:
        assert len(bodies) == len(got.messages)
        for message, body in zip(got.messages, bodies, strict=True):
            if body is not None:
                message.body = bytes(body)
    # Serialized: known fields in order, then unknown ones as they came, so both compare.
    assert got.SerializeToString(deterministic=True) == expected.SerializeToString(
        deterministic=True
    )


@contextlib.contextmanager
def every_request_split() -> Iterator[None]:
    """Every request split, however small (the split applies from 1 MiB in service)."""
    saved = bodies_module.SPLIT_FROM_BYTES
    bodies_module.SPLIT_FROM_BYTES = 0
    try:
        yield
    finally:
        bodies_module.SPLIT_FROM_BYTES = saved


@pytest.mark.parametrize(
    "raw",
    [
        # the messages field's key in 6 bytes (upb reads a key as at most 5)
        bytes([0x8A, 0x80, 0x80, 0x80, 0x80, 0x00, 3, 0x22, 1]) + b"x",
        # its length in 6 bytes
        bytes([0x0A, 0x83, 0x80, 0x80, 0x80, 0x80, 0x00, 0x22, 1]) + b"x",
        # the body's key in 6 bytes, and its length
        bytes([0x0A, 8, 0xA2, 0x80, 0x80, 0x80, 0x80, 0x00, 1]) + b"x",
        bytes([0x0A, 8, 0x22, 0x81, 0x80, 0x80, 0x80, 0x80, 0x00]) + b"x",
        # a 5-byte key past 32 bits
        bytes([0x8A, 0x80, 0x80, 0x80, 0x10, 3, 0x22, 1]) + b"x",
    ],
    ids=["messages-key", "messages-length", "body-key", "body-length", "key-past-32-bits"],
)
def test_an_overlong_varint_protobuf_refuses_is_refused(raw: bytes) -> None:
    """The split writes the messages field's key and length anew and drops the body's: an
    overlong one of them must not turn a request protobuf refuses into one it accepts."""
    with pytest.raises(DecodeError):
        s.SendMessageRequest.FromString(raw)
    with every_request_split(), pytest.raises(DecodeError):
        splitting_decoder(s.SendMessageRequest.FromString, 1, 4)(raw)
